// moe_fwd_sm90.cu — the MoE expert layer's forward in ONE cooperative persistent launch (sm_90a):
// router -> top-k -> scan -> dispatch -> expert gate/up (SwiGLU fused) -> down -> fold, plus the
// shared expert, all as items of one demand-ordered claim sequence (no host synchronisation).
//
// Items (KosmosMoeKind, moe_params.h), claimed in this order by one atomic per claim (policy
// self: every CTA claims the next item itself); the counts of UP and DOWN are data dependent
// (dropless), so their ranges are sized for the most tiles any routing can produce
// (tiles_max = ceil(T*topk/128) + E) and a claim beyond this call's tiles is skipped:
//
//   ROUTE b        math  router logits of tokens 128b.. (builder tile x @ Wr^T, fp32 kept; ping-pong:
//                        one 128-column pass per 128 experts, both on the item's warpgroup),
//                        then per row: keys = logits + bias, group-limited top-k (ties: lower
//                        expert id), combine weights, the row's rank among block b's rows of its
//                        expert (deterministic: token order), per-block counts. -> ctr ROUTED
//   SCAN           main  after every ROUTE (claimed right after them, so the movers start while
//                        the shared expert computes): per-expert totals, block bases, segment
//                        starts (padded to 128 rows so no tile straddles experts), and the expert
//                        tile table in queue order (moe_params.h queue_order; demand: the tiles
//                        of own rows expert by expert, so that the ~132 tiles in flight read
//                        one or two experts' weights, which stay in L2, then the tiles waiting
//                        for peer rows, expert by expert). -> state[2] = epoch
//   SHARED_UP m,n  math  shared expert gate/up tile, SwiGLU epilogue -> sh_up_done[m] (rastered as UP)
//   DISPATCH b     main  (remote experts only) rows of tokens 32b.. to the owners' send buffers
//   SHARED_DOWN    math  after its m-tile's SHARED_UPs -> sh_down_done[m]
//   UP q,n         math  (moe_common.cuh raster_tile: 16 queue positions at a time, n-tiles outer)
//                        after every row of tile g = tile_order[q] arrived: A = sorted rows,
//                        B = W1t[e] (H x 2F, columns of n-tile n = [128 gate | 128 up] (ping-pong:
//                        [64 gate | 64 up] of a 128-column tile), arranged
//                        once at prepare), h = silu(g) * u (bf16) -> up_done[g]
//   DOWN q,n       math  after every UP of tile g: h @ W2t[e] -> expert outputs (bf16) -> down_done[g],
//                        down_group[c]; without peer rows in up to 4 column groups c of H (Layout
//                        down_tile: every tile's n-tiles of group 0, then of group 1, ...)
//   FOLD c,b       math   (and movers) tokens 32b.., the columns of group c, after the tiles of its
//                        tokens' choices (with groups: every DOWN of group c) and the shared
//                        expert's tile; the math warps' loads, no mainloop, one FOLD per CTA at a
//                        time; claimed from their own counter, which the movers claim from too,
//                        so group c folds beside group c + 1's DOWNs and only the last group's
//                        fold is left after them:
//                        y_t = sum over j = 0..k-1 in that order of w_tj * out[pos(t, j)]
//                        (+ shared), fp32, one bf16 rounding: bitwise identical across calls.
// and, outside the sequence, the movers' items (their own claim counters), from SCAN on:
//   INDEX b        movers  sorted_choice[pos(t, j)] = t * topk + j for tokens 32b.. -> ctr INDEXED
//   GATHER 4q+p    movers  after every INDEX: rows 32p.. of tile tile_order[q] (own rows from x, the
//                          peers' from recv_rows) -> arrived[tile]
//   COMBINE_TILE q movers  (host fabric) after tile tile_order[q]'s DOWNs: its peer rows' outputs -> recv_out
//   FOLD c,b       movers  (no peer rows) as above, on the 64 mover threads
// so the rows reach the sorted buffer tile by tile in the order UP claims them, while the math
// warps run the shared expert (or the first tiles), instead of a dispatch phase between; and the
// peers' outputs leave as their tiles finish.
//
// Host fabric, mover ce (moe_params.h ce_flags): the peers' buffers are device copies that the
// runner's copy-engine plans fill (recv_rows expert by expert, then send_out, host -> device) and
// drain (send_rows after the last DISPATCH, recv_out expert by expert once COMBINE_TILE released
// it, device -> host) beside the launch; GATHER waits for its expert's rows, FOLD for the peer's
// send_out. mover sm: the same items read and write the pinned buffers themselves.
//
// Block: the Hopper builder's 384 threads (builder_sm90.cuh). Loader warps 0-1: thread 32
// schedules (claims, watchdog-bounded waits), warp 0 issues a math item's TMA loads after pushing
// it into the tile ring, both run the loader items of the sequence; loader warps 2-3 are the
// movers. Math warpgroups, two builds of this file (KosmosConfig.math_wgs, libs.MOE_SM90 /
// MOE_SM90_PP; the slower one is deleted once both are timed on a GPU, docs/notes/pingpong-plan.md):
// * joint (KOSMOS_MOE_PINGPONG 0): the two math warpgroups pop math items (and FOLDs), run one
//   128 x 256 tile's wgmma mainloop together, then its epilogue, and thread 128 releases its counter;
// * ping-pong (KOSMOS_MOE_PINGPONG 1, PingpongBuilderSm90): both pop every item of the ring; item j
//   is warpgroup j % 2's, which runs its 128 x 128 tile alone (the other skips its mainloop stages)
//   and releases its counter (the warpgroup's thread 0); the two take turns for their MMAs (named
//   barriers kBarTurn0 + wg: a warpgroup waits for its turn before a tile's first wgmma and hands
//   it over once the tile's last one is issued), so the epilogue of item j runs under item j + 1's
//   mainloop. FOLD (no mainloop) runs on both warpgroups together: its owner takes and hands over
//   the turn at once.
// Every wait is bounded by the watchdog (sync.cuh): on timeout the error record names the
// waiting item's kind (queue), its index (item), the counter (flag; -1 = the scan flag) and
// what was expected / seen; every CTA then stops claiming and the launch completes.
#include <cuda_runtime.h>

#include <new>

#include "kosmos/builder_sm90.cuh"
#include "kosmos/host_error.h"
#include "kosmos/host_launch.h"
#include "kosmos/moe_common.cuh"
#include "kosmos/moe_params.h"
#include "kosmos/sync.cuh"
#include "kosmos/trace.cuh"

// The math warpgroups' schedule of this build (module doc): 0 joint (libs.MOE_SM90), 1 ping-pong
// (libs.MOE_SM90_PP).
#ifndef KOSMOS_MOE_PINGPONG
#define KOSMOS_MOE_PINGPONG 0
#endif

