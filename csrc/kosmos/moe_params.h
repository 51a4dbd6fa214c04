// moe_params.h — the C ABI of the MoE forward kernel (csrc/moe_fwd_sm90.cu), mirrored field by
// field by kosmos_bench/kernels/moe_sm90.py (MoeArgs; a CPU test compares every offset with
// kosmos_moe_args_offset). Change both together and bump KOSMOS_MOE_ABI_VERSION.
//
// Only fixed-width fields; the struct is a multiple of 8 bytes with no implicit padding.
// All pointers are device pointers. T = tokens of every executed rank together (world 1: the
// rank's T; local fabric: W * T, rank r's tokens at rows r*T..), E = experts of every executed
// rank, M_MAX = tiles_max * 128 rows of the expert-sorted buffers.
#pragma once
#include <stdint.h>

#define KOSMOS_MOE_ABI_VERSION 7
#define KOSMOS_MOE_MAX_E 256   // experts per launch (the router tile is 256 wide)
#define KOSMOS_MOE_MAX_TOPK 16
#define KOSMOS_MOE_TOK_BLOCK 32  // tokens per DISPATCH / INDEX / FOLD item, rows per GATHER item
// DOWN runs in up to this many column groups of H (every tile's n-tiles of group 0, then of group
// 1, ...) when no peer rows wait for whole tiles (world 1, local fabric); the fold of group g then
// runs, on the movers too, while group g + 1's DOWNs compute (moe_fwd_sm90.cu Layout)
#define KOSMOS_MOE_FOLD_GROUPS 4

// Item kinds, in claim order (also the error record's `queue` and the trace record's item high byte);
// INDEX and GATHER are the movers' (their own counters, outside the claim sequence).
enum KosmosMoeKind {
  KOSMOS_MOE_ROUTE = 0,       // 128 tokens: router logits (builder tile), top-k, weights, per-block counts
  KOSMOS_MOE_SCAN = 1,        // per-expert offsets, block bases, the expert tile table
  KOSMOS_MOE_SHARED_UP = 2,   // shared expert gate/up tile (128 tokens x 256 of 2*Fs), SwiGLU epilogue
  KOSMOS_MOE_DISPATCH = 3,    // 32 tokens: rows of remote experts -> the owner's send buffer (host
                              //   fabric: pinned host memory); none without remote experts
  KOSMOS_MOE_PEER_DISPATCH = 4,  // unused (the peers' rows are GATHER's)
  KOSMOS_MOE_SHARED_DOWN = 5,
  KOSMOS_MOE_UP = 6,          // expert tile (queue position q, n-tile of 2F), SwiGLU epilogue
  KOSMOS_MOE_DOWN = 7,        // expert tile (q, n-tile of H)
  KOSMOS_MOE_COMBINE = 8,     // unused (COMBINE_TILE, the movers')
  KOSMOS_MOE_FOLD = 9,        // 32 tokens x a column group: y = sum_j w_j * out[pos(t, j)] (+ shared), fixed
                              //   order; claimed from their own counter by the sequence and the movers
  KOSMOS_MOE_NUM_KINDS = 10,
  KOSMOS_MOE_INDEX = 10,      // movers, 32 tokens: sorted_choice[pos(t, j)] = t * topk + j (own experts)
  KOSMOS_MOE_GATHER = 11,     // movers, after every INDEX: rows 32 part.. of the tile at queue position
                              //   q (item 4q + part; own rows from x, the peers' from recv_rows) -> arrived[tile]
  KOSMOS_MOE_COMBINE_TILE = 12,  // movers, host fabric, after the GATHERs: the expert outputs of the
                                 //   peer rows of the tile at queue position q -> recv_out (after its DOWNs)
};

// Counter words (uint32, zeroed by the last CTA of every call; the host zeroes them after an abort).
enum KosmosMoeCtr {
  KOSMOS_MOE_CTR_CLAIM = 0, KOSMOS_MOE_CTR_ROUTED = 1, KOSMOS_MOE_CTR_EXIT = 2,
  KOSMOS_MOE_CTR_INDEX = 3,    // INDEX claims
  KOSMOS_MOE_CTR_INDEXED = 4,  // INDEX items done
  KOSMOS_MOE_CTR_GATHER = 5,   // GATHER claims
  KOSMOS_MOE_CTR_SENT = 6,     // DISPATCH items done (host fabric)
  KOSMOS_MOE_CTR_COMB = 7,     // COMBINE_TILE claims
  KOSMOS_MOE_CTR_HEAD = 8
};
// after the head: arrived[tiles_max], up_done[tiles_max], down_done[tiles_max], sh_up_done[route_blocks],
// sh_down_done[route_blocks], combined[E_tiles] (peer rows of expert e whose outputs are in recv_out),
// down_group_done[KOSMOS_MOE_FOLD_GROUPS] (DOWN items of column group g done), the FOLD claim counter

