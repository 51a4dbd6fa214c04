// runtime.cu — host launchers and the C ABI (params.h). Every CUDA call is checked; every
// entry point returns a KosmosStatus and leaves a message for kosmos_last_error().
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kosmos/params.h"
#include "kosmos/persistent.cuh"

namespace kosmos {
const void* ag_gemm_kernel();
const void* gemm_rs_kernel();
}  // namespace kosmos

namespace {

thread_local char g_err[512] = "";

int fail(int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof(g_err), fmt, ap);
  va_end(ap);
  return code;
}

#define KOSMOS_CUDA(call)                                                                              \
  do {                                                                                                 \
    cudaError_t e_ = (call);                                                                           \
    if (e_ != cudaSuccess) return fail(KOSMOS_ERR_CUDA, "%s failed: %s", #call, cudaGetErrorString(e_)); \
  } while (0)

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
  if (p.world < 1 || p.world > KOSMOS_MAX_WORLD) return fail(KOSMOS_ERR_INVALID, "world %d outside 1..%d", p.world, KOSMOS_MAX_WORLD);
  if (p.num_ranks < 1 || p.num_ranks > p.world) return fail(KOSMOS_ERR_INVALID, "num_ranks %d outside 1..world", p.num_ranks);
  if (p.grid < p.num_ranks) return fail(KOSMOS_ERR_INVALID, "grid %d smaller than num_ranks %d", p.grid, p.num_ranks);
  if (!p.ranks || !p.state || !p.err) return fail(KOSMOS_ERR_INVALID, "null ranks/state/err pointer");
  if (p.trace && (!p.trace_count || p.trace_cap < 1)) return fail(KOSMOS_ERR_INVALID, "trace without counts/cap");
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

int kosmos_stream_write_u32(void* stream, void* dev_ptr, uint32_t value) {
  return stream_write(stream, dev_ptr, value, true);
}

// Copy-engine movers (host fabric), entries in mover order. Entry i with bytes[i] > 0 is a
// Copy i (width[i] > 0): height[i] rows of width[i] bytes, row pitch pitch[i] on both sides
// (one cudaMemcpyAsync when width == pitch, else cudaMemcpy2DAsync: a K-slice of a band), on
// copy_stream, followed by an event; flag_stream waits for that event and releases
// *flag[i] = value[i] (fenced writes). Entries with width 0 release further flags after the
// latest copy. The copies run back to back: flag releases (~2 us each in the front end,
// measured) stay off the copy engine's path. One call per kernel launch.
int kosmos_ce_enqueue(void* copy_stream, void* flag_stream, int n, const uint64_t* dst, const uint64_t* src,
                      const uint64_t* width, const uint64_t* height, const uint64_t* pitch, const uint64_t* flag,
                      const uint32_t* value) {
  if (!copy_stream || !flag_stream || n < 0 ||
      (n > 0 && (!dst || !src || !width || !height || !pitch || !flag || !value)))
    return fail(KOSMOS_ERR_INVALID, "bad CE plan");
  if (n > 0 && width[0] == 0) return fail(KOSMOS_ERR_INVALID, "CE plan: first entry has no copy");
  static thread_local std::vector<cudaEvent_t> events;  // reused across calls: a wait captures the record
  cudaStream_t cs = static_cast<cudaStream_t>(copy_stream), fs = static_cast<cudaStream_t>(flag_stream);
  size_t copies = 0;
  for (int i = 0; i < n; ++i) {
    if (width[i] > 0) {
      if (pitch[i] < width[i] || height[i] == 0) return fail(KOSMOS_ERR_INVALID, "CE plan: entry %d pitch < width", i);
      if (copies == events.size()) {
        cudaEvent_t e;
        KOSMOS_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        events.push_back(e);
      }
      void* d = reinterpret_cast<void*>(dst[i]);
      const void* s_ = reinterpret_cast<const void*>(src[i]);
      if (width[i] == pitch[i])
        KOSMOS_CUDA(cudaMemcpyAsync(d, s_, width[i] * height[i], cudaMemcpyDefault, cs));
      else
        KOSMOS_CUDA(cudaMemcpy2DAsync(d, pitch[i], s_, pitch[i], width[i], height[i], cudaMemcpyDefault, cs));
      KOSMOS_CUDA(cudaEventRecord(events[copies], cs));
      KOSMOS_CUDA(cudaStreamWaitEvent(fs, events[copies], 0));
      ++copies;
    }
    if (int rc = stream_write(fs, reinterpret_cast<void*>(flag[i]), value[i], true)) return rc;
  }
  return KOSMOS_OK;
}

int kosmos_free_mapped(void* host) {
  KOSMOS_CUDA(cudaFreeHost(host));
  return KOSMOS_OK;
}

}  // extern "C"

// The ctypes mirror (kosmos_bench/kernels/abi.py) asserts the same sizes.
static_assert(sizeof(KosmosRankArgs) == 8 * (3 + 3 + 8 + 5 * KOSMOS_MAX_WORLD) + 4 * 10, "RankArgs layout");
static_assert(sizeof(KosmosErrorRecord) == 48, "ErrorRecord layout");
static_assert(sizeof(KosmosTraceRecord) == 24, "TraceRecord layout");
static_assert(sizeof(KosmosParams) == 6 * 8 + 12 * 4, "Params layout");