namespace kosmos {
namespace moe {

#if KOSMOS_MOE_PINGPONG
// 128 x 128 tiles a warpgroup, 6 stages of 32 KB (the same ring bytes as the 4 x 48 KB of the
// joint 128 x 256 tile).
using Builder = sm90::PingpongBuilderSm90<128, 6>;
#else
using Builder = sm90::BuilderSm90<128, 256, 64, 4, true>;
#endif
using Ring = sm90::ItemRing<4, int>;  // (kind << 24) | index, -1 = no more work
constexpr int kThreads = Builder::kNumThreads;
constexpr int kLoaderThreads = 128;
// The loader warpgroup's two halves: warps 0-1 run the claim sequence (thread kSched claims, warp 0
// issues the math items' TMA loads, both warps run its loader items); warps 2-3 are the movers,
// which gather the own token rows into the expert-sorted buffer tile by tile in queue order
// (INDEX, GATHER) beside whatever the math warps compute.
constexpr int kMainThreads = 64;
constexpr int kMoverThreads = 64;
constexpr int kBarMover = 10;
constexpr int kBM = Builder::kBM, kBN = Builder::kBN, kBK = Builder::kBK;
constexpr int kTB = KOSMOS_MOE_TOK_BLOCK;
constexpr int kBarLoader = 8;
constexpr int kBarMath = 9;  // both math warpgroups (256 threads)
#if KOSMOS_MOE_PINGPONG
constexpr int kBarWg0 = 11;    // + wg: one math warpgroup's own barrier (128 threads)
constexpr int kBarTurn0 = 13;  // + wg: warpgroup wg's MMA turn (the other arrives, wg syncs: 256)
#endif
constexpr int kSched = 32;
constexpr int kLoaderRegs = 104;
constexpr int kMathRegs = 200;
static_assert(kLoaderThreads * kLoaderRegs + 256 * kMathRegs <= 384 * 168, "setmaxnreg beyond the CTA's registers");
#if KOSMOS_MOE_PINGPONG
static_assert(kBN == 128 && Builder::kAccum == 128, "the epilogues below assume 128 x 128 warpgroup tiles");
#endif
// Trace roles of this kernel (kosmos_bench/kernels/moe_sm90.py ROLE_CODES).
enum MoeRole : uint16_t { kRoleRouter = 0, kRoleDispatch = 1, kRoleExpert = 2, kRoleCombine = 3, kRoleFold = 4 };

// A FOLD's staging (run_fold): the expert output row and weight of each choice of its tokens, and
// a failed wait (reset by the fold's thread 0 before the waits; as s.bad in COMBINE).
struct FoldSmem {
  const bf16* src[kTB * KOSMOS_MOE_MAX_TOPK];
  float w[kTB * KOSMOS_MOE_MAX_TOPK];
  int bad;
};

struct Shared {
  Builder::SharedStorage builder;
  Ring::SharedStorage ring;
  int cmd[2];
  int mcmd;  // the movers' claim (mover_loop)
  int last;
  int bad;       // COMBINE: some thread's wait failed (reset by the scheduler with each claim)
  int mem_done;  // FOLD items the math warps finished (moe_common.cuh next_loader_item)
  FoldSmem fold;   // the math warps' FOLD
  FoldSmem mfold;  // the movers' FOLD (column groups)
  int scan_tiles[KOSMOS_MOE_MAX_E];
  int scan_first[KOSMOS_MOE_MAX_E + 1];
  int scan_total[KOSMOS_MOE_MAX_E];
  int scan_own[KOSMOS_MOE_MAX_E];  // tiles of expert e whose rows are all own (ready first)
};
constexpr int kSmemBytes = int(sizeof(Shared));
static_assert(kSmemBytes <= 227 * 1024, "MoE kernel shared memory exceeds 227 KB");
#if KOSMOS_MOE_PINGPONG
// The router epilogue's scratch (8 row slabs' counts, uint16, and a key row per warp) lives in its
// warpgroup's half of the epilogue staging (free between its tiles).
static_assert(Builder::kEpiWgBytes >= 8 * KOSMOS_MOE_MAX_E * 2 + 4 * KOSMOS_MOE_MAX_E * 4,
              "router scratch fits a warpgroup's epilogue staging");
#else
// The router epilogue's per-warp scratch lives in the builder's epilogue staging (free between tiles).
static_assert(Builder::kEpiBytes >= 8 * KOSMOS_MOE_MAX_E * 4 * 2, "router scratch fits the epilogue staging");
#endif

struct Params {
  KosmosMoeArgs a;
#if !KOSMOS_MOE_PINGPONG
  Builder::Params bp;
#endif
  Builder::Mainloop::Params route, up, down, sh_up, sh_down;
};
static_assert(sizeof(Params) <= 32000, "kernel parameters must fit the 32 KB parameter space");

// The claim sequence: per kind, its first claim index and its count.
struct Layout {
  int begin[KOSMOS_MOE_NUM_KINDS + 1];
  int nu, nd, nsu, nsd;  // n-tiles (kBN): UP (2F/kBN), DOWN and SHARED_DOWN (H/kBN), SHARED_UP (2Fs/kBN)
  int tm;                // tiles_max
  int rb;                // route_blocks (the shared expert's m-blocks)
  int tb;                // token blocks (FOLD items per column group)
  // DOWN column groups: fg groups of gs n-tiles (the last one may have fewer). One group when peer
  // rows wait for whole tiles (host fabric: COMBINE_TILE sends a tile's outputs after its DOWNs).
  int fg, gs;
  __device__ Layout(const KosmosMoeArgs& a) {
    tm = a.tiles_max;
    rb = a.route_blocks;
    nu = 2 * a.F / kBN;
    nd = (a.H + kBN - 1) / kBN;
    nsu = 2 * a.Fs / kBN;
    nsd = a.Fs ? nd : 0;
    tb = (a.T + kTB - 1) / kTB;
    fg = a.peer_rows ? 1 : min(KOSMOS_MOE_FOLD_GROUPS, nd);
    gs = (nd + fg - 1) / fg;
    fg = (nd + gs - 1) / gs;
    const int sends = a.E_tiles < a.E ? tb : 0;  // DISPATCH: rows for remote experts only
    int n[KOSMOS_MOE_NUM_KINDS] = {a.route_blocks, 1, a.route_blocks * nsu, sends, 0, a.route_blocks * nsd,
                                   a.tiles_max * nu, a.tiles_max * nd, 0, tb * fg};  // the peers' rows: the movers
    begin[0] = 0;
    for (int k = 0; k < KOSMOS_MOE_NUM_KINDS; ++k) begin[k + 1] = begin[k] + n[k];
  }
  // n-tiles of DOWN column group g
  __device__ int group_tiles(int g) const { return min(gs, nd - g * gs); }
  // DOWN item i -> (queue position q, n-tile n, column group g): groups outer, then q, then the
  // group's n-tiles (a tile's rows are read once per group, from L2 while its n-tiles run)
  __device__ void down_tile(int i, int* q, int* n, int* g) const {
    const int gi = min(i / (tm * gs), fg - 1), r = i - gi * tm * gs, w = group_tiles(gi);
    *g = gi;
    *q = r / w;
    *n = gi * gs + r % w;
  }
  // UP item i -> (queue position q, n-tile n): moe_common.cuh raster_tile
  __device__ void up_tile(int i, int* q, int* n) const { moe::raster_tile(i, nu, tm, q, n); }
  // SHARED_UP item i -> (m-block mb, n-tile n), rastered like UP: its B (the shared W1, 59 MB at
  // deepseek-v3's H 7168 / Fs 2048) is beyond L2; m-major the tiles in flight read all of it
  __device__ void sh_up_tile(int i, int* mb, int* n) const { moe::raster_tile(i, nsu, rb, mb, n); }
  __device__ int count(int k) const { return begin[k + 1] - begin[k]; }
  __device__ int kind_of(int c) const {
    int k = 0;
    while (k < KOSMOS_MOE_NUM_KINDS - 1 && c >= begin[k + 1]) ++k;
    return k;
  }
};

struct Ctx {
  const KosmosMoeArgs& a;
  SyncCtx sc;
  uint32_t* arrived;
  uint32_t* up_done;
  uint32_t* down_done;
  uint32_t* sh_up_done;
  uint32_t* sh_down_done;
  uint32_t* combined;
  uint32_t* down_group;  // [KOSMOS_MOE_FOLD_GROUPS] DOWN items of column group g done
  uint32_t* fold_claim;
  __device__ Ctx(const KosmosMoeArgs& a_, int block) : a(a_) {
    sc = SyncCtx{ld_relaxed(a.state) + 1, a.state, static_cast<KosmosErrorRecord*>(a.err), a.timeout_ns, false, 0,
                 block, static_cast<uint32_t>(a.spin_ns)};
    arrived = a.ctr + KOSMOS_MOE_CTR_HEAD;
    up_done = arrived + a.tiles_max;
    down_done = up_done + a.tiles_max;
    sh_up_done = down_done + a.tiles_max;
    sh_down_done = sh_up_done + a.route_blocks;
    combined = sh_down_done + a.route_blocks;
    down_group = combined + a.E_tiles;
    fold_claim = down_group + KOSMOS_MOE_FOLD_GROUPS;
  }
  // wait until *f >= target (count); `flag` names the counter in the error record
  __device__ bool wait(const uint32_t* f, uint32_t target, int kind, int item, int flag) const {
    return wait_flag(sc, f, target, kind, item, 0, flag);
  }
  __device__ bool wait_scan(int kind, int item) const { return wait(a.state + 2, sc.epoch, kind, item, -1); }
  __device__ int flag_id(const uint32_t* f) const { return int(f - a.ctr); }
};

// ------------------------------------------------------------------------------ scheduler
// Claim the next item (thread kSched): returns (kind << 24 | index) with its dependencies
// acquired, or -1 when the sequence is exhausted or the call aborted.
__device__ int decide(const Ctx& c, const Layout& L) {
  const KosmosMoeArgs& a = c.a;
  for (;;) {
    if (aborted(c.sc)) return -1;
    const int k = int(atomicAdd(a.ctr + KOSMOS_MOE_CTR_CLAIM, 1u));
    if (k >= L.begin[KOSMOS_MOE_NUM_KINDS]) return -1;
    const int kind = L.kind_of(k);
    const int i = k - L.begin[kind];
    bool ok = true;
    switch (kind) {
      case KOSMOS_MOE_ROUTE:
      case KOSMOS_MOE_SHARED_UP:
        break;
      case KOSMOS_MOE_SCAN:
        if (a.debug_skip_scan) continue;  // watchdog test: nobody computes the offsets
        ok = c.wait(a.ctr + KOSMOS_MOE_CTR_ROUTED, uint32_t(a.route_blocks), kind, i, KOSMOS_MOE_CTR_ROUTED);
        break;
      case KOSMOS_MOE_DISPATCH:
        ok = c.wait_scan(kind, i);
        break;
      case KOSMOS_MOE_SHARED_DOWN: {
        const uint32_t* f = c.sh_up_done + i / L.nsd;
        ok = c.wait(f, uint32_t(L.nsu), kind, i, c.flag_id(f));
        break;
      }
      case KOSMOS_MOE_UP:
      case KOSMOS_MOE_DOWN: {
        if (!c.wait_scan(kind, i)) return -1;
        int q, n, cg;
        if (kind == KOSMOS_MOE_UP)
          L.up_tile(i, &q, &n);
        else
          L.down_tile(i, &q, &n, &cg);
        if (q >= ldcg(a.meta)) continue;  // beyond this call's tiles
        const int g = ldcg(a.tile_order + q);
        const uint32_t* f = kind == KOSMOS_MOE_UP ? c.arrived + g : c.up_done + g;
        const uint32_t need = kind == KOSMOS_MOE_UP ? uint32_t(ldcg(a.tile_rows + g)) : uint32_t(L.nu);
        ok = c.wait(f, need, kind, i, c.flag_id(f));
        break;
      }
      case KOSMOS_MOE_FOLD: {
        // the tiles of its choices: waited for by the folding threads (run_fold); the item itself
        // from the FOLD counter, which the movers claim from too
        if (!c.wait_scan(kind, i)) return -1;
        const int f = int(atomicAdd(c.fold_claim, 1u));
        if (f >= L.count(kind)) continue;
        return (kind << 24) | f;
      }
    }
    if (!ok) return -1;
    return (kind << 24) | i;
  }
}

// ------------------------------------------------------------------------------ loader items
// SCAN (128 loader threads). Expert e's rows of block b are blk_cnt[b][e]; rows are placed
// expert by expert (segments padded to kBM), blocks in order, rows of a block in token order.
__device__ void run_scan(const Ctx& c, Shared& s, int tid) {
  const KosmosMoeArgs& a = c.a;
  int* s_tiles = s.scan_tiles;
  int* s_first = s.scan_first;
  int* s_total = s.scan_total;
  for (int e = tid; e < a.E; e += kMainThreads) {
    int run = 0;
    for (int b = 0; b < a.route_blocks; ++b) {
      const int64_t o = int64_t(b) * a.E + e;
      const int n = ldcg(a.blk_cnt + o);
      a.blk_base[o] = run;
      run += n;
    }
    a.own_total[e] = run;
    // an expert with tiles here: its own rows, then (host fabric) the peers' rows
    const int rows = e < a.E_tiles ? run + (a.peer_rows ? a.peer_total[e] : 0) : run;
    s_total[e] = rows;
    s_tiles[e] = e < a.E_tiles ? (rows + kBM - 1) / kBM : 0;
    s.scan_own[e] = run == rows ? s_tiles[e] : run / kBM;  // every tile, or those below the first peer row
  }
  named_bar_sync(kBarLoader, kMainThreads);
  if (tid == 0) {
    int acc = 0;
    for (int e = 0; e < a.E; ++e) {
      s_first[e] = acc;
      acc += s_tiles[e];
    }
    s_first[a.E] = acc;
    a.meta[0] = acc;
  }
  named_bar_sync(kBarLoader, kMainThreads);
  const int total = s_first[a.E], mode = a.queue_order;
  const int* s_own = s.scan_own;
  int own_all = 0;  // tiles of own rows only, over every expert
  for (int f = 0; f < a.E_tiles; ++f) own_all += s_own[f];
  for (int e = tid; e < a.E_tiles; e += kMainThreads) {
    a.seg_start[e] = s_first[e] * kBM;
    const int nt = s_tiles[e];
    int own_before = 0;
    for (int f = 0; f < e; ++f) own_before += s_own[f];
    for (int j = 0; j < nt; ++j) {
      int q = 0;
      if (mode == 1) {  // fifo: tiles ordered by (j, e)
        for (int f = 0; f < a.E; ++f) q += min(s_tiles[f], j) + ((f < e && s_tiles[f] > j) ? 1 : 0);
      } else if (j < s_own[e]) {  // demand: own tiles by (e, j)
        q = own_before + j;
      } else {  // then the tiles waiting for peer rows by (e, j): the order the copy engine brings them
        q = own_all + j - s_own[e];
        for (int f = 0; f < e; ++f) q += s_tiles[f] - s_own[f];
      }
      if (mode == 2) q = total - 1 - q;
      if (mode == 3) q = int((int64_t(q) * 1000003) % total);  // a prime above any tile count: a bijection
      const int g = s_first[e] + j;
      a.tile_order[q] = g;
      a.tile_expert[g] = e;
      a.tile_rows[g] = min(kBM, s_total[e] - j * kBM);
    }
  }
  named_bar_sync(kBarLoader, kMainThreads);
}

// DISPATCH b (host fabric): the rows of tokens 32b.. chosen for remote experts to the owners'
// send buffers; one warp per (t, j). The own experts' rows are the movers' (GATHER).
__device__ void run_dispatch(const Ctx& c, int b, int tid) {
  const KosmosMoeArgs& a = c.a;
  const int warp = tid / 32, lane = tid % 32;
  const int t0 = b * kTB;
  const int nt = min(kTB, a.T - t0);
  for (int p = warp; p < nt * a.topk; p += kMainThreads / 32) {
    const int t = t0 + p / a.topk, j = p % a.topk;
    int e;
    const int pos = pos_of(a, t, j, &e);
    if (e < a.E_tiles || pos < 0) continue;  // own expert, or a remote choice the reference did not make
    const int4* src = reinterpret_cast<const int4*>(static_cast<const bf16*>(a.x) + int64_t(t) * a.H);
    copy_row(reinterpret_cast<int4*>(static_cast<bf16*>(a.send_rows[e / a.E_loc]) + int64_t(pos) * a.H), src,
             a.H / 8, lane);
  }
}

// ------------------------------------------------------------------------------ mover items
// INDEX b: the choice (t * topk + j) of every own sorted row of tokens 32b.. (the inverse of pos_of).
__device__ void run_index(const Ctx& c, int b, int mt) {
  const KosmosMoeArgs& a = c.a;
  const int t0 = b * kTB;
  const int nt = min(kTB, a.T - t0);
  for (int p = mt; p < nt * a.topk; p += kMoverThreads) {
    const int t = t0 + p / a.topk, j = p % a.topk;
    int e;
    const int pos = pos_of(a, t, j, &e);
    if (e < a.E_tiles) a.sorted_choice[pos] = t * a.topk + j;
  }
}

// Where tile g's rows come from: expert e, the tile's index j in its expert, and its own rows
// (from this rank's tokens; the rest, up to rows, are the peers' on the host fabric).
struct TileRows {
  int e, j, own, rows;
};
__device__ __forceinline__ TileRows tile_rows_of(const KosmosMoeArgs& a, int g) {
  const int e = ldcg(a.tile_expert + g);
  const int j = g - ldcg(a.seg_start + e) / kBM;
  return TileRows{e, j, max(0, min(kBM, ldcg(a.own_total + e) - j * kBM)), ldcg(a.tile_rows + g)};
}

// The peer row (moe_params.h) that tile row r (>= the tile's own rows) holds.
__device__ __forceinline__ PeerRow tile_peer_row(const KosmosMoeArgs& a, const TileRows& tr, int r) {
  const int k = tr.j * kBM + r - ldcg(a.own_total + tr.e);  // among e's peer rows
  return peer_row(a, a.peer_inv[a.peer_first[tr.e] + k]);
}

// Copy-engine flags (moe_params.h ce_flags).
__device__ __forceinline__ uint32_t* ce_recv_in(const KosmosMoeArgs& a, int e) { return a.ce_flags + e; }
__device__ __forceinline__ uint32_t* ce_send_out_in(const KosmosMoeArgs& a, int p) { return a.ce_flags + a.E_tiles + p - 1; }
__device__ __forceinline__ uint32_t* ce_sent(const KosmosMoeArgs& a) { return a.ce_flags + a.E_tiles + 7; }
__device__ __forceinline__ uint32_t* ce_combined(const KosmosMoeArgs& a, int e) { return a.ce_flags + a.E_tiles + 8 + e; }
constexpr int kCeFlag = -2;  // the error record's flag for a copy-engine word (watchdog message)

// GATHER (tile g, part): rows 32*part.. of sorted tile g: own rows from their tokens' rows of x,
// the peers' (host fabric) from recv_rows (pinned host memory, or its device copy once the copy
// engine released the expert). Returns how many.
__device__ int run_gather(const Ctx& c, const TileRows& tr, int g, int part, int mt) {
  constexpr int kWarps = kMoverThreads / 32;
  const KosmosMoeArgs& a = c.a;
  const int r0 = part * kTB, r1 = min(tr.rows, r0 + kTB);
  const int warp = mt / 32, lane = mt % 32;
  for (int r = r0 + warp; r < r1; r += kWarps) {
    const int64_t pos = int64_t(g) * kBM + r;
    const bf16* src;
    if (r < tr.own) {
      src = static_cast<const bf16*>(a.x) + int64_t(ldcg(a.sorted_choice + pos) / a.topk) * a.H;
    } else {
      const PeerRow pr = tile_peer_row(a, tr, r);
      src = static_cast<const bf16*>(a.recv_rows[pr.p]) + int64_t(pr.ip) * a.H;
    }
    copy_row<8>(reinterpret_cast<int4*>(static_cast<bf16*>(a.xs) + pos * a.H), reinterpret_cast<const int4*>(src),
                 a.H / 8, lane);
  }
  return max(0, r1 - r0);
}

// COMBINE_TILE (host fabric; tile g, after its DOWNs): the expert outputs of its peer rows to the
// peers' recv_out.
__device__ void run_combine_tile(const Ctx& c, const TileRows& tr, int g, int mt) {
  constexpr int kWarps = kMoverThreads / 32;
  const KosmosMoeArgs& a = c.a;
  const int warp = mt / 32, lane = mt % 32;
  for (int r = tr.own + warp; r < tr.rows; r += kWarps) {
    const PeerRow pr = tile_peer_row(a, tr, r);
    copy_row<8>(reinterpret_cast<int4*>(static_cast<bf16*>(a.recv_out[pr.p]) + int64_t(pr.ip) * a.H),
                 reinterpret_cast<const int4*>(static_cast<const bf16*>(a.os) + (int64_t(g) * kBM + r) * a.H),
                 a.H / 8, lane);
  }
}

// FOLD f = (column group g = f / tb, token block b = f % tb), by kN threads (the 256 math threads,
// whose registers keep 8 choices' loads in flight per thread; or the 64 movers while the math warps
// run the next group's DOWNs): the threads wait for the block's choices' tiles (watchdog; with
// column groups, for every DOWN of group g at once), then y_t = sum_j w_tj * out[pos(t, j)]
// (+ shared) over the group's columns, in j order, fp32, one bf16 rounding (bitwise the same
// whoever folds and however H is grouped). A failed wait is shared through fs.bad; returns false.
template <int kN>
__device__ bool run_fold(const Ctx& c, const Layout& L, FoldSmem& fs, int f, int tid, int bar) {
  const KosmosMoeArgs& a = c.a;
  const int cg = f / L.tb, b = f % L.tb;
  const int t0 = b * kTB;
  const int nt = min(kTB, a.T - t0);
  const int k = a.topk;
  if (tid == 0) fs.bad = 0;
  named_bar_sync(bar, kN);
  bool ok = true;
  if (L.fg > 1 && tid == 0) {  // no peer rows: every choice's tile is here
    const uint32_t* d = c.down_group + cg;
    ok = c.wait(d, uint32_t(ldcg(a.meta) * L.group_tiles(cg)), KOSMOS_MOE_FOLD, f, c.flag_id(d));
  }
  for (int p = tid; p < nt * k; p += kN) {
    const int t = t0 + p / k, j = p % k;
    int e;
    const int pos = pos_of(a, t, j, &e);
    const bool here = e < a.E_tiles;  // else: the owner's output of this row, static (pinned host memory or its copy)
    fs.src[p] = pos < 0 ? nullptr
                        : (here ? static_cast<const bf16*>(a.os) : static_cast<const bf16*>(a.send_out[e / a.E_loc])) +
                              int64_t(pos) * a.H;
    fs.w[p] = __ldcg(a.weights + int64_t(t) * k + j);
    const uint32_t* d = c.down_done + pos / kBM;
    if (ok && here && L.fg == 1) ok = c.wait(d, uint32_t(L.nd), KOSMOS_MOE_FOLD, f, c.flag_id(d));
    if (ok && !here && pos >= 0 && a.ce_flags)  // the owner's output, once the copy engine brought it
      ok = c.wait(ce_send_out_in(a, e / a.E_loc), c.sc.epoch, KOSMOS_MOE_FOLD, f, kCeFlag);
  }
  if (a.Fs && tid == 0 && ok) {
    const uint32_t* d = c.sh_down_done + t0 / kBM;
    ok = c.wait(d, uint32_t(L.nsd), KOSMOS_MOE_FOLD, f, c.flag_id(d));
  }
  if (!ok) fs.bad = 1;
  named_bar_sync(bar, kN);
  const bool bad = fs.bad != 0;
  const int c0 = cg * L.gs * (kBN / 8);                                    // first 8-column chunk
  const int chunks = min(a.H / 8, (cg + 1) * L.gs * (kBN / 8)) - c0;  // of the group
  const bf16* ysh = static_cast<const bf16*>(a.ysh);
  bf16* y = static_cast<bf16*>(a.y);
  // each thread issues the loads of up to 8 choices (32 KB in flight per 256 threads) and the
  // shared expert's row before it adds them, in j order
  for (int w = tid; w < nt * chunks && !bad; w += kN) {
    const int tl = w / chunks, ch = c0 + w % chunks;
    const int t = t0 + tl;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const int4 sh = a.Fs ? ld_cg_16(ysh + int64_t(t) * a.H + ch * 8) : make_int4(0, 0, 0, 0);
    fold_rows<true>(acc, fs.src + tl * k, fs.w + tl * k, k, ch * 8);
    if (a.Fs) add_bf16x8(acc, sh);
    store_bf16x8(y + int64_t(t) * a.H + ch * 8, acc);
  }
  named_bar_sync(bar, kN);  // fs.src / fs.w / fs.bad read by every thread
  return !bad;
}

// The movers (warps 2-3): after SCAN, INDEX items until none is left, then (every INDEX done)
// GATHER items in queue order, so the tiles the math warps will claim first fill first; with
// DOWN in column groups then FOLD items (group by group, beside the math warps' DOWNs); on the
// host fabric then COMBINE_TILE items in queue order (each after its tile's DOWNs), so the peers'
// outputs leave as their tiles finish. Mover thread 0 claims and waits (watchdog-bounded); the
// others follow through s.mcmd, so a failed wait or an abort takes all 64 out together.
__device__ __noinline__ void mover_loop(const Ctx& c, const Layout& L, Shared& s, Tracer& tr, int mt) {
  const KosmosMoeArgs& a = c.a;
  const bool lead = mt == 0;
  const int tb = (a.T + kTB - 1) / kTB;
  constexpr int kParts = kBM / kTB;
  auto share = [&](int v) { return moe::share_lead(s.mcmd, lead, v, kBarMover, kMoverThreads); };
  // the lead's claim of the next item from counter `ctr` (-1: none left below `n`, or aborted)
  auto claim_at = [&](uint32_t* ctr, int n) {
    int k = -1;
    if (lead && !aborted(c.sc)) k = int(atomicAdd(ctr, 1u));
    return share(k >= 0 && k < n ? k : -1);
  };
  auto claim = [&](int ctr, int n) { return claim_at(a.ctr + ctr, n); };
  if (share(lead && c.wait_scan(KOSMOS_MOE_INDEX, 0) ? 0 : -1) < 0) return;
  for (int b; (b = claim(KOSMOS_MOE_CTR_INDEX, tb)) >= 0;) {
    const uint64_t t0 = lead ? tr.now() : 0;
    run_index(c, b, mt);
    __threadfence();
    named_bar_sync(kBarMover, kMoverThreads);
    if (lead) {
      atomicAdd(a.ctr + KOSMOS_MOE_CTR_INDEXED, 1u);
      tr.add(kRoleDispatch, (KOSMOS_MOE_INDEX << 24) | b, t0, tr.now());
    }
  }
  const uint32_t* indexed = a.ctr + KOSMOS_MOE_CTR_INDEXED;
  if (share(lead && c.wait(indexed, uint32_t(tb), KOSMOS_MOE_GATHER, 0, c.flag_id(indexed)) ? 0 : -1) < 0) return;
  const int tiles = ldcg(a.meta);
  for (int i; (i = claim(KOSMOS_MOE_CTR_GATHER, tiles * kParts)) >= 0;) {
    const uint64_t t0 = lead ? tr.now() : 0;
    const int g = ldcg(a.tile_order + i / kParts);
    const TileRows rows = tile_rows_of(a, g);
    // copy-engine movers: the expert's peer rows are in once the copy engine released it
    const int r0 = (i % kParts) * kTB;
    const bool peers = a.ce_flags && rows.rows > max(rows.own, r0) && r0 + kTB > rows.own;
    if (share(!lead || !peers || c.wait(ce_recv_in(a, rows.e), c.sc.epoch, KOSMOS_MOE_GATHER, i, kCeFlag) ? 0 : -1) < 0)
      return;
    const int n = run_gather(c, rows, g, i % kParts, mt);
    __threadfence();
    named_bar_sync(kBarMover, kMoverThreads);
    if (lead) {
      if (n) atomicAdd(c.arrived + g, uint32_t(n));
      tr.add(kRoleDispatch, (KOSMOS_MOE_GATHER << 24) | i, t0, tr.now());
    }
  }
  // DOWN in column groups (no peer rows): fold group g while the math warps run group g + 1
  for (int f; L.fg > 1 && (f = claim_at(c.fold_claim, L.count(KOSMOS_MOE_FOLD))) >= 0;) {
    const uint64_t t0 = lead ? tr.now() : 0;
    if (!run_fold<kMoverThreads>(c, L, s.mfold, f, mt, kBarMover)) return;
    if (lead) tr.add(kRoleFold, (KOSMOS_MOE_FOLD << 24) | f, t0, tr.now());
  }
  if (!a.peer_rows) return;
  for (int q; (q = claim(KOSMOS_MOE_CTR_COMB, tiles)) >= 0;) {
    const int g = ldcg(a.tile_order + q);
    const TileRows rows = tile_rows_of(a, g);
    if (rows.rows <= rows.own) continue;  // no peer rows in this tile
    const uint32_t* f = c.down_done + g;
    if (share(!lead || c.wait(f, uint32_t(L.nd), KOSMOS_MOE_COMBINE_TILE, q, c.flag_id(f)) ? 0 : -1) < 0) return;
    const uint64_t t0 = lead ? tr.now() : 0;
    run_combine_tile(c, rows, g, mt);
    __threadfence();
    named_bar_sync(kBarMover, kMoverThreads);
    if (lead) {
      const uint32_t n = uint32_t(rows.rows - rows.own);
      const uint32_t done = atomicAdd(c.combined + rows.e, n) + n;
      if (a.ce_flags && done == uint32_t(a.peer_total[rows.e])) st_release(ce_combined(a, rows.e), c.sc.epoch, false);
      tr.add(kRoleCombine, (KOSMOS_MOE_COMBINE_TILE << 24) | q, t0, tr.now());
    }
  }
}

// ------------------------------------------------------------------------------ math items
// Accumulator layout: moe_common.cuh acc_row / acc_col, per m64 half of a warpgroup's 128 x 128
// tile (builder_sm90.cuh PingpongBuilderSm90: value v = 64 h + a, rows 64 h + acc_row(t, a)).

// warp argmax over (value, id): larger value, then lower id
__device__ __forceinline__ void warp_argmax(float& v, int& id, float& extra) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, id, o);
    const float x2 = __shfl_xor_sync(0xffffffffu, extra, o);
    if (v2 > v || (v2 == v && i2 < id)) {
      v = v2;
      id = i2;
      extra = x2;
    }
  }
}

