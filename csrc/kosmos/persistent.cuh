// persistent.cuh — the self-scheduling persistent WG loop shared by every op.
//
// One launch, grid = all co-resident WGs (cooperative launch), 256 threads each. Every WG
// belongs to one rank (Params.ranks[i].wg_begin..wg_end: W ranks on the local fabric, one
// otherwise). Thread 0 of a WG decides what to do next (decide(), the rules of
// kosmos_bench/schedule.py), the whole WG executes the item (OpTraits<kOp>::execute), then
// thread 0 releases the item's flag and records a trace record.
//
// Protocol per call (epoch e = Params.state[0] + 1):
//   entry: WG 0 of each rank stores e into entry flag [rank] of every rank's flag array
//          ("my inputs are written"); with static_peers (host fabric) it also stores e into
//          the flags peers would have released (RankArgs.peer_flags).
//   work:  items wait on own flags (acquire, watchdog), release one flag (fence + release).
//   exit:  the last WG of a rank to finish stores e into exit flag [rank] of every rank and
//          waits for every peer's exit flag (no rank returns while a peer may still read or
//          write its buffers). The last WG of the grid resets the claim counters and
//          publishes state[0] = e for the next call.
#pragma once
#include "builder.cuh"
#include "mover.cuh"
#include "params.h"
#include "platform.cuh"
#include "queue.cuh"
#include "sync.cuh"
#include "trace.cuh"

