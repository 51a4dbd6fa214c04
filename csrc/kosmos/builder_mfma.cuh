// builder_mfma.cuh — portable builder for AMD GPUs: one C tile of a bf16 GEMM, fp32
// accumulation, on the matrix cores (MFMA, gfx90a and later). Same interface as
// builder_mma.cuh (see there):
//   template <class Cfg> __device__ void build_tile(const TileArgs& t, char* smem);
// C[0:rows, 0:cols] = A[0:rows, 0:K] @ B[0:K, 0:cols], row-major bf16 A (lda), B (ldb),
// C (ldc), rows <= Cfg::kBM, cols <= Cfg::kBN, any K >= 1; all Cfg::kThreads threads of the
// block call it; shared memory is free again on return.
//
// Deliberately plain (it has only been compiled, never run: no AMD GPU here): per k-tile of
// kBK = 32, every thread copies its share of A and B into shared memory with scalar loads
// (zero outside the tile; any alignment), a barrier, then each of the 4 wavefronts (2 x 2)
// multiplies its 64 x 64 warp tile as 2 x 2 MFMA 32x32x8 tiles, a barrier. No pipelining,
// no vector loads. Shared layout: A as [kBM][kLd] (row m, k), B transposed as [kBN][kLd]
// (column n, k), kLd = kBK + 4, so that each lane reads its 4 consecutive k as one 8-byte
// load. The MFMA operand layout is the one documented at mfma_bf16_32x32x8 (platform.cuh).
#pragma once
#include "platform.cuh"

namespace kosmos {

struct MfmaBuilderConfig {
  static constexpr int kBM = 128;
  static constexpr int kBN = 128;
  static constexpr int kBK = 32;
  static constexpr int kThreads = 256;            // 4 wavefronts of 64
  static constexpr int kWavesM = 2;
  static constexpr int kWavesN = 2;
  static constexpr int kWaveM = kBM / kWavesM;    // 64
  static constexpr int kWaveN = kBN / kWavesN;    // 64
  static constexpr int kFragM = kWaveM / 32;      // 2 MFMA tiles (32 x 32) down
  static constexpr int kFragN = kWaveN / 32;      // 2 across
  static constexpr int kLd = kBK + 4;             // shared row length in bf16 (8-byte aligned rows)
  static constexpr int kSmemA = kBM * kLd * 2;    // 9 KiB
  static constexpr int kSmemB = kBN * kLd * 2;    // 9 KiB
  static constexpr int kSmemBytes = kSmemA + kSmemB;
  static_assert(kWavesM * kWavesN * kWarpSize == kThreads, "one wavefront per warp tile");
  static_assert(kBK % 8 == 0, "whole MFMA k-steps per k-tile");
  static_assert(kSmemBytes + 64 <= 64 * 1024, "shared memory (LDS) budget of a gfx90a workgroup");
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

template <class Cfg>
__device__ __forceinline__ void build_tile(const TileArgs& t, char* smem) {
  const int tid = threadIdx.x;
  const int wave = tid / kWarpSize, lane = tid % kWarpSize;
  const int wave_m = wave / Cfg::kWavesN, wave_n = wave % Cfg::kWavesN;
  uint16_t* As = reinterpret_cast<uint16_t*>(smem);                // [kBM][kLd]
  uint16_t* Bs = reinterpret_cast<uint16_t*>(smem + Cfg::kSmemA);  // [kBN][kLd], transposed
  const uint16_t* A = reinterpret_cast<const uint16_t*>(t.A);
  const uint16_t* B = reinterpret_cast<const uint16_t*>(t.B);

  floatx16 acc[Cfg::kFragM][Cfg::kFragN];
  for (int i = 0; i < Cfg::kFragM; ++i)
    for (int j = 0; j < Cfg::kFragN; ++j)
      for (int e = 0; e < 16; ++e) acc[i][j][e] = 0.f;

  for (int k0 = 0; k0 < t.K; k0 += Cfg::kBK) {
    // A tile: consecutive threads take consecutive k of a row.
    for (int idx = tid; idx < Cfg::kBM * Cfg::kBK; idx += Cfg::kThreads) {
      const int m = idx / Cfg::kBK, k = idx % Cfg::kBK;
      const bool ok = m < t.rows && k0 + k < t.K;
      As[m * Cfg::kLd + k] = ok ? ld_cg_2(A + m * t.lda + k0 + k) : uint16_t(0);
    }
    // B tile: consecutive threads take consecutive n of a row of B (coalesced), stored
    // transposed.
    for (int idx = tid; idx < Cfg::kBK * Cfg::kBN; idx += Cfg::kThreads) {
      const int k = idx / Cfg::kBN, n = idx % Cfg::kBN;
      const bool ok = k0 + k < t.K && n < t.cols;
      Bs[n * Cfg::kLd + k] = ok ? ld_cg_2(B + (k0 + k) * t.ldb + n) : uint16_t(0);
    }
    __syncthreads();
    // MFMA 32x32x8: lane l supplies A[l % 32][4 (l / 32) .. + 3] and B[4 (l / 32) .. + 3][l % 32].
    const int r = lane % 32, kq = 4 * (lane / 32);
    for (int ks = 0; ks < Cfg::kBK; ks += 8) {
      bf16x4 a[Cfg::kFragM], b[Cfg::kFragN];
      for (int mi = 0; mi < Cfg::kFragM; ++mi) {
        const int m = wave_m * Cfg::kWaveM + mi * 32 + r;
        a[mi] = *reinterpret_cast<const bf16x4*>(As + m * Cfg::kLd + ks + kq);
      }
      for (int ni = 0; ni < Cfg::kFragN; ++ni) {
        const int n = wave_n * Cfg::kWaveN + ni * 32 + r;
        b[ni] = *reinterpret_cast<const bf16x4*>(Bs + n * Cfg::kLd + ks + kq);
      }
      for (int mi = 0; mi < Cfg::kFragM; ++mi)
        for (int ni = 0; ni < Cfg::kFragN; ++ni) mfma_bf16_32x32x8(acc[mi][ni], a[mi], b[ni]);
    }
    __syncthreads();  // the tile is read before the next one overwrites it
  }

  // Epilogue: acc[mi][ni][j] of lane l is C[8 (j / 4) + 4 (l / 32) + j % 4][l % 32] of
  // MFMA tile (mi, ni).
  for (int mi = 0; mi < Cfg::kFragM; ++mi)
    for (int ni = 0; ni < Cfg::kFragN; ++ni)
      for (int j = 0; j < 16; ++j) {
        const int m = wave_m * Cfg::kWaveM + mi * 32 + 8 * (j / 4) + 4 * (lane / 32) + j % 4;
        const int n = wave_n * Cfg::kWaveN + ni * 32 + lane % 32;
        if (m < t.rows && n < t.cols) t.C[m * t.ldc + n] = __float2bfloat16_rn(acc[mi][ni][j]);
      }
}

}  // namespace kosmos
