// runtime.cu — host launchers and the C ABI (params.h). Every CUDA call is checked; every
// entry point returns a KosmosStatus and leaves a message for kosmos_last_error().
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "kosmos/host_error.h"
#include "kosmos/params.h"
#include "kosmos/persistent.cuh"

namespace kosmos {
const void* ag_gemm_kernel();
const void* gemm_rs_kernel();
}  // namespace kosmos

namespace {

using kosmos::fail;
using kosmos::g_err;

const void* kernel_of(int op) {
  if (op == KOSMOS_OP_AG_GEMM) return kosmos::ag_gemm_kernel();
  if (op == KOSMOS_OP_GEMM_RS) return kosmos::gemm_rs_kernel();
  return nullptr;
}

int prepare_kernel(const void* k) {
  KOSMOS_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kosmos::kSmemBytes));
  return KOSMOS_OK;
}

}  // namespace

extern "C" {

int kosmos_abi_version(void) { return KOSMOS_ABI_VERSION; }

// Offset of field i of KosmosRankArgs / KosmosParams (the ctypes mirror's layout test, abi.py
// struct_mismatches; field order as abi.py lists them), sizeof at i = the field count, -1 past it.
long kosmos_rank_args_offset(int i) {
#define F(name) offsetof(KosmosRankArgs, name)
  static const long off[] = {F(items), F(queue), F(deps), F(peer_flags), F(flag_mult), F(ctr), F(A), F(B), F(C),
                             F(work), F(carry), F(flags), F(peer_A), F(push_dst), F(slot), F(proxy_src), F(count),
                             F(rank), F(wg_begin), F(wg_end), F(num_mover_wgs), F(num_peer_flags), F(skip),
                             F(max_inflight_movers), sizeof(KosmosRankArgs)};
#undef F
  return (i >= 0 && i < int(sizeof(off) / sizeof(off[0]))) ? off[i] : -1;
}

long kosmos_params_offset(int i) {
#define F(name) offsetof(KosmosParams, name)
  static const long off[] = {F(ranks), F(state), F(err), F(trace), F(trace_count), F(timeout_ns), F(op), F(num_ranks),
                             F(world), F(M), F(N), F(K), F(trace_cap), F(sys_scope), F(static_peers), F(grid),
                             F(mover_bulk), F(k_stream), F(spin_ns), F(wgrad_group_rows), sizeof(KosmosParams)};
#undef F
  return (i >= 0 && i < int(sizeof(off) / sizeof(off[0]))) ? off[i] : -1;
}

const char* kosmos_last_error(void) { return g_err; }

int kosmos_smem_bytes(int op) { return kernel_of(op) ? kosmos::kSmemBytes : -1; }

int kosmos_max_wgs(int op, int device, int* out) {
  const void* k = kernel_of(op);
  if (!k || !out) return fail(KOSMOS_ERR_INVALID, "kosmos_max_wgs: bad op %d or null out", op);
  int prev = 0;
  KOSMOS_CUDA(cudaGetDevice(&prev));
  KOSMOS_CUDA(cudaSetDevice(device));
  int rc = prepare_kernel(k);
  if (rc) return rc;
  int per_sm = 0, sms = 0, coop = 0;
  KOSMOS_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kosmos::kThreads, kosmos::kSmemBytes));
  KOSMOS_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  KOSMOS_CUDA(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
  KOSMOS_CUDA(cudaSetDevice(prev));
  if (!coop) return fail(KOSMOS_ERR_INVALID, "device %d does not support cooperative launches", device);
  *out = per_sm * sms;
  return KOSMOS_OK;
}