#if KOSMOS_MOE_PINGPONG
// Mainloop k-blocks of a math item (the loader's produce_grouped calls for it; the warpgroup that
// does not own the item skips as many stages). ROUTE: one 128-column pass per 128 experts.
__device__ __forceinline__ int route_passes(const KosmosMoeArgs& a) { return (a.E + kBN - 1) / kBN; }
__device__ __forceinline__ int item_kblocks(const KosmosMoeArgs& a, int kind) {
  switch (kind) {
    case KOSMOS_MOE_ROUTE:
      return route_passes(a) * (a.H / kBK);
    case KOSMOS_MOE_SHARED_UP:
    case KOSMOS_MOE_UP:
      return a.H / kBK;
    case KOSMOS_MOE_SHARED_DOWN:
      return a.Fs / kBK;
    case KOSMOS_MOE_DOWN:
      return a.F / kBK;
    default:  // FOLD
      return 0;
  }
}

using MmaTurn = moe::Turn<kBarTurn0, Builder::kWgThreads>;  // moe_common.cuh

// ROUTE logits (the item's warpgroup, thread t): pass p's columns (experts 128p..) of the tile's
// rows to a.logits (fp32). Thread t holds rows 64h + acc_row(t, a) of both m64 halves h.
template <class Accum>
__device__ __forceinline__ void route_logits(const Ctx& c, Accum const& acc, int blk, int p, int t) {
  const KosmosMoeArgs& a = c.a;
  const int row0 = blk * kBM;
#pragma unroll
  for (int v = 0; v < Builder::kAccum; ++v) {
    const int h = v / Builder::kAtomVals, av = v % Builder::kAtomVals;
    const int r = row0 + 64 * h + acc_row(t, av), col = p * kBN + acc_col(t, av);
    if (col < a.E && r < a.T) a.logits[int64_t(r) * a.E + col] = acc(v);
  }
}

