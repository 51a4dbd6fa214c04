// queue.cuh — item rows and queue claims.
//
// Item tables come from kosmos_bench/schedule.py (ITEM_FIELDS, KOSMOS_ITEM_STRIDE int32 per
// row). Queues are priority-ordered item ids; a claim takes the head by an atomic on the
// rank's per-queue counter (ctr[q]). Counters are NOT epoch based: the last WG of each call
// resets them to 0 (after every WG has made its last claim, see kernel exit), so each call
// starts at 0; the host also zeroes them after a watchdog abort.
#pragma once
#include "params.h"
#include "platform.cuh"

namespace kosmos {

enum Queue { kQBuild = 0, kQMove = 1, kQReduce = 2 };
enum ItemKind { kAgPull = 0, kAgBuild = 1, kRsBuild = 2, kRsPush = 3, kRsProxy = 4, kRsReduce = 5, kAgwBuild = 6,
                kAgwBand = 7 };  // kAgwBand: schedule wgrad_items=band (the sm90 A-transposed kernel)

// Words 0-9 of a row; word 10 (schedule.ITEM_FIELDS[10], kpart) is 0 except in ag-wgrad builder
// rows (tile items: rows of At per band; band items: the group's first row in its shard, or -n
// for a group of n whole shards), which the sm90 A-transposed kernel reads from the row itself.
struct Item {
  int kind, peer, m0, rows, n0, cols, dep_begin, dep_count, rel_rank, rel_flag;
};

__device__ __forceinline__ Item load_item(const int32_t* table, int id) {
  const int32_t* r = table + static_cast<size_t>(id) * KOSMOS_ITEM_STRIDE;
  Item it;
  it.kind = r[0];
  it.peer = r[1];
  it.m0 = r[2];
  it.rows = r[3];
  it.n0 = r[4];
  it.cols = r[5];
  it.dep_begin = r[6];
  it.dep_count = r[7];
  it.rel_rank = r[8];
  it.rel_flag = r[9];
  return it;
}

// Head of queue q without claiming: item id, or -1 when exhausted.
__device__ __forceinline__ int peek(const KosmosRankArgs& ra, int q, uint32_t* head) {
  const uint32_t h = ld_relaxed(ra.ctr + q);
  *head = h;
  return h < static_cast<uint32_t>(ra.count[q]) ? ra.queue[q][h] : -1;
}

// Claim exactly the head we peeked (CAS); false if someone else took it first.
__device__ __forceinline__ bool claim_head(const KosmosRankArgs& ra, int q, uint32_t head) {
  return atomicCAS(ra.ctr + q, head, head + 1) == head;
}

// Claim the next item whatever it is; -1 when exhausted.
__device__ __forceinline__ int claim_next(const KosmosRankArgs& ra, int q) {
  if (ld_relaxed(ra.ctr + q) >= static_cast<uint32_t>(ra.count[q])) return -1;
  const uint32_t h = atomicAdd(ra.ctr + q, 1u);
  return h < static_cast<uint32_t>(ra.count[q]) ? ra.queue[q][h] : -1;
}

}  // namespace kosmos