int kosmos_launch(const KosmosParams* params, void* stream) {
  if (!params) return fail(KOSMOS_ERR_INVALID, "null params");
  const KosmosParams& p = *params;
  const void* k = kernel_of(p.op);
  if (!k) return fail(KOSMOS_ERR_INVALID, "unknown op %d", p.op);
  if (int rc = kosmos::check_common_params(p)) return rc;
  if (p.k_stream) return fail(KOSMOS_ERR_INVALID, "k_stream (builders streaming K-slices) is the sm90 variant's only");
  int rc = prepare_kernel(k);
  if (rc) return rc;
  int dev = 0, per_sm = 0, sms = 0;
  KOSMOS_CUDA(cudaGetDevice(&dev));
  KOSMOS_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kosmos::kThreads, kosmos::kSmemBytes));
  KOSMOS_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (p.grid > per_sm * sms)
    return fail(KOSMOS_ERR_TOO_MANY_WGS, "grid %d > %d co-resident WGs (%d per SM x %d SMs)", p.grid, per_sm * sms,
                per_sm, sms);
  KosmosParams local = p;
  void* args[] = {&local};
  KOSMOS_CUDA(cudaLaunchCooperativeKernel(k, dim3(p.grid), dim3(kosmos::kThreads), args, kosmos::kSmemBytes,
                                          static_cast<cudaStream_t>(stream)));
  KOSMOS_CUDA(cudaGetLastError());
  return KOSMOS_OK;
}

int kosmos_host_device_ptr(void* host, void** dev) {
  if (!host || !dev) return fail(KOSMOS_ERR_INVALID, "null pointer");
  KOSMOS_CUDA(cudaHostGetDevicePointer(dev, host, 0));
  return KOSMOS_OK;
}

int kosmos_alloc_mapped(uint64_t bytes, void** host, void** dev) {
  if (!host || !dev) return fail(KOSMOS_ERR_INVALID, "null pointer");
  KOSMOS_CUDA(cudaHostAlloc(host, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  memset(*host, 0, bytes);
  KOSMOS_CUDA(cudaHostGetDevicePointer(dev, *host, 0));
  return KOSMOS_OK;
}

// Stream memory operation (no SM needed, so it runs while the persistent kernel holds every
// SM): *dev_ptr = value once the stream reaches it. Used by copy-engine movers to release a
// band flag after its cudaMemcpyAsync. Driver entry point looked up through the runtime,
// so the library does not link libcuda. barrier = 0 adds CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER
// (rejected with CUDA_ERROR_INVALID_VALUE on the H200 box's driver: every CE release is fenced).
typedef int (*StreamWriteValue32Fn)(void* stream, unsigned long long addr, unsigned int value, unsigned int flags);

static int stream_write(void* stream, void* dev_ptr, uint32_t value, bool barrier) {
  static StreamWriteValue32Fn fn = nullptr;
  if (!fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    KOSMOS_CUDA(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &p, 12000, cudaEnableDefault, &q));
    if (!p || q != cudaDriverEntryPointSuccess) return fail(KOSMOS_ERR_CUDA, "cuStreamWriteValue32 not available");
    fn = reinterpret_cast<StreamWriteValue32Fn>(p);
  }
  const int rc = fn(stream, reinterpret_cast<unsigned long long>(dev_ptr), value, barrier ? 0u : 1u);
  if (rc != 0) return fail(KOSMOS_ERR_CUDA, "cuStreamWriteValue32 failed: CUresult %d", rc);
  return KOSMOS_OK;
}

// Stream memory operation: the stream waits until (int32)(*dev_ptr - value) >= 0 (the epoch
// flags' comparison, CU_STREAM_WAIT_VALUE_GEQ). The copy-engine pushes of GEMM+RS wait so on the
// builder counters the persistent kernel releases (no SM needed on this side either).
typedef int (*StreamWaitValue32Fn)(void* stream, unsigned long long addr, unsigned int value, unsigned int flags);

static int stream_wait(void* stream, void* dev_ptr, uint32_t value) {
  static StreamWaitValue32Fn fn = nullptr;
  if (!fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    KOSMOS_CUDA(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000, cudaEnableDefault, &q));
    if (!p || q != cudaDriverEntryPointSuccess) return fail(KOSMOS_ERR_CUDA, "cuStreamWaitValue32 not available");
    fn = reinterpret_cast<StreamWaitValue32Fn>(p);
  }
  const int rc = fn(stream, reinterpret_cast<unsigned long long>(dev_ptr), value, 0u /* GEQ */);
  if (rc != 0) return fail(KOSMOS_ERR_CUDA, "cuStreamWaitValue32 failed: CUresult %d", rc);
  return KOSMOS_OK;
}

