// ag_gemm_sm90.cu — the Hopper-builder kernels: AG+GEMM (pull), the sm_90a variant of
// ag_gemm.cu (builder "sm90"; the default for ag-gemm on sm_90), and GEMM+RS (push, owner
// reduces), the variant of gemm_rs.cu (gemm_rs_sm90_kernel below; opt-in builder "sm90").
// Both share the block layout, shared memory, builder, tile ring and math loop.
//
// Same op, buffers, schedule arrays, epoch flags, watchdog, claims (decide() of
// persistent.cuh), trace and entry/exit protocol as the default kernel; what differs is the
// block: 384 threads, one CTA per SM (the builder takes ~215 KB of shared memory), and who
// does what inside it:
//
//   thread 32 (loader)  : the scheduler (decide: claims, pending slot, mover slots,
//                         watchdog-bounded flag waits). A builder tile is only returned once
//                         its A band flag is acquired. kAheadBlocks k-blocks before a build
//                         tile's last load (signalled by warp 0), it claims the next tile
//                         ahead if one is ready (claim_ready_build: a claim is ~10 dependent
//                         global accesses, which between two tiles starved the MMAs 2-7 us
//                         per tile on the host fabric; claimed at the tile's start instead,
//                         ready tiles went to busy WGs while idle ones waited: copy-bound FC1
//                         2-3.5% slower); else it decides once the tile's loads are issued.
//   warp 0 (loader WG)  : issues a proxy fence (generic-proxy writes of the movers and the
//                         copy engine -> async-proxy TMA reads), pushes the item into the
//                         tile ring and issues the tile's TMA loads (BuilderSm90::produce_at:
//                         own rows from A_r, a peer's rows from the gathered buffer viewed as
//                         (m_loc, K, W), batch = peer, so partial tiles read zeros, never
//                         another rank's rows).
//   warps 0-3 (loader)  : a mover item (AG_PULL) is copied by all 128 threads of the loader
//                         warpgroup (16-byte ld.global.cg, copy_contig), then the scheduler
//                         releases its band flag and its mover slot. The math warps keep
//                         computing the tiles already in the ring meanwhile.
//   warpgroups 1, 2     : pop item ids from the ring, wgmma over the tile
//                         (BuilderSm90::consume_to), staged epilogue into C_r at the tile's
//                         rows; thread 128 records the BUILD interval.
//
// Builder tiles are 128 x 256 (the schedule must be built with BN = 256); K any multiple of
// 8, N/W a multiple of 8, TMA-aligned (16-byte) A_r, B_r, C_r and gathered buffer. The
// mover_bulk path (TMA bulk copies through shared memory) is not available here (no smem
// left beside the 4-stage builder).
//
// Built into its own shared library (libkosmos_ag_sm90-<hash>.so, needs the nvidia-cutlass
// headers), so the default library and its build requirements are unchanged.
//
// KOSMOS_SM90_A_TRANSPOSED=1 (library kosmos_ag_sm90_at): the same AG kernel is op ag-wgrad
// (KOSMOS_OP_AG_WGRAD, the all-gather along the GEMM's K; schedule.py "ag-wgrad"): A (M x K) is
// read transposed from At (K x M row-major, tokens x features: the builder's LayoutA_ =
// ColumnMajor), rank p's rows of At are K/W tokens. Movers are the same AG_PULL byte ranges over
// At's bands (rows of M elements); a builder (kAgwBuild) is a C_r tile over ALL of K, its
// k-blocks in one fixed order: the own rows (from At_r in place), then rank r+1's, r+2's, ...
// (BuilderSm90::produce_rotated over the gathered buffer viewed as (M, K/W, W)); before the
// first k-block of each remote band the issuing lane waits (watchdog) for that band's flag
// (band_wait), so a tile starts on the own rows and takes the peers' bands as they arrive. The
// order is by rank, never by arrival: every call sums K the same way (bitwise repeatable).
// Band items (kAgwBand, schedule wgrad_items=band): a (band group g, tile) partial over the group's
// K rows only (BuilderSm90::produce_span: rows [kpart, kpart + Params.wgrad_group_rows) of shard
// `peer`, own rows in place; kpart = -n: n whole shards from `peer` on, ring order). The scheduler
// claims one once its group's band flags and its tile's order flag of group g-1 are there
// (decide(), as any item with deps: watchdog-bounded waits), so the groups of a tile run one
// after another in the schedule's order; the math warps add the partial to the rank's fp32 carry
// (RankArgs.carry, carry_step: group 0 stores it, later groups load + add + store, the last adds
// and stores bf16 C_r) and thread 128 releases order flag g (every carry store before it).
// Bitwise repeatable as the tiles: one fixed summation order.
// The GEMM+RS kernel is not instantiated in this library (its entry points fail).
#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdio>
#include <new>

#include "kosmos/builder_sm90.cuh"
#include "kosmos/host_error.h"
#include "kosmos/persistent.cuh"

