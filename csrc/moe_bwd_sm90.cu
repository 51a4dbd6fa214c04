// moe_bwd_sm90.cu — the MoE expert layer's backward in ONE cooperative persistent launch
// (sm_90a): given dy and the saved state of the forward (csrc/moe_fwd_sm90.cu, run with its
// pre-activations saved: moe_params.h gus / gush), every gradient of the layer: dx, the router's
// dWr, the experts' dW1 / dW2 and the shared expert's dWs1 / dWs2 (docs/moe.md, "Backward").
//
// Notation (one executed rank, or all W ranks of the local fabric at once, as the forward): a
// choice (t, j) of token t has expert e = routes[t][j], weight w_tj, sorted row pos(t, j)
// (moe_common.cuh pos_of: the forward's placement); g/u the gate/up pre-activations of a row,
// h = silu(g) * u, o = h @ W2_e^T its expert output (the forward's os), y_t = sum_j w_tj o_tj
// (+ shared). Backward:
//   dO[pos]  = w_tj * dy_t                     upstream gradient of the expert output rows
//   dw_tj    = <dy_t, o_tj>                    combine-weight gradient (fp32, fixed lane order)
//   dlogits  = softmax / sigmoid backward of the renormalised chosen weights (moe_math.weights_for)
//   dh       = dO @ W2_e;  [dg | du] = SwiGLU'(g, u) * dh (the DH tile's epilogue)
//   dxs      = [dg | du] @ W1_e                input gradient of each sorted row
//   dW2_e    = dO_e^T @ h_e;  dW1_e = [dg | du]_e^T @ xs_e   (over the expert's rows: one tile
//                                               sums them all, tokens as K, no split-K)
//   dWr_r    = dlogits_r^T @ x_r;  dxr = dlogits @ Wr
//   shared:  dh_s = dy @ Ws2, [dg|du]_s, dxsh = [dg|du]_s @ Ws1, dWs2_r = dy_r^T @ hsh_r,
//            dWs1_r = [dg|du]_s,r^T @ x_r
//   dx_t     = sum over j = 0..k-1 in that order of dxs[pos(t, j)] + dxr_t + dxsh_t   (FOLD)
//
// Items (KosmosMoeBwdKind, moe_bwd_params.h), claimed in this order by one atomic per claim
// (policy self). Every item waits only for items earlier in the order, so with every CTA
// co-resident (cooperative launch) the earliest unfinished item can always progress:
//
//   SHARED_DH mb,n   math   no wait                         -> sdh_done[mb]
//   GATHER b         math   no wait: 32 tokens' dO rows, dw, dlogits rows -> arrived[tile], lg_done[blk]
//                           (host fabric only: without peers the movers gather, below)
//   PEER_GATHER b    loader no wait (host fabric): 32 peer rows' dO from pinned host memory -> arrived[tile]
//   PAD e            loader no wait: zero dO rows of e's last tile beyond its rows -> arrived[tile]
//   SHARED_WG2 r,m,n math   no wait
//   DH q,n           math   arrived[g] == 128 (g = the forward's tile_order[q]) -> dh_done[g]
//   DXR mb,n         math   lg_done[mb] == tokens of the block                  -> xr_done[mb]
//   DWR r,m,n        math   lg_done of rank r's blocks
//   DX q,n           math   dh_done[g] == F-tiles (raster_tile order)           -> dx_done[g]
//   PEER_COMBINE b   loader dx_done of its rows' tiles (host fabric: their dx rows -> the peers, pinned host)
//   SHARED_DX mb,n   math   sdh_done[mb]                                        -> sdx_done[mb]
//   WG2 e,m,n        math   arrived of every tile of e
//   SHARED_WG1 r,m,n math   sdh_done of rank r's blocks
//   WG1 e,m,n        math   dh_done of every tile of e
//   FOLD slot        math   a FOLD b from the fold counter (the movers claim from it too): dx_done
//                           of its choices' tiles, xr_done, sdx_done (the folding threads wait)
//
// Without peers (world 1, local: every choice has its row here) the loader warpgroup's warps 2-3
// are movers with their own claim counters, as the forward's: GATHER items of 32 sorted rows of a
// tile in queue order (dO rows, dw_tj into dwc -> arrived[tile], dw_done[blk]), then LOGITS items
// of 32 tokens (their dlogits rows once dw_done has all their choices -> lg_done[blk]), beside the
// math warps' shared-expert and DH tiles: a DH starts once its own tile's rows are in instead of
// after the whole token-major gather; then FOLD items beside the weight-gradient tiles, so little
// of the fold is left after the last tile. Same dO rows, dw, dlogits and dx, bitwise.
//
// Host fabric (rank-0 view, ops/moe_host_bwd.py): a choice of a remote expert has its row in the
// owner's buffers (the forward's ref_slot; -1: the reference routing made no such choice, nothing
// moves): GATHER writes its upstream row to send_gout and takes dw from the owner's output
// (send_out), FOLD adds the owner's input gradient (send_dx); the peers' rows on the experts here
// follow their own rows in each segment (as in the forward): PEER_GATHER brings their upstream
// rows, PEER_COMBINE sends their input gradients back. All from inside the launch.
//
// Determinism: no atomics in any reduction (counters only count). Every sum has one owner and
// a fixed order: a GEMM tile's k-blocks in order in one CTA (the weight gradients sum an
// expert's rows, a rank's tokens, in sorted = token order), dw by a fixed lane split and
// butterfly, dx by j order: weight gradients and dx are bitwise identical across calls.
//
// Math warpgroups, two builds of this file (KosmosConfig.math_wgs; libs.MOE_BWD_SM90 / MOE_BWD_SM90_PP;
// the slower is deleted once both are timed): joint (KOSMOS_MOE_PINGPONG 0), the two on one
// 128 x 256 tile together; ping-pong (1), as the forward (builder_sm90.cuh PingpongBuilderSm90; the plan and
// its reason: docs/notes/pingpong-plan.md). Both pop every item of the ring; item j is warpgroup
// j % 2's, which runs its 128 x 128 tile alone (the other skips its mainloop stages) and releases
// its counter; the two take turns for their MMAs (named barriers kBarTurn0 + wg: a warpgroup
// waits for its turn before a tile's first wgmma and hands it over once the tile's last one is
// issued), so the epilogue of item j (DH's SwiGLU backward above all: ~30 of a cooperative DH
// tile's 79 us, qwen3, H100) runs under item j + 1's mainloop. GATHER and FOLD (no mainloop)
// run on both warpgroups together (256 threads, kBarMath, as before): the owner takes and hands
// over the turn at once. Every tile is 128 x 128 (kBN), so the n-tile counts (Layout nF / nH /
// nFs) are twice the joint form's; every layout the Python side passes is unchanged (the
// DH epilogue reads g / u in their natural columns, so no [gate | up] pairing is needed).
//
// Two builder types (A row-major: the dgrad GEMMs; A column-major: the wgrad GEMMs, tokens as
// K) share ONE SharedStorage and mainloop ring: the loader hands its write state, the math
// warps (ping-pong: each math warpgroup) their read state, to the builder of the next tile's type
// (builder_sm90.cuh write_state / read_state). Block layout, ring, watchdog, trace and exit protocol as the
// forward kernel (see its header comment).
#include <cuda_runtime.h>

#include <new>

#include "kosmos/builder_sm90.cuh"
#include "kosmos/host_error.h"
#include "kosmos/host_launch.h"
#include "kosmos/moe_bwd_params.h"
#include "kosmos/moe_common.cuh"
#include "kosmos/sync.cuh"
#include "kosmos/trace.cuh"

// The math warpgroups' schedule of this build (module doc): 0 joint (libs.MOE_BWD_SM90), 1 ping-pong
// (libs.MOE_BWD_SM90_PP).
#ifndef KOSMOS_MOE_PINGPONG
#define KOSMOS_MOE_PINGPONG 0
#endif

