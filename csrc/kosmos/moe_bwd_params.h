// moe_bwd_params.h — the C ABI of the MoE backward kernel (csrc/moe_bwd_sm90.cu), mirrored field
// by field by kosmos_bench/kernels/moe_bwd_sm90.py (MoeBwdArgs; a CPU test compares every offset
// with kosmos_moe_bwd_args_offset). Change both together and bump KOSMOS_MOE_BWD_ABI_VERSION.
//
// The backward reads the forward's saved state through `f`, the forward's own argument struct
// of the call it differentiates (moe_params.h: routes, weights, logits, rank, blk_base,
// seg_start, tile tables, meta, own_total, x, xs, hs, os, hsh and the pre-activations gus /
// gush, which that forward must have saved; sizes T, H, F, Fs, E, topk, E_tiles, tiles_max).
// Its counters, state and error record are the forward's and are not touched here.
//
// Only fixed-width fields; the struct is a multiple of 8 bytes with no implicit padding. All
// pointers are device pointers (pinned host memory mapped for the host fabric's tables), bf16
// unless said. T, E, E_tiles, M_MAX as in moe_params.h; W = ranks in the launch (local fabric; 1
// otherwise), T1 = T / W tokens per rank, E8 = E rounded up to 8.
#pragma once
#include <stdint.h>

#include "moe_params.h"

#define KOSMOS_MOE_BWD_ABI_VERSION 3

// Item kinds, in claim order (also the error record's `queue` and the trace record's item high byte).
enum KosmosMoeBwdKind {
  KOSMOS_MOE_BWD_SHARED_DH = 0,   // shared expert: dh_s = dy @ Ws2 tile (128 tokens x 256 of Fs), SwiGLU backward
  KOSMOS_MOE_BWD_GATHER = 1,      // 32 tokens: dO rows w_tj * dy_t into expert-sorted order (host fabric, a
                                  //   remote expert's: into its owner's send_gout), dw_tj, dlogits rows. Without
                                  //   peers (world 1, local) the movers' instead: 32 rows of a sorted tile, in
                                  //   queue order (dO rows, dw_tj into dwc); none in the claim sequence
  KOSMOS_MOE_BWD_PEER_GATHER = 2, // host fabric: 32 peer rows' upstream gradients (pinned host) -> their sorted rows
  KOSMOS_MOE_BWD_PAD = 3,         // expert e: zero dO rows of its last tile beyond its rows
  KOSMOS_MOE_BWD_SHARED_WG2 = 4,  // dWs2 tile of rank r (128 of H x 256 of Fs) = dy_r^T @ hsh_r
  KOSMOS_MOE_BWD_DH = 5,          // expert tile (queue position q, n-tile of F): dO @ W2_e, SwiGLU backward -> [dg|du]
  KOSMOS_MOE_BWD_DXR = 6,         // 128 tokens x 256 of H: dlogits @ Wr (the router's part of dx)
  KOSMOS_MOE_BWD_DWR = 7,         // dWr tile of rank r (128 of E x 256 of H) = dlogits_r^T @ x_r
  KOSMOS_MOE_BWD_DX = 8,          // expert tile (q, n-tile of H): [dg|du] @ W1_e -> dxs rows
  KOSMOS_MOE_BWD_PEER_COMBINE = 9,// host fabric: 32 peer rows' input gradients -> the peers' recv_dx (pinned host)
  KOSMOS_MOE_BWD_SHARED_DX = 10,  // 128 tokens x 256 of H: [dg|du]_s @ Ws1
  KOSMOS_MOE_BWD_WG2 = 11,        // dW2_e tile (128 of H x 256 of F) = dO_e^T @ h_e over the expert's rows
  KOSMOS_MOE_BWD_SHARED_WG1 = 12, // dWs1 tile of rank r (128 of 2Fs x 256 of H) = [dg|du]_s,r^T @ x_r
  KOSMOS_MOE_BWD_WG1 = 13,        // dW1_e tile (128 of 2F x 256 of H) = [dg|du]_e^T @ xs_e
  KOSMOS_MOE_BWD_FOLD = 14,       // 32 tokens: dx_t = sum_j dxs[pos(t, j)] (j order; host fabric, a remote
                                  //   expert's: the owner's send_dx row) + dxr_t + dxsh_t
  KOSMOS_MOE_BWD_NUM_KINDS = 15,  // the claim sequence's kinds; the movers' own, after them:
  KOSMOS_MOE_BWD_LOGITS = 15,     // movers (no peers), 32 tokens after their choices' dw: dlogits rows
};