namespace kosmos {

constexpr int kThreads = BuilderCfg::kThreads;
constexpr int kSmemBytes = BuilderCfg::kSmemBytes;
static_assert(kSmemBytes + 64 <= 227 * 1024, "dynamic + static shared memory must fit one SM");
static_assert(kBulkStages * kBulkBytes + 8 * kBulkStages <= kSmemBytes, "bulk mover staging fits the builder smem");

// Flag layout constants shared with schedule.FlagLayout.
__device__ __forceinline__ int entry_flag(int s) { return s; }
__device__ __forceinline__ int exit_flag(int world, int s) { return world + s; }

template <int kOp>
struct OpTraits;  // execute(): defined in ag_gemm.cu / gemm_rs.cu

struct Wg {
  const KosmosParams& p;
  const KosmosRankArgs& ra;
  SyncCtx sc;
  Tracer tr;
  int wg;   // index within its rank
  int nwg;  // WGs of its rank
};

__device__ __forceinline__ uint32_t target_of(const Wg& w, int flag) {
  return w.sc.epoch * static_cast<uint32_t>(w.ra.flag_mult[flag]);
}

// What an item of queue q waits for on flag f: the whole release count of this call, except
// builders under Params.k_stream (band flags count K-slices): the first slice; the builder
// waits for the others inside the tile (ag_gemm_sm90.cu).
__device__ __forceinline__ uint32_t dep_target(const Wg& w, int q, int flag) {
  const uint32_t full = target_of(w, flag);
  return (w.p.k_stream && q == kQBuild) ? full - static_cast<uint32_t>(w.ra.flag_mult[flag]) + 1u : full;
}

// ag-wgrad tile builders (kAgwBuild) list the remote bands they reduce over as deps, but wait
// for them inside the tile, k-block by k-block (ag_gemm_sm90.cu, A-transposed build): to claim
// them, and to every wait here, they are ready at once. Its band items (kAgwBand: the group's
// band flags and the tile's order flag of the group before) are claimed and waited for as any
// other item (schedule.py: the simulator's readiness of the band variant).
__device__ __forceinline__ bool deps_in_tile(const Wg& w, int q, const Item& it) {
  return q == kQBuild && w.p.op == KOSMOS_OP_AG_WGRAD && it.kind == kAgwBuild;
}

__device__ __forceinline__ bool deps_ready(const Wg& w, int q, int id) {
  const Item it = load_item(w.ra.items[q], id);
  if (deps_in_tile(w, q, it)) return true;
  for (int d = 0; d < it.dep_count; ++d) {
    const int f = w.ra.deps[it.dep_begin + d];
    if (!flag_ready(ld_acquire(w.ra.flags[w.ra.rank] + f, w.sc.sys), dep_target(w, q, f))) return false;
  }
  return true;
}

// Wait (watchdog on) for every dep of a claimed item; records a WAIT interval if it waited.
__device__ __forceinline__ bool wait_deps(const Wg& w, int q, int id) {
  const Item it = load_item(w.ra.items[q], id);
  if (deps_in_tile(w, q, it)) return true;
  const uint64_t t0 = w.tr.now();
  bool waited = false;
  for (int d = 0; d < it.dep_count; ++d) {
    const int f = w.ra.deps[it.dep_begin + d];
    const uint32_t* addr = w.ra.flags[w.ra.rank] + f;
    const uint32_t tgt = dep_target(w, q, f);
    if (flag_ready(ld_acquire(addr, w.sc.sys), tgt)) continue;
    waited = true;
    if (!wait_flag(w.sc, addr, tgt, q, id, w.ra.rank, f)) return false;
  }
  if (waited) w.tr.add(kRoleWait, id, t0, w.tr.now());
  return true;
}

// Thread 0 (ag_gemm_sm90.cu: the scheduling thread): choose the next item. Returns false when
// this WG is done (or the call aborted).
template <int kOp>
__device__ bool decide(const Wg& w, int* q_out, int* id_out, bool* counted, int* pend) {
  const KosmosRankArgs& ra = w.ra;
  const int k = ra.num_mover_wgs;
  int id;
  if (k > 0) {  // fixed roles
    if (pend[0] >= 0) {  // a builder claimed ahead (claim_ready_build), not ready then
      *q_out = pend[0];
      *id_out = pend[1];
      pend[0] = -1;
      return wait_deps(w, *q_out, *id_out);
    }
    if (w.wg < k) {
      id = claim_next(ra, kQMove);
      if (id < 0) return false;
      *q_out = kQMove;
      *id_out = id;
      return wait_deps(w, kQMove, id);
    }
    for (int q = kQBuild; q <= kQReduce; q += (kQReduce - kQBuild)) {
      id = claim_next(ra, q);
      if (id >= 0) {
        *q_out = q;
        *id_out = id;
        return wait_deps(w, q, id);
      }
    }
    return false;
  }
  // Self-scheduling. Claims never serialise on a readiness check: a WG that sees a ready
  // head claims with an atomicAdd (it may get a later item); a builder/reduce it got that
  // is not ready yet becomes `pending` (thread-0 state across decisions) and the WG does
  // other work first, blocking on it only once nothing else can be claimed.
  // Mover slots: with a cap (ctr[4] = movers in flight, hard cap via atomicAdd/atomicSub)
  // the link is kept saturated first ("link-first": a WG takes a mover whenever a slot is
  // free), the other WGs build; cap 0 (device-memory fabrics) = builder-first, no limit.
  const uint32_t cap = static_cast<uint32_t>(ra.max_inflight_movers);
  const uint64_t t_idle = w.tr.now();
  uint64_t t_spin = 0;
  bool idled = false;
  auto left = [&](int q) { return ld_relaxed(ra.ctr + q) < static_cast<uint32_t>(ra.count[q]); };
  auto acquire_slot = [&]() -> bool {
    if (cap == 0) return true;
    if (ld_relaxed(ra.ctr + 4) >= cap) return false;
    if (atomicAdd(ra.ctr + 4, 1u) < cap) return true;
    atomicSub(ra.ctr + 4, 1u);
    return false;
  };
  auto release_slot = [&]() {
    if (cap != 0) atomicSub(ra.ctr + 4, 1u);
  };
  auto take = [&](int q, int item, bool wait) -> bool {
    *q_out = q;
    *id_out = item;
    if (q == kQMove && cap != 0) *counted = true;  // slot released after the item
    if (idled) w.tr.add(kRoleWait, -1, t_idle, w.tr.now());
    return wait ? wait_deps(w, q, item) : true;
  };
  // Claim the next mover if a slot is free; -1 otherwise.
  auto mover_with_slot = [&]() -> int {
    if (!left(kQMove) || !acquire_slot()) return -1;
    const int m = claim_next(ra, kQMove);
    if (m < 0) release_slot();
    return m;
  };
  auto take_pending = [&](bool wait) -> bool {
    const int q = pend[0], item = pend[1];
    pend[0] = -1;
    return take(q, item, wait);
  };
  for (;;) {
    if (aborted(w.sc)) return false;
    uint32_t h;
    if (pend[0] >= 0 && pend[0] != kQMove && deps_ready(w, pend[0], pend[1])) return take_pending(false);
    if (kOp == KOSMOS_OP_AG_GEMM || kOp == KOSMOS_OP_AG_WGRAD) {
      // [link-first: mover if a slot is free] > builder head ready (claim; not ready ->
      // pending) > mover (slot) > block on pending / next builder (movers exhausted).
      // ag-wgrad: tile builders are always ready (deps_in_tile), band items as ag-gemm's; its cap is never 0
      // (schedule.max_inflight_movers): the slot holders keep the movers going.
      if (cap != 0) {
        id = mover_with_slot();
        if (id >= 0) return take(kQMove, id, true);
      }
      if (pend[0] < 0) {
        id = peek(ra, kQBuild, &h);
        if (id >= 0 && deps_ready(w, kQBuild, id)) {
          id = claim_next(ra, kQBuild);
          if (id < 0) continue;
          if (deps_ready(w, kQBuild, id)) return take(kQBuild, id, false);
          pend[0] = kQBuild;
          pend[1] = id;
          continue;
        }
      }
      if (left(kQMove)) {
        id = mover_with_slot();
        if (id >= 0) return take(kQMove, id, true);
      } else {
        if (pend[0] >= 0) return take_pending(true);
        id = claim_next(ra, kQBuild);
        if (id >= 0) return take(kQBuild, id, true);
        return false;
      }
    } else {
      // pending ready (a mover also needs a slot) > reduce head ready (claim; not ready ->
      // pending) > next mover (claim; ready and a slot -> run, else pending: unready pushes
      // never block the ready items behind them) > builder > pending mover (slot, wait:
      // builders exhausted) > mover (slot, wait) > block on pending / next reduce
      if (pend[0] == kQMove && deps_ready(w, kQMove, pend[1]) && acquire_slot()) return take_pending(false);
      if (pend[0] < 0) {
        id = peek(ra, kQReduce, &h);
        if (id >= 0 && deps_ready(w, kQReduce, id)) {
          id = claim_next(ra, kQReduce);
          if (id < 0) continue;
          if (deps_ready(w, kQReduce, id)) return take(kQReduce, id, false);
          pend[0] = kQReduce;
          pend[1] = id;
          continue;
        }
      }
      if (pend[0] < 0 && left(kQMove)) {
        id = claim_next(ra, kQMove);
        if (id >= 0) {
          if (deps_ready(w, kQMove, id) && acquire_slot()) return take(kQMove, id, false);
          pend[0] = kQMove;
          pend[1] = id;
          continue;
        }
      }
      id = claim_next(ra, kQBuild);
      if (id >= 0) return take(kQBuild, id, false);
      if (pend[0] == kQMove) {
        if (acquire_slot()) return take_pending(true);  // its builder is claimed
      } else if (left(kQMove)) {
        id = mover_with_slot();
        if (id >= 0) return take(kQMove, id, true);
      } else {
        if (pend[0] >= 0) return take_pending(true);
        id = claim_next(ra, kQReduce);
        if (id >= 0) return take(kQReduce, id, true);
        return false;
      }
    }
    // Nothing claimable right now (all mover slots taken): poll again, watchdog on.
    if (!idled) {
      idled = true;
      t_spin = globaltimer_ns();
    } else if (globaltimer_ns() - t_spin > w.sc.timeout_ns) {
      raise_timeout(w.sc, kQMove, -1, ra.rank, -1, cap, ld_relaxed(ra.ctr + 4), globaltimer_ns() - t_spin);
      return false;
    }
    backoff_ns(64);
  }
}

// Lookahead claim (ag-gemm builders; the thread that runs decide(), while its WG still works on
// a build tile): the next builder item if one can be claimed ready right now, else -1. Same
// rules as decide() but never waits and never takes a mover: with a free mover slot (link-first
// cap) or nothing ready it returns -1 and decide() runs after the tile as before; a claimed
// builder that is not ready becomes pending, as in decide(). A claim costs a chain of ~10
// dependent global accesses (counter, queue, item row, dep index, flag, ...): ahead, they
// overlap the tile instead of starving the MMAs between two tiles.
inline __device__ __noinline__ int claim_ready_build(const Wg& w, int* pend) {
  const KosmosRankArgs& ra = w.ra;
  if (aborted(w.sc) || (pend[0] >= 0 && pend[0] != kQBuild)) return -1;
  if (pend[0] == kQBuild) {
    if (!deps_ready(w, kQBuild, pend[1])) return -1;
    pend[0] = -1;
    return pend[1];
  }
  const int k = ra.num_mover_wgs;
  int id;
  if (k > 0) {  // fixed roles: builder WGs claim in order and wait
    if (w.wg < k) return -1;
    id = claim_next(ra, kQBuild);
  } else {
    const uint32_t cap = static_cast<uint32_t>(ra.max_inflight_movers);
    if (cap != 0 && ld_relaxed(ra.ctr + kQMove) < static_cast<uint32_t>(ra.count[kQMove]) &&
        ld_relaxed(ra.ctr + 4) < cap)
      return -1;  // link-first: decide() takes the mover after the tile
    uint32_t h;
    id = peek(ra, kQBuild, &h);
    if (id < 0 || !deps_ready(w, kQBuild, id)) return -1;
    id = claim_next(ra, kQBuild);
  }
  if (id < 0) return -1;
  if (deps_ready(w, kQBuild, id)) return id;
  pend[0] = kQBuild;
  pend[1] = id;
  return -1;
}

__device__ __forceinline__ uint16_t role_of(int kind) {
  switch (kind) {
    case kAgPull:
    case kRsPush:
    case kRsProxy:
      return kRoleMove;
    case kRsReduce:
      return kRoleReduce;
    // kAgBuild, kRsBuild, kAgwBuild, kAgwBand: BUILD
    default:
      return kRoleBuild;
  }
}

// ---- pieces of the kernel shared with other kernels of the same protocol (ag_gemm_sm90.cu) ----

// Which executed rank block `block` belongs to.
__device__ __forceinline__ int rank_index_of(const KosmosParams& p, int block) {
  int ri = 0;
  while (ri + 1 < p.num_ranks && block >= p.ranks[ri].wg_end) ++ri;
  return ri;
}

__device__ __forceinline__ Wg make_wg(const KosmosParams& p, const KosmosRankArgs& ra, int block) {
  const uint32_t epoch = ld_relaxed(p.state) + 1;
  return Wg{p, ra, SyncCtx{epoch, p.state, p.err, p.timeout_ns, p.sys_scope != 0, ra.rank, block - ra.wg_begin,
                    static_cast<uint32_t>(p.spin_ns)},
            make_tracer(p, block), block - ra.wg_begin, ra.wg_end - ra.wg_begin};
}

// Entry handshake, one thread of the block (WG 0 of each rank does the stores).
__device__ __forceinline__ void entry_signal(const Wg& w) {
  const KosmosRankArgs& ra = w.ra;
  const int me = ra.rank;
  if (w.wg != 0) return;
  for (int s = 0; s < w.p.world; ++s) st_release(ra.flags[s] + entry_flag(me), w.sc.epoch, w.sc.sys && s != me);
  if (w.p.static_peers)
    for (int i = 0; i < ra.num_peer_flags; ++i) st_release(ra.flags[me] + ra.peer_flags[i], w.sc.epoch, false);
}

// After an item completed (its writes ordered before this thread by a barrier): release its
// flag, give back its mover slot, record it. One thread.
__device__ __forceinline__ void finish_item(const Wg& w, const Item& it, int id, bool counted, uint64_t t0) {
  const KosmosRankArgs& ra = w.ra;
  const int me = ra.rank;
  if (it.rel_flag >= 0) {
    const int tgt = it.rel_rank;
    const bool sys = w.sc.sys && tgt != me;
    fence(sys);
    uint32_t* f = ra.flags[tgt] + it.rel_flag;
    const int mult = (tgt == me) ? ra.flag_mult[it.rel_flag] : 1;
    if (mult == 1)
      st_release(f, w.sc.epoch, sys);
    else
      atomicAdd(f, 1u);  // ordered after the fence above
  }
  if (counted) atomicSub(ra.ctr + 4, 1u);
  w.tr.add(role_of(it.kind), id, t0, w.tr.now());
}

// Exit protocol, one thread of the block, after all of the block's work is done.
__device__ __forceinline__ void exit_protocol(const Wg& w) {
  const KosmosParams& p = w.p;
  const KosmosRankArgs& ra = w.ra;
  const int W = p.world;
  const int me = ra.rank;
  const uint32_t epoch = w.sc.epoch;
  __threadfence();
  const uint32_t done = atomicAdd(ra.ctr + 3, 1u);
  if (done == static_cast<uint32_t>(w.nwg - 1) && !ra.skip && !aborted(w.sc)) {
    fence(w.sc.sys);
    for (int s = 0; s < W; ++s) st_release(ra.flags[s] + exit_flag(W, me), epoch, w.sc.sys && s != me);
    for (int s = 0; s < W; ++s) {
      if (!wait_flag(w.sc, ra.flags[me] + exit_flag(W, s), epoch, kQueueHandshake, -1, me, exit_flag(W, s))) break;
    }
  }
  __threadfence();
  const uint32_t g = atomicAdd(p.state + 2, 1u);
  if (g == static_cast<uint32_t>(p.grid - 1)) {
    for (int i = 0; i < p.num_ranks; ++i)
      for (int c = 0; c < KOSMOS_NUM_CTR; ++c) p.ranks[i].ctr[c] = 0;
    p.state[2] = 0;
    __threadfence();
    st_release(p.state, epoch, false);
  }
}

template <int kOp>
__global__ void __launch_bounds__(kThreads, 1) kosmos_persistent_kernel(const KosmosParams p) {
  extern __shared__ __align__(128) char smem[];
  __shared__ int s_cmd[2];
  const int tid = threadIdx.x;
  const int block = blockIdx.x;

  const KosmosRankArgs& ra = p.ranks[rank_index_of(p, block)];
  Wg w = make_wg(p, ra, block);

  bool counted = false;  // thread 0: the current item holds an in-flight mover slot
  int pend[2] = {-1, -1};  // thread 0: (queue, item) claimed but not yet ready (policy self)
  if (!ra.skip) {
    if (tid == 0) entry_signal(w);
    for (;;) {
      if (tid == 0) {
        int q = -1, id = -1;
        counted = false;
        if (!decide<kOp>(w, &q, &id, &counted, pend)) q = -1;
        s_cmd[0] = q;
        s_cmd[1] = id;
      }
      __syncthreads();
      const int q = s_cmd[0], id = s_cmd[1];
      __syncthreads();
      if (q < 0) break;
      const Item it = load_item(ra.items[q], id);
      const uint64_t t0 = (tid == 0) ? w.tr.now() : 0;
      OpTraits<kOp>::execute(p, ra, it, w.sc, smem, tid);
      __syncthreads();
      if (tid == 0) finish_item(w, it, id, counted, t0);
    }
  }

  // ---- exit ----
  if (tid == 0) exit_protocol(w);
}

}  // namespace kosmos
