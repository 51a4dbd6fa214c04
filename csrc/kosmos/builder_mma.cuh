// builder_mma.cuh — portable builder: one C tile of a bf16 GEMM, fp32 accumulation.
//
// Interface (shared with the Hopper builder that will replace it on sm_90a):
//   template <class Cfg> __device__ void build_tile(const TileArgs& t, char* smem);
// computes C[0:rows, 0:cols] = A[0:rows, 0:K] @ B[0:K, 0:cols] for row-major bf16 A
// (lda), B (ldb), C (ldc), rows <= Cfg::kBM, cols <= Cfg::kBN, any K >= 1. All
// Cfg::kThreads threads of the block call it; it leaves shared memory free on return.
//
// Mechanics: kStages-deep cp.async (16 B, zero-filled outside the tile) shared-memory
// pipeline over k-tiles of kBK = 64; 8 warps as 2 (M) x 4 (N), each a 64 x 32 warp tile of
// mma.sync m16n8k16 fed by ldmatrix (A) and ldmatrix.trans (B). Shared layout per stage:
//   A: kBM rows x 128 B (64 bf16), 16-byte chunk c of row m stored at chunk c ^ (m & 7)
//   B: kBK rows x 256 B (128 bf16), chunk c of row k stored at (c & 8) | ((c ^ k) & 7)
// (conflict-free ldmatrix). Operands whose leading dim or base is not 16-byte aligned, or
// whose contiguous extent is not a multiple of 8 (e.g. N/W = 777), take a scalar load path
// into the same layout: slower, same results.
#pragma once
#include "platform.cuh"

