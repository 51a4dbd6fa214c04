// ag_gemm.cu — AG+GEMM (pull): C_r = [A_0; ...; A_{W-1}] @ B_r.
//
// Buffers of rank r (RankArgs):
//   A        A_r          M/W x K   bf16  (m_loc*K*2 bytes)
//   B        B_r          K x N/W   bf16
//   C        C_r          M x N/W   bf16
//   work     gathered A   M x K     bf16  (rows of rank p at p*m_loc; own rows unused: the
//                                         builder reads A_r directly)
//   peer_A[p] A_p as this rank reads it (other device allocation / pinned host / NVLink peer)
// Items (schedule.py): AG_PULL copies a byte slice of band (p, j) into `work`; AG_BUILD
// computes one C tile from A_r or `work`.
#include "kosmos/persistent.cuh"

namespace kosmos {

template <>
struct OpTraits<KOSMOS_OP_AG_GEMM> {
  static __device__ __forceinline__ void execute(const KosmosParams& p, const KosmosRankArgs& ra, const Item& it,
                                                 const SyncCtx& sc, char* smem, int tid) {
    const int64_t K = p.K;
    const int64_t m_loc = p.M / p.world;
    const int64_t n_loc = p.N / p.world;
    if (it.kind == kAgPull) {
      const int64_t bytes = static_cast<int64_t>(it.rows) * K * 2;
      const int64_t per = (((bytes + 15) / 16 + it.cols - 1) / it.cols) * 16;  // it.cols = slices, it.n0 = slice
      const int64_t begin = per * it.n0;
      const int64_t len = (bytes - begin < per) ? (bytes - begin) : per;
      const char* src = static_cast<const char*>(ra.peer_A[it.peer]) + it.m0 * K * 2 + begin;
      char* dst = static_cast<char*>(ra.work) + (it.peer * m_loc + it.m0) * K * 2 + begin;
      if (len <= 0) return;
      if (p.mover_bulk && aligned16(src) && aligned16(dst) && len >= 16) {
        // one thread drives the copy engine path; the (< 16 B) tail goes through copy_contig
        if (tid == 0) {
          uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kBulkStages * kBulkBytes);
          bulk_copy_contig(dst, src, static_cast<size_t>(len), smem, bars, [&](uint64_t dt) {
            if (aborted(sc)) return true;
            if (dt > sc.timeout_ns) {
              raise_timeout(sc, kQMove, -1, sc.rank, -1, 0, 0, dt);
              return true;
            }
            return false;
          });
        }
        const int64_t body = len & ~int64_t(15);
        if (len > body) copy_contig(dst + body, src + body, static_cast<size_t>(len - body), tid, kThreads);
      } else {
        copy_contig(dst, src, static_cast<size_t>(len), tid, kThreads);
      }
    } else {
      TileArgs t;
      t.A = (it.peer == ra.rank) ? static_cast<const bf16*>(ra.A) + it.m0 * K
                                 : static_cast<const bf16*>(ra.work) + (it.peer * m_loc + it.m0) * K;
      t.lda = K;
      t.B = static_cast<const bf16*>(ra.B) + it.n0;
      t.ldb = n_loc;
      t.C = static_cast<bf16*>(ra.C) + (it.peer * m_loc + it.m0) * n_loc + it.n0;
      t.ldc = n_loc;
      t.rows = it.rows;
      t.cols = it.cols;
      t.K = p.K;
      build_tile<BuilderCfg>(t, smem);
    }
  }
};

template __global__ void kosmos_persistent_kernel<KOSMOS_OP_AG_GEMM>(const KosmosParams p);

const void* ag_gemm_kernel() { return reinterpret_cast<const void*>(&kosmos_persistent_kernel<KOSMOS_OP_AG_GEMM>); }

}  // namespace kosmos
