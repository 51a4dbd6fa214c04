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

#define KOSMOS_MOE_ABI_VERSION 1
#define KOSMOS_MOE_MAX_E 256   // experts per launch (the router tile is 256 wide)
#define KOSMOS_MOE_MAX_TOPK 16
#define KOSMOS_MOE_TOK_BLOCK 32  // tokens per DISPATCH / FOLD item

// Item kinds, in claim order (also the error record's `queue` and the trace record's item high byte).
enum KosmosMoeKind {
  KOSMOS_MOE_ROUTE = 0,     // 128 tokens: router logits (builder tile), top-k, weights, per-block counts
  KOSMOS_MOE_SHARED_UP = 1, // shared expert gate/up tile (128 tokens x 256 of 2*Fs), SwiGLU epilogue
  KOSMOS_MOE_SCAN = 2,      // per-expert offsets, block bases, the expert tile table
  KOSMOS_MOE_DISPATCH = 3,  // 32 tokens: rows -> their places in the expert-sorted buffer
  KOSMOS_MOE_SHARED_DOWN = 4,
  KOSMOS_MOE_UP = 5,        // expert tile (queue position q, n-tile of 2F), SwiGLU epilogue
  KOSMOS_MOE_DOWN = 6,      // expert tile (q, n-tile of H)
  KOSMOS_MOE_FOLD = 7,      // 32 tokens: y = sum_j w_j * out[pos(t, j)] (+ shared), fixed order
  KOSMOS_MOE_NUM_KINDS = 8,
};

// Counter words (uint32, zeroed by the last CTA of every call; the host zeroes them after an abort).
enum KosmosMoeCtr { KOSMOS_MOE_CTR_CLAIM = 0, KOSMOS_MOE_CTR_ROUTED = 1, KOSMOS_MOE_CTR_EXIT = 2, KOSMOS_MOE_CTR_HEAD = 4 };
// after the head: arrived[tiles_max], up_done[tiles_max], down_done[tiles_max], sh_up_done[route_blocks],
// sh_down_done[route_blocks]

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
  int32_t reserved0;
} KosmosMoeArgs;