// ROUTE epilogue (the item's warpgroup, 128 threads, after every pass's logits): per row top-k,
// weights, ranks; then the block's per-expert counts. The tile's rows are 8 slabs of 16 (token
// order); warp w (of the warpgroup) holds slabs w and w + 4 whole (every column of their rows:
// its own logit stores), and takes their rows in order. Ranks: the row's count among its slab's
// earlier rows, then (after the barrier) + the counts of the slabs before: token order, as before.
__device__ void route_topk(const Ctx& c, Builder& builder, int blk, int wg, int t, int bar) {
  const KosmosMoeArgs& a = c.a;
  const int warp = t / 32, lane = t % 32;
  const int E = a.E, k = a.topk;
  const int row0 = blk * kBM;
  uint16_t* cnt = reinterpret_cast<uint16_t*>(builder.epilogue_smem(wg));  // [8 slabs][E]
  float* kbuf = reinterpret_cast<float*>(cnt + 8 * KOSMOS_MOE_MAX_E) + warp * KOSMOS_MOE_MAX_E;  // [E] per warp
  for (int e = lane; e < E; e += 32) {
    cnt[warp * KOSMOS_MOE_MAX_E + e] = 0;
    cnt[(warp + 4) * KOSMOS_MOE_MAX_E + e] = 0;
  }
  __syncwarp();  // also orders the warp's logit stores before its loads below (its slabs' whole rows)
  const int gs = E / a.n_group;
  constexpr int kMaxPer = KOSMOS_MOE_MAX_E / 32;
  for (int ii = 0; ii < 32; ++ii) {
    const int slab = warp + 4 * (ii / 16);
    const int t_ = row0 + 16 * slab + ii % 16;
    if (t_ >= a.T) break;  // slab w + 4's rows come after slab w's
    float key[kMaxPer], lg[kMaxPer];
#pragma unroll
    for (int q = 0; q < kMaxPer; ++q) {
      const int e = lane + 32 * q;
      lg[q] = e < E ? __ldcg(a.logits + int64_t(t_) * E + e) : 0.f;
      key[q] = e < E ? lg[q] + a.bias[e] : -INFINITY;
    }
    if (a.n_group > 1) {
#pragma unroll
      for (int q = 0; q < kMaxPer; ++q)
        if (lane + 32 * q < E) kbuf[lane + 32 * q] = key[q];
      __syncwarp();
      float gscore = -INFINITY;
      if (lane < a.n_group) {
        float m1 = -INFINITY, m2 = -INFINITY;
        for (int u = 0; u < gs; ++u) {
          const float x = kbuf[lane * gs + u];
          if (x > m1) {
            m2 = m1;
            m1 = x;
          } else if (x > m2) {
            m2 = x;
          }
        }
        gscore = gs >= 2 ? m1 + m2 : m1;
      }
      __syncwarp();
      bool keep = false;
      for (int s = 0; s < a.topk_group; ++s) {
        float v = gscore;
        int id = lane < a.n_group ? lane : 1 << 20;
        float dummy = 0.f;
        warp_argmax(v, id, dummy);
        if (lane == id) {
          keep = true;
          gscore = -INFINITY;
        }
      }
      // experts of groups not kept: -inf (the lane holding group g's flag is lane g)
#pragma unroll
      for (int q = 0; q < kMaxPer; ++q) {
        const int e = lane + 32 * q;
        const bool kept = __shfl_sync(0xffffffffu, keep, min(e / max(gs, 1), 31));
        if (e < E && !kept) key[q] = -INFINITY;
      }
    }
    int my_e = -1;
    float my_l = 0.f;
    for (int j = 0; j < k; ++j) {
      float v = -INFINITY;
      int id = 1 << 20;  // lanes without a valid expert lose every tie
      float l = 0.f;
#pragma unroll
      for (int q = 0; q < kMaxPer; ++q) {
        const int e = lane + 32 * q;
        if (e < E && (key[q] > v || id == (1 << 20))) {  // ascending e: ties keep the lower id
          v = key[q];
          id = e;
          l = lg[q];
        }
      }
      warp_argmax(v, id, l);
#pragma unroll
      for (int q = 0; q < kMaxPer; ++q)
        if (lane + 32 * q == id) key[q] = -INFINITY;
      if (lane == j) {
        my_e = id;
        my_l = l;
      }
    }
    // combine weights over the k choices (lanes 0..k-1)
    float wv;
    if (a.scoring == 0) {
      float mx = lane < k ? my_l : -INFINITY;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      wv = lane < k ? expf(my_l - mx) : 0.f;
    } else {
      wv = lane < k ? 1.f / (1.f + expf(-my_l)) : 0.f;
    }
    float sum = wv;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane < k) {
      const float w = a.scoring == 0 ? wv / sum : wv / sum * a.scale;
      a.routes[int64_t(t_) * k + lane] = my_e;
      a.weights[int64_t(t_) * k + lane] = w;
      const int r = cnt[slab * KOSMOS_MOE_MAX_E + my_e];
      cnt[slab * KOSMOS_MOE_MAX_E + my_e] = uint16_t(r + 1);
      a.rank[int64_t(t_) * k + lane] = r;
    }
    __syncwarp();
  }
  named_bar_sync(bar, Builder::kWgThreads);  // every slab's counts
  // ranks: + the rows of the slabs before (earlier tokens of the block)
  for (int ii = 0; ii < 32; ++ii) {
    const int slab = warp + 4 * (ii / 16);
    const int t_ = row0 + 16 * slab + ii % 16;
    if (t_ >= a.T) break;
    if (lane < k) {
      const int e = a.routes[int64_t(t_) * k + lane];
      int off = 0;
      for (int s2 = 0; s2 < slab; ++s2) off += cnt[s2 * KOSMOS_MOE_MAX_E + e];
      a.rank[int64_t(t_) * k + lane] += off;
    }
  }
  for (int e = t; e < E; e += Builder::kWgThreads) {
    int tot = 0;
    for (int s2 = 0; s2 < 8; ++s2) tot += cnt[s2 * KOSMOS_MOE_MAX_E + e];
    a.blk_cnt[int64_t(blk) * E + e] = tot;
  }
}

