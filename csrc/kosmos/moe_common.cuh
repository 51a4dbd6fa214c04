// moe_common.cuh — device helpers shared by the MoE forward and backward kernels
// (csrc/moe_fwd_sm90.cu, csrc/moe_bwd_sm90.cu): the sorted-row position of a choice, the
// row copy of the loader warps, the folds' inner loop, named barriers, the loader's claim loop,
// the expert-tile raster, the wgmma accumulator layout, a deterministic warp sum.
// Include after the CUDA / bf16 headers (builder_sm90.cuh).
#pragma once
#include <cuda_bf16.h>

#include "moe_params.h"
#include "platform.cuh"
#include "sync.cuh"

namespace kosmos {
namespace moe {

constexpr int kMoeBM = 128;  // rows per expert tile (segments of the sorted buffers are padded to it)

__device__ __forceinline__ void named_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
// Arrive at barrier `id` (of n threads) without waiting: the forward's ping-pong MMA turn (the
// arriving warpgroup hands it on, the other's bar.sync completes the count).
__device__ __forceinline__ void named_bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }

// The ping-pong math warpgroups' MMA turn (both MoE kernels' ping-pong builds; CUTLASS's ping-pong
// order, on named barriers kBarTurn0 + wg): item j's owner waits for item j - 1's owner (the other
// warpgroup) to have issued its last wgmma, and hands the turn on once its own are issued, so the
// tensor cores run one warpgroup's mainloop while the other's epilogue runs. Every item takes and
// gives exactly once (items without a mainloop: both at once); after the last item the warpgroup
// whose turn it is consumes the pending arrival (finish). The wait is intra-CTA: the other
// warpgroup only needs its tile's stages (TMA, issued by the loader in ring order) to reach its
// give, never another CTA's counters (the scheduler waited for those before pushing the item).
template <int kBarTurn0, int kWgThreads>
struct Turn {
  int wg;
  __device__ __forceinline__ void take(int j) const {
    if (j > 0) named_bar_sync(kBarTurn0 + wg, 2 * kWgThreads);
  }
  __device__ __forceinline__ void give() const { named_bar_arrive(kBarTurn0 + (wg ^ 1), 2 * kWgThreads); }
  // j: the ring index of the end marker (items 0..j-1 ran)
  __device__ __forceinline__ void finish(int j) const {
    if ((j & 1) == wg) take(j);
  }
};

__device__ __forceinline__ int ldcg(const int32_t* p) { return __ldcg(p); }

// The movers' lead's value v to all n movers through the shared word `slot` (barrier `bar`):
// every mover returns it (a claim, or -1 after a failed wait: all take the same path).
__device__ __forceinline__ int share_lead(int& slot, bool lead, int v, int bar, int n) {
  if (lead) slot = v;
  named_bar_sync(bar, n);
  const int r = *reinterpret_cast<volatile int*>(&slot);
  named_bar_sync(bar, n);
  return r;
}

// The loader's next item, claimed by its scheduler thread (decide(): the kernel's claim and
// wait) and shared with the loader threads through s.cmd[0] (< 0: none left). The math warps'
// memory-bound items (kinds in mem_kinds, a bit mask: FOLD, the backward's GATHER) have no
// mainloop stages to throttle their claims: the next claim waits until the math warps finished
// the CTA's last one (s.mem_done), so those items spread over every CTA.
template <class Shared, class Decide>
__device__ __forceinline__ int next_loader_item(Shared& s, int& mem_claimed, uint32_t mem_kinds, bool sched, int bar,
                                                int threads, const SyncCtx& sc, Decide decide) {
  if (sched) {
    while (*reinterpret_cast<volatile int*>(&s.mem_done) < mem_claimed && !aborted(sc)) __nanosleep(64);
    s.bad = 0;
    s.cmd[0] = decide();
    mem_claimed += s.cmd[0] >= 0 && ((mem_kinds >> (s.cmd[0] >> 24)) & 1u);
  }
  named_bar_sync(bar, threads);  // cmd written
  const int item = s.cmd[0];
  named_bar_sync(bar, threads);  // cmd read
  return item;
}

// Expert-tile item i -> (queue position q, n-tile n) in groups of kRasterGroup queue positions,
// n-tiles outer within a group (the forward's UP, the backward's DX: their B, one expert's W1,
// is 59 MB at deepseek-v3's H 7168 / F 2048, beyond L2). The ~132 items in flight then read ~16
// tiles' rows and ~8 n-tiles of W1; q-major they would read every n-tile of ~5 tiles, all of W1,
// re-streamed from HBM every few tiles (UP tile 108 -> 92 us, results/device-h100-20261206c).
// tm: the table's tiles (items = tm * nn); a bijection of [0, tm * nn).
constexpr int kRasterGroup = 16;
__device__ __forceinline__ void raster_tile(int i, int nn, int tm, int* q, int* n) {
  const int g0 = i / (kRasterGroup * nn) * kRasterGroup, r = i % (kRasterGroup * nn);
  const int gm = min(kRasterGroup, tm - g0);
  *q = g0 + r % gm;
  *n = r / gm;
}

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

// The folds' inner loop (forward FOLD: weighted, backward FOLD: weight 1): acc[u] += w[j] * the
// 8 bf16 at rows[j] + off, j = 0..k-1 in j order (bitwise the same sums every call), kAhead
// choices' 16-byte loads in flight before their adds (a fold is latency-bound). A null row (no
// output for that choice: host fabric, moe_params.h ref_slot) adds nothing.
template <bool kWeighted, int kAhead = 8>
__device__ __forceinline__ void fold_rows(float (&acc)[8], const bf16* const* rows, const float* w, int k,
                                          int64_t off) {
  for (int j0 = 0; j0 < k; j0 += kAhead) {
    int4 v[kAhead];
#pragma unroll
    for (int d = 0; d < kAhead; ++d) {
      const bf16* src = j0 + d < k ? rows[j0 + d] : nullptr;
      v[d] = src ? ld_cg_16(src + off) : make_int4(0, 0, 0, 0);
    }
#pragma unroll
    for (int d = 0; d < kAhead; ++d) {
      if (j0 + d >= k || !rows[j0 + d]) continue;
      const bf16* h = reinterpret_cast<const bf16*>(&v[d]);
#pragma unroll
      for (int u = 0; u < 8; ++u)
        acc[u] = kWeighted ? fmaf(w[j0 + d], __bfloat162float(h[u]), acc[u]) : acc[u] + __bfloat162float(h[u]);
    }
  }
}

// acc[u] += the 8 bf16 of v (the shared expert's row, the router's input gradient).
__device__ __forceinline__ void add_bf16x8(float (&acc)[8], const int4& v) {
  const bf16* h = reinterpret_cast<const bf16*>(&v);
#pragma unroll
  for (int u = 0; u < 8; ++u) acc[u] += __bfloat162float(h[u]);
}

// The 8 sums rounded to bf16 as one 16-byte store.
__device__ __forceinline__ void store_bf16x8(bf16* dst, const float (&acc)[8]) {
  int4 out;
  bf16* o = reinterpret_cast<bf16*>(&out);
#pragma unroll
  for (int u = 0; u < 8; ++u) o[u] = __float2bfloat16_rn(acc[u]);
  *reinterpret_cast<int4*>(dst) = out;
}

// Accumulator layout (builder_sm90.cuh store_staged_to): math thread m (0..255), value v:
//   row = 16*(m/32) + (m%32)/4 + 8*((v/2)%2),   col = 8*(v/4) + 2*(m%4) + v%2.
// Value v + 64 is the same row, column + 128 (the SwiGLU epilogues pair gate and up by it).
// The same formulas give one m64 half of a ping-pong warpgroup tile (PingpongBuilderSm90: its
// thread t = 0..127 as m, value a = 0..kBN/2-1 of the half as v).
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