namespace kosmos {
namespace moe_bwd {

using moe::acc_col;
using moe::acc_row;
using moe::add_bf16x8;
using moe::fold_rows;
using moe::ldcg;
using moe::named_bar_sync;
using moe::pos_of;
using moe::store_bf16x8;
using moe::warp_sum;

#if KOSMOS_MOE_PINGPONG
// 128 x 128 tiles a math warpgroup, 6 stages of 32 KB (the ring bytes of the joint form's
// 4 x 48 KB: the shared memory is unchanged)
using BuilderN = sm90::PingpongBuilderSm90<128, 6>;  // A row-major: dgrad GEMMs
using BuilderT = sm90::PingpongBuilderSm90<128, 6, cutlass::layout::ColumnMajor>;  // A column-major: wgrad GEMMs
#else
using BuilderN = sm90::BuilderSm90<128, 256, 64, 4, true>;  // A row-major: dgrad GEMMs
using BuilderT = sm90::BuilderSm90<128, 256, 64, 4, true, 1, cutlass::layout::RowMajor,
                                   cutlass::layout::ColumnMajor>;  // A column-major: wgrad GEMMs
#endif
static_assert(sizeof(BuilderN::SharedStorage) == sizeof(BuilderT::SharedStorage) &&
                  alignof(BuilderN::SharedStorage) == alignof(BuilderT::SharedStorage) &&
                  sizeof(BuilderN::Mainloop::TensorStorage) == sizeof(BuilderT::Mainloop::TensorStorage),
              "the two builder types must share one SharedStorage (same ring, same epilogue staging)");
static_assert(cute::is_same_v<BuilderN::PipelineState, BuilderT::PipelineState> &&
                  cute::is_same_v<BuilderN::MainloopPipeline, BuilderT::MainloopPipeline>,
              "the two builder types must share one pipeline");
using Ring = sm90::ItemRing<4, int>;  // (kind << 24) | index, -1 = no more work
constexpr int kThreads = BuilderN::kNumThreads;
constexpr int kLoaderThreads = 128;
// Without peers (Layout::mg) the loader warpgroup's halves: warps 0-1 run the claim sequence
// (thread kSched claims, warp 0 issues the math items' TMA loads, both run PAD), warps 2-3 the movers.
constexpr int kMainThreads = 64;
constexpr int kMoverThreads = 64;
constexpr int kBarMover = 10;
constexpr int kBM = BuilderN::kBM, kBN = BuilderN::kBN, kBK = BuilderN::kBK;
static_assert(kBM == moe::kMoeBM, "expert tiles are the forward's 128 rows");
constexpr int kTB = KOSMOS_MOE_TOK_BLOCK;
static_assert(kBM % kTB == 0, "a token block of GATHER / FOLD lies in one 128-token block");
constexpr int kBarLoader = 8;
constexpr int kBarMath = 9;  // both math warpgroups (256 threads)
#if KOSMOS_MOE_PINGPONG
constexpr int kBarWg0 = 11;    // + wg: one math warpgroup's own barrier (128 threads)
constexpr int kBarTurn0 = 13;  // + wg: warpgroup wg's MMA turn (the other arrives, wg syncs: 256)
#endif
constexpr int kSched = 32;
constexpr int kLoaderRegs = 104;
constexpr int kMathRegs = 200;
static_assert(128 * kLoaderRegs + 256 * kMathRegs <= 384 * 168, "setmaxnreg beyond the CTA's registers");
#if KOSMOS_MOE_PINGPONG
static_assert(kBN == 128 && BuilderN::kAccum == 128 && BuilderT::kAccum == 128,
              "the epilogues below assume 128 x 128 warpgroup tiles");
#endif
// Trace roles of this kernel (kosmos_bench/kernels/moe_bwd_sm90.py ROLE_CODES).
enum BwdRole : uint16_t {
  kRoleGather = 0,   // combine backward: dO rows, dw, dlogits rows (and PAD)
  kRoleDgrad = 1,    // expert dgrad tiles (DH with the SwiGLU backward, DX)
  kRoleWgrad = 2,    // expert wgrad tiles
  kRoleRouter = 3,   // router dgrad / wgrad tiles
  kRoleShared = 4,   // the shared expert's tiles
  kRoleFold = 5,     // dx = sum over the choices (+ router, shared)
  kRoleCombine = 6,  // host fabric: the peers' rows' input gradients out
};

// A FOLD's staging (run_fold): the dxs row of each choice of its tokens, and a failed wait (reset
// by the fold's thread 0 before the waits), one for the math warps' folds and one for the movers'.
struct FoldSmem {
  const bf16* src[kTB * KOSMOS_MOE_MAX_TOPK];
  int bad;
};

struct Shared {
  BuilderN::SharedStorage builder;
  Ring::SharedStorage ring;
  int cmd[2];
  int mcmd;  // the movers' claim (mover_loop)
  int last;
  int bad;  // PEER_COMBINE: some thread's wait failed (reset by the scheduler with each claim)
  int mem_done;  // GATHER / FOLD items the math warps finished (moe_common.cuh next_loader_item)
  FoldSmem fold, mfold;  // FOLD by the math warps / by the movers
};
constexpr int kSmemBytes = int(sizeof(Shared));
static_assert(kSmemBytes <= 227 * 1024, "MoE backward kernel shared memory exceeds 227 KB");

struct Params {
  KosmosMoeBwdArgs a;
#if !KOSMOS_MOE_PINGPONG
  BuilderN::Params bpn;
  BuilderT::Params bpt;
#endif
  BuilderN::Mainloop::Params dh, dx, dxr, sdh, sdx;    // A row-major
  BuilderT::Mainloop::Params wg2, wg1, dwr, swg2, swg1;  // A column-major
};
static_assert(sizeof(Params) <= 32000, "kernel parameters must fit the 32 KB parameter space");

__host__ __device__ __forceinline__ int cdiv(int a, int b) { return (a + b - 1) / b; }

// The claim sequence: per kind, its first claim index and its count; the tile counts.
// No peers (world 1, local: every choice has its row here): the movers gather (no GATHER items
// in the claim sequence). Computed where used: not a register held across the items.
__host__ __device__ __forceinline__ bool movers_gather(const KosmosMoeArgs& f) {
  return f.E_tiles == f.E && f.peer_rows == 0;
}

struct Layout {
  int begin[KOSMOS_MOE_BWD_NUM_KINDS + 1];
  int nF, nH, nFs;      // kBN-wide n-tiles of F, H, Fs (0 without a shared expert)
  int mH, mF2, mFs2, mE;  // 128-row m-tiles of H, 2F, 2Fs, E8 (the wgrad outputs' rows)
  __host__ __device__ Layout(const KosmosMoeBwdArgs& a) {
    const KosmosMoeArgs& f = a.f;
    const bool mg = movers_gather(f);
    nF = cdiv(f.F, kBN);
    nH = cdiv(f.H, kBN);
    nFs = cdiv(f.Fs, kBN);
    mH = cdiv(f.H, kBM);
    mF2 = cdiv(2 * f.F, kBM);
    mFs2 = cdiv(2 * f.Fs, kBM);
    mE = cdiv(a.E8, kBM);
    const int nb = f.route_blocks, tb = cdiv(f.T, kTB), tm = f.tiles_max, W = a.W;
    const int pb = cdiv(f.peer_rows, kTB);
    const int sh = f.Fs ? 1 : 0;
    const int n[KOSMOS_MOE_BWD_NUM_KINDS] = {sh * nb * nFs,      mg ? 0 : tb,  pb,      f.E_tiles,   sh * W * mH * nFs,
                                             tm * nF,            nb * nH,      W * mE * nH,          tm * nH,
                                             pb,                 sh * nb * nH, f.E_tiles * mH * nF,
                                             sh * W * mFs2 * nH, f.E_tiles * mF2 * nH,               tb};
    begin[0] = 0;
    for (int k = 0; k < KOSMOS_MOE_BWD_NUM_KINDS; ++k) begin[k + 1] = begin[k] + n[k];
  }
  __host__ __device__ int count(int k) const { return begin[k + 1] - begin[k]; }
  __device__ int kind_of(int c) const {
    int k = 0;
    while (k < KOSMOS_MOE_BWD_NUM_KINDS - 1 && c >= begin[k + 1]) ++k;
    return k;
  }
};

struct Ctx {
  const KosmosMoeBwdArgs& a;
  SyncCtx sc;
  __device__ Ctx(const KosmosMoeBwdArgs& a_, int block) : a(a_) {
    sc = SyncCtx{ld_relaxed(a.state) + 1, a.state, static_cast<KosmosErrorRecord*>(a.err), a.timeout_ns, false, 0,
                 block, static_cast<uint32_t>(a.spin_ns)};
  }
  // the counter arrays (computed from the parameters where used: no registers held across items)
  __device__ uint32_t* arrived() const { return a.ctr + KOSMOS_MOE_BWD_CTR_HEAD; }
  __device__ uint32_t* dh_done() const { return arrived() + a.f.tiles_max; }
  __device__ uint32_t* dx_done() const { return dh_done() + a.f.tiles_max; }
  __device__ uint32_t* lg_done() const { return dx_done() + a.f.tiles_max; }
  __device__ uint32_t* xr_done() const { return lg_done() + a.f.route_blocks; }
  __device__ uint32_t* sdh_done() const { return xr_done() + a.f.route_blocks; }
  __device__ uint32_t* sdx_done() const { return sdh_done() + a.f.route_blocks; }
  __device__ uint32_t* dw_done() const { return sdx_done() + a.f.route_blocks; }
  // wait until *f >= target (count); the error record names the counter word
  __device__ bool wait(const uint32_t* f, uint32_t target, int kind, int item) const {
    return wait_flag(sc, f, target, kind, item, 0, int(f - a.ctr));
  }
  // tokens of 128-token block mb
  __device__ uint32_t block_tokens(int mb) const { return uint32_t(min(kBM, a.f.T - mb * kBM)); }
};

// The forward's segment of expert e (< E_tiles): its rows (own, then the peers' on the host
// fabric), first sorted tile and tile count (0: no rows; its weight gradients are zero).
struct ExpertTiles {
  int first, n, rows;
};
__device__ __forceinline__ ExpertTiles expert_tiles(const KosmosMoeArgs& f, int e) {
  const int rows = ldcg(f.own_total + e) + (f.peer_rows ? f.peer_total[e] : 0);
  return ExpertTiles{ldcg(f.seg_start + e) / kBM, cdiv(rows, kBM), rows};
}

// 128-token blocks holding rank r's tokens [r*T1, (r+1)*T1)
__device__ __forceinline__ void rank_blocks(const KosmosMoeBwdArgs& a, int r, int* b0, int* b1) {
  *b0 = r * a.T1 / kBM;
  *b1 = ((r + 1) * a.T1 - 1) / kBM + 1;
}

// ------------------------------------------------------------------------------ scheduler
// Claim the next item (thread kSched): returns (kind << 24 | index) with its dependencies
// acquired, or -1 when the sequence is exhausted or the call aborted.
__device__ int decide(const Ctx& c, const Layout& L) {
  const KosmosMoeBwdArgs& a = c.a;
  const KosmosMoeArgs& f = a.f;
  for (;;) {
    if (aborted(c.sc)) return -1;
    const int k = int(atomicAdd(a.ctr + KOSMOS_MOE_BWD_CTR_CLAIM, 1u));
    if (k >= L.begin[KOSMOS_MOE_BWD_NUM_KINDS]) return -1;
    const int kind = L.kind_of(k);
    const int i = k - L.begin[kind];
    bool ok = true;
    switch (kind) {
      case KOSMOS_MOE_BWD_GATHER:
        if (a.debug_skip_gather) continue;  // watchdog test: no dO rows ever arrive
        break;
      case KOSMOS_MOE_BWD_DH:
      case KOSMOS_MOE_BWD_DX: {
        int q = i / L.nF, n;
        if (kind == KOSMOS_MOE_BWD_DX) moe::raster_tile(i, L.nH, f.tiles_max, &q, &n);
        if (q >= ldcg(f.meta)) continue;  // beyond the forward's tiles
        const int g = ldcg(f.tile_order + q);
        ok = kind == KOSMOS_MOE_BWD_DH ? c.wait(c.arrived() + g, uint32_t(kBM), kind, i)
                                       : c.wait(c.dh_done() + g, uint32_t(L.nF), kind, i);
        break;
      }
      case KOSMOS_MOE_BWD_DXR: {
        const int mb = i / L.nH;
        ok = c.wait(c.lg_done() + mb, c.block_tokens(mb), kind, i);
        break;
      }
      case KOSMOS_MOE_BWD_SHARED_DX:
        ok = c.wait(c.sdh_done() + i / L.nH, uint32_t(L.nFs), kind, i);
        break;
      case KOSMOS_MOE_BWD_DWR:
      case KOSMOS_MOE_BWD_SHARED_WG1: {
        const int r = i / (kind == KOSMOS_MOE_BWD_DWR ? L.mE * L.nH : L.mFs2 * L.nH);
        int b0, b1;
        rank_blocks(a, r, &b0, &b1);
        for (int mb = b0; mb < b1 && ok; ++mb)
          ok = kind == KOSMOS_MOE_BWD_DWR ? c.wait(c.lg_done() + mb, c.block_tokens(mb), kind, i)
                                          : c.wait(c.sdh_done() + mb, uint32_t(L.nFs), kind, i);
        break;
      }
      case KOSMOS_MOE_BWD_WG2:
      case KOSMOS_MOE_BWD_WG1: {
        const int e = i / (kind == KOSMOS_MOE_BWD_WG2 ? L.mH * L.nF : L.mF2 * L.nH);
        const ExpertTiles et = expert_tiles(f, e);
        for (int g = et.first; g < et.first + et.n && ok; ++g)
          ok = kind == KOSMOS_MOE_BWD_WG2 ? c.wait(c.arrived() + g, uint32_t(kBM), kind, i)
                                          : c.wait(c.dh_done() + g, uint32_t(L.nF), kind, i);
        break;
      }
      case KOSMOS_MOE_BWD_FOLD: {
        // a slot: the item itself from the FOLD counter, which the movers claim from too; the
        // tiles of its choices are waited for by the folding threads (run_fold)
        const int fb = int(atomicAdd(a.ctr + KOSMOS_MOE_BWD_CTR_FOLD, 1u));
        if (fb >= L.count(kind)) continue;
        return (kind << 24) | fb;
      }
      default:  // SHARED_DH, PEER_GATHER, PAD, SHARED_WG2: inputs only; PEER_COMBINE: its threads wait
        break;
    }
    if (!ok) return -1;
    return (kind << 24) | i;
  }
}

// ------------------------------------------------------------------------------ memory items
// One choice's dO row and dw (one warp): d = bf16(w * y) chunk by chunk and dw = <y, o> (each
// lane sums its 16-byte chunks in order, then the warp's butterfly: the same bits whichever
// item, token-major or tile-major, gathers the row). kDepth chunks of y and o in flight per lane
// before their math and stores (a row is latency-bound): the movers take 8 (one at a time, their
// gather paced the DH tiles at ~200 GB/s), the math warps' host-fabric GATHER 4 (8 spilled 2.5 KB
// of the kernel). No row (row false: the host fabric's choice the reference routing did not make,
// moe_params.h ref_slot): dw 0.
template <int kDepth = 4>
__device__ __forceinline__ float gather_row(const int4* y, const int4* o, int4* d, float w, int chunks, int lane,
                                            bool row = true) {
  float part = 0.f;
  for (int ch0 = lane; ch0 < chunks && row; ch0 += 32 * kDepth) {
    int4 yv[kDepth], ov[kDepth];
#pragma unroll
    for (int u = 0; u < kDepth; ++u)
      if (ch0 + u * 32 < chunks) {
        yv[u] = __ldg(y + ch0 + u * 32);
        ov[u] = ld_cg_16(o + ch0 + u * 32);
      }
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      if (ch0 + u * 32 >= chunks) continue;
      const bf16* yh = reinterpret_cast<const bf16*>(&yv[u]);
      const bf16* oh = reinterpret_cast<const bf16*>(&ov[u]);
      int4 out;
      bf16* ob = reinterpret_cast<bf16*>(&out);
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const float yf = __bfloat162float(yh[q]);
        part = fmaf(yf, __bfloat162float(oh[q]), part);
        ob[q] = __float2bfloat16_rn(w * yf);
      }
      d[ch0 + u * 32] = out;
    }
  }
  return warp_sum(part);
}

