// platform.cuh — every vendor intrinsic used by the kosmos kernels, in ONE place.
//
// Two branches, picked by the compiler: hipcc for AMD GPUs (__HIP__) and nvcc.
// Nothing else in csrc/ names an intrinsic or a vendor API; the only other preprocessor
// choice is the GEMM builder (builder.cuh: MFMA on AMD, mma.sync on NVIDIA). The AMD branch
// also maps the CUDA runtime names of the host code (runtime.cu, host_error.h) to HIP.
//
// AMD branch: compile-checked with ROCm 5.2.3's hipcc for gfx90a (MI200); never executed.
#pragma once

#include <cstdint>

#if defined(__HIP__)  // clang compiling HIP for AMD GPUs (hipcc with HIP_PLATFORM=amd)
#define KOSMOS_PLATFORM_HIP 1
#include <hip/hip_runtime.h>

#include <cstring>

namespace kosmos {

// bf16 as storage (the kernels only load, store and convert it); conversions round to
// nearest even, like CUDA's __float2bfloat16_rn. Named as CUDA's so that the protocol
// headers (mover.cuh) compile unchanged.
struct bf16 {
  uint16_t bits;
};
__host__ __device__ __forceinline__ float __bfloat162float(bf16 h) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(h.bits) << 16);
}
__host__ __device__ __forceinline__ bf16 __float2bfloat16_rn(float f) {
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}
__host__ __device__ __forceinline__ bf16 __ushort_as_bfloat16(uint16_t v) { return bf16{v}; }

constexpr int kWarpSize = 64;  // a wavefront (gfx9 / CDNA)

// ---- clocks and ids ------------------------------------------------------------------
// s_memrealtime counts a constant 100 MHz clock on gfx90a and gfx942 (10 ns per tick;
// hipDeviceAttributeWallClockRate reports it in kHz).
constexpr uint64_t kRealtimeNsPerTick = 10;
__device__ __forceinline__ uint64_t globaltimer_ns() { return __builtin_amdgcn_s_memrealtime() * kRealtimeNsPerTick; }

__device__ __forceinline__ uint32_t sm_id() { return __smid(); }  // CU and shader engine of the wave

// s_sleep k waits about 64 k clocks; one unit per 64 ns requested (an approximation).
__device__ __forceinline__ void backoff_ns(uint32_t ns) {
  for (uint32_t t = 0; t < ns; t += 64) __builtin_amdgcn_s_sleep(1);
}

// ---- flags: acquire / release / relaxed at agent (.gpu) or system (.sys) scope ---------
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p, bool sys) {
  if (sys) return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}