namespace kosmos {
namespace sm90 {

// KOSMOS_SM90_B_TRANSPOSED (a build flag of each library, kernels/libs.py): 1 in kosmos_ag_sm90_bt,
// where B_r is read transposed, K contiguous (the backward dgrad GEMMs: W_r^T in place); every
// kernel and ABI entry is otherwise the same.
// KOSMOS_SM90_A_TRANSPOSED (a build flag of each library): 1 in kosmos_ag_sm90_at (op ag-wgrad,
// see the top of the file), else 0.
constexpr bool kAT = KOSMOS_SM90_A_TRANSPOSED != 0;
static_assert(!(kAT && KOSMOS_SM90_B_TRANSPOSED != 0), "one transposed operand per library");
using AgBuilder = BuilderSm90<128, 256, 64, 4, true, 1,
                              cute::conditional_t<KOSMOS_SM90_B_TRANSPOSED != 0, cutlass::layout::ColumnMajor,
                                                  cutlass::layout::RowMajor>,
                              cute::conditional_t<kAT, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>>;
// The AG kernel's op and builder item kind in this library.
constexpr int kAgOp = kAT ? KOSMOS_OP_AG_WGRAD : KOSMOS_OP_AG_GEMM;
constexpr int kAgBuildKind = kAT ? kAgwBuild : kAgBuild;
constexpr int kAgRingDepth = 4;
using AgRing = ItemRing<kAgRingDepth, int>;  // builder item id, -1 = no more work
constexpr int kAgThreads = AgBuilder::kNumThreads;
constexpr int kLoaderThreads = 128;
constexpr int kBarLoader = 8;  // named barriers (0 is __syncthreads; CUTLASS's mainloop uses none)
constexpr int kBarMath = 9;
constexpr int kSched = 32;  // the scheduling thread (warp 1 of the loader warpgroup; warp 0 issues TMA)
// The scheduler claims the next tile this many k-blocks before the current tile's last load:
// 12-17 us at 1.98-1.41 GHz (128x256x64 per k-block), more than a claim takes (5-10 us), and
// at most that early (AgSm90Params.ahead_blocks, the default; config field ahead_blocks).
constexpr int kAheadBlocks = 24;
// setmaxnreg: the launch gives every thread 168 registers (64,512 per CTA); the loader
// warpgroup keeps 88 (the scheduling loop and the 128-thread mover copy spill below that,
// e.g. at the standalone kernel's 40), the math warpgroups get 208 (no spills already at 168).
// 128 * 88 + 256 * 208 = 64,512: the CTA's registers, no more.
constexpr int kLoaderRegs = 88;
constexpr int kMathRegs = 208;
static_assert(128 * kLoaderRegs + 256 * kMathRegs <= 384 * 168, "setmaxnreg beyond the CTA's registers");

// GEMM+RS: the scheduler hands build ids to warp 0 through this ring (one slot: warp 0 pops a
// tile's id as it starts issuing its loads, so at most one tile waits there).
using LoadRing = ItemRing<1, int>;

struct AgShared {
  AgBuilder::SharedStorage builder;
  AgRing::SharedStorage ring;
  LoadRing::SharedStorage load_ring;  // GEMM+RS only
  int cmd[3];  // scheduler -> loader: queue, item, all K-slices of its band in (no slice waits)
  // loader -> scheduler: a build tile's loads reached kAheadBlocks before its end (an mbarrier,
  // one arrival per tile: the scheduler sleeps in try_wait instead of polling a shared word;
  // same speed and power measured, and nothing issues while it waits)
  alignas(8) uint64_t ahead_bar;
};
constexpr int kAgSmemBytes = int(sizeof(AgShared));
static_assert(kAgSmemBytes <= 227 * 1024, "sm90 AG+GEMM shared memory exceeds 227 KB");

// TMA descriptors of one executed rank: A_r as (m_loc, K, 1) and the gathered buffer as
// (m_loc, K, W) (batch p = rank p's rows), each paired with B_r (K x N/W). A-transposed
// (ag-wgrad): At_r as A (M, K/W, 1) and the gathered At as (M, K/W, W), B_r as (N/W, K/W, W)
// (batch p = the K rows of rank p's tokens).
struct AgRankMaps {
  AgBuilder::Mainloop::Params own;
  AgBuilder::Mainloop::Params work;
};

struct AgSm90Params {
  KosmosParams base;
  AgBuilder::Params bp;  // K, N/W, k-blocks (and rank 0's maps, unused by produce_at)
  AgRankMaps maps[KOSMOS_MAX_WORLD];
  int32_t m_loc;  // rows of a shard of A (A-transposed: M, the rows of C_r)
  int32_t n_loc;
  int32_t ahead_blocks = kAheadBlocks;  // lookahead claim (kosmos_sm90_ag_set_ahead; -1: none)
  int32_t k_loc = 0;                    // A-transposed: K/W (rows of At per rank); else 0
};
static_assert(sizeof(AgSm90Params) <= 32000, "kernel parameters must fit the 32 KB parameter space");

// Params.k_stream: band flag f counts the K-slices of the band delivered in K order (mult =
// slices per band, flag = mult*(e-1) + slices there); slice s holds k-blocks
// [s*nkb/mult, (s+1)*nkb/mult) (kosmos_bench/impls/kosmos.py cuts the copies the same way).
// kwait of produce_at: spin (watchdog) until k-block k's slice is there; returns the k-blocks
// in place (flag -1: all of them at once). On timeout/abort it returns nkb: the loads go on (garbage, the call is failed),
// so the math warps never block.
// Out of line: called once per slice of a streamed tile, and inlined into the loader's TMA
// loop it made ptxas spill (the kernel is compiled at 168 registers before setmaxnreg).
__device__ __noinline__ int slice_wait(const Wg* w, int flag, int item, int nkb, int k) {
  const KosmosRankArgs& ra = w->ra;
  const uint32_t mult = static_cast<uint32_t>(ra.flag_mult[flag]);
  const uint32_t base = w->sc.epoch * mult - mult;
  const uint32_t* f = ra.flags[ra.rank] + flag;
  const uint32_t need = static_cast<uint32_t>((int64_t(k + 1) * mult + nkb - 1) / nkb);  // slices 0..slice(k)
  if (!wait_flag(w->sc, f, base + need, kQBuild, item, ra.rank, flag)) return nkb;
  const uint32_t have = min(ld_acquire(f, w->sc.sys) - base, mult);
  fence_proxy_async_global();  // the copy engine's writes -> this thread's TMA reads
  return static_cast<int>((int64_t(have) * nkb) / mult);
}

// Scheduler, for a build item claimed ready ahead: whether every K-slice of its band is in
// already (no k_stream, own rows, or the band flag at its full count), so that its tile issues
// its loads without slice waits. Off the MMAs' critical path (the tile before is loading).
__device__ __noinline__ bool band_landed(const Wg& w, int id) {
  const Item it = load_item(w.ra.items[kQBuild], id);
  if (!w.p.k_stream || it.dep_count == 0 || it.peer == w.ra.rank) return true;
  const int f = w.ra.deps[it.dep_begin];
  return flag_ready(ld_acquire(w.ra.flags[w.ra.rank] + f, w.sc.sys), target_of(w, f));
}

// produce_at hook: tells the scheduler (one arrival on smem.ahead_bar) when the tile's loads
// reach k-block `at` (kAheadBlocks before the last; produce_at passes every k once).
struct AheadSignal {
  uint64_t* bar;
  int at;
  __device__ __forceinline__ void operator()(int k) const {
    if (k == at) cutlass::arch::ClusterBarrier::arrive(bar);
  }
};

// A-transposed (ag-wgrad): the wait before tile k-block i (produce_rotated's order: nkb per
// segment, segment 0 the own rows, segment s >= 1 rank r+s's). In a remote segment, k-block kb is
// in band j = kb / kb_band of that peer, whose flag is deps[dep_begin + (s-1)*nb + j] (the
// schedule's shared k-order list, nb bands per peer). Spins (watchdog) until the band's full count;
// returns the tile k-blocks in place (through the band's last k-block). On timeout/abort it
// returns every k-block: the loads go on (garbage, the call is failed), the math warps never block.
// Out of line, as slice_wait.
__device__ __noinline__ int band_wait(const Wg* w, int item, int dep_begin, int nb, int kb_band, int nkb, int i) {
  const KosmosRankArgs& ra = w->ra;
  const int s = i / nkb, kb = i - s * nkb;
  const int j = kb / kb_band;
  const int flag = ra.deps[dep_begin + (s - 1) * nb + j];
  if (!wait_flag(w->sc, ra.flags[ra.rank] + flag, target_of(*w, flag), kQBuild, item, ra.rank, flag))
    return w->p.world * nkb;
  fence_proxy_async_global();  // the movers' (generic-proxy) writes -> this thread's TMA reads
  return s * nkb + min(nkb, (j + 1) * kb_band);
}

struct BandWait {
  const Wg* w;
  int item;
  int dep_begin;
  int nb;       // bands per peer (dep_count / (W - 1))
  int kb_band;  // k-blocks per band
  int nkb;      // k-blocks per segment
  __device__ __forceinline__ int operator()(int i) const {
    return i < nkb ? nkb : band_wait(w, item, dep_begin, nb, kb_band, nkb, i);
  }
};

struct SliceWait {
  const Wg* w;
  int flag;  // -1: all there (own rows, whole-band flags)
  int item;
  int nkb;
  __device__ __forceinline__ int operator()(int k) const { return flag < 0 ? nkb : slice_wait(w, flag, item, nkb, k); }
};

// ag-wgrad band items (kAgwBand, schedule wgrad_items=band; group g, tile (mt, nt)): the k-blocks of
// the item's band group, rows [kpart, kpart + min(group_rows, K/W - kpart)) of its shard (a shard's
// last group shorter; a partial last k-block reads zeros: TMA, as the tile items' segments), or,
// kpart = -n, every k-block of n whole shards (schedule.wgrad_groups: groups of more than a shard).
__device__ __forceinline__ int band_kblocks(int group_rows, int k_loc, int kpart) {
  const int shard_kb = (k_loc + AgBuilder::kBK - 1) / AgBuilder::kBK;
  return kpart < 0 ? -kpart * shard_kb : (min(group_rows, k_loc - kpart) + AgBuilder::kBK - 1) / AgBuilder::kBK;
}

// The band items' fp32 carry of one C tile (RankArgs.carry: one kBM x kBN tile per C_r tile), in the
// math warps' fragment order: value v of math thread t at [(v / 4) * 4 * kNumMathThreads + 4 * t + v % 4]
// (16-byte vectors, a warp's 512 contiguous bytes; every group of a tile has the same fragment
// layout, so the carry needs no row/column map and no masks). `ct` is the tile's carry + 4 * t.
// Group 0 (first) stores its partial; each later group adds the carry to its partial (one fp32 add
// per value; the groups in the schedule's fixed order, so bitwise the same every call) and stores
// the sum (middle groups) or keeps it in `acc` for the bf16 store (the last). L2 only (.cg): other
// SMs wrote it (their release: the order flag the scheduler acquired before the item was handed here).
template <class Accum>
__device__ __forceinline__ void carry_step(Accum& acc, float* ct, bool first, bool last) {
  constexpr int kV = decltype(cute::size(acc))::value;
  static_assert(kV % 4 == 0, "the carry moves 16-byte vectors of 4 accumulator values");
  float4* c = reinterpret_cast<float4*>(ct);
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < kV / 4; ++j) {
    float4* cj = c + j * AgBuilder::kNumMathThreads;
    if (!first) {
      const float4 v = __ldcg(cj);
      acc(4 * j) += v.x;
      acc(4 * j + 1) += v.y;
      acc(4 * j + 2) += v.z;
      acc(4 * j + 3) += v.w;
    }
    if (!last) __stcg(cj, make_float4(acc(4 * j), acc(4 * j + 1), acc(4 * j + 2), acc(4 * j + 3)));
  }
}

// math_loop without band items: every item is a whole tile (consume_to; the GEMM+RS kernel and the
// builds without the A-transposed kernel compile exactly as before band items).
struct NoBandItems {};

// ag-wgrad band items (the A-transposed build): kblocks: the band group's (the loader issued
// them so), carry: the carry step (carry_step); true only for the last group (it stores C).
// First group: peer == rank (schedule.wgrad_groups: the own shard first, whole), last: no release.
struct BandItems {
  const KosmosParams& p;
  const KosmosRankArgs& ra;
  int k_loc;
  int n_tiles;  // C_r tiles per row of tiles
  __device__ __forceinline__ int kblocks(const int32_t* row, int tile_kb) const {
    return row[0] == kAgwBand ? band_kblocks(p.wgrad_group_rows, k_loc, row[10]) : tile_kb;
  }
  template <class Accum>
  __device__ __forceinline__ bool carry(Accum& acc, const int32_t* row) const {
    if (row[0] != kAgwBand) return true;
    const int64_t t = int64_t(row[2] / AgBuilder::kBM) * n_tiles + row[4] / AgBuilder::kBN;
    const bool last = row[9] < 0;
    carry_step(acc, ra.carry + t * (AgBuilder::kBM * AgBuilder::kBN) + 4 * (int(threadIdx.x) - 128),
               row[1] == ra.rank, last);
    return last;
  }
};

__device__ __forceinline__ void named_bar_sync(int id, int nthreads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

// The math warpgroups of both kernels: pop builder item ids from the ring until -1; build each
// tile (num_k_blk k-blocks, as the loader issued them) into tile_of(item row) (row stride ldc,
// the row's rows x cols), then thread 128 releases its flag (every store of the tile before the
// release) and records the BUILD interval. A tile with no flag and no trace (ag-gemm's, every
// tile at world 1) skips the barrier: the math warps then run as the standalone builder's.
// band (NoBandItems, BandItems): an item's k-blocks, and its carry epilogue before (or instead
// of) the bf16 store.
template <class TileOf, class Band = NoBandItems>
__device__ __forceinline__ void math_loop(AgBuilder& builder, AgRing& ring, const KosmosParams& p,
                                          const KosmosRankArgs& ra, int block, int kind, int64_t ldc,
                                          int num_k_blk, TileOf tile_of, Band band = {}) {
  const int tid = int(threadIdx.x);
  for (;;) {
    const int id = ring.pop();  // builder item id
    if (id < 0) break;
    const uint64_t t0 = (tid == 128 && p.trace) ? globaltimer_ns() : 0;
    const int32_t* row = ra.items[kQBuild] + static_cast<size_t>(id) * KOSMOS_ITEM_STRIDE;
    bf16* tile = tile_of(row);
    Item done{};  // what finish_item reads, loaded with the tile's row (no load after the MMAs)
    done.kind = kind;
    done.rel_rank = row[8];
    done.rel_flag = row[9];
    if constexpr (cute::is_same_v<Band, NoBandItems>) {
      builder.consume_to(reinterpret_cast<AgBuilder::dtype_t*>(tile), ldc, row[3], row[5], num_k_blk);  // rows, cols
    } else {
      auto acc = AgBuilder::make_accum();
      builder.mma_k(acc, band.kblocks(row, num_k_blk));
      if (band.carry(acc, row)) builder.store_staged_to(acc, tid - 128, tile, ldc, row[3], row[5]);
    }
    if (done.rel_flag < 0 && !p.trace) continue;  // nothing to release or record (world 1, ag-gemm): no barrier
    named_bar_sync(kBarMath, AgBuilder::kNumMathThreads);  // every store of the tile (or carry) before its release
    if (tid == 128) {
      // (re)built here so that none of the scheduling state stays live across the MMAs
      Wg wm = make_wg(p, ra, block);
      wm.tr.shared = true;
      finish_item(wm, done, id, false, t0);
    }
  }
}

// The loader's end (warp 0): no more tiles for the math warps, wait until they released every stage.
__device__ __forceinline__ void loader_tail(AgBuilder& builder, AgRing& ring, int warp_idx, int lane) {
  if (warp_idx == 0) {
    if (lane == 0) ring.push(-1);
    __syncwarp();
    builder.produce_tail();
  }
}

__global__ void __launch_bounds__(kAgThreads, 1) ag_gemm_sm90_kernel(const __grid_constant__ AgSm90Params P) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  AgShared& smem = *reinterpret_cast<AgShared*>(smem_raw);
  const KosmosParams& p = P.base;
  const int tid = int(threadIdx.x);
  const int block = int(blockIdx.x);
  const int ri = rank_index_of(p, block);
  const KosmosRankArgs& ra = p.ranks[ri];
  Wg w = make_wg(p, ra, block);
  w.tr.shared = true;  // loader thread 0 and math thread 128 both record

  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int lane = tid % 32;
  const auto role = AgBuilder::role_of(tid);
  AgRing ring(smem.ring, warp_idx == 0, role == AgBuilder::Role::kMath, AgBuilder::kNumMathThreads);
  AgBuilder builder(smem.builder, P.bp, role);
  const AgRankMaps& maps = P.maps[ri];
  if (tid == 0) {
    AgBuilder::Mainloop::prefetch_tma_descriptors(maps.own);
    AgBuilder::Mainloop::prefetch_tma_descriptors(maps.work);
    cutlass::arch::ClusterBarrier::init(&smem.ahead_bar, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int m_loc = P.m_loc;
  const int n_loc = P.n_loc;
  // A band of a shard: rows of row_elems elements (A_p: m_loc x K; A-transposed, At_p: K/W x M)
  const int64_t row_elems = kAT ? int64_t(p.M) : int64_t(p.K);
  const int64_t shard_rows = kAT ? int64_t(P.k_loc) : int64_t(m_loc);
  // k-blocks of a build tile (A-transposed: every rank's K/W rows, one segment each); read where
  // used (from the parameter space), so that no value computed before the role split stays live
  // into the math warps (held across setmaxnreg it was spilled and reloaded every tile)
  auto tile_kb = [&]() { return P.bp.num_k_blk * (kAT ? p.world : 1); };

  if (role == AgBuilder::Role::kLoader) {
    cutlass::arch::warpgroup_reg_dealloc<kLoaderRegs>();
    if (!ra.skip) {
      if (tid == 0) entry_signal(w);
      bool counted = false;    // scheduler: the current mover holds an in-flight slot
      int pend[2] = {-1, -1};  // scheduler: claimed, not yet ready (policy self)
      auto decide_next = [&](int ahead, bool landed) {  // scheduler: the next item -> smem.cmd
        int q = kQBuild, id = ahead;
        if (ahead < 0) {
          counted = false;
          if (!decide<kAgOp>(w, &q, &id, &counted, pend)) q = -1;
        }
        smem.cmd[0] = q;
        smem.cmd[1] = id;
        smem.cmd[2] = landed;
      };
      if (tid == kSched) decide_next(-1, false);
      uint32_t ahead_phase = 0;  // scheduler: parity of the next ahead_bar phase (one per build tile)
      for (;;) {
        named_bar_sync(kBarLoader, kLoaderThreads);  // cmd written
        const int q = smem.cmd[0], id = smem.cmd[1];
        const bool landed = smem.cmd[2] != 0;
        named_bar_sync(kBarLoader, kLoaderThreads);  // cmd read: the scheduler may write the next
        if (q < 0) break;
        const Item it = load_item(ra.items[q], id);
        int ahead = -1;
        bool ahead_landed = false;
        const bool band_item = kAT && it.kind == kAgwBand;
        if (it.kind == kAgBuildKind || band_item) {
          // decide() returned it with its band flag acquired (watchdog-bounded wait); A-transposed:
          // tiles with none (their bands are waited for inside the tile, BandWait), band items with
          // their group's band flags and their tile's order flag of the group before.
          // kpart (item word 10), A-transposed: tiles: rows of At per band (a multiple of kBK,
          // kosmos.builder.validate); band items: the group's first row in its shard (ditto)
          const int kpart = kAT ? ra.items[kQBuild][static_cast<size_t>(id) * KOSMOS_ITEM_STRIDE + 10] : 0;
          const int item_kb = band_item ? band_kblocks(p.wgrad_group_rows, P.k_loc, kpart) : tile_kb();
          // k-block at which the loads signal the scheduler's lookahead claim (-1: no lookahead)
          const int ahead_at = P.ahead_blocks < 0 ? -1 : max(0, item_kb - max(1, P.ahead_blocks));
          if (warp_idx == 0) {
            fence_proxy_async_global();  // movers' / copy engine's writes -> this warp's TMA reads
            if (lane == 0) ring.push(id);
            __syncwarp();
            const int m_blk = it.m0 / AgBuilder::kBM, n_blk = it.n0 / AgBuilder::kBN;
            if constexpr (kAT) {
              if (band_item) {  // the group's k-blocks of shard `peer` (own rows in place, a peer's
                // gathered), or (kpart = -n) of n whole gathered shards from `peer` on, ring order
                const int nseg = kpart < 0 ? -kpart : 1;
                builder.produce_span(maps.own, maps.work, m_loc, p.world, it.peer, nseg, it.peer == ra.rank,
                                     kpart < 0 ? 0 : kpart / AgBuilder::kBK, item_kb / nseg, m_blk, n_blk,
                                     AheadSignal{&smem.ahead_bar, ahead_at});
              } else {
                const int nb = p.world > 1 ? it.dep_count / (p.world - 1) : 1;
                builder.produce_rotated(maps.own, maps.work, m_loc, p.world, ra.rank, m_blk, n_blk,
                                        BandWait{&w, id, it.dep_begin, nb, kpart / AgBuilder::kBK, P.bp.num_k_blk},
                                        AheadSignal{&smem.ahead_bar, ahead_at});
              }
            } else {
              const bool own = it.peer == ra.rank;
              // K-slices of a remote band may still be arriving: load each k-block once its slice is there
              const int slice_flag = (!own && p.k_stream && it.dep_count > 0 && !landed) ? ra.deps[it.dep_begin] : -1;
              builder.produce_at(own ? maps.own : maps.work, m_loc, own ? 1 : p.world, m_blk, n_blk, own ? 0 : it.peer,
                                 SliceWait{&w, slice_flag, id, P.bp.num_k_blk},
                                 AheadSignal{&smem.ahead_bar, ahead_at});
            }
          } else if (tid == kSched && ahead_at >= 0) {
            // until the loads reach kAheadBlocks before the tile's end (they always do: an aborted
            // call's slice waits return and its loads go on); bounded all the same, and giving up
            // is harmless (the claim is just earlier; the parity still advances once per tile, as
            // the arrivals do). try_wait suspends the thread in hardware between checks.
            for (const uint64_t t0 = globaltimer_ns();
                 !cutlass::arch::ClusterBarrier::try_wait(&smem.ahead_bar, ahead_phase) &&
                 globaltimer_ns() - t0 < w.sc.timeout_ns;) {
            }
            ahead_phase ^= 1u;
            ahead = claim_ready_build(w, pend);
            ahead_landed = ahead >= 0 && band_landed(w, ahead);
          }
          named_bar_sync(kBarLoader, kLoaderThreads);  // the tile's loads are issued
        } else {  // AG_PULL: a byte slice of band (peer, m0) into the gathered buffer
          const uint64_t t0 = (tid == kSched) ? w.tr.now() : 0;
          const int64_t bytes = static_cast<int64_t>(it.rows) * row_elems * 2;
          const int64_t per = (((bytes + 15) / 16 + it.cols - 1) / it.cols) * 16;  // it.cols slices, it.n0 = slice
          const int64_t begin = per * it.n0;
          const int64_t len = (bytes - begin < per) ? (bytes - begin) : per;
          if (len > 0) {
            const char* src = static_cast<const char*>(ra.peer_A[it.peer]) + it.m0 * row_elems * 2 + begin;
            char* dst = static_cast<char*>(ra.work) + (it.peer * shard_rows + it.m0) * row_elems * 2 + begin;
            copy_contig(dst, src, static_cast<size_t>(len), tid, kLoaderThreads);
          }
          named_bar_sync(kBarLoader, kLoaderThreads);
          if (tid == kSched) finish_item(w, it, id, counted, t0);
        }
        if (tid == kSched) decide_next(ahead, ahead_landed);
      }
    }
    loader_tail(builder, ring, warp_idx, lane);
  } else {
    cutlass::arch::warpgroup_reg_alloc<kMathRegs>();
    bf16* C = static_cast<bf16*>(ra.C);
    auto tile_of = [=](const int32_t* row) {
      // peer, m0, n0 (A-transposed: C_r rows m0.., the tile's peer is the rank itself)
      return C + ((kAT ? 0 : row[1] * int64_t(m_loc)) + row[2]) * n_loc + row[4];
    };
    if constexpr (kAT) {  // band items: their group's k-blocks, then the carry epilogue
      math_loop(builder, ring, p, ra, block, kAgBuildKind, n_loc, tile_kb(), tile_of,
                BandItems{p, ra, P.k_loc, P.bp.num_n_blk});
    } else {
      math_loop(builder, ring, p, ra, block, kAgBuildKind, n_loc, tile_kb(), tile_of);
    }
  }
  __syncthreads();
  if (tid == 0) exit_protocol(w);
}


// ------------------------------------------------------------------ GEMM+RS on the Hopper builder
// The sm90 variant of gemm_rs.cu (same op, buffers, items, flags, claims -- decide<GEMM_RS> --,
// watchdog, trace and entry/exit protocol); the block is the AG kernel's (384 threads, AgShared):
//   scheduler (thread 32) : decide() -> smem.cmd; a builder tile's id goes to warp 0 through a
//                           one-slot ring (smem.load_ring; it blocks only while warp 0 has not
//                           started the tile before), then it decides the next item.
//   warp 0 (loader WG)    : only TMA: pops RS_BUILD ids, pushes each into the tile ring and issues
//                           its loads: A_r viewed as (m_loc, K/W, W), batch = destination band d
//                           (a partial tile reads zeros, never band d+1's rows), B_r columns n0...
//   warps 1-3 (loader WG) : RS_PUSH / RS_PROXY: copy_tile by their 96 threads (as the portable
//                           movers, ld.global.cg). RS_REDUCE: reduce_tile by the 96 threads:
//                           the portable kernel's arithmetic (fp32 sum of slots 0..W-1 in rank
//                           order, one bf16 rounding), so the result depends only on the partials,
//                           never on arrival order. Not warp 0: while a reduce or push runs, the
//                           next tile's loads go on (with warp 0 in the copy, the math warps
//                           starved once the ring's tiles were done); not the math warps: a
//                           reduce in the tile ring would stall the MMAs behind it.
//   warpgroups 1, 2       : pop RS_BUILD ids, wgmma over K/W, staged epilogue (bf16) into the
//                           rank's own slot (d = rank) or the staging buffer (row d*m_loc + m0),
//                           thread 128 releases the builder flag.
// Tiles 128 x 256 (schedule built with BN = 256); K/W and N multiples of 8 (TMA), 16-byte
// aligned A_r, B_r, staging and slots.
struct RsSm90Params {
  KosmosParams base;
  AgBuilder::Params bp;                                 // K/W, N, k-blocks
  AgBuilder::Mainloop::Params maps[KOSMOS_MAX_WORLD];  // per executed rank: A_r (m_loc, K/W, W) with B_r
  int32_t m_loc;
  int32_t n;
};
static_assert(sizeof(RsSm90Params) <= 32000, "kernel parameters must fit the 32 KB parameter space");
// setmaxnreg of the GEMM+RS kernel: its loader warpgroup also runs the reduce items (W 16-byte
// loads in flight per thread, W slot pointers, fp32 sums: it spilled at the AG kernel's 88); the
// math warpgroups need no more than the 168 they compile at. 128 * 104 + 256 * 200 = 64,512.
constexpr int kRsLoaderRegs = 104;
constexpr int kRsMathRegs = 200;
static_assert(128 * kRsLoaderRegs + 256 * kRsMathRegs <= 384 * 168, "setmaxnreg beyond the CTA's registers");

// A template only so that the A-transposed library never instantiates it (RsKernel below).
template <bool kInstantiated = true>
__global__ void __launch_bounds__(kAgThreads, 1) gemm_rs_sm90_kernel(const __grid_constant__ RsSm90Params P) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  AgShared& smem = *reinterpret_cast<AgShared*>(smem_raw);
  const KosmosParams& p = P.base;
  const int tid = int(threadIdx.x);
  const int block = int(blockIdx.x);
  const int ri = rank_index_of(p, block);
  const KosmosRankArgs& ra = p.ranks[ri];
  Wg w = make_wg(p, ra, block);
  w.tr.shared = true;  // loader thread 32 and math thread 128 both record

  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int lane = tid % 32;
  const auto role = AgBuilder::role_of(tid);
  AgRing ring(smem.ring, warp_idx == 0, role == AgBuilder::Role::kMath, AgBuilder::kNumMathThreads);
  LoadRing load_ring(smem.load_ring, tid == kSched, warp_idx == 0, 32);
  AgBuilder builder(smem.builder, P.bp, role);
  const AgBuilder::Mainloop::Params& map = P.maps[ri];
  if (tid == 0) AgBuilder::Mainloop::prefetch_tma_descriptors(map);
  __syncthreads();

  const int64_t N = P.n;
  const int m_loc = P.m_loc;
  const int W = p.world;

  if (role == AgBuilder::Role::kLoader) {
    cutlass::arch::warpgroup_reg_dealloc<kRsLoaderRegs>();
    if (!ra.skip && warp_idx == 0) {
      // TMA issuer: the build tiles the scheduler hands over, in its order. Nothing else runs
      // on this warp, so a reduce or a push on warps 1-3 never holds back the next tile's loads.
      if (tid == 0) entry_signal(w);
      for (;;) {
        const int id = load_ring.pop();  // every lane
        if (id < 0) break;
        const Item it = load_item(ra.items[kQBuild], id);
        if (lane == 0) ring.push(id);
        __syncwarp();
        builder.produce_at(map, m_loc, W, it.m0 / AgBuilder::kBM, it.n0 / AgBuilder::kBN, it.peer);
      }
    } else if (!ra.skip) {
      // Warps 1-3: the scheduler (thread 32) decides; a build goes to warp 0's ring (blocking
      // only while warp 0 has not started the one before), a mover or reduce runs here on the
      // 96 threads while warp 0 keeps the math warps fed.
      constexpr int kExec = kLoaderThreads - 32;
      const int xt = tid - 32;
      bool counted = false;    // scheduler: the current mover holds an in-flight slot
      int pend[2] = {-1, -1};  // scheduler: claimed, not yet ready (policy self)
      auto decide_next = [&]() {
        int q = -1, id = -1;
        counted = false;
        if (!decide<KOSMOS_OP_GEMM_RS>(w, &q, &id, &counted, pend)) q = -1;
        smem.cmd[0] = q;
        smem.cmd[1] = id;
      };
      if (tid == kSched) decide_next();
      for (;;) {
        named_bar_sync(kBarLoader, kExec);  // cmd written
        const int q = smem.cmd[0], id = smem.cmd[1];
        named_bar_sync(kBarLoader, kExec);  // cmd read: the scheduler may write the next
        if (q < 0) break;
        const Item it = load_item(ra.items[q], id);
        if (it.kind == kRsBuild) {
          if (tid == kSched) load_ring.push(id);
        } else {
          const uint64_t t0 = (tid == kSched) ? w.tr.now() : 0;
          if (it.kind == kRsReduce) {
            bf16* srcs[KOSMOS_MAX_WORLD];
#pragma unroll
            for (int s = 0; s < KOSMOS_MAX_WORLD; ++s)
              srcs[s] = (s < W) ? static_cast<bf16*>(ra.slot[s]) + it.m0 * N + it.n0 : nullptr;
            reduce_tile(static_cast<bf16*>(ra.C) + it.m0 * N + it.n0, N, srcs, N, W, it.rows, it.cols, xt, kExec);
          } else {
            const bool push = it.kind == kRsPush;
            const bf16* src = push ? static_cast<const bf16*>(ra.work) + (it.peer * int64_t(m_loc) + it.m0) * N + it.n0
                                   : static_cast<const bf16*>(ra.proxy_src[it.peer]) + it.m0 * N + it.n0;
            bf16* dst = static_cast<bf16*>(push ? ra.push_dst[it.peer] : ra.slot[it.peer]) + it.m0 * N + it.n0;
            copy_tile(dst, N, src, N, it.rows, it.cols, xt, kExec);
          }
          named_bar_sync(kBarLoader, kExec);  // every copy / store of the item before its release
          if (tid == kSched) finish_item(w, it, id, counted, t0);
        }
        if (tid == kSched) decide_next();
      }
      if (tid == kSched) load_ring.push(-1);
    }
    loader_tail(builder, ring, warp_idx, lane);
  } else {
    cutlass::arch::warpgroup_reg_alloc<kRsMathRegs>();
    math_loop(builder, ring, p, ra, block, kRsBuild, N, P.bp.num_k_blk, [&](const int32_t* row) {
      const int d = row[1], m0 = row[2], n0 = row[4];  // destination band, row in it, column
      return (d == ra.rank) ? static_cast<bf16*>(ra.slot[d]) + int64_t(m0) * N + n0
                            : static_cast<bf16*>(ra.work) + (d * int64_t(m_loc) + m0) * N + n0;
    });
  }
  __syncthreads();
  // Host fabric with copy-engine pushes: the copy stream waits (cuStreamWaitValue32, no watchdog
  // of its own) on builder counters. A call that aborted (or a rank told to skip) would leave them
  // short and the stream blocked for good, so every builder flag gets this call's full count: the
  // pushes then copy garbage of a call that is failed anyway, and the launch's streams drain.
  if (p.static_peers && (ra.skip || aborted(w.sc))) {
    const int tiles = W * ((m_loc + AgBuilder::kBM - 1) / AgBuilder::kBM) * int((N + AgBuilder::kBN - 1) / AgBuilder::kBN);
    uint32_t* f = ra.flags[ra.rank];
    for (int i = tid; i < tiles; i += kAgThreads) {
      const int fl = 2 * W + i;  // schedule.FlagLayout: built = 2 * world
      st_release(f + fl, w.sc.epoch * static_cast<uint32_t>(ra.flag_mult[fl]), false);
    }
  }
  if (tid == 0) exit_protocol(w);
}

// The GEMM+RS kernel of this library: none in the A-transposed (ag-wgrad) build.
template <bool kHasRs>
struct RsKernel {
  static const void* get() { return reinterpret_cast<const void*>(&gemm_rs_sm90_kernel<true>); }
};
template <>
struct RsKernel<false> {
  static const void* get() { return nullptr; }
};

// ------------------------------------------------------------------------------ host side
namespace {

using kosmos::fail;

bool aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The two kernels of this library (same block, same shared memory): 0 = AG+GEMM, 1 = GEMM+RS.
// (nullptr: GEMM+RS in the A-transposed library, which has none)
const void* kernel_of(int which) {
  return which == 0 ? reinterpret_cast<const void*>(&ag_gemm_sm90_kernel) : RsKernel<!kAT>::get();
}

int prepare_kernel(int which) {
  if (!kernel_of(which)) return fail(KOSMOS_ERR_INVALID, "the A-transposed (ag-wgrad) sm90 library has no GEMM+RS kernel");
  KOSMOS_CUDA(cudaFuncSetAttribute(kernel_of(which), cudaFuncAttributeMaxDynamicSharedMemorySize, kAgSmemBytes));
  return KOSMOS_OK;
}

int max_wgs(int which, int device, int* out) {
  if (!out) return fail(KOSMOS_ERR_INVALID, "null out");
  int prev = 0, major = 0, per_sm = 0, sms = 0, coop = 0;
  KOSMOS_CUDA(cudaGetDevice(&prev));
  KOSMOS_CUDA(cudaSetDevice(device));
  KOSMOS_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major != 9) return fail(KOSMOS_ERR_INVALID, "the sm90 builder needs an sm_90 GPU (device %d is sm_%dx)", device, major);
  if (int rc = prepare_kernel(which)) return rc;
  KOSMOS_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_of(which), kAgThreads, kAgSmemBytes));
  KOSMOS_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  KOSMOS_CUDA(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
  KOSMOS_CUDA(cudaSetDevice(prev));
  if (!coop) return fail(KOSMOS_ERR_INVALID, "device %d does not support cooperative launches", device);
  *out = per_sm * sms;
  return KOSMOS_OK;
}

// Cooperative launch of kernel `which` with its parameter block P (a host object).
int launch(int which, void* P, const KosmosParams& p, void* stream) {
  if (!kernel_of(which)) return prepare_kernel(which);  // the reason
  // Co-resident CTAs per device, looked up once: the launch sits between the first copy-engine
  // copy and the rest of the plan (kosmos.py), so it stays short.
  static int co_resident[2][64], per_sm_of[2][64];
  int dev = 0;
  KOSMOS_CUDA(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return fail(KOSMOS_ERR_INVALID, "device %d", dev);
  if (!co_resident[which][dev]) {
    int per_sm = 0, sms = 0;
    if (int rc = prepare_kernel(which)) return rc;
    KOSMOS_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_of(which), kAgThreads, kAgSmemBytes));
    KOSMOS_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    per_sm_of[which][dev] = per_sm;
    co_resident[which][dev] = per_sm * sms;
  }
  const int per_sm = per_sm_of[which][dev], sms = per_sm ? co_resident[which][dev] / per_sm : 0;
  if (p.grid > co_resident[which][dev])
    return fail(KOSMOS_ERR_TOO_MANY_WGS, "grid %d > %d co-resident CTAs (%d per SM x %d SMs)", p.grid, per_sm * sms,
                per_sm, sms);
  void* args[] = {P};
  KOSMOS_CUDA(cudaLaunchCooperativeKernel(kernel_of(which), dim3(p.grid), dim3(kAgThreads), args, kAgSmemBytes,
                                           static_cast<cudaStream_t>(stream)));
  KOSMOS_CUDA(cudaGetLastError());
  return KOSMOS_OK;
}

}  // namespace