// Token t's dlogits row (E8 bf16, zero where not chosen; one warp, lane j < k holding choice j's
// weight, dw and expert) from the router's backward (moe_math.weights_for):
//   softmax: w = p_j / sum_chosen p   ->  dl_j = w_j (dw_j - sum_i w_i dw_i)
//   sigmoid: w = scale s_j / S        ->  dl_j = (scale dw_j - sum_i w_i dw_i) / S * s_j (1 - s_j)
// The top-k selection itself has no gradient; logits of experts not chosen get 0.
__device__ __forceinline__ void write_dlogits(const KosmosMoeBwdArgs& a, int t, int lane, float my_w, float my_dw,
                                              int my_e) {
  const KosmosMoeArgs& f = a.f;
  const int k = f.topk;
  const float wdw = warp_sum(lane < k ? my_w * my_dw : 0.f);
  float dl;
  if (f.scoring == 0) {
    dl = my_w * (my_dw - wdw);
  } else {
    const float l = lane < k ? __ldg(f.logits + int64_t(t) * f.E + my_e) : 0.f;
    const float s = 1.f / (1.f + expf(-l));
    const float S = warp_sum(lane < k ? s : 0.f);
    dl = (f.scale * my_dw - wdw) / S * s * (1.f - s);
  }
  if (lane >= k) dl = 0.f;
  bf16* row = static_cast<bf16*>(a.dlogits) + int64_t(t) * a.E8;
  for (int c0 = 0; c0 < a.E8; c0 += 32) {  // uniform trip count: the shuffles see every lane
    const int col = c0 + lane;
    float v = 0.f;
    for (int j = 0; j < k; ++j) {
      const int ej = __shfl_sync(0xffffffffu, my_e, j);
      const float dj = __shfl_sync(0xffffffffu, dl, j);
      if (ej == col) v = dj;
    }
    if (col < a.E8) row[col] = __float2bfloat16_rn(v);
  }
}

// GATHER b (host fabric; the 256 math threads, as FOLD: 8 warps bring the dO rows in ~3x faster
// than the loader's 4 did, and no tile waits on the loader meanwhile): tokens 32b.., one warp per
// token. For each choice j (in order): the row dO[pos] = bf16(w_tj * dy_t) and dw_tj = <dy_t, o_tj>
// (gather_row); then the token's dlogits row (write_dlogits).
__device__ void run_gather(const Ctx& c, int b, int tid) {
  constexpr int kN = BuilderN::kNumMathThreads;
  const KosmosMoeBwdArgs& a = c.a;
  const KosmosMoeArgs& f = a.f;
  const int warp = tid / 32, lane = tid % 32;
  const int t0 = b * kTB;
  const int nt = min(kTB, f.T - t0);
  const int k = f.topk, H = f.H, chunks = H / 8;
  const bf16* dy = static_cast<const bf16*>(a.dy);
  const bf16* os = static_cast<const bf16*>(f.os);
  bf16* dos = static_cast<bf16*>(a.dos);
  for (int tl = warp; tl < nt; tl += kN / 32) {
    const int t = t0 + tl;
    const int4* dyr = reinterpret_cast<const int4*>(dy + int64_t(t) * H);
    float my_w = 0.f, my_dw = 0.f;
    int my_e = -1;
    for (int j = 0; j < k; ++j) {
      int e;
      const int pos = pos_of(f, t, j, &e);  // the same for every lane
      const bool here = e < f.E_tiles;      // else (host fabric): the owner's buffers, pinned host memory
      const float w = __ldcg(f.weights + int64_t(t) * k + j);
      const int4* o = reinterpret_cast<const int4*>(
          (here ? os : static_cast<const bf16*>(f.send_out[e / f.E_loc])) + int64_t(pos) * H);
      int4* d = reinterpret_cast<int4*>((here ? dos : static_cast<bf16*>(a.send_gout[e / f.E_loc])) + int64_t(pos) * H);
      const float part = gather_row(dyr, o, d, w, chunks, lane, pos >= 0);
      if (lane == j) {
        my_w = w;
        my_dw = part;
        my_e = e;
      }
      if (here) {
        __threadfence();
        __syncwarp();
        if (lane == 0) atomicAdd(c.arrived() + pos / kBM, 1u);
      }
    }
    write_dlogits(a, t, lane, my_w, my_dw, my_e);
  }
  __threadfence();
  named_bar_sync(kBarMath, kN);  // every token's dlogits row before the count
  if (tid == 0) atomicAdd(c.lg_done() + t0 / kBM, uint32_t(nt));
}

// The movers' GATHER (no peers; tile g, part): rows 32*part.. of sorted tile g, one warp per row:
// its choice c = sorted_choice[pos] (the forward's INDEX), the dO row and dw into dwc[c]
// (gather_row); each row counts in dw_done of its token's block (after the warp's rows). Returns
// how many rows.
__device__ int run_gather_rows(const Ctx& c, int g, int part, int mt) {
  constexpr int kWarps = kMoverThreads / 32;
  const KosmosMoeBwdArgs& a = c.a;
  const KosmosMoeArgs& f = a.f;
  const int r0 = part * kTB, r1 = min(ldcg(f.tile_rows + g), r0 + kTB);
  const int warp = mt / 32, lane = mt % 32;
  static_assert(kTB / kWarps <= 32, "a warp's rows of a GATHER item: one lane each");
  int my_t = -1;  // lane j: the token of the warp's j-th row
  for (int r = r0 + warp; r < r1; r += kWarps) {
    const int64_t pos = int64_t(g) * kBM + r;
    const int ci = ldcg(f.sorted_choice + pos);
    const int t = ci / f.topk;
    const float dw = gather_row<8>(reinterpret_cast<const int4*>(static_cast<const bf16*>(a.dy) + int64_t(t) * f.H),
                                   reinterpret_cast<const int4*>(static_cast<const bf16*>(f.os) + pos * f.H),
                                   reinterpret_cast<int4*>(static_cast<bf16*>(a.dos) + pos * f.H),
                                   __ldcg(f.weights + ci), f.H / 8, lane);
    if (lane == 0) a.dwc[ci] = dw;
    if (lane == (r - r0) / kWarps) my_t = t;
  }
  // one fence for the warp's rows (a fence a row held every row's stores in flight behind it)
  __threadfence();
  __syncwarp();
  if (my_t >= 0) atomicAdd(c.dw_done() + my_t / kBM, 1u);
  return max(0, r1 - r0);
}

// LOGITS b (movers, no peers): tokens 32b.., one warp per token, after every choice of their block
// has its dw: the dlogits rows from dwc (the values the token-major GATHER keeps in registers).
__device__ void run_logits(const Ctx& c, int b, int mt) {
  constexpr int kWarps = kMoverThreads / 32;
  const KosmosMoeBwdArgs& a = c.a;
  const KosmosMoeArgs& f = a.f;
  const int warp = mt / 32, lane = mt % 32, k = f.topk;
  const int t0 = b * kTB, nt = min(kTB, f.T - t0);
  for (int tl = warp; tl < nt; tl += kWarps) {
    const int64_t t = t0 + tl;
    const bool mine = lane < k;
    write_dlogits(a, int(t), lane, mine ? __ldcg(f.weights + t * k + lane) : 0.f,
                  mine ? __ldcg(a.dwc + t * k + lane) : 0.f, mine ? ldcg(f.routes + t * k + lane) : -1);
  }
}

// PAD e: the dO rows of e's last tile beyond its rows are zero (the wgrad dW2_e = dO_e^T @ h_e
// sums whole tiles); they count as arrived, so a tile is complete at 128.
__device__ void run_pad(const Ctx& c, int e, int tid, int nl) {
  const KosmosMoeBwdArgs& a = c.a;
  const KosmosMoeArgs& f = a.f;
  const ExpertTiles et = expert_tiles(f, e);
  if (et.n == 0) return;  // uniform over the nl threads
  const int warp = tid / 32, lane = tid % 32;
  const int p0 = et.first * kBM + et.rows, p1 = (et.first + et.n) * kBM;
  const int chunks = f.H / 8;
  for (int r = p0 + warp; r < p1; r += nl / 32) {
    int4* d = reinterpret_cast<int4*>(static_cast<bf16*>(a.dos) + int64_t(r) * f.H);
    for (int ch = lane; ch < chunks; ch += 32) d[ch] = make_int4(0, 0, 0, 0);
  }
  __threadfence();
  named_bar_sync(kBarLoader, nl);
  if (tid == 0 && p1 > p0) atomicAdd(c.arrived() + et.first + et.n - 1, uint32_t(p1 - p0));
}

// PEER_GATHER b (host fabric): the upstream gradients of peer rows 32b.. (pinned host memory,
// as the peers' combine backward made them) to their sorted rows (the forward's placement).
__device__ void run_peer_gather(const Ctx& c, int b, int tid, int nl) {
  const KosmosMoeBwdArgs& a = c.a;
  const KosmosMoeArgs& f = a.f;
  const int warp = tid / 32, lane = tid % 32;
  const int r1 = min(f.peer_rows, (b + 1) * kTB);
  for (int i = b * kTB + warp; i < r1; i += nl / 32) {
    const moe::PeerRow pr = moe::peer_row(f, i);
    const int4* src = reinterpret_cast<const int4*>(static_cast<const bf16*>(a.recv_gout[pr.p]) + int64_t(pr.ip) * f.H);
    moe::copy_row(reinterpret_cast<int4*>(static_cast<bf16*>(a.dos) + int64_t(pr.dst) * f.H), src, f.H / 8, lane);
    __threadfence();
    __syncwarp();
    if (lane == 0) atomicAdd(c.arrived() + pr.dst / kBM, 1u);
  }
}

// PEER_COMBINE b (host fabric): the input gradients of peer rows 32b.. back to the peers' recv_dx,
// each row once its tile's DX items are done (every thread waits for a share of the rows; a
// failed wait is shared through s.bad so that all nl threads take the same path).
__device__ void run_peer_combine(const Ctx& c, const Layout& L, Shared& s, int b, int tid, int nl) {
  const KosmosMoeBwdArgs& a = c.a;
  const KosmosMoeArgs& f = a.f;
  const int warp = tid / 32, lane = tid % 32;
  const int r1 = min(f.peer_rows, (b + 1) * kTB);
  bool ok = true;
  for (int i = b * kTB + tid; i < r1 && ok; i += nl)
    ok = c.wait(c.dx_done() + moe::peer_row(f, i).dst / kBM, uint32_t(L.nH), KOSMOS_MOE_BWD_PEER_COMBINE, b);
  if (!ok) s.bad = 1;
  named_bar_sync(kBarLoader, nl);
  const bool bad = s.bad != 0;
  for (int i = b * kTB + warp; i < r1 && !bad; i += nl / 32) {
    const moe::PeerRow pr = moe::peer_row(f, i);
    const int4* src = reinterpret_cast<const int4*>(static_cast<const bf16*>(a.dxs) + int64_t(pr.dst) * f.H);
    moe::copy_row(reinterpret_cast<int4*>(static_cast<bf16*>(a.recv_dx[pr.p]) + int64_t(pr.ip) * f.H), src, f.H / 8,
                  lane);
  }
  named_bar_sync(kBarLoader, nl);  // s.bad read by every thread
}

// FOLD b by kN threads (the 256 math threads, whose registers keep 8 choices' loads in flight
// per thread; or the 64 movers, once they have no GATHER / LOGITS left, while the math warps run
// the weight-gradient tiles): every thread waits for a share of the block's choices' DX tiles
// (watchdog), thread 0 for the router's and the shared expert's dx tiles; then dx_t = sum_j
// dxs[pos(t, j)] in j order + dxr_t + dxsh_t, fp32, one bf16 rounding (bitwise the same whoever
// folds). A failed wait (abort) is shared through fs.bad so that all kN threads take the same
// path through the barriers; returns false then.
template <int kN>
__device__ bool run_fold(const Ctx& c, const Layout& L, FoldSmem& fs, int b, int tid, int bar) {
  const KosmosMoeBwdArgs& a = c.a;
  const KosmosMoeArgs& f = a.f;
  const int t0 = b * kTB;
  const int nt = min(kTB, f.T - t0);
  const int k = f.topk;
  const bf16* dxs = static_cast<const bf16*>(a.dxs);
  if (tid == 0) fs.bad = 0;
  named_bar_sync(bar, kN);
  bool ok = true;
  for (int p = tid; p < nt * k; p += kN) {
    const int t = t0 + p / k, j = p % k;
    int e;
    const int pos = pos_of(f, t, j, &e);
    const bool here = e < f.E_tiles;  // else: the owner's input gradient of this row, static in pinned host memory
    fs.src[p] = pos < 0 ? nullptr
                        : (here ? dxs : static_cast<const bf16*>(a.send_dx[e / f.E_loc])) + int64_t(pos) * f.H;
    if (ok && here) ok = c.wait(c.dx_done() + pos / kBM, uint32_t(L.nH), KOSMOS_MOE_BWD_FOLD, b);
  }
  if (tid == 0 && ok) ok = c.wait(c.xr_done() + t0 / kBM, uint32_t(L.nH), KOSMOS_MOE_BWD_FOLD, b);
  if (tid == 0 && ok && f.Fs) ok = c.wait(c.sdx_done() + t0 / kBM, uint32_t(L.nH), KOSMOS_MOE_BWD_FOLD, b);
  if (!ok) fs.bad = 1;
  named_bar_sync(bar, kN);
  const bool bad = fs.bad != 0;
  const int chunks = f.H / 8;
  const bf16* dxr = static_cast<const bf16*>(a.dxr);
  const bf16* dxsh = static_cast<const bf16*>(a.dxsh);
  bf16* dx = static_cast<bf16*>(a.dx);
  // the router's and the shared expert's rows, then up to 8 choices' loads in flight before they
  // are added; adds in j order, then the router's, then the shared expert's
  for (int w = tid; w < nt * chunks && !bad; w += kN) {
    const int tl = w / chunks, ch = w % chunks;
    const int64_t t = t0 + tl;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const int4 vr = ld_cg_16(dxr + t * f.H + ch * 8);
    const int4 vs = f.Fs ? ld_cg_16(dxsh + t * f.H + ch * 8) : make_int4(0, 0, 0, 0);
    fold_rows<false>(acc, fs.src + tl * k, nullptr, k, ch * 8);
    add_bf16x8(acc, vr);
    if (f.Fs) add_bf16x8(acc, vs);
    store_bf16x8(dx + t * f.H + ch * 8, acc);
  }
  named_bar_sync(bar, kN);  // fs.src and fs.bad read by every thread
  return !bad;
}