__device__ __forceinline__ uint32_t ld_relaxed(const uint32_t* p) {
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

__device__ __forceinline__ void st_release(uint32_t* p, uint32_t v, bool sys) {
  if (sys)
    __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
  else
    __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}

__device__ __forceinline__ void st_relaxed(uint32_t* p, uint32_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

// Full fence at agent / system scope (as the CUDA branch).
__device__ __forceinline__ void fence(bool sys) {
  if (sys)
    __threadfence_system();
  else
    __threadfence();
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// ---- data movement -------------------------------------------------------------------
// Loads that see data written by other WGs / GPUs / the host during the call: relaxed
// atomic loads at agent scope (coherent: they skip the non-coherent per-CU cache).
__device__ __forceinline__ int4 ld_cg_16(const void* p) {
  const uint64_t* q = static_cast<const uint64_t*>(p);
  const uint64_t lo = __hip_atomic_load(q, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
  const uint64_t hi = __hip_atomic_load(q + 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
  int4 v;
  v.x = static_cast<int>(lo);
  v.y = static_cast<int>(lo >> 32);
  v.z = static_cast<int>(hi);
  v.w = static_cast<int>(hi >> 32);
  return v;
}
__device__ __forceinline__ uint16_t ld_cg_2(const void* p) {
  return __hip_atomic_load(static_cast<const uint16_t*>(p), __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ __forceinline__ void st_16(void* p, int4 v) { *reinterpret_cast<int4*>(p) = v; }

// Shared memory (LDS) addresses as 32-bit offsets, as on NVIDIA.
using lds_char = __attribute__((address_space(3))) char;
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(reinterpret_cast<uintptr_t>((const lds_char*)p));
}
__device__ __forceinline__ char* smem_ptr(uint32_t addr) { return (char*)(lds_char*)(uintptr_t)addr; }

// ---- bulk copies: no TMA on AMD. The issuing thread copies each stage itself, so a
// stage is complete when bulk_g2s returns and the mbarrier calls are no-ops: correct and
// slow (Params.mover_bulk is a Hopper tuning). Staging sized for 64 KiB of LDS.
constexpr int kBulkStages = 4;
constexpr uint32_t kBulkBytes = 4096;
__device__ __forceinline__ void mbar_init(uint32_t, uint32_t) {}
__device__ __forceinline__ void fence_proxy_async_smem() {}
__device__ __forceinline__ void fence_proxy_async_global() {}
__device__ __forceinline__ void mbar_expect_tx(uint32_t, uint32_t) {}
__device__ __forceinline__ bool mbar_try_wait(uint32_t, uint32_t) { return true; }
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t) {
  char* d = smem_ptr(dst);
  for (uint32_t i = 0; i < bytes; i += 16) st_16(d + i, ld_cg_16(static_cast<const char*>(src) + i));
}
__device__ __forceinline__ void bulk_s2g(void* dst, uint32_t src, uint32_t bytes) {
  const char* s = smem_ptr(src);
  for (uint32_t i = 0; i < bytes; i += 16) st_16(static_cast<char*>(dst) + i, *reinterpret_cast<const int4*>(s + i));
}
__device__ __forceinline__ void bulk_commit() {}
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {}
__device__ __forceinline__ void bulk_wait_all() {}

// ---- matrix cores (MFMA, gfx90a+) ------------------------------------------------------
// D(32x32 fp32) += A(32x8 bf16) * B(8x32 bf16), one wavefront. Per lane l (0..63):
//   a[i] = A[l % 32][4 (l / 32) + i],  b[i] = B[4 (l / 32) + i][l % 32]    (i = 0..3)
//   d[j] = D[8 (j / 4) + 4 (l / 32) + j % 4][l % 32]                      (j = 0..15)
using bf16x4 = short __attribute__((ext_vector_type(4)));
using floatx16 = float __attribute__((ext_vector_type(16)));
__device__ __forceinline__ void mfma_bf16_32x32x8(floatx16& d, bf16x4 a, bf16x4 b) {
  d = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(a, b, d, 0, 0, 0);
}

}  // namespace kosmos

// ---- host runtime: the CUDA runtime names runtime.cu and host_error.h use, as HIP ----
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrCooperativeLaunch hipDeviceAttributeCooperativeLaunch
#define cudaFuncSetAttribute hipFuncSetAttribute
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define cudaLaunchCooperativeKernel hipLaunchCooperativeKernel
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocMapped hipHostMallocMapped
#define cudaHostAllocPortable hipHostMallocPortable
#define cudaHostGetDevicePointer hipHostGetDevicePointer
#define cudaFreeHost hipHostFree
#define cudaStream_t hipStream_t
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaEvent_t hipEvent_t
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventRecord hipEventRecord
#define cudaEventDestroy ::kosmos::event_destroy  // runtime.cu ignores its result; hipError_t is [[nodiscard]]
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpy2DAsync hipMemcpy2DAsync
#define cudaMemcpyDefault hipMemcpyDefault

// cuStreamWriteValue32 (looked up by runtime.cu through the CUDA driver entry point) is
// hipStreamWriteValue32 here; HIP takes no NO_MEMORY_BARRIER flag, so every write is fenced.
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1 };
constexpr unsigned long long cudaEnableDefault = 0;
namespace kosmos {
inline void event_destroy(hipEvent_t e) { static_cast<void>(hipEventDestroy(e)); }
inline int hip_stream_write_value32(void* stream, unsigned long long addr, unsigned int value, unsigned int) {
  return static_cast<int>(
      hipStreamWriteValue32(static_cast<hipStream_t>(stream), reinterpret_cast<void*>(addr), value, 0));
}
}  // namespace kosmos
inline hipError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                                   cudaDriverEntryPointQueryResult* q) {
  const bool ok = std::strcmp(symbol, "cuStreamWriteValue32") == 0;
  *fn = ok ? reinterpret_cast<void*>(&kosmos::hip_stream_write_value32) : nullptr;
  *q = ok ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return hipSuccess;
}
#else
#define KOSMOS_PLATFORM_HIP 0
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace kosmos {

using bf16 = __nv_bfloat16;
constexpr int kWarpSize = 32;

// ---- clocks and ids ------------------------------------------------------------------
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t sm_id() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void backoff_ns(uint32_t ns) { __nanosleep(ns); }

// ---- flags: acquire / release / relaxed at .gpu or .sys scope -------------------------
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p, bool sys) {
  uint32_t v;
  if (sys)
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  else
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t ld_relaxed(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release(uint32_t* p, uint32_t v, bool sys) {
  if (sys)
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
  else
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void st_relaxed(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Full fence at .gpu / .sys scope (makes this thread's and, after a CTA barrier, the CTA's
// prior writes visible before a following release).
__device__ __forceinline__ void fence(bool sys) {
  if (sys)
    __threadfence_system();
  else
    __threadfence();
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// ---- data movement -------------------------------------------------------------------
// 16-byte load that bypasses L1 (data written by other WGs / GPUs / the host this call).
__device__ __forceinline__ int4 ld_cg_16(const void* p) { return __ldcg(reinterpret_cast<const int4*>(p)); }
__device__ __forceinline__ uint16_t ld_cg_2(const void* p) {
  return __ldcg(reinterpret_cast<const unsigned short*>(p));
}
__device__ __forceinline__ void st_16(void* p, int4 v) { *reinterpret_cast<int4*>(p) = v; }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async 16 bytes global -> shared, L2 only (cg); src_bytes = 0 zero-fills.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void st_shared_16(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// ---- bulk async copies (TMA, sm_90) and mbarriers ----------------------------------------
// Staging of mover.cuh's bulk_copy_contig: kBulkStages stages of kBulkBytes in shared memory.
constexpr int kBulkStages = 4;
constexpr uint32_t kBulkBytes = 16384;
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
// global -> shared, completion counted on an mbarrier (bytes % 16 == 0, 16-byte aligned)
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// shared -> global, tracked by bulk groups
__device__ __forceinline__ void bulk_s2g(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// ---- tensor cores (portable mma.sync path) -------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// D = A(16x16 bf16, row) * B(16x8 bf16, col) + D (fp32)
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace kosmos
#endif  // __HIP__
