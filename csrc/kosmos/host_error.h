// host_error.h — the C ABI's error convention, shared by the libraries' host code: fail()
// formats a message into this translation unit's thread-local buffer (what the library's
// *_last_error() returns) and returns the code; KOSMOS_CUDA(call) fails with KOSMOS_ERR_CUDA
// and the CUDA error string when `call` does not return cudaSuccess.
#pragma once

#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdio>

#include "params.h"

namespace kosmos {
namespace {  // one buffer per translation unit (each library keeps its own last error)

thread_local char g_err[512] = "";

__attribute__((format(printf, 2, 3))) int fail(int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof(g_err), fmt, ap);
  va_end(ap);
  return code;
}

}  // namespace
}  // namespace kosmos

#define KOSMOS_CUDA(call)                                                                    \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess)                                                                   \
      return ::kosmos::fail(KOSMOS_ERR_CUDA, "%s failed: %s", #call, cudaGetErrorString(e_)); \
  } while (0)
