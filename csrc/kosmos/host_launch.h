// host_launch.h — the host side the MoE kernels share (csrc/moe_fwd_sm90.cu, moe_bwd_sm90.cu):
// how many CTAs of a cooperative kernel fit a device at once (the grid's bound, after the sm_90
// check) and its one cooperative launch. Include after host_error.h.
#pragma once

#include "host_error.h"

namespace kosmos {
namespace {  // fail() writes this translation unit's error buffer

// CTAs of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory) co-resident on `dev`.
inline int co_resident(const void* kernel, int threads, int smem, int dev, int* out) {
  int per_sm = 0, sms = 0;
  KOSMOS_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  KOSMOS_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  KOSMOS_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  *out = per_sm * sms;
  return KOSMOS_OK;
}

// co_resident on `device` (the current device kept), which must be an sm_90 GPU; `what` names
// the kernel in the error.
inline int sm90_co_resident(const void* kernel, int threads, int smem, int device, int* out, const char* what) {
  if (!out) return fail(KOSMOS_ERR_INVALID, "null out");
  int prev = 0, major = 0;
  KOSMOS_CUDA(cudaGetDevice(&prev));
  KOSMOS_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major != 9)
    return fail(KOSMOS_ERR_INVALID, "the %s needs an sm_90 GPU (device %d is sm_%dx)", what, device, major);
  KOSMOS_CUDA(cudaSetDevice(device));
  const int rc = co_resident(kernel, threads, smem, device, out);
  KOSMOS_CUDA(cudaSetDevice(prev));
  return rc;
}

// One cooperative launch of `kernel` with its one argument `params` (grid CTAs) on `stream`, no
// synchronisation; the grid is checked against the co-resident CTAs, counted once per device in
// `co`. `what` prefixes the errors.
template <class P>
int cooperative_launch(const void* kernel, int threads, int smem, P& params, int grid, void* stream, int (&co)[64],
                       const char* what) {
  int dev = 0;
  KOSMOS_CUDA(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return fail(KOSMOS_ERR_INVALID, "device %d", dev);
  if (!co[dev])
    if (int rc = co_resident(kernel, threads, smem, dev, &co[dev])) return rc;
  if (grid < 1 || grid > co[dev])
    return fail(KOSMOS_ERR_TOO_MANY_WGS, "%s: grid %d outside 1..%d co-resident CTAs", what, grid, co[dev]);
  void* args[] = {&params};
  KOSMOS_CUDA(
      cudaLaunchCooperativeKernel(kernel, dim3(grid), dim3(threads), args, smem, static_cast<cudaStream_t>(stream)));
  KOSMOS_CUDA(cudaGetLastError());
  return KOSMOS_OK;
}

}  // namespace
}  // namespace kosmos
