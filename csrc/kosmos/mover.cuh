// mover.cuh — WG-wide copies and the deterministic reduction.
//
// All loads are L1-bypassing (ld.global.cg): sources may be written by other WGs, other
// GPUs or the host during the call, or live in pinned host memory (PCIe). Each thread keeps
// kUnroll 16-byte loads in flight (256 threads x 8 x 16 B = 32 KiB per WG), enough to cover
// PCIe latency with a handful of mover WGs.
#pragma once
#include "params.h"
#include "platform.cuh"

namespace kosmos {

constexpr int kMoverUnroll = 8;


// Copy `bytes` (even) contiguous bytes. All threads of the WG call it.
__device__ __forceinline__ void copy_contig(void* dst, const void* src, size_t bytes, int tid, int nthr) {
  size_t done = 0;
  if (aligned16(dst) && aligned16(src)) {
    const size_t n16 = bytes >> 4;
    const char* s = static_cast<const char*>(src);
    char* d = static_cast<char*>(dst);
    for (size_t base = tid; base < n16; base += static_cast<size_t>(kMoverUnroll) * nthr) {
      int4 v[kMoverUnroll];
#pragma unroll
      for (int u = 0; u < kMoverUnroll; ++u) {
        const size_t i = base + static_cast<size_t>(u) * nthr;
        if (i < n16) v[u] = ld_cg_16(s + i * 16);
      }
#pragma unroll
      for (int u = 0; u < kMoverUnroll; ++u) {
        const size_t i = base + static_cast<size_t>(u) * nthr;
        if (i < n16) st_16(d + i * 16, v[u]);
      }
    }
    done = n16 << 4;
  }
  const uint16_t* s2 = static_cast<const uint16_t*>(src);
  uint16_t* d2 = static_cast<uint16_t*>(dst);
  for (size_t i = done / 2 + tid; i < bytes / 2; i += nthr) d2[i] = ld_cg_2(s2 + i);
}

// Copy a rows x cols bf16 tile between two row-major matrices (leading dims in elements).
__device__ __forceinline__ void copy_tile(bf16* dst, int64_t ldd, const bf16* src, int64_t lds, int rows, int cols,
                                          int tid, int nthr) {
  const bool vec = aligned16(dst) && aligned16(src) && (ldd % 8 == 0) && (lds % 8 == 0) && (cols % 8 == 0);
  if (vec) {
    const int cpr = cols / 8;
    const int n = rows * cpr;
    for (int base = tid; base < n; base += kMoverUnroll * nthr) {
      int4 v[kMoverUnroll];
#pragma unroll
      for (int u = 0; u < kMoverUnroll; ++u) {
        const int i = base + u * nthr;
        if (i < n) v[u] = ld_cg_16(src + (i / cpr) * lds + (i % cpr) * 8);
      }
#pragma unroll
      for (int u = 0; u < kMoverUnroll; ++u) {
        const int i = base + u * nthr;
        if (i < n) st_16(dst + (i / cpr) * ldd + (i % cpr) * 8, v[u]);
      }
    }
  } else {
    const int n = rows * cols;
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
    for (int i = tid; i < n; i += nthr) d[(i / cols) * ldd + i % cols] = ld_cg_2(s + (i / cols) * lds + i % cols);
  }
}

// out[rows x cols] = sum_{s = 0..world-1} src[s][rows x cols], fp32 accumulation in rank
// order (bitwise deterministic whatever the arrival order), one bf16 rounding at the end.
__device__ __forceinline__ void reduce_tile(bf16* out, int64_t ldo, bf16* const* src, int64_t lds, int world,
                                            int rows, int cols, int tid, int nthr) {
  bool vec = aligned16(out) && (ldo % 8 == 0) && (lds % 8 == 0) && (cols % 8 == 0);
  for (int s = 0; s < world; ++s) vec = vec && aligned16(src[s]);
  if (vec) {
    const int cpr = cols / 8;
    const int n = rows * cpr;
    for (int i = tid; i < n; i += nthr) {
      const int64_t off_s = (i / cpr) * lds + (i % cpr) * 8;
      int4 v[KOSMOS_MAX_WORLD];
#pragma unroll
      for (int s = 0; s < KOSMOS_MAX_WORLD; ++s)
        if (s < world) v[s] = ld_cg_16(src[s] + off_s);
      float acc[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = 0.f;
#pragma unroll
      for (int s = 0; s < KOSMOS_MAX_WORLD; ++s) {
        if (s < world) {
          const bf16* h = reinterpret_cast<const bf16*>(&v[s]);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e] += __bfloat162float(h[e]);
        }
      }
      int4 o;
      bf16* oh = reinterpret_cast<bf16*>(&o);
#pragma unroll
      for (int e = 0; e < 8; ++e) oh[e] = __float2bfloat16_rn(acc[e]);
      st_16(out + (i / cpr) * ldo + (i % cpr) * 8, o);
    }
  } else {
    const int n = rows * cols;
    for (int i = tid; i < n; i += nthr) {
      const int64_t off_s = (i / cols) * lds + i % cols;
      float acc = 0.f;
      for (int s = 0; s < world; ++s) {
        const uint16_t raw = ld_cg_2(src[s] + off_s);
        acc += __bfloat162float(__ushort_as_bfloat16(raw));
      }
      out[(i / cols) * ldo + i % cols] = __float2bfloat16_rn(acc);
    }
  }
}

}  // namespace kosmos

