// params.h — the C ABI shared by the kernels, the host launchers and the Python binding
// (kosmos_bench/kernels/abi.py mirrors these structs field by field with ctypes; change
// both together and bump KOSMOS_ABI_VERSION).
//
// Only fixed-width fields; every struct is a multiple of 8 bytes with no implicit padding.
#pragma once
#include <stdint.h>

#define KOSMOS_ABI_VERSION 9
#define KOSMOS_MAX_WORLD 8
#define KOSMOS_ITEM_STRIDE 11  // int32 words per item row (schedule.ITEM_FIELDS)
#define KOSMOS_NUM_CTR 8       // uint32 counters per rank in Params.state (after 4 globals)

// AG_WGRAD: the all-gather along the GEMM's K (ag-wgrad), sm90 A-transposed build only.
enum KosmosOp { KOSMOS_OP_AG_GEMM = 0, KOSMOS_OP_GEMM_RS = 1, KOSMOS_OP_AG_WGRAD = 2 };

// Error codes returned by every host entry point (0 = ok).
enum KosmosStatus {
  KOSMOS_OK = 0,
  KOSMOS_ERR_INVALID = -1,      // bad arguments (message in kosmos_last_error())
  KOSMOS_ERR_CUDA = -2,         // a CUDA call failed (message names it)
  KOSMOS_ERR_TOO_MANY_WGS = -3, // grid larger than what can be co-resident
};

// One rank executed by this launch (W of them on the local fabric, 1 otherwise). Lives in
// device memory (Params.ranks points at an array of them).
typedef struct KosmosRankArgs {
  // Item tables (int32 [count][KOSMOS_ITEM_STRIDE]) and queues (int32 [count]) indexed by
  // queue: 0 builders, 1 movers, 2 reduces.
  const int32_t* items[3];
  const int32_t* queue[3];
  const int32_t* deps;        // flat flag indices into this rank's flag array
  const int32_t* peer_flags;  // flags set to the epoch at entry when Params.static_peers
  const int32_t* flag_mult;   // [num_flags] releases per call of each own flag (ready at epoch * mult)
  uint32_t* ctr;              // [KOSMOS_NUM_CTR]: claims (builder, mover, reduce), rank done, movers in flight
  const void* A;              // ag-gemm: A_r (M/W x K); gemm-rs: A_r (M x K/W); ag-wgrad: At_r (K/W x M)
  const void* B;              // ag-gemm: B_r (K x N/W); gemm-rs: B_r (K/W x N)    bf16 row-major
  void* C;                    // ag-gemm: C_r (M x N/W); gemm-rs: C_r (M/W x N)    bf16 row-major
  void* work;                 // ag-gemm: gathered A (M x K); gemm-rs: partial staging (M x N); ag-wgrad: At (K x M)
  float* carry;               // ag-wgrad band items (AGW_BAND): fp32 carry, one 128 x 256 tile per C_r tile in the
                              // math warps' fragment order (m_tiles * n_tiles * 32768 floats); else NULL
  uint32_t* flags[KOSMOS_MAX_WORLD];        // flags[p]: rank p's flag array (uint32[num_flags])
  const void* peer_A[KOSMOS_MAX_WORLD];     // ag-gemm: A_p as this rank reads it (M/W x K); ag-wgrad: At_p (K/W x M)
  void* push_dst[KOSMOS_MAX_WORLD];         // gemm-rs: recv[d] slot r (M/W x N) as this rank writes it
  void* slot[KOSMOS_MAX_WORLD];             // gemm-rs: own recv slot s (M/W x N), reduce sources
  const void* proxy_src[KOSMOS_MAX_WORLD];  // gemm-rs host fabric: peer s's static contribution (M/W x N)
  int32_t count[3];
  int32_t rank;            // logical rank id
  int32_t wg_begin;        // first blockIdx.x of this rank
  int32_t wg_end;          // one past the last
  int32_t num_mover_wgs;   // 0: policy self; k > 0: fixed (WGs 0..k-1 move)
  int32_t num_peer_flags;
  int32_t skip;            // debug: this rank never signals and does no work (watchdog test)
  int32_t max_inflight_movers;  // policy self: soft cap on concurrent mover items (0 = none)
} KosmosRankArgs;