// UP / SHARED_UP tiles: the 128 columns of n-tile n are [64 gate | 64 up] of h columns 64n..64n+63
// (W1t arranged so at prepare): in each m64 half, value a < 32 is gate and a + 32 the up of the
// same (row, h column); the 64-column chunk 0 of the tile is gate, chunk 1 up.

// The gate/up pre-activations of such a tile (h columns c0..c0+63) saved for the backward
// (moe_params.h gus / gush) in natural column order: gate to pre + c0, up to pre + F + c0 (row
// stride 2F): the tile's two chunks as they are.
template <class Accum>
__device__ __forceinline__ void store_preact(Builder& builder, Accum const& acc, bf16* pre, int F, int c0, int rows) {
  builder.store_chunk(acc, 0, pre + c0, 2 * F, rows, 64);
  builder.store_chunk(acc, 1, pre + F + c0, 2 * F, rows, 64);
}

// SwiGLU over such a tile: the gate values (chunk 0) become h.
template <class Accum>
__device__ __forceinline__ void swiglu(Accum& acc) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int v = h * Builder::kAtomVals; v < h * Builder::kAtomVals + Builder::kAtomVals / 2; ++v) {
      const float g = acc(v), u = acc(v + Builder::kAtomVals / 2);
      acc(v) = g / (1.f + __expf(-g)) * u;
    }
  }
}