// ------------------------------------------------------------------------------ math items
#if KOSMOS_MOE_PINGPONG
// Accumulator layout: moe_common.cuh acc_row / acc_col, per m64 half of a warpgroup's 128 x 128
// tile (builder_sm90.cuh PingpongBuilderSm90: value v = 64 h + a, rows 64 h + acc_row(t, a)).
//
// The SwiGLU backward epilogue of a dh tile (rows 0..127 of the tile, h columns n*128..):
//   a = silu(g) u:  dg = dh u sig(g) (1 + g (1 - sig(g))),  du = dh silu(g)
// with g, u the saved pre-activations (natural layout: row stride 2Fw, up at +Fw) at `pre`, the
// result [dg | du] at `dpre` (same layout). Rows >= rows: zero (zero_pad: the expert tile's pad
// rows, so that the wgrad over whole tiles adds nothing) or untouched (the shared expert's
// token tail, beyond the buffer). g / u come in and [dg | du] go out through the builder's
// epilogue staging (each warp its 16 rows of each m64 half, 32 columns of g and of u at a time,
// 16-byte loads and stores, the next chunk's loads in flight while this one computes): element
// by element from the accumulator's positions they were 64 dependent round trips to memory a
// tile. The tile's dh columns are natural h columns and g / u are read from memory, so the
// ping-pong's 128-wide tiles need no [gate | up] column pairing (unlike the forward's UP).
constexpr int kEpiRow = 144;  // bytes a staging row: 32 g + 32 u bf16 (128 B) + 16 B against bank conflicts
constexpr int kChunk = 32;    // columns of g (and of u) a chunk
static_assert(BuilderN::kEpiWgBytes >= 4 * 16 * kEpiRow, "the SwiGLU epilogue stages 16 rows a warp of the warpgroup");

// L2 prefetch of the tile's g / u slices (thread t of the item's warpgroup: row t, g and u; before
// the turn and the MMAs: the epilogue's loads then hit L2)
__device__ __forceinline__ void swiglu_prefetch(int t, int n, int Fw, int rows, const bf16* pre) {
  if (t >= rows || n * kBN >= Fw) return;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const char* p = reinterpret_cast<const char*>(pre + int64_t(t) * 2 * Fw + half * Fw + n * kBN);
#pragma unroll
    for (int l = 0; l < kBN * 2 / 128; ++l) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + 128 * l));
  }
}

// The item's warpgroup (thread t; epi: its half of the staging, builder epilogue_smem(wg)).
// Fw % 128 == 0 (validate): every chunk of the tile lies inside the Fw columns.
template <class Accum>
__device__ __forceinline__ void swiglu_bwd_store(Accum const& acc, uint8_t* epi, int t, int n, int Fw, int rows,
                                                 const bf16* pre, bf16* dpre, bool zero_pad) {
  const int64_t ld = 2 * int64_t(Fw);
  const int lane = t % 32, warp = t / 32;
  uint8_t* stage = epi + warp * 16 * kEpiRow;
  const int seg = lane % 8;  // the lane's 16 bytes of a staging row: g 0..3, u 4..7
  const int64_t seg_col = (seg < 4 ? 0 : Fw) + (seg % 4) * 8;
  constexpr int kPerHalf = kBN / kChunk;  // chunks of an m64 half's 16 rows (this warp's)
  constexpr int kChunks = 2 * kPerHalf;   // chunk q: half q / kPerHalf, columns 32 (q % kPerHalf)..
  int4 in[4];
  auto load = [&](int q) {
    const int row0 = 64 * (q / kPerHalf) + 16 * warp;  // acc_row(t, a) + 64 h - (lane / 4) - 8 ((a / 2) % 2)
    const int col0 = n * kBN + (q % kPerHalf) * kChunk;
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      const int r = row0 + it * 4 + lane / 8;
      in[it] = r < rows ? __ldg(reinterpret_cast<const int4*>(pre + r * ld + col0 + seg_col)) : make_int4(0, 0, 0, 0);
    }
  };
  load(0);
#pragma unroll
  for (int q = 0; q < kChunks; ++q) {
    const int h = q / kPerHalf, c = q % kPerHalf;
    const int row0 = 64 * h + 16 * warp;
    const int col0 = n * kBN + c * kChunk;
#pragma unroll
    for (int it = 0; it < 4; ++it)
      *reinterpret_cast<int4*>(stage + (it * 4 + lane / 8) * kEpiRow + seg * 16) = in[it];
    __syncwarp();
    if (q + 1 < kChunks) load(q + 1);
#pragma unroll
    for (int b = 0; b < kChunk / 8; ++b) {
#pragma unroll
      for (int hrow = 0; hrow < 2; ++hrow) {
        // values v, v + 1: one row, two columns (half h, atom value (c * 4 + b) * 4 + 2 hrow)
        const int v = h * BuilderN::kAtomVals + (c * (kChunk / 8) + b) * 4 + 2 * hrow;
        const int rr = lane / 4 + 8 * hrow;
        const int off = rr * kEpiRow + (b * 8 + 2 * (lane % 4)) * 2;
        __nv_bfloat162* gp = reinterpret_cast<__nv_bfloat162*>(stage + off);
        __nv_bfloat162* up = reinterpret_cast<__nv_bfloat162*>(stage + off + 64);
        const __nv_bfloat162 g2 = *gp, u2 = *up;
        float dg[2], du[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float g = __bfloat162float(e ? g2.y : g2.x), u = __bfloat162float(e ? u2.y : u2.x);
          const float dh = acc(v + e);
          const float sg = __frcp_rn(1.f + __expf(-g));  // fast exp: DH tiles 79 -> 75 us (qwen3, H100)
          const bool pad = row0 + rr >= rows;
          dg[e] = pad ? 0.f : dh * u * sg * (1.f + g * (1.f - sg));
          du[e] = pad ? 0.f : dh * g * sg;
        }
        *gp = __floats2bfloat162_rn(dg[0], dg[1]);
        *up = __floats2bfloat162_rn(du[0], du[1]);
      }
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      const int rr = it * 4 + lane / 8, r = row0 + rr;
      if (r < rows || zero_pad)
        *reinterpret_cast<int4*>(dpre + r * ld + col0 + seg_col) =
            *reinterpret_cast<const int4*>(stage + rr * kEpiRow + seg * 16);
    }
    __syncwarp();
  }
}

template <class Accum>
__device__ __forceinline__ void zero_acc(Accum& acc) {
#pragma unroll
  for (int v = 0; v < BuilderN::kAccum; ++v) acc(v) = 0.f;
}

// Mainloop k-blocks of math item (kind, i): what produce_item loads for it, what its warpgroup
// computes on and the other warpgroup skips (both must agree, item by item). GATHER, FOLD: none.
__device__ __forceinline__ int item_kblocks(const KosmosMoeBwdArgs& a, const Layout& L, int kind, int i) {
  const KosmosMoeArgs& f = a.f;
  switch (kind) {
    case KOSMOS_MOE_BWD_SHARED_DH:
    case KOSMOS_MOE_BWD_DH:
      return f.H / kBK;
    case KOSMOS_MOE_BWD_DXR:
      return cdiv(a.E8, kBK);
    case KOSMOS_MOE_BWD_DX:
      return 2 * f.F / kBK;
    case KOSMOS_MOE_BWD_SHARED_DX:
      return 2 * f.Fs / kBK;
    case KOSMOS_MOE_BWD_SHARED_WG2:
    case KOSMOS_MOE_BWD_DWR:
    case KOSMOS_MOE_BWD_SHARED_WG1:
      return cdiv(a.T1, kBK);
    case KOSMOS_MOE_BWD_WG2:  // the expert's tiles, tokens as K (none: no rows, nothing loaded)
      return 2 * expert_tiles(f, i / (L.mH * L.nF)).n;
    case KOSMOS_MOE_BWD_WG1:
      return 2 * expert_tiles(f, i / (L.mF2 * L.nH)).n;
    default:
      return 0;
  }
}

// The wgrad tiles (tokens as K): A column-major, BuilderT; every other tile BuilderN.
__device__ __forceinline__ bool a_col_major(int kind) {
  return kind == KOSMOS_MOE_BWD_SHARED_WG2 || kind == KOSMOS_MOE_BWD_DWR || kind == KOSMOS_MOE_BWD_SHARED_WG1 ||
         kind == KOSMOS_MOE_BWD_WG2 || kind == KOSMOS_MOE_BWD_WG1;
}

using MmaTurn = moe::Turn<kBarTurn0, BuilderN::kWgThreads>;  // moe_common.cuh

