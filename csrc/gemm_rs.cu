// gemm_rs.cu — GEMM+RS (push, owner reduces): C_r = band r of sum_s A_s @ B_s.
//
// Buffers of rank r (RankArgs):
//   A            A_r                 M x K/W   bf16
//   B            B_r                 K/W x N   bf16
//   C            C_r                 M/W x N   bf16
//   work         partial staging     M x N     bf16  (band d at rows d*m_loc; band r unused)
//   slot[s]      own recv slot s     M/W x N   bf16  (slot r: own partial, written by builders)
//   push_dst[d]  recv[d] slot r      M/W x N   bf16  (as this rank writes it)
//   proxy_src[s] host fabric: peer s's contribution to band r (pinned host, static)
// Items: RS_BUILD (partial tile -> staging or own slot), RS_PUSH (staging -> push_dst[d]),
// RS_PROXY (proxy_src[s] -> slot[s]), RS_REDUCE (sum of slots 0..W-1 in rank order -> C).
#include "kosmos/persistent.cuh"

namespace kosmos {

template <>
struct OpTraits<KOSMOS_OP_GEMM_RS> {
  static __device__ __forceinline__ void execute(const KosmosParams& p, const KosmosRankArgs& ra, const Item& it,
                                                 const SyncCtx& sc, char* smem, int tid) {
    const int64_t N = p.N;
    const int64_t m_loc = p.M / p.world;
    const int64_t k_loc = p.K / p.world;
    switch (it.kind) {
      case kRsBuild: {
        TileArgs t;
        t.A = static_cast<const bf16*>(ra.A) + (it.peer * m_loc + it.m0) * k_loc;
        t.lda = k_loc;
        t.B = static_cast<const bf16*>(ra.B) + it.n0;
        t.ldb = N;
        t.C = (it.peer == ra.rank) ? static_cast<bf16*>(ra.slot[ra.rank]) + it.m0 * N + it.n0
                                   : static_cast<bf16*>(ra.work) + (it.peer * m_loc + it.m0) * N + it.n0;
        t.ldc = N;
        t.rows = it.rows;
        t.cols = it.cols;
        t.K = static_cast<int>(k_loc);
        build_tile<BuilderCfg>(t, smem);
        break;
      }
      case kRsPush: {
        const bf16* src = static_cast<const bf16*>(ra.work) + (it.peer * m_loc + it.m0) * N + it.n0;
        bf16* dst = static_cast<bf16*>(ra.push_dst[it.peer]) + it.m0 * N + it.n0;
        copy_tile(dst, N, src, N, it.rows, it.cols, tid, kThreads);
        break;
      }
      case kRsProxy: {
        const bf16* src = static_cast<const bf16*>(ra.proxy_src[it.peer]) + it.m0 * N + it.n0;
        bf16* dst = static_cast<bf16*>(ra.slot[it.peer]) + it.m0 * N + it.n0;
        copy_tile(dst, N, src, N, it.rows, it.cols, tid, kThreads);
        break;
      }
      default: {  // kRsReduce
        bf16* srcs[KOSMOS_MAX_WORLD];
#pragma unroll
        for (int s = 0; s < KOSMOS_MAX_WORLD; ++s)
          srcs[s] = (s < p.world) ? static_cast<bf16*>(ra.slot[s]) + it.m0 * N + it.n0 : nullptr;
        bf16* out = static_cast<bf16*>(ra.C) + it.m0 * N + it.n0;
        reduce_tile(out, N, srcs, N, p.world, it.rows, it.cols, tid, kThreads);
        break;
      }
    }
  }
};

template __global__ void kosmos_persistent_kernel<KOSMOS_OP_GEMM_RS>(const KosmosParams p);

const void* gemm_rs_kernel() { return reinterpret_cast<const void*>(&kosmos_persistent_kernel<KOSMOS_OP_GEMM_RS>); }

}  // namespace kosmos