// Counter words (uint32, zeroed by the last CTA of every call; the host zeroes them after an abort).
enum KosmosMoeBwdCtr {
  KOSMOS_MOE_BWD_CTR_CLAIM = 0,
  KOSMOS_MOE_BWD_CTR_MGATHER = 1,  // the movers' GATHER claims (no peers)
  KOSMOS_MOE_BWD_CTR_EXIT = 2,
  KOSMOS_MOE_BWD_CTR_MLOGITS = 3,  // the movers' LOGITS claims
  KOSMOS_MOE_BWD_CTR_FOLD = 4,     // FOLD items, claimed by the sequence's FOLD slots and the movers
  KOSMOS_MOE_BWD_CTR_HEAD = 5
};
// after the head: arrived[tiles_max] (dO rows of sorted tile g, pad rows included: 128 when
// complete), dh_done[tiles_max], dx_done[tiles_max], lg_done[route_blocks] (tokens of block b
// with their dlogits row), xr_done[route_blocks], sdh_done[route_blocks], sdx_done[route_blocks],
// dw_done[route_blocks] (choices of block b's tokens with their dw in dwc; the movers' GATHER)

typedef struct KosmosMoeBwdArgs {
  KosmosMoeArgs f;       // the forward's arguments (its saved state; see above)
  const void* dy;        // (T x H) output gradient
  const void* w1;        // (E_tiles x 2F x H) W1 of the experts here, natural layout (gate rows, then up)
  const void* w2;        // (E_tiles x H x F)
  const void* wr;        // (E8 x H) router weight, zero rows beyond E
  const void* ws1;       // (2Fs x H) shared expert (Fs > 0)
  const void* ws2;       // (H x Fs)
  void* dos;             // (M_MAX x H) upstream gradient of the expert outputs, w_tj * dy_t (sorted rows)
  void* dgus;            // (M_MAX x 2F) [dg | du] of the sorted rows (pad rows 0)
  void* dxs;             // (M_MAX x H) input gradients of the sorted rows
  void* dlogits;         // (T x E8) router logits' gradient (bf16: the router wgrad/dgrad's A)
  void* dxr;             // (T x H) dlogits @ Wr
  void* dgush;           // (T x 2Fs) shared expert [dg | du]
  void* dxsh;            // (T x H) shared expert's part of dx
  void* dx;              // (T x H) output: the tokens' gradient
  void* dwr;             // (W x E x H) output: each rank's tokens' share of the router gradient
  void* dw1;             // (E_tiles x 2F x H) output: every executed rank's rows in token order (host: then the peers')
  void* dw2;             // (E_tiles x H x F) output
  void* dws1;            // (W x 2Fs x H) output: each rank's share (Fs > 0)
  void* dws2;            // (W x H x Fs) output
  float* dwc;            // (T x topk) fp32 dw_tj of every choice (the movers' GATHER, read by LOGITS; no peers)
  // host fabric (rank-0 view, kosmos_bench/ops/moe_host_bwd.py; the forward's peer tables in f):
  // per peer p = 1..W-1, rows in the order of the forward's recv_rows / send_rows
  const void* recv_gout[8];  // [p] (n_p x H) upstream gradients of p's rows on the experts here (host -> device)
  void* recv_dx[8];          // [p] (n_p x H) their input gradients                            (device -> host)
  void* send_gout[8];        // [p] (m_p x H) upstream gradients of own rows on p's experts    (device -> host)
  const void* send_dx[8];    // [p] (m_p x H) p's input gradients of those rows                (host -> device)
  uint32_t* ctr;         // counters (KosmosMoeBwdCtr), ctr_words of them
  uint32_t* state;       // [0] completed calls, [1] aborted epoch, [2], [3] unused
  void* err;             // KosmosErrorRecord (device memory)
  void* trace;           // KosmosTraceRecord [grid][trace_cap] or NULL
  uint32_t* trace_count; // [grid]
  uint64_t timeout_ns;
  int32_t W, T1, E8, ctr_words;
  int32_t grid, trace_cap, spin_ns;
  int32_t debug_skip_gather;  // 1: the GATHER items never run (watchdog test)
} KosmosMoeBwdArgs;