// A-transposed (ag-wgrad): At (K x M) gathered along K, B_r (K x N/W), C_r (M x N/W). Mirrors
// kosmos/builder.py validate(op='ag-wgrad').
const char* validate_wgrad(int M, int N, int K, int W) {
  if (W < 1 || W > KOSMOS_MAX_WORLD) return "sm90 ag-wgrad: world outside 1..8";
  if (M <= 0 || N <= 0 || K <= 0) return "sm90 ag-wgrad: M, N, K must be positive";
  if (K % W || N % W) return "sm90 ag-wgrad: K and N must be divisible by world";
  if (M % 8) return "sm90 ag-wgrad: M must be a multiple of 8 (TMA: 16-byte row strides of At)";
  if ((N / W) % 8) return "sm90 ag-wgrad: N/world must be a multiple of 8 (TMA: 16-byte row strides of B_r and C_r)";
  return nullptr;
}

const char* validate(int M, int N, int K, int W) {
  if (kAT) return validate_wgrad(M, N, K, W);
  if (W < 1 || W > KOSMOS_MAX_WORLD) return "sm90 ag-gemm: world outside 1..8";
  if (M <= 0 || N <= 0 || K <= 0) return "sm90 ag-gemm: M, N, K must be positive";
  if (M % W || N % W) return "sm90 ag-gemm: M and N must be divisible by world";
  if (K % 8) return "sm90 ag-gemm: K must be a multiple of 8 (TMA: 16-byte row strides)";
  if ((N / W) % 8) return "sm90 ag-gemm: N/world must be a multiple of 8 (TMA: 16-byte row strides of B_r and C_r)";
  return nullptr;
}