// The math warpgroups (module doc): every item of the ring in order; item j is warpgroup j % 2's.
__device__ void math_loop(const Ctx& c, const Layout& L, const Params& P, Shared& s, Builder& builder, Ring& ring,
                          Tracer& tr) {
  const KosmosMoeArgs& a = c.a;
  const int m = int(threadIdx.x) - 128;  // math thread 0..255
  const int wg = m / Builder::kWgThreads, t = m % Builder::kWgThreads;
  const int bar = kBarWg0 + wg;
  const MmaTurn turn{wg};
  const auto give = [&] { turn.give(); };
  int j = 0;  // ring index of the item
  for (;; ++j) {
    const int item = ring.pop();
    if (item < 0) break;
    const int kind = item >> 24, i = item & 0xffffff;
    const bool mine = (j & 1) == wg;
    if (kind == KOSMOS_MOE_FOLD) {
      // both warpgroups fold (the 256 threads' loads in flight); the owner passes the turn at once
      if (mine) {
        turn.take(j);
        turn.give();
      }
      const uint64_t t0 = (m == 0) ? tr.now() : 0;
      run_fold<Builder::kNumMathThreads>(c, L, s.fold, i, m, kBarMath);
      if (m == 0) {
        atomicAdd(&s.mem_done, 1);
        tr.add(kRoleFold, item, t0, tr.now());
      }
      continue;
    }
    if (!mine) {  // the other warpgroup's tile: skip its stages
      builder.skip_k(item_kblocks(a, kind));
      continue;
    }
    const uint64_t t0 = (t == 0) ? tr.now() : 0;
    auto acc = Builder::make_accum();
    uint32_t *rel = nullptr, *rel2 = nullptr;
    uint16_t role = kRoleExpert;
    turn.take(j);
    switch (kind) {
      case KOSMOS_MOE_ROUTE: {
        // the turn is held across the passes (ROUTE items are few: one per 128 tokens)
        const int np = route_passes(a);
        for (int p = 0; p < np; ++p) {
          builder.mma_k(acc, a.H / kBK, [&] {
            if (p == np - 1) turn.give();
          });
          route_logits(c, acc, i, p, t);
        }
        route_topk(c, builder, i, wg, t, bar);
        rel = a.ctr + KOSMOS_MOE_CTR_ROUTED;
        role = kRoleRouter;
        break;
      }
      case KOSMOS_MOE_SHARED_UP: {
        int mb, n;
        L.sh_up_tile(i, &mb, &n);
        builder.mma_k(acc, a.H / kBK, give);
        if (a.gush)
          store_preact(builder, acc, static_cast<bf16*>(a.gush) + int64_t(mb) * kBM * 2 * a.Fs, a.Fs, n * (kBN / 2),
                       a.T - mb * kBM);
        swiglu(acc);
        builder.store_tile<1>(acc, static_cast<bf16*>(a.hsh) + int64_t(mb) * kBM * a.Fs + n * (kBN / 2), a.Fs,
                              a.T - mb * kBM, kBN / 2);
        rel = c.sh_up_done + mb;
        break;
      }
      case KOSMOS_MOE_SHARED_DOWN: {
        const int mb = i / L.nsd, n = i % L.nsd;
        builder.mma_k(acc, a.Fs / kBK, give);
        builder.store_tile(acc, static_cast<bf16*>(a.ysh) + int64_t(mb) * kBM * a.H + n * kBN, a.H, a.T - mb * kBM,
                           a.H - n * kBN);
        rel = c.sh_down_done + mb;
        break;
      }
      case KOSMOS_MOE_UP: {
        int q, n;
        L.up_tile(i, &q, &n);
        const int g = __ldcg(a.tile_order + q);
        builder.mma_k(acc, a.H / kBK, give);
        if (a.gus) store_preact(builder, acc, static_cast<bf16*>(a.gus) + int64_t(g) * kBM * 2 * a.F, a.F, n * (kBN / 2), kBM);
        swiglu(acc);
        builder.store_tile<1>(acc, static_cast<bf16*>(a.hs) + int64_t(g) * kBM * a.F + n * (kBN / 2), a.F, kBM,
                              kBN / 2);
        rel = c.up_done + g;
        break;
      }
      case KOSMOS_MOE_DOWN: {
        int q, n, cg;
        L.down_tile(i, &q, &n, &cg);
        const int g = __ldcg(a.tile_order + q);
        builder.mma_k(acc, a.F / kBK, give);
        builder.store_tile(acc, static_cast<bf16*>(a.os) + int64_t(g) * kBM * a.H + n * kBN, a.H, kBM, a.H - n * kBN);
        rel = c.down_done + g;
        rel2 = c.down_group + cg;
        break;
      }
      default:  // not a math kind: nothing to compute, the turn goes on
        turn.give();
        break;
    }
    __threadfence();
    named_bar_sync(bar, Builder::kWgThreads);  // every store of the item before its release
    if (t == 0) {
      if (rel) atomicAdd(rel, 1u);
      if (rel2) atomicAdd(rel2, 1u);
      tr.add(role, item, t0, tr.now());
    }
  }
  turn.finish(j);
}

#else  // joint: both math warpgroups on one 128 x 256 tile
// ROUTE epilogue (256 math threads): logits (fp32) of the tile's rows to a.logits, then per
// warp (16 rows each, in row order) top-k, weights, ranks; then the block's per-expert counts.
template <class Accum>
__device__ void route_epilogue(const Ctx& c, Builder& builder, Accum const& acc, int blk) {
  const KosmosMoeArgs& a = c.a;
  const int m = int(threadIdx.x) - 128;
  const int warp = m / 32, lane = m % 32;
  const int E = a.E, k = a.topk;
  const int row0 = blk * kBM;
  int* cnt = reinterpret_cast<int*>(builder.epilogue_smem());           // [8][E]
  float* kbuf = reinterpret_cast<float*>(cnt + 8 * KOSMOS_MOE_MAX_E) + warp * KOSMOS_MOE_MAX_E;  // [E] per warp
#pragma unroll
  for (int v = 0; v < Builder::kBN / 2; ++v) {
    const int r = row0 + acc_row(m, v), col = acc_col(m, v);
    if (col < E && r < a.T) a.logits[int64_t(r) * E + col] = acc(v);
  }
  for (int e = lane; e < E; e += 32) cnt[warp * KOSMOS_MOE_MAX_E + e] = 0;
  __syncwarp();  // also orders the warp's logit stores before its loads below (each warp owns 16 whole rows)
  const int gs = E / a.n_group;
  constexpr int kMaxPer = KOSMOS_MOE_MAX_E / 32;
  for (int i = 0; i < 16; ++i) {
    const int t = row0 + warp * 16 + i;
    if (t >= a.T) break;
    float key[kMaxPer], lg[kMaxPer];
#pragma unroll
    for (int q = 0; q < kMaxPer; ++q) {
      const int e = lane + 32 * q;
      lg[q] = e < E ? __ldcg(a.logits + int64_t(t) * E + e) : 0.f;
      key[q] = e < E ? lg[q] + a.bias[e] : -INFINITY;
    }
    if (a.n_group > 1) {
#pragma unroll
      for (int q = 0; q < kMaxPer; ++q)
        if (lane + 32 * q < E) kbuf[lane + 32 * q] = key[q];
      __syncwarp();
      float gscore = -INFINITY;
      if (lane < a.n_group) {
        float m1 = -INFINITY, m2 = -INFINITY;
        for (int u = 0; u < gs; ++u) {
          const float x = kbuf[lane * gs + u];
          if (x > m1) {
            m2 = m1;
            m1 = x;
          } else if (x > m2) {
            m2 = x;
          }
        }
        gscore = gs >= 2 ? m1 + m2 : m1;
      }
      __syncwarp();
      bool keep = false;
      for (int s = 0; s < a.topk_group; ++s) {
        float v = gscore;
        int id = lane < a.n_group ? lane : 1 << 20;
        float dummy = 0.f;
        warp_argmax(v, id, dummy);
        if (lane == id) {
          keep = true;
          gscore = -INFINITY;
        }
      }
      // experts of groups not kept: -inf (the lane holding group g's flag is lane g)
#pragma unroll
      for (int q = 0; q < kMaxPer; ++q) {
        const int e = lane + 32 * q;
        const bool kept = __shfl_sync(0xffffffffu, keep, min(e / max(gs, 1), 31));
        if (e < E && !kept) key[q] = -INFINITY;
      }
    }
    int my_e = -1;
    float my_l = 0.f;
    for (int j = 0; j < k; ++j) {
      float v = -INFINITY;
      int id = 1 << 20;  // lanes without a valid expert lose every tie
      float l = 0.f;
#pragma unroll
      for (int q = 0; q < kMaxPer; ++q) {
        const int e = lane + 32 * q;
        if (e < E && (key[q] > v || id == (1 << 20))) {  // ascending e: ties keep the lower id
          v = key[q];
          id = e;
          l = lg[q];
        }
      }
      warp_argmax(v, id, l);
#pragma unroll
      for (int q = 0; q < kMaxPer; ++q)
        if (lane + 32 * q == id) key[q] = -INFINITY;
      if (lane == j) {
        my_e = id;
        my_l = l;
      }
    }
    // combine weights over the k choices (lanes 0..k-1)
    float wv;
    if (a.scoring == 0) {
      float mx = lane < k ? my_l : -INFINITY;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      wv = lane < k ? expf(my_l - mx) : 0.f;
    } else {
      wv = lane < k ? 1.f / (1.f + expf(-my_l)) : 0.f;
    }
    float sum = wv;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane < k) {
      const float w = a.scoring == 0 ? wv / sum : wv / sum * a.scale;
      a.routes[int64_t(t) * k + lane] = my_e;
      a.weights[int64_t(t) * k + lane] = w;
      const int r = cnt[warp * KOSMOS_MOE_MAX_E + my_e];
      cnt[warp * KOSMOS_MOE_MAX_E + my_e] = r + 1;
      a.rank[int64_t(t) * k + lane] = r;
    }
    __syncwarp();
  }
  named_bar_sync(kBarMath, Builder::kNumMathThreads);  // every warp's counts
  // ranks: + the rows of the warps before (earlier tokens of the block)
  for (int i = 0; i < 16; ++i) {
    const int t = row0 + warp * 16 + i;
    if (t >= a.T) break;
    if (lane < k) {
      const int e = a.routes[int64_t(t) * k + lane];
      int off = 0;
      for (int w2 = 0; w2 < warp; ++w2) off += cnt[w2 * KOSMOS_MOE_MAX_E + e];
      a.rank[int64_t(t) * k + lane] += off;
    }
  }
  if (m < E) {
    int tot = 0;
    for (int w2 = 0; w2 < 8; ++w2) tot += cnt[w2 * KOSMOS_MOE_MAX_E + m];
    a.blk_cnt[int64_t(blk) * E + m] = tot;
  }
}

// The gate/up pre-activations of a [128 gate | 128 up] tile (h columns c0..c0+127) saved for the
// backward (moe_params.h gus / gush) in natural column order: gate to pre + c0, up to
// pre + F + c0 (row stride 2F). Values v < 64 are the gate half, v + 64 the up half of the same
// (row, column): swapped in registers so that the staged epilogue stores each half.
template <class Accum>
__device__ __forceinline__ void store_preact(Builder& builder, Accum& acc, int m, bf16* pre, int F, int c0, int rows) {
  builder.store_staged_to<kBN / 2>(acc, m, pre + c0, 2 * F, rows, kBN / 2);
#pragma unroll
  for (int v = 0; v < kBN / 4; ++v) {
    const float t = acc(v);
    acc(v) = acc(v + kBN / 4);
    acc(v + kBN / 4) = t;
  }
  builder.store_staged_to<kBN / 2>(acc, m, pre + F + c0, 2 * F, rows, kBN / 2);
#pragma unroll
  for (int v = 0; v < kBN / 4; ++v) {
    const float t = acc(v);
    acc(v) = acc(v + kBN / 4);
    acc(v + kBN / 4) = t;
  }
}

// SwiGLU over a tile whose columns are [128 gate | 128 up]: values v < 64 become h.
template <class Accum>
__device__ __forceinline__ void swiglu(Accum& acc) {
#pragma unroll
  for (int v = 0; v < Builder::kBN / 4; ++v) {
    const float g = acc(v), u = acc(v + Builder::kBN / 4);
    acc(v) = g / (1.f + __expf(-g)) * u;
  }
}

