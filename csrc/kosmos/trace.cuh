// trace.cuh — optional per-WG role records.
//
// Buffer layout: KosmosTraceRecord trace[grid][trace_cap] (24 bytes each) and uint32
// trace_count[grid]. Only thread 0 of a WG records, so a plain increment suffices; record i
// is written only when i < trace_cap: overflow is counted (count - cap = dropped), never
// written out of bounds. trace == nullptr disables recording (one predictable branch).
// Kernels where more than one thread of a block records (the sm90 AG+GEMM: loader thread 0
// and the math warps' leader) set Tracer.shared: the count is then taken by atomicAdd.
#pragma once
#include "params.h"
#include "platform.cuh"

namespace kosmos {

enum Role : uint16_t { kRoleMove = 0, kRoleBuild = 1, kRoleReduce = 2, kRoleWait = 3 };

struct Tracer {
  KosmosTraceRecord* rec;  // this WG's records, or nullptr
  uint32_t* count;
  int cap;
  uint16_t sm;
  bool shared;  // several threads of the block record (ag_gemm_sm90.cu): count by atomicAdd

  __device__ __forceinline__ bool on() const { return rec != nullptr; }
  __device__ __forceinline__ uint64_t now() const { return on() ? globaltimer_ns() : 0; }
  __device__ __forceinline__ void add(uint16_t role, int item, uint64_t t0, uint64_t t1) const {
    if (!on()) return;
    uint32_t i;
    if (shared) {
      i = atomicAdd(count, 1u);
    } else {
      i = *count;
      *count = i + 1;
    }
    if (i < static_cast<uint32_t>(cap)) {
      KosmosTraceRecord r;
      r.t0 = t0;
      r.t1 = t1;
      r.item = item;
      r.role = role;
      r.sm = sm;
      rec[i] = r;
    }
  }
};

__device__ __forceinline__ Tracer make_tracer(const KosmosParams& p, int block) {
  Tracer t;
  t.rec = p.trace ? p.trace + static_cast<size_t>(block) * p.trace_cap : nullptr;
  t.count = p.trace_count ? p.trace_count + block : nullptr;
  t.cap = p.trace_cap;
  t.sm = static_cast<uint16_t>(sm_id());
  t.shared = false;
  if (!t.count) t.rec = nullptr;
  return t;
}

}  // namespace kosmos