// GEMM+RS: A_r (M x K/W), B_r (K/W x N), C_r (M/W x N). Mirrors kosmos/builder.py validate_rs.
const char* validate_rs(int M, int N, int K, int W) {
  if (W < 1 || W > KOSMOS_MAX_WORLD) return "sm90 gemm-rs: world outside 1..8";
  if (M <= 0 || N <= 0 || K <= 0) return "sm90 gemm-rs: M, N, K must be positive";
  if (M % W || K % W) return "sm90 gemm-rs: M and K must be divisible by world";
  if ((K / W) % 8) return "sm90 gemm-rs: K/world must be a multiple of 8 (TMA: 16-byte row strides of A_r)";
  if (N % 8) return "sm90 gemm-rs: N must be a multiple of 8 (TMA: 16-byte row strides of B_r, partials and C_r)";
  return nullptr;
}

}  // namespace sm90
}  // namespace kosmos

// ----------------------------------------------------------------------------------- C ABI
extern "C" {

using kosmos::sm90::AgSm90Params;

const char* kosmos_sm90_last_error(void) { return kosmos::g_err; }

// 1 when this library reads B_r transposed (K contiguous), else 0.
int kosmos_sm90_b_transposed(void) { return KOSMOS_SM90_B_TRANSPOSED != 0; }
// 1 when this library reads A transposed (its AG kernel is op ag-wgrad; its GEMM+RS entry points
// fail: no such kernel in it), else 0.
int kosmos_sm90_a_transposed(void) { return KOSMOS_SM90_A_TRANSPOSED != 0; }

// "" when (M, N, K, world) are supported, else why not. No GPU needed.
const char* kosmos_sm90_ag_validate(int M, int N, int K, int W) {
  const char* why = kosmos::sm90::validate(M, N, K, W);
  return why ? why : "";
}

int kosmos_sm90_ag_smem_bytes(void) { return kosmos::sm90::kAgSmemBytes; }
int kosmos_sm90_ag_threads(void) { return kosmos::sm90::kAgThreads; }

// Launch parameters (TMA descriptors) live in a host object; create once per runner.
void* kosmos_sm90_ag_create(void) { return new (std::nothrow) AgSm90Params(); }
void kosmos_sm90_ag_destroy(void* h) { delete static_cast<AgSm90Params*>(h); }

// The lookahead claim: at the load this many k-blocks before a build tile's end (0 and 1: its
// last load; the tile's k-blocks or more: its first), -1: none (decide after the tile's loads).
int kosmos_sm90_ag_set_ahead(void* h, int blocks) {
  if (!h) return kosmos::fail(KOSMOS_ERR_INVALID, "sm90 ag-gemm: null handle");
  if (blocks < -1) return kosmos::fail(KOSMOS_ERR_INVALID, "sm90 ag-gemm: ahead blocks %d < -1", blocks);
  static_cast<AgSm90Params*>(h)->ahead_blocks = blocks;
  return KOSMOS_OK;
}

// Executed rank i: A_r (M/W x K), gathered buffer (M x K), B_r (K x N/W), C_r (M x N/W).
// A-transposed (ag-wgrad): A = At_r (K/W x M), gathered buffer At (K x M), B_r (K x N/W), C_r (M x N/W).
int kosmos_sm90_ag_set_rank(void* h, int i, const void* A, const void* work, const void* B, const void* C, int M,
                            int N, int K, int W) {
  using namespace kosmos::sm90;
  if (!h) return fail(KOSMOS_ERR_INVALID, "sm90 ag-gemm: null handle");
  if (i < 0 || i >= KOSMOS_MAX_WORLD) return fail(KOSMOS_ERR_INVALID, "sm90 ag-gemm: rank index %d", i);
  if (const char* why = validate(M, N, K, W)) return fail(KOSMOS_ERR_INVALID, "%s", why);
  if (!A || !work || !B || !C) return fail(KOSMOS_ERR_INVALID, "sm90 ag-gemm: null buffer");
  if (!aligned(A) || !aligned(work) || !aligned(B) || !aligned(C))
    return fail(KOSMOS_ERR_INVALID, "sm90 ag-gemm: A_r, B_r, C_r and the gathered buffer must be 16-byte aligned");
  AgSm90Params& P = *static_cast<AgSm90Params*>(h);
  const int n_loc = N / W;
  if (kAT) {  // A viewed as (M, K/W, batches): At_r in place, the gathered At by rank; B_r as (N/W, K/W, W)
    const int k_loc = K / W;
    P.maps[i].own = AgBuilder::make_mainloop_params(A, M, 1, int64_t(k_loc) * M, B, n_loc, k_loc);
    P.maps[i].work = AgBuilder::make_mainloop_params(work, M, W, int64_t(k_loc) * M, B, n_loc, k_loc);
    if (i == 0) P.bp = AgBuilder::make_params(A, B, const_cast<void*>(C), M, n_loc, k_loc);
    P.m_loc = M;
    P.n_loc = n_loc;
    P.k_loc = k_loc;
    return KOSMOS_OK;
  }
  const int m_loc = M / W;
  P.maps[i].own = AgBuilder::make_mainloop_params(A, m_loc, 1, int64_t(m_loc) * K, B, n_loc, K);
  P.maps[i].work = AgBuilder::make_mainloop_params(work, m_loc, W, int64_t(m_loc) * K, B, n_loc, K);
  if (i == 0) P.bp = AgBuilder::make_params(A, B, const_cast<void*>(C), m_loc, n_loc, K);
  P.m_loc = m_loc;
  P.n_loc = n_loc;
  return KOSMOS_OK;
}

int kosmos_sm90_ag_max_wgs(int device, int* out) { return kosmos::sm90::max_wgs(0, device, out); }

int kosmos_sm90_ag_launch(void* h, const KosmosParams* params, void* stream) {
  using namespace kosmos::sm90;
  if (!h || !params) return fail(KOSMOS_ERR_INVALID, "null handle or params");
  const KosmosParams& p = *params;
  if (p.op != kAgOp)
    return fail(KOSMOS_ERR_INVALID, "kosmos_sm90_ag_launch of this library is op %d only (op %d)", kAgOp, p.op);
  if (int rc = kosmos::check_common_params(p)) return rc;
  if (p.mover_bulk) return fail(KOSMOS_ERR_INVALID, "sm90 ag-gemm: mover_bulk is not supported (no smem beside the builder)");
  if (kAT && p.k_stream) return fail(KOSMOS_ERR_INVALID, "sm90 ag-wgrad: no k_stream (its tiles wait per band)");
  if (p.wgrad_group_rows % AgBuilder::kBK)
    return fail(KOSMOS_ERR_INVALID, "sm90 ag-wgrad: band groups of %d rows are not whole k-blocks of %d", p.wgrad_group_rows,
                AgBuilder::kBK);
  if (const char* why = validate(p.M, p.N, p.K, p.world)) return fail(KOSMOS_ERR_INVALID, "%s", why);
  AgSm90Params& P = *static_cast<AgSm90Params*>(h);
  const bool same = kAT ? (P.m_loc == p.M && P.n_loc == p.N / p.world && P.k_loc == p.K / p.world)
                        : (P.m_loc == p.M / p.world && P.n_loc == p.N / p.world);
  if (!same) return fail(KOSMOS_ERR_INVALID, "sm90 ag-gemm: set_rank was not called for this shape");
  P.base = p;
  return launch(0, &P, p, stream);
}

// ---- GEMM+RS (gemm_rs_sm90_kernel) ----
using kosmos::sm90::RsSm90Params;
const char* kosmos_sm90_rs_validate(int M, int N, int K, int W) {
  const char* why = kosmos::sm90::validate_rs(M, N, K, W);
  return why ? why : "";
}

void* kosmos_sm90_rs_create(void) { return new (std::nothrow) RsSm90Params(); }
void kosmos_sm90_rs_destroy(void* h) { delete static_cast<RsSm90Params*>(h); }

// Executed rank i: A_r (M x K/W), B_r (K/W x N). The partials' destinations (own slot, staging)
// are the rank args' (Params.ranks[i].slot / work: 16-byte aligned, the runner's buffers).
int kosmos_sm90_rs_set_rank(void* h, int i, const void* A, const void* B, int M, int N, int K, int W) {
  using namespace kosmos::sm90;
  if (!h) return fail(KOSMOS_ERR_INVALID, "sm90 gemm-rs: null handle");
  if (i < 0 || i >= KOSMOS_MAX_WORLD) return fail(KOSMOS_ERR_INVALID, "sm90 gemm-rs: rank index %d", i);
  if (const char* why = validate_rs(M, N, K, W)) return fail(KOSMOS_ERR_INVALID, "%s", why);
  if (!A || !B) return fail(KOSMOS_ERR_INVALID, "sm90 gemm-rs: null buffer");
  if (!aligned(A) || !aligned(B)) return fail(KOSMOS_ERR_INVALID, "sm90 gemm-rs: A_r and B_r must be 16-byte aligned");
  RsSm90Params& P = *static_cast<RsSm90Params*>(h);
  const int m_loc = M / W, k_loc = K / W;
  // A_r viewed as (m_loc, K/W, W): batch d = the rows of destination band d
  P.maps[i] = AgBuilder::make_mainloop_params(A, m_loc, W, int64_t(m_loc) * k_loc, B, N, k_loc);
  if (i == 0) P.bp = AgBuilder::make_params(A, B, nullptr, m_loc, N, k_loc);
  P.m_loc = m_loc;
  P.n = N;
  return KOSMOS_OK;
}

int kosmos_sm90_rs_max_wgs(int device, int* out) { return kosmos::sm90::max_wgs(1, device, out); }

int kosmos_sm90_rs_launch(void* h, const KosmosParams* params, void* stream) {
  using namespace kosmos::sm90;
  if (!h || !params) return fail(KOSMOS_ERR_INVALID, "null handle or params");
  const KosmosParams& p = *params;
  if (p.op != KOSMOS_OP_GEMM_RS) return fail(KOSMOS_ERR_INVALID, "kosmos_sm90_rs_launch is gemm-rs only (op %d)", p.op);
  if (int rc = kosmos::check_common_params(p)) return rc;
  if (p.mover_bulk || p.k_stream) return fail(KOSMOS_ERR_INVALID, "sm90 gemm-rs: no mover_bulk / k_stream");
  if (const char* why = validate_rs(p.M, p.N, p.K, p.world)) return fail(KOSMOS_ERR_INVALID, "%s", why);
  RsSm90Params& P = *static_cast<RsSm90Params*>(h);
  if (P.m_loc != p.M / p.world || P.n != p.N || P.bp.K != p.K / p.world)
    return fail(KOSMOS_ERR_INVALID, "sm90 gemm-rs: set_rank was not called for this shape");
  P.base = p;
  return launch(1, &P, p, stream);
}

}  // extern "C"