// The math warpgroups (module doc): every item of the ring in order; item j is warpgroup j % 2's.
__device__ __forceinline__ void math_loop(const Ctx& c, const Layout& L, Shared& s, BuilderN& bn, BuilderT& bt, Ring& ring,
                                          Tracer& tr) {
  const KosmosMoeBwdArgs& a = c.a;
  const KosmosMoeArgs& f = a.f;
  const int m = int(threadIdx.x) - 128;  // math thread 0..255
  const int wg = m / BuilderN::kWgThreads, t = m % BuilderN::kWgThreads;
  const MmaTurn turn{wg};
  const int T = f.T, H = f.H, F = f.F, Fs = f.Fs;
  int j = 0;  // ring index of the item
  for (;; ++j) {
    const int item = ring.pop();
    if (item < 0) break;
    const int kind = item >> 24, i = item & 0xffffff;
    const bool mine = (j & 1) == wg;
    if (kind == KOSMOS_MOE_BWD_GATHER || kind == KOSMOS_MOE_BWD_FOLD) {
      // both warpgroups (their 256 threads' loads in flight, kBarMath); the owner passes the turn
      // at once. Each warpgroup finished its earlier items before the joint barrier, so the
      // FOLD's waits see the CTA's earlier tiles released, as in the cooperative form.
      if (mine) {
        turn.take(j);
        turn.give();
      }
      const uint64_t t0 = (m == 0) ? tr.now() : 0;
      if (kind == KOSMOS_MOE_BWD_GATHER) {
        run_gather(c, i, m);  // ends with kBarMath: every thread's stores before lg_done
      } else {
        run_fold<BuilderN::kNumMathThreads>(c, L, s.fold, i, m, kBarMath);  // an abort: the claims end
      }
      if (m == 0) {  // after the routine's last kBarMath: all 256 threads are done with it
        atomicAdd(&s.mem_done, 1);
        tr.add(kind == KOSMOS_MOE_BWD_GATHER ? kRoleGather : kRoleFold, item, t0, tr.now());
      }
      continue;
    }
    const int nk = item_kblocks(a, L, kind, i);
    if (!mine) {  // the other warpgroup's tile: skip its stages (the read state held between tiles is bn's)
      bn.skip_k(nk);
      continue;
    }
    const uint64_t t0 = (t == 0) ? tr.now() : 0;
    // DH / SHARED_DH: the L2 prefetch of the epilogue's g / u before the turn and the MMAs
    if (kind == KOSMOS_MOE_BWD_DH) {
      const int g = ldcg(f.tile_order + i / L.nF);
      swiglu_prefetch(t, i % L.nF, F, ldcg(f.tile_rows + g), static_cast<const bf16*>(f.gus) + int64_t(g) * kBM * 2 * F);
    } else if (kind == KOSMOS_MOE_BWD_SHARED_DH) {
      const int mb = i / L.nFs;
      swiglu_prefetch(t, i % L.nFs, Fs, T - mb * kBM, static_cast<const bf16*>(f.gush) + int64_t(mb) * kBM * 2 * Fs);
    }
    // the tile's MMAs, one call site per A layout (not one per kind: less code, fewer registers
    // live across the cases): take the turn, hand it on once the last wgmma is issued
    auto acc = BuilderN::make_accum();
    static_assert(cute::is_same_v<decltype(acc), decltype(BuilderT::make_accum())>, "one accumulator type");
    turn.take(j);
    if (nk == 0) {  // an expert without rows (WG1 / WG2): nothing was loaded (the loader skipped the tile too)
      turn.give();
      zero_acc(acc);
    } else if (a_col_major(kind)) {
      bt.read_state() = bn.read_state();
      bt.mma_k(acc, nk, [&] { turn.give(); });
      bn.read_state() = bt.read_state();
    } else {
      bn.mma_k(acc, nk, [&] { turn.give(); });
    }
    uint32_t* rel = nullptr;
    uint16_t role = kRoleDgrad;
    switch (kind) {
      case KOSMOS_MOE_BWD_SHARED_DH: {
        const int mb = i / L.nFs, n = i % L.nFs;
        const int64_t o = int64_t(mb) * kBM * 2 * Fs;
        swiglu_bwd_store(acc, bn.epilogue_smem(wg), t, n, Fs, T - mb * kBM, static_cast<const bf16*>(f.gush) + o,
                         static_cast<bf16*>(a.dgush) + o, false);
        rel = c.sdh_done() + mb;
        role = kRoleShared;
        break;
      }
      case KOSMOS_MOE_BWD_DH: {
        const int g = ldcg(f.tile_order + i / L.nF), n = i % L.nF;
        const int64_t o = int64_t(g) * kBM * 2 * F;
        swiglu_bwd_store(acc, bn.epilogue_smem(wg), t, n, F, ldcg(f.tile_rows + g), static_cast<const bf16*>(f.gus) + o,
                         static_cast<bf16*>(a.dgus) + o, true);
        rel = c.dh_done() + g;
        break;
      }
      case KOSMOS_MOE_BWD_DXR: {
        const int mb = i / L.nH, n = i % L.nH;
        bn.store_tile(acc, static_cast<bf16*>(a.dxr) + int64_t(mb) * kBM * H + n * kBN, H, T - mb * kBM, H - n * kBN);
        rel = c.xr_done() + mb;
        role = kRoleRouter;
        break;
      }
      case KOSMOS_MOE_BWD_DX: {
        int q, n;
        moe::raster_tile(i, L.nH, f.tiles_max, &q, &n);
        const int g = ldcg(f.tile_order + q);
        bn.store_tile(acc, static_cast<bf16*>(a.dxs) + int64_t(g) * kBM * H + n * kBN, H, kBM, H - n * kBN);
        rel = c.dx_done() + g;
        break;
      }
      case KOSMOS_MOE_BWD_SHARED_DX: {
        const int mb = i / L.nH, n = i % L.nH;
        bn.store_tile(acc, static_cast<bf16*>(a.dxsh) + int64_t(mb) * kBM * H + n * kBN, H, T - mb * kBM,
                      H - n * kBN);
        rel = c.sdx_done() + mb;
        role = kRoleShared;
        break;
      }
      case KOSMOS_MOE_BWD_SHARED_WG2: {  // dWs2_r (H x Fs) tile
        const int r = i / (L.mH * L.nFs), mh = (i / L.nFs) % L.mH, n = i % L.nFs;
        bn.store_tile(acc, static_cast<bf16*>(a.dws2) + int64_t(r) * H * Fs + int64_t(mh) * kBM * Fs + n * kBN, Fs,
                      H - mh * kBM, Fs - n * kBN);
        role = kRoleShared;
        break;
      }
      case KOSMOS_MOE_BWD_DWR: {  // dWr_r (E x H) tile
        const int r = i / (L.mE * L.nH), me = (i / L.nH) % L.mE, n = i % L.nH;
        bn.store_tile(acc, static_cast<bf16*>(a.dwr) + int64_t(r) * f.E * H + int64_t(me) * kBM * H + n * kBN, H,
                      f.E - me * kBM, H - n * kBN);
        role = kRoleRouter;
        break;
      }
      case KOSMOS_MOE_BWD_SHARED_WG1: {  // dWs1_r (2Fs x H) tile
        const int r = i / (L.mFs2 * L.nH), mf = (i / L.nH) % L.mFs2, n = i % L.nH;
        bn.store_tile(acc, static_cast<bf16*>(a.dws1) + int64_t(r) * 2 * Fs * H + int64_t(mf) * kBM * H + n * kBN, H,
                      2 * Fs - mf * kBM, H - n * kBN);
        role = kRoleShared;
        break;
      }
      case KOSMOS_MOE_BWD_WG2: {  // dW2_e (H x F) tile
        const int e = i / (L.mH * L.nF), mh = (i / L.nF) % L.mH, n = i % L.nF;
        bn.store_tile(acc, static_cast<bf16*>(a.dw2) + int64_t(e) * H * F + int64_t(mh) * kBM * F + n * kBN, F,
                      H - mh * kBM, F - n * kBN);
        role = kRoleWgrad;
        break;
      }
      case KOSMOS_MOE_BWD_WG1: {  // dW1_e (2F x H) tile
        const int e = i / (L.mF2 * L.nH), mf = (i / L.nH) % L.mF2, n = i % L.nH;
        bn.store_tile(acc, static_cast<bf16*>(a.dw1) + int64_t(e) * 2 * F * H + int64_t(mf) * kBM * H + n * kBN, H,
                      2 * F - mf * kBM, H - n * kBN);
        role = kRoleWgrad;
        break;
      }
      default:  // not a math kind (never pushed): no k-blocks, the turn went on above
        break;
    }
    __threadfence();
    named_bar_sync(kBarWg0 + wg, BuilderN::kWgThreads);  // every store of the item before its release
    if (t == 0) {
      if (rel) atomicAdd(rel, 1u);
      tr.add(role, item, t0, tr.now());
    }
  }
  turn.finish(j);
}

// Loader warp 0: the TMA loads of math item (kind, i), in the ring order (the math side's
// mma / skip sequence mirrors it; item_kblocks k-blocks each).
__device__ void produce_item(const Params& P, const Layout& L, BuilderN& bn, BuilderT& bt, int kind, int i) {
  const KosmosMoeBwdArgs& a = P.a;
  const KosmosMoeArgs& f = a.f;
  const int T = f.T, H = f.H, F = f.F, Fs = f.Fs, W = a.W, T1 = a.T1;
  const int rows_s = f.tiles_max * kBM;
  const int nk = item_kblocks(a, L, kind, i);
  // a column-major-A tile: bt takes the ring's write state and gives it back
  auto produce_t = [&](typename BuilderT::Mainloop::Params const& mp, int rows_a, int batches_a, int l_a, int m_blk,
                       int N, int K, int batches_b, int l_b, int n_blk, int k0) {
    bt.write_state() = bn.write_state();
    bt.produce_grouped(mp, rows_a, batches_a, l_a, m_blk, N, K, nk, batches_b, l_b, n_blk, k0);
    bn.write_state() = bt.write_state();
  };
  switch (kind) {
    case KOSMOS_MOE_BWD_SHARED_DH:
      bn.produce_grouped(P.sdh, T, 1, 0, i / L.nFs, Fs, H, nk, 1, 0, i % L.nFs);
      break;
    case KOSMOS_MOE_BWD_DH: {
      const int g = ldcg(f.tile_order + i / L.nF);
      bn.produce_grouped(P.dh, rows_s, 1, 0, g, F, H, nk, f.E_tiles, ldcg(f.tile_expert + g), i % L.nF);
      break;
    }
    case KOSMOS_MOE_BWD_DXR:
      bn.produce_grouped(P.dxr, T, 1, 0, i / L.nH, H, a.E8, nk, 1, 0, i % L.nH);
      break;
    case KOSMOS_MOE_BWD_DX: {
      int q, n;
      moe::raster_tile(i, L.nH, f.tiles_max, &q, &n);
      const int g = ldcg(f.tile_order + q);
      bn.produce_grouped(P.dx, rows_s, 1, 0, g, H, 2 * F, nk, f.E_tiles, ldcg(f.tile_expert + g), n);
      break;
    }
    case KOSMOS_MOE_BWD_SHARED_DX:
      bn.produce_grouped(P.sdx, T, 1, 0, i / L.nH, H, 2 * Fs, nk, 1, 0, i % L.nH);
      break;
    case KOSMOS_MOE_BWD_SHARED_WG2: {
      const int r = i / (L.mH * L.nFs), mh = (i / L.nFs) % L.mH, n = i % L.nFs;
      produce_t(P.swg2, H, W, r, mh, Fs, T1, W, r, n, 0);
      break;
    }
    case KOSMOS_MOE_BWD_DWR: {
      const int r = i / (L.mE * L.nH), me = (i / L.nH) % L.mE, n = i % L.nH;
      produce_t(P.dwr, a.E8, W, r, me, H, T1, W, r, n, 0);
      break;
    }
    case KOSMOS_MOE_BWD_SHARED_WG1: {
      const int r = i / (L.mFs2 * L.nH), mf = (i / L.nH) % L.mFs2, n = i % L.nH;
      produce_t(P.swg1, 2 * Fs, W, r, mf, H, T1, W, r, n, 0);
      break;
    }
    case KOSMOS_MOE_BWD_WG2: {
      const int e = i / (L.mH * L.nF), mh = (i / L.nF) % L.mH, n = i % L.nF;
      if (nk) produce_t(P.wg2, H, 1, 0, mh, F, rows_s, 1, 0, n, expert_tiles(f, e).first * (kBM / kBK));
      break;
    }
    case KOSMOS_MOE_BWD_WG1: {
      const int e = i / (L.mF2 * L.nH), mf = (i / L.nH) % L.mF2, n = i % L.nH;
      if (nk) produce_t(P.wg1, 2 * F, 1, 0, mf, H, rows_s, 1, 0, n, expert_tiles(f, e).first * (kBM / kBK));
      break;
    }
    default:
      break;
  }
}

__device__ __forceinline__ bool is_loader_item(int kind) {
  return kind == KOSMOS_MOE_BWD_PEER_GATHER || kind == KOSMOS_MOE_BWD_PAD || kind == KOSMOS_MOE_BWD_PEER_COMBINE;
}

// The movers (warps 2-3, no peers): GATHER items (32 rows of a sorted tile, in queue order, so
// the tiles DH claims first fill first) until none is left, then LOGITS items (32 tokens, once
// their block's choices all have their dw), then FOLD items (from the counter the sequence's FOLD
// slots share). Mover thread 0 claims and waits (watchdog-bounded); the others follow through
// s.mcmd, so a failed wait or an abort takes all 64 out together. A GATHER waits for nothing, a
// LOGITS only for GATHERs, every one of which was claimed before it; a FOLD for DX / DXR /
// SHARED_DX tiles of the math warps, which wait for no mover item still unclaimed then.
__device__ __noinline__ void mover_loop(const Ctx& c, const Layout& L, Shared& s, Tracer& tr, int mt) {
  const KosmosMoeBwdArgs& a = c.a;
  const KosmosMoeArgs& f = a.f;
  const bool lead = mt == 0;
  constexpr int kParts = kBM / kTB;
  auto share = [&](int v) { return moe::share_lead(s.mcmd, lead, v, kBarMover, kMoverThreads); };
  // the lead's claim from counter word `ctr` (-1: none left below `n`, or aborted)
  auto claim = [&](int ctr, int n) {
    int k = -1;
    if (lead && !aborted(c.sc)) k = int(atomicAdd(a.ctr + ctr, 1u));
    return share(k >= 0 && k < n ? k : -1);
  };
  const int tiles = ldcg(f.meta);
  for (int i; (i = claim(KOSMOS_MOE_BWD_CTR_MGATHER, tiles * kParts)) >= 0;) {
    if (a.debug_skip_gather) continue;  // watchdog test: no dO rows ever arrive
    const uint64_t t0 = lead ? tr.now() : 0;
    const int g = ldcg(f.tile_order + i / kParts);
    const int n = run_gather_rows(c, g, i % kParts, mt);
    __threadfence();
    named_bar_sync(kBarMover, kMoverThreads);
    if (lead) {
      if (n) atomicAdd(c.arrived() + g, uint32_t(n));
      tr.add(kRoleGather, (KOSMOS_MOE_BWD_GATHER << 24) | i, t0, tr.now());
    }
  }
  for (int b; (b = claim(KOSMOS_MOE_BWD_CTR_MLOGITS, cdiv(f.T, kTB))) >= 0;) {
    const int mb = b * kTB / kBM;
    const uint32_t need = c.block_tokens(mb) * uint32_t(f.topk);
    if (share(!lead || c.wait(c.dw_done() + mb, need, KOSMOS_MOE_BWD_LOGITS, b) ? 0 : -1) < 0) return;
    const uint64_t t0 = lead ? tr.now() : 0;
    run_logits(c, b, mt);
    __threadfence();
    named_bar_sync(kBarMover, kMoverThreads);
    if (lead) {
      atomicAdd(c.lg_done() + mb, uint32_t(min(kTB, f.T - b * kTB)));
      tr.add(kRoleRouter, (KOSMOS_MOE_BWD_LOGITS << 24) | b, t0, tr.now());
    }
  }
  // then FOLD items, beside the math warps' weight-gradient tiles (the claim sequence's FOLD
  // slots take the rest): the fold's tail after the last tile shrinks to what is left
  for (int b; (b = claim(KOSMOS_MOE_BWD_CTR_FOLD, L.count(KOSMOS_MOE_BWD_FOLD))) >= 0;) {
    const uint64_t t0 = lead ? tr.now() : 0;
    if (!run_fold<kMoverThreads>(c, L, s.mfold, b, mt, kBarMover)) return;
    if (lead) tr.add(kRoleFold, (KOSMOS_MOE_BWD_FOLD << 24) | b, t0, tr.now());
  }
}

