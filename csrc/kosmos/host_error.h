// host_error.h — the C ABI's error convention, shared by the libraries' host code: fail()
// formats a message into this translation unit's thread-local buffer (what the library's
// *_last_error() returns) and returns the code; KOSMOS_CUDA(call) fails with KOSMOS_ERR_CUDA
// and the CUDA error string when `call` does not return cudaSuccess; check_common_params() holds
// the launch checks of every entry point.
#pragma once

#include "platform.cuh"  // the CUDA runtime (HIP: its names mapped to HIP)

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

// The Params checks every launch entry point shares (kosmos_launch, kosmos_sm90_ag_launch);
// KOSMOS_OK or the failure, with its message set.
inline int check_common_params(const KosmosParams& p) {
  if (p.world < 1 || p.world > KOSMOS_MAX_WORLD) return fail(KOSMOS_ERR_INVALID, "world %d outside 1..%d", p.world, KOSMOS_MAX_WORLD);
  if (p.num_ranks < 1 || p.num_ranks > p.world) return fail(KOSMOS_ERR_INVALID, "num_ranks %d outside 1..world", p.num_ranks);
  if (p.grid < p.num_ranks) return fail(KOSMOS_ERR_INVALID, "grid %d smaller than num_ranks %d", p.grid, p.num_ranks);
  if (!p.ranks || !p.state || !p.err) return fail(KOSMOS_ERR_INVALID, "null ranks/state/err pointer");
  if (p.trace && (!p.trace_count || p.trace_cap < 1)) return fail(KOSMOS_ERR_INVALID, "trace without counts/cap");
  if (p.spin_ns < 0 || p.spin_ns > 1000000) return fail(KOSMOS_ERR_INVALID, "spin_ns %d outside 0..1000000", p.spin_ns);
  if (p.wgrad_group_rows < 0 || (p.wgrad_group_rows != 0 && p.op != KOSMOS_OP_AG_WGRAD))
    return fail(KOSMOS_ERR_INVALID, "wgrad_group_rows %d: ag-wgrad band items only, >= 0", p.wgrad_group_rows);
  return KOSMOS_OK;
}

}  // namespace kosmos

#define KOSMOS_CUDA(call)                                                                    \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess)                                                                   \
      return ::kosmos::fail(KOSMOS_ERR_CUDA, "%s failed: %s", #call, cudaGetErrorString(e_)); \
  } while (0)