namespace kosmos {

struct MmaBuilderConfig {
  static constexpr int kBM = 128;
  static constexpr int kBN = 128;
  static constexpr int kBK = 64;
  static constexpr int kStages = 3;
  static constexpr int kThreads = 256;
  static constexpr int kWarpsM = 2;
  static constexpr int kWarpsN = 4;
  static constexpr int kWarpM = kBM / kWarpsM;  // 64
  static constexpr int kWarpN = kBN / kWarpsN;  // 32
  static constexpr int kFragM = kWarpM / 16;    // 4
  static constexpr int kFragN = kWarpN / 8;     // 4
  static constexpr int kSmemA = kBM * kBK * 2;  // 16 KiB per stage
  static constexpr int kSmemB = kBK * kBN * 2;  // 16 KiB per stage
  static constexpr int kSmemBytes = kStages * (kSmemA + kSmemB);
  static_assert(kWarpsM * kWarpsN * kWarpSize == kThreads, "one warp per warp tile");
  static_assert(kBK == 64 && kBN == 128, "swizzles below assume 128 B A rows and 256 B B rows");
  static_assert((kBM * kBK / 8) % kThreads == 0 && (kBK * kBN / 8) % kThreads == 0, "whole chunks per thread");
  static_assert(kSmemBytes <= 200 * 1024, "shared memory budget (one WG per SM)");
};

struct TileArgs {
  const bf16* A;
  int64_t lda;
  const bf16* B;
  int64_t ldb;
  bf16* C;
  int64_t ldc;
  int rows, cols, K;
};

namespace detail {

__device__ __forceinline__ uint32_t a_off(int m, int c) { return m * 128 + ((c ^ (m & 7)) << 4); }
__device__ __forceinline__ uint32_t b_off(int k, int c) { return k * 256 + (((c & 8) | ((c ^ k) & 7)) << 4); }

template <class Cfg>
__device__ __forceinline__ void load_stage(const TileArgs& t, bool a_vec, bool b_vec, uint32_t sa, uint32_t sb,
                                           int k0, int tid) {
  constexpr int kChunksA = Cfg::kBM * Cfg::kBK / 8 / Cfg::kThreads;
  constexpr int kChunksB = Cfg::kBK * Cfg::kBN / 8 / Cfg::kThreads;
#pragma unroll
  for (int i = 0; i < kChunksA; ++i) {
    const int idx = tid + i * Cfg::kThreads;
    const int m = idx >> 3, c = idx & 7;
    const int gk = k0 + c * 8;
    const uint32_t dst = sa + a_off(m, c);
    const bool row_ok = m < t.rows;
    if (a_vec) {
      const bool ok = row_ok && gk < t.K;
      cp_async_16(dst, ok ? static_cast<const void*>(t.A + m * t.lda + gk) : static_cast<const void*>(t.A), ok ? 16 : 0);
    } else {
      uint16_t h[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) h[e] = (row_ok && gk + e < t.K) ? ld_cg_2(t.A + m * t.lda + gk + e) : uint16_t(0);
      st_shared_16(dst, make_uint4(h[0] | (uint32_t(h[1]) << 16), h[2] | (uint32_t(h[3]) << 16),
                                   h[4] | (uint32_t(h[5]) << 16), h[6] | (uint32_t(h[7]) << 16)));
    }
  }
#pragma unroll
  for (int i = 0; i < kChunksB; ++i) {
    const int idx = tid + i * Cfg::kThreads;
    const int k = idx >> 4, c = idx & 15;
    const int gk = k0 + k, gn = c * 8;
    const uint32_t dst = sb + b_off(k, c);
    const bool k_ok = gk < t.K;
    if (b_vec) {
      const bool ok = k_ok && gn < t.cols;
      cp_async_16(dst, ok ? static_cast<const void*>(t.B + gk * t.ldb + gn) : static_cast<const void*>(t.B), ok ? 16 : 0);
    } else {
      uint16_t h[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) h[e] = (k_ok && gn + e < t.cols) ? ld_cg_2(t.B + gk * t.ldb + gn + e) : uint16_t(0);
      st_shared_16(dst, make_uint4(h[0] | (uint32_t(h[1]) << 16), h[2] | (uint32_t(h[3]) << 16),
                                   h[4] | (uint32_t(h[5]) << 16), h[6] | (uint32_t(h[7]) << 16)));
    }
  }
}

}  // namespace detail

template <class Cfg>
__device__ __forceinline__ void build_tile(const TileArgs& t, char* smem) {
  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int warp_m = warp / Cfg::kWarpsN, warp_n = warp % Cfg::kWarpsN;
  const uint32_t s_base = smem_addr(smem);
  auto sa = [&](int s) { return s_base + s * (Cfg::kSmemA + Cfg::kSmemB); };
  auto sb = [&](int s) { return s_base + s * (Cfg::kSmemA + Cfg::kSmemB) + Cfg::kSmemA; };

  const bool a_vec = aligned16(t.A) && (t.lda % 8 == 0) && (t.K % 8 == 0);
  const bool b_vec = aligned16(t.B) && (t.ldb % 8 == 0) && (t.cols % 8 == 0);

  float acc[Cfg::kFragM][Cfg::kFragN][4];
#pragma unroll
  for (int i = 0; i < Cfg::kFragM; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kFragN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  const int nk = (t.K + Cfg::kBK - 1) / Cfg::kBK;
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < nk) detail::load_stage<Cfg>(t, a_vec, b_vec, sa(s), sb(s), s * Cfg::kBK, tid);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<Cfg::kStages - 2>();
    __syncthreads();
    const int nxt = kt + Cfg::kStages - 1;
    if (nxt < nk) detail::load_stage<Cfg>(t, a_vec, b_vec, sa(nxt % Cfg::kStages), sb(nxt % Cfg::kStages),
                                          nxt * Cfg::kBK, tid);
    cp_async_commit();
    const uint32_t A_s = sa(kt % Cfg::kStages), B_s = sb(kt % Cfg::kStages);
#pragma unroll
    for (int ks = 0; ks < Cfg::kBK / 16; ++ks) {
      uint32_t af[Cfg::kFragM][4];
#pragma unroll
      for (int mi = 0; mi < Cfg::kFragM; ++mi) {
        const int m = warp_m * Cfg::kWarpM + mi * 16 + (lane & 15);
        const int c = ks * 2 + (lane >> 4);
        ldmatrix_x4(af[mi], A_s + detail::a_off(m, c));
      }
      uint32_t bfr[Cfg::kFragN][2];
#pragma unroll
      for (int nj = 0; nj < Cfg::kFragN / 2; ++nj) {
        const int mat = lane >> 3;
        const int k = ks * 16 + (mat & 1) * 8 + (lane & 7);
        const int n = warp_n * Cfg::kWarpN + nj * 16 + (mat >> 1) * 8;
        uint32_t r[4];
        ldmatrix_x4_trans(r, B_s + detail::b_off(k, n >> 3));
        bfr[2 * nj][0] = r[0];
        bfr[2 * nj][1] = r[1];
        bfr[2 * nj + 1][0] = r[2];
        bfr[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < Cfg::kFragM; ++mi)
#pragma unroll
        for (int ni = 0; ni < Cfg::kFragN; ++ni) mma_bf16_16816(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // Epilogue: fragment (mi, ni) element e sits at row 16 mi + lane/4 (+8 for e >= 2),
  // col 8 ni + 2 (lane % 4) + (e & 1) of the warp tile.
  const bool pair_ok = ((reinterpret_cast<uintptr_t>(t.C) & 3) == 0) && (t.ldc % 2 == 0);
#pragma unroll
  for (int mi = 0; mi < Cfg::kFragM; ++mi) {
#pragma unroll
    for (int ni = 0; ni < Cfg::kFragN; ++ni) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = warp_m * Cfg::kWarpM + mi * 16 + (lane >> 2) + h * 8;
        const int n = warp_n * Cfg::kWarpN + ni * 8 + (lane & 3) * 2;
        if (m >= t.rows) continue;
        bf16* dst = t.C + m * t.ldc + n;
        const float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
        if (pair_ok && n + 1 < t.cols) {
          *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
        } else {
          if (n < t.cols) dst[0] = __float2bfloat16_rn(v0);
          if (n + 1 < t.cols) dst[1] = __float2bfloat16_rn(v1);
        }
      }
    }
  }
}

}  // namespace kosmos