typedef struct KosmosMoeArgs {
  const void* x;         // (T x H) bf16 tokens
  const float* bias;     // (E) fp32 selection bias
  void* y;               // (T x H) bf16 output
  int32_t* routes;       // (T x topk) global expert ids (output)
  float* weights;        // (T x topk) fp32 combine weights
  int32_t* rank;         // (T x topk) row of (t, j) among its router block's rows of expert e
  float* logits;         // (T x E) fp32 router logits
  int32_t* blk_cnt;      // (route_blocks x E) rows of expert e in router block b
  int32_t* blk_base;     // (route_blocks x E) rows of expert e in blocks before b
  int32_t* seg_start;    // (E) first sorted row of expert e (segments padded to 128 rows)
  int32_t* tile_order;   // (tiles_max) sorted m-tile at queue position q
  int32_t* tile_expert;  // (tiles_max) expert of sorted m-tile g
  int32_t* tile_rows;    // (tiles_max) valid rows of sorted m-tile g
  int32_t* meta;         // [0]: expert tiles this call
  void* xs;              // (M_MAX x H) bf16 expert-sorted token rows
  void* hs;              // (M_MAX x F) bf16 SwiGLU activations
  void* os;              // (M_MAX x H) bf16 expert outputs
  void* hsh;             // (T x Fs) bf16 shared expert activations (Fs > 0)
  void* ysh;             // (T x H) bf16 shared expert output (Fs > 0)
  // saved for the backward (csrc/moe_bwd_sm90.cu), NULL when not wanted: the gate/up
  // pre-activations [g | u] (natural column order: gate columns 0..F-1, then up) of every
  // sorted row (UP epilogue) and of every token (SHARED_UP epilogue), bf16
  void* gus;             // (M_MAX x 2F)
  void* gush;            // (T x 2Fs) (Fs > 0)
  int32_t* own_total;    // (E) rows of expert e from the executed tokens this call (scan)
  int32_t* sorted_choice; // (M_MAX) choice t * topk + j of each own row of the expert-sorted buffer (INDEX)
  // host fabric: the peers' rows of expert e in sorted order, as peer rows (below):
  // peer_inv[peer_first[e] + k] = the peer row of e's k-th peer row (static, from the view)
  const int32_t* peer_inv;    // (R)
  const int32_t* peer_first;  // (E_tiles)
  // host fabric with copy-engine movers (mover ce; NULL: SM movers read and write the pinned
  // buffers below themselves): those buffers are then device copies that the runner's copy-
  // engine plans move over PCIe, and these words (monotonic, = the call's epoch when released)
  // order the two: [e] expert e's peer rows are in recv_rows, [E_tiles + p - 1] peer p's
  // send_out is in (both written by the copy engine); [E_tiles + 7] every DISPATCH row is in
  // send_rows, [E_tiles + 8 + e] every peer row of expert e has its output in recv_out (both
  // written by the kernel; the last CTA releases all of them at exit, so an aborted call
  // leaves no copy waiting). 2 E_tiles + 8 words.
  uint32_t* ce_flags;
  // host fabric: the peers' outputs exist for rank 0's reference routing only (moe_host.py): a
  // remote choice (t, e) finds its row in e's owner's send buffers where ref_routes[t][j'] == e
  // (ref_slot[t][j']); a choice the reference did not make has no row (-1: not sent, adds 0)
  const int32_t* ref_routes;  // (T x topk) global expert ids of the reference routing
  const int32_t* ref_slot;    // (T x topk) row in send_rows / send_out of the owner, -1 when local
  // host fabric (peers = W - 1 static ranks in pinned host memory; kosmos_bench/ops/moe_host.py):
  // peer rows concatenated over peers p = 1..W-1 (row i of peer p is index peer_begin[p] + i)
  const int32_t* peer_expert;  // (R) local expert of each peer row
  const int32_t* peer_rel;     // (R) its row among its expert's peer rows (peers in order)
  const int32_t* peer_total;   // (E_tiles) peer rows per local expert
  const void* recv_rows[8];    // [p] (n_p x H) peer p's rows for the local experts       (host -> device)
  void* recv_out[8];           // [p] (n_p x H) their expert outputs                      (device -> host)
  void* send_rows[8];          // [p] (m_p x H) own rows for peer p's experts              (device -> host)
  const void* send_out[8];     // [p] (m_p x H) peer p's expert outputs of those rows      (host -> device)
  int32_t peer_begin[9];       // prefix of peer rows over p (peer_begin[0] = peer_begin[1] = 0)
  int32_t E_tiles;             // experts with tiles here (the executed rank's; == E without peers)
  int32_t E_loc;               // experts per rank (owner of remote expert e: e / E_loc)
  int32_t peer_rows;           // R
  uint32_t* ctr;         // counters (KosmosMoeCtr), ctr_words of them
  uint32_t* state;       // [0] completed calls, [1] aborted epoch, [2] scan flag (epoch), [3] unused
  void* err;             // KosmosErrorRecord (device memory)
  void* trace;           // KosmosTraceRecord [grid][trace_cap] or NULL
  uint32_t* trace_count; // [grid]
  uint64_t timeout_ns;
  int32_t T, H, F, Fs, E, topk;
  int32_t n_group, topk_group, scoring;  // scoring 0 softmax, 1 sigmoid
  int32_t route_blocks, tiles_max, ctr_words;
  int32_t grid, trace_cap, spin_ns;
  int32_t debug_skip_scan;  // 1: the SCAN item never runs (watchdog test)
  float scale;
  // expert-tile order of UP / DOWN (and the backward's DH / DX), set by SCAN: 0 demand (tiles
  // whose rows are all own first, expert by expert, so the tiles in flight share one expert's
  // weights in L2; then the tiles waiting for peer rows, expert by expert),
  // 1 fifo (first tile of every expert, then the second...: the order dispatch fills them),
  // 2 reverse (of demand), 3 random (a fixed permutation of demand)
  int32_t queue_order;
} KosmosMoeArgs;