__device__ void math_loop(const Ctx& c, const Layout& L, const Params& P, Shared& s, Builder& builder, Ring& ring,
                          Tracer& tr) {
  const KosmosMoeArgs& a = c.a;
  const int tid = int(threadIdx.x), m = tid - 128;
  for (;;) {
    const int item = ring.pop();
    if (item < 0) break;
    const int kind = item >> 24, i = item & 0xffffff;
    const uint64_t t0 = (tid == 128) ? tr.now() : 0;
    auto acc = Builder::make_accum();
    uint32_t *rel = nullptr, *rel2 = nullptr;
    uint16_t role = kRoleExpert;
    switch (kind) {
      case KOSMOS_MOE_ROUTE:
        builder.mma_k(acc, a.H / kBK);
        route_epilogue(c, builder, acc, i);
        rel = a.ctr + KOSMOS_MOE_CTR_ROUTED;
        role = kRoleRouter;
        break;
      case KOSMOS_MOE_SHARED_UP: {
        int mb, n;
        L.sh_up_tile(i, &mb, &n);
        builder.mma_k(acc, a.H / kBK);
        if (a.gush)
          store_preact(builder, acc, m, static_cast<bf16*>(a.gush) + int64_t(mb) * kBM * 2 * a.Fs, a.Fs,
                       n * (kBN / 2), a.T - mb * kBM);
        swiglu(acc);
        builder.store_staged_to<kBN / 2>(acc, m, static_cast<bf16*>(a.hsh) + int64_t(mb) * kBM * a.Fs + n * (kBN / 2),
                                         a.Fs, a.T - mb * kBM, kBN / 2);
        rel = c.sh_up_done + mb;
        break;
      }
      case KOSMOS_MOE_SHARED_DOWN: {
        const int mb = i / L.nsd, n = i % L.nsd;
        builder.mma_k(acc, a.Fs / kBK);
        builder.store_staged_to(acc, m, static_cast<bf16*>(a.ysh) + int64_t(mb) * kBM * a.H + n * kBN, a.H,
                                a.T - mb * kBM, a.H - n * kBN);
        rel = c.sh_down_done + mb;
        break;
      }
      case KOSMOS_MOE_UP: {
        int q, n;
        L.up_tile(i, &q, &n);
        const int g = __ldcg(a.tile_order + q);
        builder.mma_k(acc, a.H / kBK);
        if (a.gus)
          store_preact(builder, acc, m, static_cast<bf16*>(a.gus) + int64_t(g) * kBM * 2 * a.F, a.F, n * (kBN / 2), kBM);
        swiglu(acc);
        builder.store_staged_to<kBN / 2>(acc, m, static_cast<bf16*>(a.hs) + int64_t(g) * kBM * a.F + n * (kBN / 2), a.F,
                                         kBM, kBN / 2);
        rel = c.up_done + g;
        break;
      }
      case KOSMOS_MOE_DOWN: {
        int q, n, cg;
        L.down_tile(i, &q, &n, &cg);
        const int g = __ldcg(a.tile_order + q);
        builder.mma_k(acc, a.F / kBK);
        builder.store_staged_to(acc, m, static_cast<bf16*>(a.os) + int64_t(g) * kBM * a.H + n * kBN, a.H, kBM,
                                a.H - n * kBN);
        rel = c.down_done + g;
        rel2 = c.down_group + cg;
        break;
      }
      case KOSMOS_MOE_FOLD:
        run_fold<Builder::kNumMathThreads>(c, L, s.fold, i, m, kBarMath);
        role = kRoleFold;
        if (tid == 128) atomicAdd(&s.mem_done, 1);
        break;
      default:
        break;
    }
    __threadfence();
    named_bar_sync(kBarMath, Builder::kNumMathThreads);  // every store of the item before its release
    if (tid == 128) {
      if (rel) atomicAdd(rel, 1u);
      if (rel2) atomicAdd(rel2, 1u);
      tr.add(role, item, t0, tr.now());
    }
  }
}

#endif  // KOSMOS_MOE_PINGPONG

// ------------------------------------------------------------------------------ the kernel
__global__ void __launch_bounds__(kThreads, 1) moe_fwd_sm90_kernel(const __grid_constant__ Params P) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  Shared& s = *reinterpret_cast<Shared*>(smem_raw);
  const KosmosMoeArgs& a = P.a;
  const int tid = int(threadIdx.x);
  const int block = int(blockIdx.x);
  const Ctx c(a, block);
  const Layout L(a);
  KosmosParams tp{};  // the tracer's view of the trace buffers
  tp.trace = static_cast<KosmosTraceRecord*>(a.trace);
  tp.trace_count = a.trace_count;
  tp.trace_cap = a.trace_cap;
  Tracer tr = make_tracer(tp, block);
  tr.shared = true;

  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int lane = tid % 32;
  const auto role = Builder::role_of(tid);
  Ring ring(s.ring, warp_idx == 0, role == Builder::Role::kMath, Builder::kNumMathThreads);
  if (tid == 0) s.mem_done = 0;
#if KOSMOS_MOE_PINGPONG
  Builder builder(s.builder, P.route, role);
#else
  Builder builder(s.builder, P.bp, role);
#endif
  if (tid == 0) {
    Builder::Mainloop::prefetch_tma_descriptors(P.route);
    Builder::Mainloop::prefetch_tma_descriptors(P.up);
    Builder::Mainloop::prefetch_tma_descriptors(P.down);
  }
  __syncthreads();

  const int rows_s = a.tiles_max * kBM;  // rows of the expert-sorted buffers
  if (role == Builder::Role::kLoader) {
    cutlass::arch::warpgroup_reg_dealloc<kLoaderRegs>();
    if (warp_idx >= kMainThreads / 32) {
      mover_loop(c, L, s, tr, tid - kMainThreads);
    } else {
      int mem_claimed = 0;  // (thread kSched)
      for (;;) {
        const int item = moe::next_loader_item(s, mem_claimed, 1u << KOSMOS_MOE_FOLD, tid == kSched, kBarLoader,
                                               kMainThreads, c.sc, [&] { return decide(c, L); });
        if (item < 0) break;
        const int kind = item >> 24, i = item & 0xffffff;
        switch (kind) {
          case KOSMOS_MOE_ROUTE:
          case KOSMOS_MOE_SHARED_UP:
          case KOSMOS_MOE_SHARED_DOWN:
          case KOSMOS_MOE_UP:
          case KOSMOS_MOE_DOWN:
          case KOSMOS_MOE_FOLD:  // the math warps fold (no mainloop stages)
            if (warp_idx == 0) {
              fence_proxy_async_global();  // generic-proxy writes of other CTAs (acquired) -> this warp's TMA reads
              if (lane == 0) ring.push(item);
              __syncwarp();
              if (kind == KOSMOS_MOE_ROUTE) {  // ping-pong: one pass per 128 experts (route_passes), one item
#if KOSMOS_MOE_PINGPONG
                for (int p = 0; p < route_passes(a); ++p)
                  builder.produce_grouped(P.route, a.T, 1, 0, i, 256, a.H, a.H / kBK, 1, 0, p);
#else
                builder.produce_grouped(P.route, a.T, 1, 0, i, 256, a.H, a.H / kBK, 1, 0, 0);
#endif
              } else if (kind == KOSMOS_MOE_SHARED_UP) {
                int mb, n;
                L.sh_up_tile(i, &mb, &n);
                builder.produce_grouped(P.sh_up, a.T, 1, 0, mb, 2 * a.Fs, a.H, a.H / kBK, 1, 0, n);
              } else if (kind == KOSMOS_MOE_SHARED_DOWN) {
                builder.produce_grouped(P.sh_down, a.T, 1, 0, i / L.nsd, a.H, a.Fs, a.Fs / kBK, 1, 0, i % L.nsd);
              } else if (kind == KOSMOS_MOE_UP) {
                int q, n;
                L.up_tile(i, &q, &n);
                const int g = __ldcg(a.tile_order + q);
                const int e = __ldcg(a.tile_expert + g);
                builder.produce_grouped(P.up, rows_s, 1, 0, g, 2 * a.F, a.H, a.H / kBK, a.E_tiles, e, n);
              } else if (kind == KOSMOS_MOE_DOWN) {
                int q, n, cg;
                L.down_tile(i, &q, &n, &cg);
                const int g = __ldcg(a.tile_order + q);
                const int e = __ldcg(a.tile_expert + g);
                builder.produce_grouped(P.down, rows_s, 1, 0, g, a.H, a.F, a.F / kBK, a.E_tiles, e, n);
              }
            }
            break;
          default: {
            const uint64_t t0 = (tid == kSched) ? tr.now() : 0;
            uint16_t r = kRoleRouter;
            if (kind == KOSMOS_MOE_SCAN) {
              run_scan(c, s, tid);
              __threadfence();
              named_bar_sync(kBarLoader, kMainThreads);
              if (tid == kSched) st_release(a.state + 2, c.sc.epoch, false);
            } else if (kind == KOSMOS_MOE_DISPATCH) {
              r = kRoleDispatch;
              run_dispatch(c, i, tid);
              if (a.ce_flags) {  // the last DISPATCH releases the copy engine's send_rows copies
                __threadfence();
                named_bar_sync(kBarLoader, kMainThreads);
                if (tid == kSched && atomicAdd(a.ctr + KOSMOS_MOE_CTR_SENT, 1u) + 1 == uint32_t(L.count(kind)))
                  st_release(ce_sent(a), c.sc.epoch, false);
              }
            }
            if (tid == kSched) tr.add(r, item, t0, tr.now());
            break;
          }
        }
      }
      if (warp_idx == 0) {
        if (lane == 0) ring.push(-1);
        __syncwarp();
        builder.produce_tail();
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<kMathRegs>();
    math_loop(c, L, P, s, builder, ring, tr);
  }

  // exit: the last CTA zeroes the per-call counters and publishes the completed call
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    s.last = atomicAdd(a.ctr + KOSMOS_MOE_CTR_EXIT, 1u) == uint32_t(a.grid - 1);
  }
  __syncthreads();
  if (s.last) {
    __threadfence();
    for (int w = tid; w < a.ctr_words; w += kThreads) a.ctr[w] = 0;
    // copy-engine movers: whatever the call released or not (an abort), no copy waits past it
    if (a.ce_flags)
      for (int w = tid; w <= a.E_tiles; w += kThreads) st_release(ce_sent(a) + w, c.sc.epoch, false);
    __syncthreads();
    if (tid == 0) {
      __threadfence();
      st_release(a.state, c.sc.epoch, false);
    }
  }
}

