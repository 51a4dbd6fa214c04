// moe_common.cuh — device helpers shared by the MoE forward and backward kernels
// (csrc/moe_fwd_sm90.cu, csrc/moe_bwd_sm90.cu): the sorted-row position of a choice, the
// row copy of the loader warps, named barriers, the wgmma accumulator layout, a
// deterministic warp sum. Include after the CUDA / bf16 headers (builder_sm90.cuh).
#pragma once
#include <cuda_bf16.h>

#include "moe_params.h"
#include "platform.cuh"

namespace kosmos {
namespace moe {

constexpr int kMoeBM = 128;  // rows per expert tile (segments of the sorted buffers are padded to it)

__device__ __forceinline__ void named_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }

__device__ __forceinline__ int ldcg(const int32_t* p) { return __ldcg(p); }

// Row of choice (t, j) (after the forward's SCAN): in the sorted buffer when its expert e has
// tiles here (e < E_tiles), else (host fabric) in the send buffers of e's owner, -1 when the
// reference routing made no such choice (moe_params.h ref_slot); *e_out = e.
__device__ __forceinline__ int pos_of(const KosmosMoeArgs& a, int t, int j, int* e_out) {
  const int e = ldcg(a.routes + int64_t(t) * a.topk + j);
  *e_out = e;
  if (e >= a.E_tiles) {
    for (int r = 0; r < a.topk; ++r)
      if (a.ref_routes[int64_t(t) * a.topk + r] == e) return a.ref_slot[int64_t(t) * a.topk + r];
    return -1;
  }
  return ldcg(a.seg_start + e) + ldcg(a.blk_base + int64_t(t / kMoeBM) * a.E + e) +
         ldcg(a.rank + int64_t(t) * a.topk + j);
}

// Peer row i (host fabric): its peer, its row in that peer's buffers and its sorted row here.
struct PeerRow {
  int p, ip, dst;
};
__device__ __forceinline__ PeerRow peer_row(const KosmosMoeArgs& a, int i) {
  int p = 1;
  while (p < 7 && i >= a.peer_begin[p + 1]) ++p;
  const int e = a.peer_expert[i];
  return PeerRow{p, i - a.peer_begin[p], ldcg(a.seg_start + e) + ldcg(a.own_total + e) + a.peer_rel[i]};
}

// One warp copies a row of `chunks` 16-byte chunks (ld.global.cg: the source may be pinned host
// memory), kDepth 16-byte loads in flight per lane (a row copy is latency-bound).
template <int kDepth = 8>
__device__ __forceinline__ void copy_row(int4* dst, const int4* src, int chunks, int lane) {
  for (int i = lane; i < chunks; i += 32 * kDepth) {
    int4 v[kDepth];
#pragma unroll
    for (int u = 0; u < kDepth; ++u)
      if (i + u * 32 < chunks) v[u] = ld_cg_16(src + i + u * 32);
#pragma unroll
    for (int u = 0; u < kDepth; ++u)
      if (i + u * 32 < chunks) dst[i + u * 32] = v[u];
  }
}

// Accumulator layout (builder_sm90.cuh store_staged_to): math thread m (0..255), value v:
//   row = 16*(m/32) + (m%32)/4 + 8*((v/2)%2),   col = 8*(v/4) + 2*(m%4) + v%2.
// Value v + 64 is the same row, column + 128 (the SwiGLU epilogues pair gate and up by it).
__device__ __forceinline__ int acc_row(int m, int v) { return 16 * (m / 32) + (m % 32) / 4 + 8 * ((v / 2) % 2); }
__device__ __forceinline__ int acc_col(int m, int v) { return 8 * (v / 4) + 2 * (m % 4) + v % 2; }

// Sum over the warp's 32 lanes, the same butterfly every call: bitwise reproducible.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace moe
}  // namespace kosmos