namespace kosmos {

// Bulk (TMA) contiguous copy through shared memory, issued by ONE thread: kBulkStages
// stages of kBulkBytes, loads (global -> smem, mbarrier) run kBulkStages ahead of stores
// (smem -> global, bulk groups). smem: kBulkStages * kBulkBytes bytes (+ 8 * kBulkStages
// for the barriers in `bars`). Requires 16-byte aligned src/dst; `bytes` may have a
// non-multiple-of-16 tail, which the caller copies with copy_contig. Returns false on a
// watchdog timeout (the call then aborts and the WG exits). Barrier phases restart per
// call: the barriers are (re)initialised on entry and every store is waited for on return.
// kBulkStages / kBulkBytes: platform.cuh (the staging fits the platform's shared memory).

template <class Timeout>
__device__ __forceinline__ bool bulk_copy_contig(char* dst, const char* src, size_t bytes, char* smem, uint64_t* bars,
                                                 Timeout&& timed_out) {
  const size_t n = bytes & ~size_t(15);
  const size_t chunks = (n + kBulkBytes - 1) / kBulkBytes;
  const uint32_t s0 = smem_addr(smem);
  for (int s = 0; s < kBulkStages; ++s) mbar_init(smem_addr(bars + s), 1);
  fence_proxy_async_smem();  // barriers and any generic-proxy smem writes before the async proxy
  auto issue = [&](size_t i) {
    const uint32_t st = static_cast<uint32_t>(i % kBulkStages);
    const size_t off = i * kBulkBytes;
    const uint32_t len = static_cast<uint32_t>((n - off) < kBulkBytes ? (n - off) : kBulkBytes);
    mbar_expect_tx(smem_addr(bars + st), len);
    bulk_g2s(s0 + st * kBulkBytes, src + off, len, smem_addr(bars + st));
  };
  for (size_t i = 0; i < chunks && i < static_cast<size_t>(kBulkStages); ++i) issue(i);
  bool ok = true;
  for (size_t i = 0; i < chunks; ++i) {
    const uint32_t st = static_cast<uint32_t>(i % kBulkStages);
    const uint32_t parity = static_cast<uint32_t>((i / kBulkStages) & 1);
    const uint64_t t0 = globaltimer_ns();
    while (!mbar_try_wait(smem_addr(bars + st), parity)) {
      if (timed_out(globaltimer_ns() - t0)) {
        ok = false;
        break;
      }
    }
    if (!ok) break;
    const size_t off = i * kBulkBytes;
    const uint32_t len = static_cast<uint32_t>((n - off) < kBulkBytes ? (n - off) : kBulkBytes);
    bulk_s2g(dst + off, s0 + st * kBulkBytes, len);
    bulk_commit();
    if (i + kBulkStages < chunks) {
      bulk_wait_read<0>();  // the store of this stage has read smem: reuse it
      issue(i + kBulkStages);
    }
  }
  bulk_wait_all();
  fence_proxy_async_global();  // async-proxy global writes before the generic-proxy flag release
  return ok;
}

}  // namespace kosmos