#else  // joint: both math warpgroups on one 128 x 256 tile
// The SwiGLU backward epilogue of a dh tile (rows 0..127 of the tile, h columns n*256..):
//   a = silu(g) u:  dg = dh u sig(g) (1 + g (1 - sig(g))),  du = dh silu(g)
// with g, u the saved pre-activations (natural layout: row stride 2Fw, up at +Fw) at `pre`, the
// result [dg | du] at `dpre` (same layout). Rows >= rows: zero (zero_pad: the expert tile's pad
// rows, so that the wgrad over whole tiles adds nothing) or untouched (the shared expert's
// token tail, beyond the buffer). g / u come in and [dg | du] go out through the builder's
// epilogue staging (each warp its 16 rows, 32 columns of g and of u at a time, 16-byte loads and
// stores, the next chunk's loads in flight while this one computes): element by element from
// the accumulator's positions they were 64 dependent round trips to memory a tile.
constexpr int kEpiRow = 144;  // bytes a staging row: 32 g + 32 u bf16 (128 B) + 16 B against bank conflicts
constexpr int kChunk = 32;    // columns of g (and of u) a chunk
static_assert(BuilderN::kEpiBytes >= 8 * 16 * kEpiRow, "the SwiGLU epilogue stages 16 rows a math warp");

// L2 prefetch of the tile's g / u slices (before its MMAs: the epilogue's loads then hit L2)
__device__ __forceinline__ void swiglu_prefetch(int m, int n, int Fw, int rows, const bf16* pre) {
  const int r = m / 2, half = m % 2;
  if (r >= rows || n * kBN >= Fw) return;
  const char* p = reinterpret_cast<const char*>(pre + int64_t(r) * 2 * Fw + half * Fw + n * kBN);
#pragma unroll
  for (int l = 0; l < kBN * 2 / 128; ++l) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + 128 * l));
}

template <class Accum>
__device__ __forceinline__ void swiglu_bwd_store(Accum const& acc, uint8_t* epi, int m, int n, int Fw, int rows,
                                                 const bf16* pre, bf16* dpre, bool zero_pad) {
  const int64_t ld = 2 * int64_t(Fw);
  const int lane = m % 32, warp = m / 32;
  uint8_t* stage = epi + warp * 16 * kEpiRow;
  const int row0 = 16 * warp;  // acc_row(m, v) - (lane / 4) - 8 * ((v / 2) % 2)
  const int seg = lane % 8;    // the lane's 16 bytes of a staging row: g 0..3, u 4..7
  const int64_t seg_col = (seg < 4 ? 0 : Fw) + (seg % 4) * 8;
  constexpr int kChunks = kBN / kChunk;
  int4 in[4];
  auto load = [&](int c) {
    const int col0 = n * kBN + c * kChunk;
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      const int r = row0 + it * 4 + lane / 8;
      in[it] = (r < rows && col0 < Fw) ? __ldg(reinterpret_cast<const int4*>(pre + r * ld + col0 + seg_col))
                                       : make_int4(0, 0, 0, 0);
    }
  };
  load(0);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int col0 = n * kBN + c * kChunk;
    if (col0 >= Fw) break;  // Fw % 128 == 0: a chunk is all in or all out
#pragma unroll
    for (int it = 0; it < 4; ++it)
      *reinterpret_cast<int4*>(stage + (it * 4 + lane / 8) * kEpiRow + seg * 16) = in[it];
    __syncwarp();
    if (c + 1 < kChunks) load(c + 1);
#pragma unroll
    for (int b = 0; b < kChunk / 8; ++b) {
#pragma unroll
      for (int hrow = 0; hrow < 2; ++hrow) {
        const int v = (c * (kChunk / 8) + b) * 4 + 2 * hrow;  // values v, v + 1: one row, two columns
        const int rr = lane / 4 + 8 * hrow;
        const int off = rr * kEpiRow + (b * 8 + 2 * (lane % 4)) * 2;
        __nv_bfloat162* gp = reinterpret_cast<__nv_bfloat162*>(stage + off);
        __nv_bfloat162* up = reinterpret_cast<__nv_bfloat162*>(stage + off + 64);
        const __nv_bfloat162 g2 = *gp, u2 = *up;
        float dg[2], du[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float g = __bfloat162float(h ? g2.y : g2.x), u = __bfloat162float(h ? u2.y : u2.x);
          const float dh = acc(v + h);
          const float sg = __frcp_rn(1.f + __expf(-g));  // fast exp: DH tiles 79 -> 75 us (qwen3, H100)
          const bool pad = row0 + rr >= rows;
          dg[h] = pad ? 0.f : dh * u * sg * (1.f + g * (1.f - sg));
          du[h] = pad ? 0.f : dh * g * sg;
        }
        *gp = __floats2bfloat162_rn(dg[0], dg[1]);
        *up = __floats2bfloat162_rn(du[0], du[1]);
      }
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      const int rr = it * 4 + lane / 8, r = row0 + rr;
      if (r < rows || zero_pad)
        *reinterpret_cast<int4*>(dpre + r * ld + col0 + seg_col) =
            *reinterpret_cast<const int4*>(stage + rr * kEpiRow + seg * 16);
    }
    __syncwarp();
  }
}

template <class Accum>
__device__ __forceinline__ void zero_acc(Accum& acc) {
#pragma unroll
  for (int v = 0; v < kBN / 2; ++v) acc(v) = 0.f;
}

// mma over the next tile's k-blocks with the builder of its type (the ring's read state is
// bn's between tiles)
template <class Accum>
__device__ __forceinline__ void mma_t(BuilderN& bn, BuilderT& bt, Accum& acc, int nk) {
  bt.read_state() = bn.read_state();
  bt.mma_k(acc, nk);
  bn.read_state() = bt.read_state();
}

__device__ __forceinline__ void math_loop(const Ctx& c, const Layout& L, Shared& s, BuilderN& bn, BuilderT& bt, Ring& ring,
                                          Tracer& tr) {
  const KosmosMoeBwdArgs& a = c.a;
  const KosmosMoeArgs& f = a.f;
  const int tid = int(threadIdx.x), m = tid - 128;
  const int T = f.T, H = f.H, F = f.F, Fs = f.Fs;
  for (;;) {
    const int item = ring.pop();
    if (item < 0) break;
    const int kind = item >> 24, i = item & 0xffffff;
    const uint64_t t0 = (tid == 128) ? tr.now() : 0;
    uint32_t* rel = nullptr;
    uint16_t role = kRoleDgrad;
    switch (kind) {
      case KOSMOS_MOE_BWD_SHARED_DH: {
        const int mb = i / L.nFs, n = i % L.nFs;
        const int64_t o = int64_t(mb) * kBM * 2 * Fs;
        swiglu_prefetch(m, n, Fs, T - mb * kBM, static_cast<const bf16*>(f.gush) + o);
        auto acc = BuilderN::make_accum();
        bn.mma_k(acc, H / kBK);
        swiglu_bwd_store(acc, bn.epilogue_smem(), m, n, Fs, T - mb * kBM, static_cast<const bf16*>(f.gush) + o,
                         static_cast<bf16*>(a.dgush) + o, false);
        rel = c.sdh_done() + mb;
        role = kRoleShared;
        break;
      }
      case KOSMOS_MOE_BWD_DH: {
        const int g = ldcg(f.tile_order + i / L.nF), n = i % L.nF;
        const int64_t o = int64_t(g) * kBM * 2 * F;
        const int rows = ldcg(f.tile_rows + g);
        swiglu_prefetch(m, n, F, rows, static_cast<const bf16*>(f.gus) + o);
        auto acc = BuilderN::make_accum();
        bn.mma_k(acc, H / kBK);
        swiglu_bwd_store(acc, bn.epilogue_smem(), m, n, F, rows, static_cast<const bf16*>(f.gus) + o,
                         static_cast<bf16*>(a.dgus) + o, true);
        rel = c.dh_done() + g;
        break;
      }
      case KOSMOS_MOE_BWD_DXR: {
        const int mb = i / L.nH, n = i % L.nH;
        auto acc = BuilderN::make_accum();
        bn.mma_k(acc, cdiv(a.E8, kBK));
        bn.store_staged_to(acc, m, static_cast<bf16*>(a.dxr) + int64_t(mb) * kBM * H + n * kBN, H, T - mb * kBM,
                           H - n * kBN);
        rel = c.xr_done() + mb;
        role = kRoleRouter;
        break;
      }
      case KOSMOS_MOE_BWD_DX: {
        int q, n;
        moe::raster_tile(i, L.nH, f.tiles_max, &q, &n);
        const int g = ldcg(f.tile_order + q);
        auto acc = BuilderN::make_accum();
        bn.mma_k(acc, 2 * F / kBK);
        bn.store_staged_to(acc, m, static_cast<bf16*>(a.dxs) + int64_t(g) * kBM * H + n * kBN, H, kBM, H - n * kBN);
        rel = c.dx_done() + g;
        break;
      }
      case KOSMOS_MOE_BWD_SHARED_DX: {
        const int mb = i / L.nH, n = i % L.nH;
        auto acc = BuilderN::make_accum();
        bn.mma_k(acc, 2 * Fs / kBK);
        bn.store_staged_to(acc, m, static_cast<bf16*>(a.dxsh) + int64_t(mb) * kBM * H + n * kBN, H, T - mb * kBM,
                           H - n * kBN);
        rel = c.sdx_done() + mb;
        role = kRoleShared;
        break;
      }
      case KOSMOS_MOE_BWD_SHARED_WG2: {  // dWs2_r (H x Fs) tile
        const int r = i / (L.mH * L.nFs), mh = (i / L.nFs) % L.mH, n = i % L.nFs;
        auto acc = BuilderT::make_accum();
        mma_t(bn, bt, acc, cdiv(a.T1, kBK));
        bn.store_staged_to(acc, m, static_cast<bf16*>(a.dws2) + int64_t(r) * H * Fs + int64_t(mh) * kBM * Fs + n * kBN,
                           Fs, H - mh * kBM, Fs - n * kBN);
        role = kRoleShared;
        break;
      }
      case KOSMOS_MOE_BWD_DWR: {  // dWr_r (E x H) tile
        const int r = i / (L.mE * L.nH), me = (i / L.nH) % L.mE, n = i % L.nH;
        auto acc = BuilderT::make_accum();
        mma_t(bn, bt, acc, cdiv(a.T1, kBK));
        bn.store_staged_to(acc, m,
                           static_cast<bf16*>(a.dwr) + int64_t(r) * f.E * H + int64_t(me) * kBM * H + n * kBN, H,
                           f.E - me * kBM, H - n * kBN);
        role = kRoleRouter;
        break;
      }
      case KOSMOS_MOE_BWD_SHARED_WG1: {  // dWs1_r (2Fs x H) tile
        const int r = i / (L.mFs2 * L.nH), mf = (i / L.nH) % L.mFs2, n = i % L.nH;
        auto acc = BuilderT::make_accum();
        mma_t(bn, bt, acc, cdiv(a.T1, kBK));
        bn.store_staged_to(acc, m,
                           static_cast<bf16*>(a.dws1) + int64_t(r) * 2 * Fs * H + int64_t(mf) * kBM * H + n * kBN, H,
                           2 * Fs - mf * kBM, H - n * kBN);
        role = kRoleShared;
        break;
      }
      case KOSMOS_MOE_BWD_WG2: {  // dW2_e (H x F) tile
        const int e = i / (L.mH * L.nF), mh = (i / L.nF) % L.mH, n = i % L.nF;
        const ExpertTiles et = expert_tiles(f, e);
        auto acc = BuilderT::make_accum();
        if (et.n) {
          mma_t(bn, bt, acc, 2 * et.n);
        } else {
          zero_acc(acc);  // no rows: no k-blocks were loaded (the loader skipped the tile too)
        }
        bn.store_staged_to(acc, m, static_cast<bf16*>(a.dw2) + int64_t(e) * H * F + int64_t(mh) * kBM * F + n * kBN,
                           F, H - mh * kBM, F - n * kBN);
        role = kRoleWgrad;
        break;
      }
      case KOSMOS_MOE_BWD_WG1: {  // dW1_e (2F x H) tile
        const int e = i / (L.mF2 * L.nH), mf = (i / L.nH) % L.mF2, n = i % L.nH;
        const ExpertTiles et = expert_tiles(f, e);
        auto acc = BuilderT::make_accum();
        if (et.n) {
          mma_t(bn, bt, acc, 2 * et.n);
        } else {
          zero_acc(acc);
        }
        bn.store_staged_to(acc, m,
                           static_cast<bf16*>(a.dw1) + int64_t(e) * 2 * F * H + int64_t(mf) * kBM * H + n * kBN, H,
                           2 * F - mf * kBM, H - n * kBN);
        role = kRoleWgrad;
        break;
      }
      case KOSMOS_MOE_BWD_GATHER:
        run_gather(c, i, m);
        role = kRoleGather;
        if (tid == 128) atomicAdd(&s.mem_done, 1);
        break;
      case KOSMOS_MOE_BWD_FOLD:
        run_fold<BuilderN::kNumMathThreads>(c, L, s.fold, i, m, kBarMath);  // an abort: the claims end
        role = kRoleFold;
        if (tid == 128) atomicAdd(&s.mem_done, 1);
        break;
      default:
        break;
    }
    __threadfence();
    named_bar_sync(kBarMath, BuilderN::kNumMathThreads);  // every store of the item before its release
    if (tid == 128) {
      if (rel) atomicAdd(rel, 1u);
      tr.add(role, item, t0, tr.now());
    }
  }
}