// Error record (host-mapped memory). count increases by one per timed-out call.
typedef struct KosmosErrorRecord {
  uint32_t count;
  uint32_t epoch;      // call that timed out
  int32_t rank;
  int32_t wg;          // WG index within its rank
  int32_t queue;       // 0 builder, 1 mover, 2 reduce, 3 handshake
  int32_t item;        // item id in its table (handshake: -1)
  int32_t flag_rank;   // whose flag array
  int32_t flag;        // flag index
  uint32_t expected;   // epoch waited for
  uint32_t seen;       // last value read
  uint64_t waited_ns;
} KosmosErrorRecord;

// One trace record (24 bytes): role 0 MOVE, 1 BUILD, 2 REDUCE, 3 WAIT.
typedef struct KosmosTraceRecord {
  uint64_t t0;
  uint64_t t1;
  int32_t item;
  uint16_t role;
  uint16_t sm;
} KosmosTraceRecord;

typedef struct KosmosParams {
  const KosmosRankArgs* ranks;  // device array [num_ranks]
  uint32_t* state;              // device: [0] completed calls, [1] aborted epoch, [2] grid done, [3] unused
  KosmosErrorRecord* err;       // host-mapped (device pointer)
  KosmosTraceRecord* trace;     // device [grid][trace_cap] or NULL (tracing off)
  uint32_t* trace_count;        // device [grid] records attempted per WG (dropped = count - cap)
  uint64_t timeout_ns;          // watchdog deadline of every spin
  int32_t op;                   // KosmosOp
  int32_t num_ranks;            // ranks executed by this launch
  int32_t world;
  int32_t M, N, K;              // global problem
  int32_t trace_cap;
  int32_t sys_scope;            // 1: cross-rank flags at .sys scope (nvlink); 0: .gpu
  int32_t static_peers;         // 1: host fabric (peers do not execute)
  int32_t grid;                 // number of WGs (blocks) launched
  int32_t mover_bulk;           // 1: ag-gemm band slices move with bulk async copies (TMA, sm_90) through
                                //    shared memory; 0: 16-byte vector loads/stores
  int32_t k_stream;             // 1: ag-gemm band flags count K-slices delivered in K order (copy-engine
                                //    movers: band flag = mult*(e-1) + slices there, mult = slices per
                                //    band); a builder claims a tile once slice 0 of its band is there and
                                //    waits for the others inside the tile (sm90 variant only)
  int32_t spin_ns;              // sleep between two polls of a flag spin (ns, >= 0)
  int32_t wgrad_group_rows;     // ag-wgrad band items: K rows of a band group (schedule meta group_rows; a
                                //    shard's last group shorter); 0 without band items
} KosmosParams;

#ifdef __cplusplus
extern "C" {
#endif
int kosmos_abi_version(void);
const char* kosmos_last_error(void);
int kosmos_max_wgs(int op, int device, int* out);
int kosmos_launch(const KosmosParams* params, void* stream);
int kosmos_host_device_ptr(void* host, void** dev);
int kosmos_alloc_mapped(uint64_t bytes, void** host, void** dev);
int kosmos_free_mapped(void* host);
int kosmos_smem_bytes(int op);
int kosmos_stream_write_u32(void* stream, void* dev_ptr, uint32_t value);
int kosmos_stream_create(void** stream);
int kosmos_stream_destroy(void* stream);
void* kosmos_ce_plan_create(void* copy_stream, void* flag_stream, int n, const uint64_t* dst, const uint64_t* src,
                            const uint64_t* width, const uint64_t* height, const uint64_t* pitch,
                            const uint64_t* flag, const uint32_t* mult, const uint32_t* back, int head,
                            int inline_from);
int kosmos_ce_plan_set_waits(void* plan, int n, const uint64_t* wait, const uint32_t* wait_mult);
int kosmos_ce_plan_begin(void* plan, void* main_stream, uint32_t epoch);
int kosmos_ce_plan_end(void* plan, void* main_stream, uint32_t epoch);
void kosmos_ce_plan_destroy(void* plan);
#ifdef __cplusplus
}
#endif