// ------------------------------------------------------------------------------ host side
namespace {

const char* validate(int T, int H, int F, int Fs, int E, int topk, int n_group, int topk_group) {
  if (T <= 0 || H <= 0 || F <= 0 || E <= 0) return "moe sm90: T, H, F, E must be positive";
  if (E > KOSMOS_MOE_MAX_E) return "moe sm90: more than 256 experts in one launch (the router tile is 256 wide)";
  if (topk < 1 || topk > KOSMOS_MOE_MAX_TOPK || topk > E) return "moe sm90: topk must be in 1..min(16, experts)";
  if (H % 64 || F % 128 || Fs % 128) return "moe sm90: H must be a multiple of 64, F and the shared F of 128";
  if (n_group < 1 || n_group > 32 || E % n_group || topk_group < 1 || topk_group > n_group)
    return "moe sm90: groups must divide the experts (at most 32 groups)";
  if (n_group > 1 && topk > topk_group * (E / n_group)) return "moe sm90: topk exceeds the experts of the kept groups";
  if (T >= (1 << 24) / 8) return "moe sm90: too many tokens for one launch";
  return nullptr;
}

bool aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace
}  // namespace moe
}  // namespace kosmos

// ----------------------------------------------------------------------------------- C ABI
extern "C" {

using kosmos::fail;
using kosmos::moe::Builder;
using kosmos::moe::Params;

int kosmos_moe_abi_version(void) { return KOSMOS_MOE_ABI_VERSION; }
const char* kosmos_moe_last_error(void) { return kosmos::g_err; }
int kosmos_moe_smem_bytes(void) { return kosmos::moe::kSmemBytes; }
int kosmos_moe_threads(void) { return kosmos::moe::kThreads; }

// Offset of field i of KosmosMoeArgs (the Python mirror's layout test), -1 past the last.
long kosmos_moe_args_offset(int i) {
#define F(name) offsetof(KosmosMoeArgs, name)
  static const long off[] = {F(x), F(bias), F(y), F(routes), F(weights), F(rank), F(logits), F(blk_cnt), F(blk_base),
                             F(seg_start), F(tile_order), F(tile_expert), F(tile_rows), F(meta), F(xs), F(hs), F(os),
                             F(hsh), F(ysh), F(gus), F(gush), F(own_total), F(sorted_choice), F(peer_inv), F(peer_first), F(ce_flags), F(ref_routes), F(ref_slot), F(peer_expert), F(peer_rel),
                             F(peer_total), F(recv_rows), F(recv_out), F(send_rows), F(send_out), F(peer_begin),
                             F(E_tiles), F(E_loc), F(peer_rows), F(ctr), F(state), F(err), F(trace), F(trace_count), F(timeout_ns), F(T),
                             F(H), F(F), F(Fs), F(E), F(topk), F(n_group), F(topk_group), F(scoring),
                             F(route_blocks), F(tiles_max), F(ctr_words), F(grid), F(trace_cap), F(spin_ns),
                             F(debug_skip_scan), F(scale), F(queue_order), sizeof(KosmosMoeArgs)};
#undef F
  return (i >= 0 && i < int(sizeof(off) / sizeof(off[0]))) ? off[i] : -1;
}

// "" when the shape is supported, else why not. No GPU needed.
const char* kosmos_moe_validate(int T, int H, int F, int Fs, int E, int topk, int n_group, int topk_group) {
  const char* why = kosmos::moe::validate(T, H, F, Fs, E, topk, n_group, topk_group);
  return why ? why : "";
}

void* kosmos_moe_create(void) { return new (std::nothrow) Params(); }
void kosmos_moe_destroy(void* h) { delete static_cast<Params*>(h); }

// The arguments and the weights as the kernel reads them (arranged once at prepare):
//   wr_t  (H x 256)      router weight transposed, zero columns beyond E
//   w1_t  (E x H x 2F)   per expert W1^T, the columns of each kBN-wide n-tile = [kBN/2 gate | kBN/2 up]
//                        (joint 256, ping-pong 128: kosmos_moe.py arrange_w1)
//   w2_t  (E x F x H)    per expert W2^T
//   ws1_t (H x 2Fs), ws2_t (Fs x H): the shared expert likewise (NULL when Fs = 0)
int kosmos_moe_set(void* h, const KosmosMoeArgs* args, const void* wr_t, const void* w1_t, const void* w2_t,
                   const void* ws1_t, const void* ws2_t) {
  if (!h || !args) return fail(KOSMOS_ERR_INVALID, "moe sm90: null handle or args");
  const KosmosMoeArgs& a = *args;
  if (const char* why = kosmos::moe::validate(a.T, a.H, a.F, a.Fs, a.E, a.topk, a.n_group, a.topk_group))
    return fail(KOSMOS_ERR_INVALID, "%s", why);
  if (!a.x || !a.y || !a.xs || !a.hs || !a.os || !a.sorted_choice || !a.ctr || !a.state || !a.err || !wr_t || !w1_t || !w2_t)
    return fail(KOSMOS_ERR_INVALID, "moe sm90: null buffer");
  if (a.Fs && (!ws1_t || !ws2_t || !a.hsh || !a.ysh)) return fail(KOSMOS_ERR_INVALID, "moe sm90: null shared-expert buffer");
  if (a.gush && !a.Fs) return fail(KOSMOS_ERR_INVALID, "moe sm90: shared pre-activations without a shared expert");
  const void* const bufs[] = {a.x, a.y, a.xs, a.hs, a.os, wr_t, w1_t, w2_t};
  for (const void* p : bufs)
    if (!kosmos::moe::aligned(p)) return fail(KOSMOS_ERR_INVALID, "moe sm90: buffers must be 16-byte aligned");
  if (a.E_tiles < 1 || a.E_tiles > a.E || a.E_loc < 1 || (a.E_tiles < a.E && a.E % a.E_loc))
    return fail(KOSMOS_ERR_INVALID, "moe sm90: E_tiles / E_loc do not fit E");
  if (a.E_tiles < a.E && (!a.ref_routes || !a.ref_slot))
    return fail(KOSMOS_ERR_INVALID, "moe sm90: remote experts without the reference routing's send slots");
  if (a.peer_rows < 0 || (a.peer_rows && (!a.peer_expert || !a.peer_rel || !a.peer_total || !a.peer_inv || !a.peer_first)))
    return fail(KOSMOS_ERR_INVALID, "moe sm90: peer rows without their tables");
  if (a.route_blocks != (a.T + 127) / 128 || a.tiles_max < (a.T * a.topk + a.peer_rows + 127) / 128 + a.E_tiles)
    return fail(KOSMOS_ERR_INVALID, "moe sm90: route_blocks / tiles_max do not match T, topk, E");
  if (a.ce_flags && a.E_tiles == a.E) return fail(KOSMOS_ERR_INVALID, "moe sm90: copy-engine flags without peers");
  if (a.ctr_words < KOSMOS_MOE_CTR_HEAD + 3 * a.tiles_max + 2 * a.route_blocks + a.E_tiles + KOSMOS_MOE_FOLD_GROUPS + 1)
    return fail(KOSMOS_ERR_INVALID, "moe sm90: ctr_words too small");
  Params& P = *static_cast<Params*>(h);
  P.a = a;
  const int rows_s = a.tiles_max * 128;
#if !KOSMOS_MOE_PINGPONG
  P.bp = Builder::make_params(a.x, wr_t, a.y, a.T, 256, a.H);
#endif
  P.route = Builder::make_grouped_params(a.x, a.T, 1, int64_t(a.T) * a.H, wr_t, 256, a.H, 1);
  P.up = Builder::make_grouped_params(a.xs, rows_s, 1, int64_t(rows_s) * a.H, w1_t, 2 * a.F, a.H, a.E_tiles);
  P.down = Builder::make_grouped_params(a.hs, rows_s, 1, int64_t(rows_s) * a.F, w2_t, a.H, a.F, a.E_tiles);
  if (a.Fs) {
    P.sh_up = Builder::make_grouped_params(a.x, a.T, 1, int64_t(a.T) * a.H, ws1_t, 2 * a.Fs, a.H, 1);
    P.sh_down = Builder::make_grouped_params(a.hsh, a.T, 1, int64_t(a.T) * a.Fs, ws2_t, a.H, a.Fs, 1);
  } else {
    P.sh_up = P.route;
    P.sh_down = P.route;
  }
  return KOSMOS_OK;
}

int kosmos_moe_max_wgs(int device, int* out) {
  namespace m = kosmos::moe;
  return kosmos::sm90_co_resident(reinterpret_cast<const void*>(m::moe_fwd_sm90_kernel), m::kThreads, m::kSmemBytes,
                                  device, out, "MoE sm90 kernel");
}

// One cooperative launch of the whole forward on `stream` (no synchronisation).
int kosmos_moe_launch(void* h, void* stream) {
  if (!h) return fail(KOSMOS_ERR_INVALID, "moe sm90: null handle");
  Params& P = *static_cast<Params*>(h);
  static int co[64];
  namespace m = kosmos::moe;
  return kosmos::cooperative_launch(reinterpret_cast<const void*>(m::moe_fwd_sm90_kernel), m::kThreads, m::kSmemBytes,
                                    P, P.a.grid, stream, co, "moe sm90");
}

}  // extern "C"