// Loader warp 0: the TMA loads of math item (kind, i), in the ring order (the math side's
// mma sequence mirrors it).
__device__ void produce_item(const Params& P, const Layout& L, BuilderN& bn, BuilderT& bt, int kind, int i) {
  const KosmosMoeBwdArgs& a = P.a;
  const KosmosMoeArgs& f = a.f;
  const int T = f.T, H = f.H, F = f.F, Fs = f.Fs, W = a.W, T1 = a.T1;
  const int rows_s = f.tiles_max * kBM;
  // a column-major-A tile: bt takes the ring's write state and gives it back
  auto produce_t = [&](typename BuilderT::Mainloop::Params const& mp, int rows_a, int batches_a, int l_a, int m_blk,
                       int N, int K, int nk, int batches_b, int l_b, int n_blk, int k0) {
    bt.write_state() = bn.write_state();
    bt.produce_grouped(mp, rows_a, batches_a, l_a, m_blk, N, K, nk, batches_b, l_b, n_blk, BuilderT::AllThere{},
                       BuilderT::NoHook{}, k0);
    bn.write_state() = bt.write_state();
  };
  switch (kind) {
    case KOSMOS_MOE_BWD_SHARED_DH:
      bn.produce_grouped(P.sdh, T, 1, 0, i / L.nFs, Fs, H, H / kBK, 1, 0, i % L.nFs);
      break;
    case KOSMOS_MOE_BWD_DH: {
      const int g = ldcg(f.tile_order + i / L.nF);
      bn.produce_grouped(P.dh, rows_s, 1, 0, g, F, H, H / kBK, f.E_tiles, ldcg(f.tile_expert + g), i % L.nF);
      break;
    }
    case KOSMOS_MOE_BWD_DXR:
      bn.produce_grouped(P.dxr, T, 1, 0, i / L.nH, H, a.E8, cdiv(a.E8, kBK), 1, 0, i % L.nH);
      break;
    case KOSMOS_MOE_BWD_DX: {
      int q, n;
      moe::raster_tile(i, L.nH, f.tiles_max, &q, &n);
      const int g = ldcg(f.tile_order + q);
      bn.produce_grouped(P.dx, rows_s, 1, 0, g, H, 2 * F, 2 * F / kBK, f.E_tiles, ldcg(f.tile_expert + g), n);
      break;
    }
    case KOSMOS_MOE_BWD_SHARED_DX:
      bn.produce_grouped(P.sdx, T, 1, 0, i / L.nH, H, 2 * Fs, 2 * Fs / kBK, 1, 0, i % L.nH);
      break;
    case KOSMOS_MOE_BWD_SHARED_WG2: {
      const int r = i / (L.mH * L.nFs), mh = (i / L.nFs) % L.mH, n = i % L.nFs;
      produce_t(P.swg2, H, W, r, mh, Fs, T1, cdiv(T1, kBK), W, r, n, 0);
      break;
    }
    case KOSMOS_MOE_BWD_DWR: {
      const int r = i / (L.mE * L.nH), me = (i / L.nH) % L.mE, n = i % L.nH;
      produce_t(P.dwr, a.E8, W, r, me, H, T1, cdiv(T1, kBK), W, r, n, 0);
      break;
    }
    case KOSMOS_MOE_BWD_SHARED_WG1: {
      const int r = i / (L.mFs2 * L.nH), mf = (i / L.nH) % L.mFs2, n = i % L.nH;
      produce_t(P.swg1, 2 * Fs, W, r, mf, H, T1, cdiv(T1, kBK), W, r, n, 0);
      break;
    }
    case KOSMOS_MOE_BWD_WG2: {
      const int e = i / (L.mH * L.nF), mh = (i / L.nF) % L.mH, n = i % L.nF;
      const ExpertTiles et = expert_tiles(f, e);
      if (et.n) produce_t(P.wg2, H, 1, 0, mh, F, rows_s, 2 * et.n, 1, 0, n, et.first * (kBM / kBK));
      break;
    }
    case KOSMOS_MOE_BWD_WG1: {
      const int e = i / (L.mF2 * L.nH), mf = (i / L.nH) % L.mF2, n = i % L.nH;
      const ExpertTiles et = expert_tiles(f, e);
      if (et.n) produce_t(P.wg1, 2 * F, 1, 0, mf, H, rows_s, 2 * et.n, 1, 0, n, et.first * (kBM / kBK));
      break;
    }
    default:
      break;
  }
}

__device__ __forceinline__ bool is_loader_item(int kind) {
  return kind == KOSMOS_MOE_BWD_PEER_GATHER || kind == KOSMOS_MOE_BWD_PAD || kind == KOSMOS_MOE_BWD_PEER_COMBINE;
}

// The movers (warps 2-3, no peers): GATHER items (32 rows of a sorted tile, in queue order, so
// the tiles DH claims first fill first) until none is left, then LOGITS items (32 tokens, once
// their block's choices all have their dw), then FOLD items (from the counter the sequence's FOLD
// slots share). Mover thread 0 claims and waits (watchdog-bounded); the others follow through
// s.mcmd, so a failed wait or an abort takes all 64 out together. A GATHER waits for nothing, a
// LOGITS only for GATHERs, every one of which was claimed before it; a FOLD for DX / DXR /
// SHARED_DX tiles of the math warps, which wait for no mover item still unclaimed then.
__device__ __noinline__ void mover_loop(const Ctx& c, const Layout& L, Shared& s, Tracer& tr, int mt) {
  const KosmosMoeBwdArgs& a = c.a;
  const KosmosMoeArgs& f = a.f;
  const bool lead = mt == 0;
  constexpr int kParts = kBM / kTB;
  auto share = [&](int v) { return moe::share_lead(s.mcmd, lead, v, kBarMover, kMoverThreads); };
  // the lead's claim from counter word `ctr` (-1: none left below `n`, or aborted)
  auto claim = [&](int ctr, int n) {
    int k = -1;
    if (lead && !aborted(c.sc)) k = int(atomicAdd(a.ctr + ctr, 1u));
    return share(k >= 0 && k < n ? k : -1);
  };
  const int tiles = ldcg(f.meta);
  for (int i; (i = claim(KOSMOS_MOE_BWD_CTR_MGATHER, tiles * kParts)) >= 0;) {
    if (a.debug_skip_gather) continue;  // watchdog test: no dO rows ever arrive
    const uint64_t t0 = lead ? tr.now() : 0;
    const int g = ldcg(f.tile_order + i / kParts);
    const int n = run_gather_rows(c, g, i % kParts, mt);
    __threadfence();
    named_bar_sync(kBarMover, kMoverThreads);
    if (lead) {
      if (n) atomicAdd(c.arrived() + g, uint32_t(n));
      tr.add(kRoleGather, (KOSMOS_MOE_BWD_GATHER << 24) | i, t0, tr.now());
    }
  }
  for (int b; (b = claim(KOSMOS_MOE_BWD_CTR_MLOGITS, cdiv(f.T, kTB))) >= 0;) {
    const int mb = b * kTB / kBM;
    const uint32_t need = c.block_tokens(mb) * uint32_t(f.topk);
    if (share(!lead || c.wait(c.dw_done() + mb, need, KOSMOS_MOE_BWD_LOGITS, b) ? 0 : -1) < 0) return;
    const uint64_t t0 = lead ? tr.now() : 0;
    run_logits(c, b, mt);
    __threadfence();
    named_bar_sync(kBarMover, kMoverThreads);
    if (lead) {
      atomicAdd(c.lg_done() + mb, uint32_t(min(kTB, f.T - b * kTB)));
      tr.add(kRoleRouter, (KOSMOS_MOE_BWD_LOGITS << 24) | b, t0, tr.now());
    }
  }
  // then FOLD items, beside the math warps' weight-gradient tiles (the claim sequence's FOLD
  // slots take the rest): the fold's tail after the last tile shrinks to what is left
  for (int b; (b = claim(KOSMOS_MOE_BWD_CTR_FOLD, L.count(KOSMOS_MOE_BWD_FOLD))) >= 0;) {
    const uint64_t t0 = lead ? tr.now() : 0;
    if (!run_fold<kMoverThreads>(c, L, s.mfold, b, mt, kBarMover)) return;
    if (lead) tr.add(kRoleFold, (KOSMOS_MOE_BWD_FOLD << 24) | b, t0, tr.now());
  }
}

#endif  // KOSMOS_MOE_PINGPONG

// ------------------------------------------------------------------------------ the kernel
__global__ void __launch_bounds__(kThreads, 1) moe_bwd_sm90_kernel(const __grid_constant__ Params P) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  Shared& s = *reinterpret_cast<Shared*>(smem_raw);
  const KosmosMoeBwdArgs& a = P.a;
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
  const auto role = BuilderN::role_of(tid);
  Ring ring(s.ring, warp_idx == 0, role == BuilderN::Role::kMath, BuilderN::kNumMathThreads);
  if (tid == 0) s.mem_done = 0;
  // both builder types over the one SharedStorage (the second initialises the same barriers
  // again, before any use: harmless)