int kosmos_stream_write_u32(void* stream, void* dev_ptr, uint32_t value) {
  return stream_write(stream, dev_ptr, value, true);
}

// The copy-engine plan's streams are the library's own (non-blocking, never used for anything
// else). A stream that has issued copies before (torch's pool hands the same 32 streams to every
// user in turn) has its stream memory operations executed behind the copies queued on the copy
// engine: a flag stream like that releases no band before the last byte has landed, and the
// call takes copy + GEMM (results/issue4-h200-20261203, t14: 3288 vs 2238 us).
int kosmos_stream_create(void** stream) {
  if (!stream) return fail(KOSMOS_ERR_INVALID, "null stream pointer");
  cudaStream_t s = nullptr;
  KOSMOS_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = s;
  return KOSMOS_OK;
}

int kosmos_stream_destroy(void* stream) {
  if (stream) KOSMOS_CUDA(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
  return KOSMOS_OK;
}

// Copy-engine mover plan (host fabric, ag-gemm and gemm-rs; kosmos_bench/ce_plan.py), entries in mover
// order: entry i copies height[i] rows of width[i] bytes (row pitch pitch[i] on both sides; one
// cudaMemcpyAsync when width == pitch, else cudaMemcpy2DAsync, a K-slice of a band) and/or
// releases *flag[i] = mult[i] * epoch - back[i]. Entries with width 0 release further flags
// after the latest copy. Copies run back to back on the copy stream, each followed by an
// event; the flag stream waits for that event and releases (fenced writes, kept off the copy
// engine's path; while copies are in flight they land ~11 us apart, so the runner gives every
// copy one release: ce_plan.share_flags). Given one stream for both, releases follow
// their copy in stream order with no events (5% slower: results/issue4-h200-20261203, t9).
// Entries from inline_from on release on the copy stream (the last copy's: nothing follows
// them, so the copy engine waits for nothing and the event hop to the flag stream is saved).
// The copy stream first waits for the flag stream's earlier releases: a band's earlier
// K-slice release still queued there would otherwise land after (and undo) its last one.
// The arrays are copied in at creation, so a call costs the host two C calls around the
// kernel launch (begin: entries [0, head), end: the rest). flag[i] == 0: no release.
// kosmos_ce_plan_set_waits (GEMM+RS pushes): before entry i's copy the copy stream waits until
// *wait[i] >= wait_mult[i] * epoch (wait[i] == 0: no wait) -- a builder counter of the kernel,
// so such a plan is enqueued after the kernel launch (head 0): nothing the kernel needs may
// queue behind a wait on the kernel.
struct CePlan {
  std::vector<uint64_t> dst, src, width, height, pitch, flag, wait;
  std::vector<uint32_t> mult, back, wait_mult;
  int head = 0, inline_from = 0;
  cudaStream_t cs = nullptr, fs = nullptr;
  cudaEvent_t ready = nullptr, copies_done = nullptr, flags_done = nullptr, flags_before_inline = nullptr;
  std::vector<cudaEvent_t> events;  // one per copy; a wait captures the record, so reuse is safe
};

// Entries [lo, hi) on the plan's streams.
static int ce_enqueue(CePlan& P, int lo, int hi, uint32_t epoch) {
  if (lo >= hi) return KOSMOS_OK;
  const cudaStream_t cs = P.cs, fs = P.fs;
  size_t copy = 0;
  for (int i = 0; i < lo; ++i) copy += P.width[i] > 0;
  for (int i = lo; i < hi; ++i) {
    if (P.width[i] > 0) {
      if (!P.wait.empty() && P.wait[i])
        if (int rc = stream_wait(cs, reinterpret_cast<void*>(P.wait[i]), P.wait_mult[i] * epoch)) return rc;
      void* d = reinterpret_cast<void*>(P.dst[i]);
      const void* s_ = reinterpret_cast<const void*>(P.src[i]);
      if (P.width[i] == P.pitch[i])
        KOSMOS_CUDA(cudaMemcpyAsync(d, s_, P.width[i] * P.height[i], cudaMemcpyDefault, cs));
      else
        KOSMOS_CUDA(cudaMemcpy2DAsync(d, P.pitch[i], s_, P.pitch[i], P.width[i], P.height[i], cudaMemcpyDefault, cs));
      if (fs != cs && i < P.inline_from) {  // else stream order is enough
        KOSMOS_CUDA(cudaEventRecord(P.events[copy], cs));
        KOSMOS_CUDA(cudaStreamWaitEvent(fs, P.events[copy], 0));
      }
      ++copy;
    }
    if (i == P.inline_from && fs != cs) {  // after this entry's copy: nothing waits for it
      KOSMOS_CUDA(cudaEventRecord(P.flags_before_inline, fs));
      KOSMOS_CUDA(cudaStreamWaitEvent(cs, P.flags_before_inline, 0));
    }
    if (!P.flag[i]) continue;
    cudaStream_t rs = i < P.inline_from ? fs : cs;
    if (int rc = stream_write(rs, reinterpret_cast<void*>(P.flag[i]), P.mult[i] * epoch - P.back[i], true)) return rc;
  }
  return KOSMOS_OK;
}

void kosmos_ce_plan_destroy(void* h) {
  CePlan* P = static_cast<CePlan*>(h);
  if (!P) return;
  for (cudaEvent_t e : P->events) cudaEventDestroy(e);
  for (cudaEvent_t e : {P->ready, P->copies_done, P->flags_done, P->flags_before_inline})
    if (e) cudaEventDestroy(e);
  delete P;
}

// head: entries [0, head) go in before the kernel launch (the first copy and its releases).
void* kosmos_ce_plan_create(void* copy_stream, void* flag_stream, int n, const uint64_t* dst, const uint64_t* src,
                            const uint64_t* width, const uint64_t* height, const uint64_t* pitch,
                            const uint64_t* flag, const uint32_t* mult, const uint32_t* back, int head,
                            int inline_from) {
  if (!copy_stream || !flag_stream || n < 1 || head < 0 || head > n || inline_from < 0 || inline_from > n || !dst || !src || !width || !height || !pitch ||
      !flag || !mult || !back) {
    fail(KOSMOS_ERR_INVALID, "bad CE plan");
    return nullptr;
  }
  if (width[0] == 0 || (head < n && width[head] == 0)) {
    fail(KOSMOS_ERR_INVALID, "CE plan: the first entry and the entry at head must copy");
    return nullptr;
  }
  for (int i = 0; i < n; ++i)
    if (width[i] > 0 && (pitch[i] < width[i] || height[i] == 0)) {
      fail(KOSMOS_ERR_INVALID, "CE plan: entry %d has pitch < width or no rows", i);
      return nullptr;
    }
  CePlan* P = new (std::nothrow) CePlan();
  if (!P) {
    fail(KOSMOS_ERR_INVALID, "out of host memory");
    return nullptr;
  }
  P->dst.assign(dst, dst + n);
  P->src.assign(src, src + n);
  P->width.assign(width, width + n);
  P->height.assign(height, height + n);
  P->pitch.assign(pitch, pitch + n);
  P->flag.assign(flag, flag + n);
  P->mult.assign(mult, mult + n);
  P->back.assign(back, back + n);
  P->head = head;
  P->inline_from = inline_from;
  P->cs = static_cast<cudaStream_t>(copy_stream);
  P->fs = static_cast<cudaStream_t>(flag_stream);
  size_t copies = 0;
  for (int i = 0; i < n; ++i) copies += width[i] > 0;
  P->events.assign(copies, nullptr);
  bool ok = true;
  for (cudaEvent_t& e : P->events) ok = ok && cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess;
  for (cudaEvent_t* e : {&P->ready, &P->copies_done, &P->flags_done, &P->flags_before_inline})
    ok = ok && cudaEventCreateWithFlags(e, cudaEventDisableTiming) == cudaSuccess;
  if (!ok) {
    fail(KOSMOS_ERR_CUDA, "CE plan: cudaEventCreate failed");
    kosmos_ce_plan_destroy(P);
    return nullptr;
  }
  return P;
}

// Waits before the copies (GEMM+RS pushes; see CePlan): n entries as at creation.
int kosmos_ce_plan_set_waits(void* h, int n, const uint64_t* wait, const uint32_t* wait_mult) {
  if (!h || !wait || !wait_mult) return fail(KOSMOS_ERR_INVALID, "null CE plan or waits");
  CePlan& P = *static_cast<CePlan*>(h);
  if (n != static_cast<int>(P.dst.size())) return fail(KOSMOS_ERR_INVALID, "CE plan waits: %d entries, plan has %d", n, int(P.dst.size()));
  if (P.head != 0) return fail(KOSMOS_ERR_INVALID, "CE plan waits: a plan that waits on the kernel goes after its launch (head 0)");
  P.wait.assign(wait, wait + n);
  P.wait_mult.assign(wait_mult, wait_mult + n);
  return KOSMOS_OK;
}

// Before the kernel launch on main_stream: the copy and flag streams wait for what precedes
// the kernel on main (earlier readers of the gathered buffer), never for the kernel (which
// waits for them); then the head entries.
int kosmos_ce_plan_begin(void* h, void* main_stream, uint32_t epoch) {
  if (!h) return fail(KOSMOS_ERR_INVALID, "null CE plan");
  CePlan& P = *static_cast<CePlan*>(h);
  cudaStream_t m = static_cast<cudaStream_t>(main_stream);
  KOSMOS_CUDA(cudaEventRecord(P.ready, m));
  KOSMOS_CUDA(cudaStreamWaitEvent(P.cs, P.ready, 0));
  KOSMOS_CUDA(cudaStreamWaitEvent(P.fs, P.ready, 0));
  return ce_enqueue(P, 0, P.head, epoch);
}

// After the kernel launch: the rest of the plan; main_stream then waits for both streams.
int kosmos_ce_plan_end(void* h, void* main_stream, uint32_t epoch) {
  if (!h) return fail(KOSMOS_ERR_INVALID, "null CE plan");
  CePlan& P = *static_cast<CePlan*>(h);
  if (int rc = ce_enqueue(P, P.head, static_cast<int>(P.dst.size()), epoch)) return rc;
  cudaStream_t m = static_cast<cudaStream_t>(main_stream);
  KOSMOS_CUDA(cudaEventRecord(P.copies_done, P.cs));
  KOSMOS_CUDA(cudaEventRecord(P.flags_done, P.fs));
  KOSMOS_CUDA(cudaStreamWaitEvent(m, P.copies_done, 0));
  KOSMOS_CUDA(cudaStreamWaitEvent(m, P.flags_done, 0));
  return KOSMOS_OK;
}

int kosmos_free_mapped(void* host) {
  KOSMOS_CUDA(cudaFreeHost(host));
  return KOSMOS_OK;
}

}  // extern "C"

// The ctypes mirror (kosmos_bench/kernels/abi.py) asserts the same sizes.
static_assert(sizeof(KosmosRankArgs) == 8 * (3 + 3 + 9 + 5 * KOSMOS_MAX_WORLD) + 4 * 10, "RankArgs layout");
static_assert(sizeof(KosmosErrorRecord) == 48, "ErrorRecord layout");
static_assert(sizeof(KosmosTraceRecord) == 24, "TraceRecord layout");
static_assert(sizeof(KosmosParams) == 6 * 8 + 14 * 4, "Params layout");
