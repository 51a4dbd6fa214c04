// sync.cuh — epoch flags and the watchdog.
//
// Epoch flags: every call gets epoch e = (completed calls) + 1, read from Params.state[0]
// at kernel start. A flag is ready when (int32)(flag - e) >= 0; flags are never reset (all
// start at 0 when allocated). Release = fence + st.release, acquire = ld.acquire, at .sys
// scope when Params.sys_scope (nvlink) and .gpu otherwise.
//
// Watchdog: every spin has a globaltimer deadline (Params.timeout_ns). On timeout the WG
// that first claims the abort (atomicExch(state[1], e) != e) writes the error record to
// host-mapped memory; every spin and every scheduling decision checks state[1] == e and
// bails out, so all WGs exit and the launch completes: the GPU never hangs.
#pragma once
#include "params.h"
#include "platform.cuh"

namespace kosmos {

constexpr int kQueueHandshake = 3;

struct SyncCtx {
  uint32_t epoch;
  uint32_t* state;
  KosmosErrorRecord* err;
  uint64_t timeout_ns;
  bool sys;
  int rank;
  int wg;
  uint32_t spin_ns;  // sleep between polls (Params.spin_ns)
};

__device__ __forceinline__ bool flag_ready(uint32_t v, uint32_t target) {
  return static_cast<int32_t>(v - target) >= 0;
}

__device__ __forceinline__ bool aborted(const SyncCtx& c) { return ld_relaxed(c.state + 1) == c.epoch; }

inline __device__ __noinline__ void raise_timeout(const SyncCtx& c, int queue, int item, int flag_rank, int flag,
                                           uint32_t expected, uint32_t seen, uint64_t waited) {
  if (atomicExch(c.state + 1, c.epoch) != c.epoch) {
    volatile KosmosErrorRecord* e = c.err;
    e->epoch = c.epoch;
    e->rank = c.rank;
    e->wg = c.wg;
    e->queue = queue;
    e->item = item;
    e->flag_rank = flag_rank;
    e->flag = flag;
    e->expected = expected;
    e->seen = seen;
    e->waited_ns = waited;
    __threadfence_system();
    e->count = e->count + 1;
    __threadfence_system();
  }
}

// Spin until *f reaches `target` (epoch * multiplicity); false on timeout (error recorded)
// or abort. One thread calls it.
__device__ __forceinline__ bool wait_flag(const SyncCtx& c, const uint32_t* f, uint32_t target, int queue, int item,
                                          int flag_rank, int flag) {
  uint32_t v = ld_acquire(f, c.sys);
  if (flag_ready(v, target)) return true;
  const uint64_t t0 = globaltimer_ns();
  for (uint32_t spin = 0;; ++spin) {
    v = ld_acquire(f, c.sys);
    if (flag_ready(v, target)) return true;
    if ((spin & 15) == 15) {
      if (aborted(c)) return false;
      const uint64_t dt = globaltimer_ns() - t0;
      if (dt > c.timeout_ns) {
        raise_timeout(c, queue, item, flag_rank, flag, target, v, dt);
        return false;
      }
    }
    backoff_ns(c.spin_ns);
  }
}

}  // namespace kosmos