#if KOSMOS_MOE_PINGPONG
  BuilderN bn(s.builder, P.dh, role);
  BuilderT bt(reinterpret_cast<BuilderT::SharedStorage&>(s.builder), P.wg2,
#else
  BuilderN bn(s.builder, P.bpn, role);
  BuilderT bt(reinterpret_cast<BuilderT::SharedStorage&>(s.builder), P.bpt,
#endif
              role == BuilderN::Role::kLoader ? BuilderT::Role::kLoader
                                              : (role == BuilderN::Role::kMath ? BuilderT::Role::kMath
                                                                               : BuilderT::Role::kNone));
  if (tid == 0) {
    BuilderN::Mainloop::prefetch_tma_descriptors(P.dh);
    BuilderN::Mainloop::prefetch_tma_descriptors(P.dx);
    BuilderT::Mainloop::prefetch_tma_descriptors(P.wg2);
    BuilderT::Mainloop::prefetch_tma_descriptors(P.wg1);
  }
  __syncthreads();

  if (role == BuilderN::Role::kLoader) {
    cutlass::arch::warpgroup_reg_dealloc<kLoaderRegs>();
    const bool mg = movers_gather(a.f);
    const int nl = mg ? kMainThreads : kLoaderThreads;  // the claim sequence's threads
    if (mg && warp_idx >= kMainThreads / 32) {
      mover_loop(c, L, s, tr, tid - kMainThreads);
    } else {
      int mem_claimed = 0;  // (thread kSched)
      for (;;) {
        const int item = moe::next_loader_item(s, mem_claimed, (1u << KOSMOS_MOE_BWD_GATHER) | (1u << KOSMOS_MOE_BWD_FOLD),
                                               tid == kSched, kBarLoader, nl, c.sc, [&] { return decide(c, L); });
        if (item < 0) break;
        const int kind = item >> 24, i = item & 0xffffff;
        if (!is_loader_item(kind)) {
          if (warp_idx == 0) {
            fence_proxy_async_global();  // generic-proxy writes of other CTAs (acquired) -> this warp's TMA reads
            if (lane == 0) ring.push(item);
            __syncwarp();
            produce_item(P, L, bn, bt, kind, i);
          }
          continue;
        }
        const uint64_t t0 = (tid == kSched) ? tr.now() : 0;
        uint16_t r = kRoleGather;
        if (kind == KOSMOS_MOE_BWD_PEER_GATHER) {
          run_peer_gather(c, i, tid, nl);
        } else if (kind == KOSMOS_MOE_BWD_PAD) {
          run_pad(c, i, tid, nl);
        } else {
          r = kRoleCombine;
          run_peer_combine(c, L, s, i, tid, nl);
        }
        if (tid == kSched) tr.add(r, item, t0, tr.now());
      }
      if (warp_idx == 0) {
        if (lane == 0) ring.push(-1);
        __syncwarp();
        bn.produce_tail();
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<kMathRegs>();
    math_loop(c, L, s, bn, bt, ring, tr);
  }

  // exit: the last CTA zeroes the per-call counters and publishes the completed call
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    s.last = atomicAdd(a.ctr + KOSMOS_MOE_BWD_CTR_EXIT, 1u) == uint32_t(a.grid - 1);
  }
  __syncthreads();
  if (s.last) {
    __threadfence();
    for (int w = tid; w < a.ctr_words; w += kThreads) a.ctr[w] = 0;
    __syncthreads();
    if (tid == 0) {
      __threadfence();
      st_release(a.state, c.sc.epoch, false);
    }
  }
}

// ------------------------------------------------------------------------------ host side
namespace {

// W ranks of T/W tokens each in one launch (world 1: W = 1), the forward's shape limits.
const char* validate(int T, int H, int F, int Fs, int E, int topk, int W) {
  if (T <= 0 || H <= 0 || F <= 0 || E <= 0 || W <= 0) return "moe bwd sm90: T, H, F, E, W must be positive";
  if (E > KOSMOS_MOE_MAX_E) return "moe bwd sm90: more than 256 experts in one launch (the forward's router tile)";
  if (topk < 1 || topk > KOSMOS_MOE_MAX_TOPK || topk > E) return "moe bwd sm90: topk must be in 1..min(16, experts)";
  if (H % 64 || F % 128 || Fs % 128) return "moe bwd sm90: H must be a multiple of 64, F and the shared F of 128";
  if (T % W) return "moe bwd sm90: the tokens must split evenly over the ranks";
  if (int64_t(T) * topk >= (1 << 24) / 2) return "moe bwd sm90: too many token choices for one launch";
  return nullptr;
}

bool aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace
}  // namespace moe_bwd
}  // namespace kosmos

// ----------------------------------------------------------------------------------- C ABI
extern "C" {

using kosmos::fail;
using kosmos::moe_bwd::BuilderN;
using kosmos::moe_bwd::BuilderT;
using kosmos::moe_bwd::Params;

int kosmos_moe_bwd_abi_version(void) { return KOSMOS_MOE_BWD_ABI_VERSION; }
int kosmos_moe_bwd_fwd_abi_version(void) { return KOSMOS_MOE_ABI_VERSION; }
const char* kosmos_moe_bwd_last_error(void) { return kosmos::g_err; }
int kosmos_moe_bwd_smem_bytes(void) { return kosmos::moe_bwd::kSmemBytes; }
int kosmos_moe_bwd_threads(void) { return kosmos::moe_bwd::kThreads; }

// Offset of field i of KosmosMoeBwdArgs (the Python mirror's layout test), -1 past the last.
long kosmos_moe_bwd_args_offset(int i) {
#define F(name) offsetof(KosmosMoeBwdArgs, name)
  static const long off[] = {F(f), F(dy), F(w1), F(w2), F(wr), F(ws1), F(ws2), F(dos), F(dgus), F(dxs), F(dlogits),
                             F(dxr), F(dgush), F(dxsh), F(dx), F(dwr), F(dw1), F(dw2), F(dws1), F(dws2), F(dwc),
                             F(recv_gout), F(recv_dx), F(send_gout), F(send_dx), F(ctr),
                             F(state), F(err), F(trace), F(trace_count), F(timeout_ns), F(W), F(T1), F(E8),
                             F(ctr_words), F(grid), F(trace_cap), F(spin_ns), F(debug_skip_gather),
                             sizeof(KosmosMoeBwdArgs)};
#undef F
  return (i >= 0 && i < int(sizeof(off) / sizeof(off[0]))) ? off[i] : -1;
}

// "" when the shape is supported, else why not. No GPU needed.
const char* kosmos_moe_bwd_validate(int T, int H, int F, int Fs, int E, int topk, int W) {
  const char* why = kosmos::moe_bwd::validate(T, H, F, Fs, E, topk, W);
  return why ? why : "";
}

// Claims of kind k for these arguments (-1: k out of range); the CPU tests check the item
// layout against the Python mirror (kernels/moe_bwd_sm90.py item_counts).
long kosmos_moe_bwd_item_count(const KosmosMoeBwdArgs* args, int k) {
  if (!args || k < 0 || k >= KOSMOS_MOE_BWD_NUM_KINDS) return -1;
  return kosmos::moe_bwd::Layout(*args).count(k);
}

void* kosmos_moe_bwd_create(void) { return new (std::nothrow) Params(); }
void kosmos_moe_bwd_destroy(void* h) { delete static_cast<Params*>(h); }

int kosmos_moe_bwd_set(void* h, const KosmosMoeBwdArgs* args) {
  if (!h || !args) return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: null handle or args");
  const KosmosMoeBwdArgs& a = *args;
  const KosmosMoeArgs& f = a.f;
  if (const char* why = kosmos::moe_bwd::validate(f.T, f.H, f.F, f.Fs, f.E, f.topk, a.W))
    return fail(KOSMOS_ERR_INVALID, "%s", why);
  if (a.T1 * a.W != f.T) return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: T1 * W != T");
  if (f.E_tiles < 1 || f.E_tiles > f.E || f.E_loc < 1 || (f.E_tiles < f.E && (f.E % f.E_loc || a.W != 1)))
    return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: E_tiles / E_loc / W do not fit E (remote experts: the host view, W = 1)");
  if (f.E_tiles < f.E && (!f.ref_routes || !f.ref_slot))
    return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: remote experts without the reference routing's send slots");
  if (f.peer_rows < 0 || (f.peer_rows && (!f.peer_expert || !f.peer_rel || !f.peer_total)))
    return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: peer rows without their tables");
  if (a.E8 < f.E || a.E8 % 8) return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: E8 must be E rounded up to 8");
  if (!f.x || !f.xs || !f.hs || !f.os || !f.gus || !f.routes || !f.weights || !f.logits || !f.rank || !f.blk_base ||
      !f.seg_start || !f.tile_order || !f.tile_expert || !f.tile_rows || !f.meta || !f.own_total)
    return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: the forward's saved state is incomplete (pre-activations saved?)");
  if (!a.dy || !a.w1 || !a.w2 || !a.wr || !a.dos || !a.dgus || !a.dxs || !a.dlogits || !a.dxr || !a.dx || !a.dwr ||
      !a.dw1 || !a.dw2 || !a.ctr || !a.state || !a.err)
    return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: null buffer");
  if (f.Fs && (!f.hsh || !f.gush || !a.ws1 || !a.ws2 || !a.dgush || !a.dxsh || !a.dws1 || !a.dws2))
    return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: null shared-expert buffer");
  const void* const bufs[] = {f.x, f.xs, f.hs, f.os, f.gus, a.dy, a.w1, a.w2, a.wr, a.dos, a.dgus, a.dxs,
                              a.dlogits, a.dxr, a.dx, a.dwr, a.dw1, a.dw2};
  for (const void* p : bufs)
    if (!kosmos::moe_bwd::aligned(p)) return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: buffers must be 16-byte aligned");
  if (f.route_blocks != (f.T + 127) / 128 || f.tiles_max < (f.T * f.topk + f.peer_rows + 127) / 128 + f.E_tiles)
    return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: the forward's route_blocks / tiles_max do not match T, topk, E");
  if (a.ctr_words < KOSMOS_MOE_BWD_CTR_HEAD + 3 * f.tiles_max + 5 * f.route_blocks)
    return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: ctr_words too small");
  if (a.trace && (!a.trace_count || a.trace_cap < 1)) return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: trace without counts");
  const kosmos::moe_bwd::Layout L(a);
  if (kosmos::moe_bwd::movers_gather(f) && (!a.dwc || !f.sorted_choice))
    return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: no peers (the movers gather) but no dwc / forward sorted_choice");
  for (int k = 0; k < KOSMOS_MOE_BWD_NUM_KINDS; ++k)
    if (L.count(k) >= (1 << 24)) return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: item kind %d has too many items", k);
  Params& P = *static_cast<Params*>(h);
  P.a = a;
  const int T = f.T, H = f.H, F = f.F, Fs = f.Fs, W = a.W, T1 = a.T1, E = f.E_tiles;
  const int rows_s = f.tiles_max * 128;
  // A row-major (M x K): the dgrad GEMMs; B (K x N, N contiguous): the layer's weights as they are
#if !KOSMOS_MOE_PINGPONG
  P.bpn = BuilderN::make_params(a.dos, a.w2, a.dgus, rows_s, F, H);
#endif
  P.dh = BuilderN::make_grouped_params(a.dos, rows_s, 1, int64_t(rows_s) * H, a.w2, F, H, E);
  P.dx = BuilderN::make_grouped_params(a.dgus, rows_s, 1, int64_t(rows_s) * 2 * F, a.w1, H, 2 * F, E);
  P.dxr = BuilderN::make_grouped_params(a.dlogits, T, 1, int64_t(T) * a.E8, a.wr, H, a.E8, 1);
  // A column-major (the token rows as K, K x M storage): the wgrad GEMMs, a rank's tokens per batch
#if !KOSMOS_MOE_PINGPONG
  P.bpt = BuilderT::make_params(a.dos, f.hs, a.dw2, H, F, rows_s);
#endif
  P.wg2 = BuilderT::make_grouped_params(a.dos, H, 1, int64_t(rows_s) * H, f.hs, F, rows_s, 1);
  P.wg1 = BuilderT::make_grouped_params(a.dgus, 2 * F, 1, int64_t(rows_s) * 2 * F, f.xs, H, rows_s, 1);
  P.dwr = BuilderT::make_grouped_params(a.dlogits, a.E8, W, int64_t(T1) * a.E8, f.x, H, T1, W);
  if (Fs) {
    P.sdh = BuilderN::make_grouped_params(a.dy, T, 1, int64_t(T) * H, a.ws2, Fs, H, 1);
    P.sdx = BuilderN::make_grouped_params(a.dgush, T, 1, int64_t(T) * 2 * Fs, a.ws1, H, 2 * Fs, 1);
    P.swg2 = BuilderT::make_grouped_params(a.dy, H, W, int64_t(T1) * H, f.hsh, Fs, T1, W);
    P.swg1 = BuilderT::make_grouped_params(a.dgush, 2 * Fs, W, int64_t(T1) * 2 * Fs, f.x, H, T1, W);
  } else {
    P.sdh = P.sdx = P.dh;
    P.swg2 = P.swg1 = P.wg2;
  }
  return KOSMOS_OK;
}

int kosmos_moe_bwd_max_wgs(int device, int* out) {
  namespace m = kosmos::moe_bwd;
  return kosmos::sm90_co_resident(reinterpret_cast<const void*>(m::moe_bwd_sm90_kernel), m::kThreads, m::kSmemBytes,
                                  device, out, "MoE sm90 backward kernel");
}

// One cooperative launch of the whole backward on `stream` (no synchronisation).
int kosmos_moe_bwd_launch(void* h, void* stream) {
  if (!h) return fail(KOSMOS_ERR_INVALID, "moe bwd sm90: null handle");
  Params& P = *static_cast<Params*>(h);
  static int co[64];
  namespace m = kosmos::moe_bwd;
  return kosmos::cooperative_launch(reinterpret_cast<const void*>(m::moe_bwd_sm90_kernel), m::kThreads, m::kSmemBytes,
                                    P, P.a.grid, stream, co, "moe bwd sm90");
}

}  // extern "C"
