// builder_sm90.cuh — Hopper (sm_90a) builder: one C tile of C = A @ B per call.
//
//   A (M x K) bf16 row-major, B (K x N) bf16 row-major (N contiguous, i.e. MN-major for the
//   tensor cores), C (M x N) bf16 row-major, fp32 accumulation. LayoutB_ = ColumnMajor: B is
//   read transposed, K contiguous (a K x N view of an N x K row-major tensor: the backward
//   dgrad GEMMs' W^T, read in place); the TMA descriptor and the wgmma descriptor take it.
//   LayoutA_ = ColumnMajor: A is read transposed, M contiguous (an M x K view of a K x M
//   row-major tensor: the wgrad GEMMs' X^T with tokens as K, read in place).
//
// Mainloop: TMA (cp.async.bulk.tensor) -> kNumStages-deep shared-memory ring guarded by
// mbarriers -> wgmma (HGMMA m64nNk16, both operands from shared memory, B transposed by the
// descriptor). The mainloop is CUTLASS's `CollectiveMma<MainloopSm90TmaGmmaWarpSpecialized>`
// (cooperative schedule: two consumer warpgroups split the BM rows); this header adds the
// per-tile entry points and the epilogue, so that a persistent kernel can hand the builder
// one tile at a time and do other work (mover items) between tiles.
//
// Thread roles inside a CTA of kNumThreads = 384 (3 warpgroups):
//   warpgroup 0           : "loader" — one warp of it (any one, whole warp) calls produce();
//                           the other warps of the group are free (mover work, claiming).
//   warpgroups 1 and 2    : "math"   — all 256 threads call consume() with the same tiles,
//                           in the same order as produce() was called.
// The loader runs ahead of the math warps by up to kNumStages k-blocks, so while the math
// warps finish tile t (last MMAs + epilogue), the loads of tile t+1 are already in flight:
// that is the "prefetch the next tile's first stages" of the design. The tile sequence must
// be handed from the loader to the math warps: ItemRing below (used by gemm_sm90.cu).
//
// Shared memory (SharedStorage):
//   tensors.smem_A : kNumStages x (kBM x kBK) bf16, 128B-swizzled  = kNumStages * kBM*kBK*2 B
//   tensors.smem_B : kNumStages x (kBN x kBK) bf16, 128B-swizzled  = kNumStages * kBN*kBK*2 B
//   pipeline       : 2 * kNumStages mbarriers (full / empty)       = 16 * kNumStages B
//   epilogue       : staging, 8 warps x 16 rows x 144 B             = 18,432 B (kStagedEpilogue)
//   (128x256x64: 4 stages 215,104 B; 3 stages 165,952 B — leaves ~60 KB of the 227 KB for
//   movers, at ~0.3 % GEMM speed on H200.)
//
// Waits: all waits here are intra-CTA mbarrier waits (TMA completion, stage release, ring
// slots) without a watchdog; they cannot block on other CTAs or GPUs. Cross-CTA readiness
// (flags) is the caller's, with its watchdog, before produce() is called for a tile.
//
// Requirements (checked on the host by `validate`): K % 8 == 0 and N % 8 == 0 (TMA needs
// 16-byte-aligned global row strides), 16-byte-aligned base pointers. Any M, N, K otherwise:
// partial tiles in M, N and K are handled (TMA zero-fills out-of-bounds loads; the
// epilogue masks rows >= M and columns >= N).
//
// New intrinsics used here (to fold into platform.cuh later): setmaxnreg via
// cutlass::arch::warpgroup_reg_{alloc,dealloc}, mbarrier/TMA/wgmma via CuTe/CUTLASS.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/pipeline/pipeline.hpp>

namespace kosmos {
namespace sm90 {

// ItemRing: the loader warp's scheduling decisions (tile indices, or any item encoding the
// caller likes; payload item_t), handed in order to the math warps through kDepth smem slots
// guarded by full/empty mbarriers. One thread pushes (lane 0 of the loader warp); every one
// of `num_poppers` threads pops every item.
//   smem: 2 * kDepth mbarriers (16 * kDepth B) + kDepth * sizeof(item_t)
template <int kDepth, class item_t = int>
struct ItemRing {
  using Pipe = cutlass::PipelineAsync<kDepth>;
  struct SharedStorage {
    typename Pipe::SharedStorage barriers;
    item_t item[kDepth];
  };

  // Construct in all threads (warp 0 initialises the barriers), then __syncthreads().
  CUTLASS_DEVICE ItemRing(SharedStorage& smem, bool is_pusher, bool is_popper, int num_poppers)
      : smem_(smem), pipe_(smem.barriers, params(is_pusher, is_popper, num_poppers)),
        push_state_(cutlass::make_producer_start_state<Pipe>()), pop_state_() {}

  // One thread: blocks while all kDepth slots are still unread.
  CUTLASS_DEVICE void push(item_t const& item) {
    pipe_.producer_acquire(push_state_);
    smem_.item[push_state_.index()] = item;
    pipe_.producer_commit(push_state_);
    ++push_state_;
  }

  // Every popper thread, in the same order: blocks until the next item is there.
  CUTLASS_DEVICE item_t pop() {
    pipe_.consumer_wait(pop_state_);
    item_t const item = smem_.item[pop_state_.index()];
    pipe_.consumer_release(pop_state_);
    ++pop_state_;
    return item;
  }

 private:
  static CUTLASS_DEVICE typename Pipe::Params params(bool is_pusher, bool is_popper, int num_poppers) {
    typename Pipe::Params p;
    p.role = is_pusher ? Pipe::ThreadCategory::Producer
           : is_popper ? Pipe::ThreadCategory::Consumer
                       : Pipe::ThreadCategory::NonParticipant;
    p.producer_arv_count = 1;
    p.consumer_arv_count = uint32_t(num_poppers);
    return p;
  }

  SharedStorage& smem_;
  Pipe pipe_;
  typename Pipe::PipelineState push_state_;
  typename Pipe::PipelineState pop_state_;
};

// kClusterM_ = 2: the CTA is one of a 2-CTA cluster along M that builds the tiles (2i, n) and
// (2i+1, n) together, in lock step: each CTA loads half of the shared B tile and TMA multicasts
// it to both (half the L2->SM traffic for B); the stage's release goes to both CTAs' loaders.
// The caller must then (a) hand both CTAs tiles of the same column in the same order, (b)
// cluster-sync after constructing the builder, (c) call produce_tail() before exiting.
template <int kBM_ = 128, int kBN_ = 256, int kBK_ = 64, int kNumStages_ = 4, bool kStagedEpilogue_ = true,
          int kClusterM_ = 1, class LayoutB_ = cutlass::layout::RowMajor, class LayoutA_ = cutlass::layout::RowMajor>
struct BuilderSm90 {
  using LayoutA = LayoutA_;
  using LayoutB = LayoutB_;
  static constexpr bool kAColMajor = cute::is_same_v<LayoutA, cutlass::layout::ColumnMajor>;
  static_assert(kAColMajor || cute::is_same_v<LayoutA, cutlass::layout::RowMajor>, "A row- or column-major");
  static constexpr bool kBColMajor = cute::is_same_v<LayoutB, cutlass::layout::ColumnMajor>;
  static_assert(kBColMajor || cute::is_same_v<LayoutB, cutlass::layout::RowMajor>, "B row- or column-major");
  static constexpr int kClusterM = kClusterM_;
  static_assert(kClusterM == 1 || kClusterM == 2, "clusters of 1 or 2 CTAs along M");
  static constexpr bool kStagedEpilogue = kStagedEpilogue_;
  static constexpr int kBM = kBM_;
  static constexpr int kBN = kBN_;
  static constexpr int kBK = kBK_;
  static constexpr int kNumStages = kNumStages_;
  static constexpr int kNumThreads = 384;           // 1 loader + 2 math warpgroups
  static constexpr int kNumMathThreads = 256;
  static constexpr int kLoaderRegs = 40;            // setmaxnreg for warpgroup 0
  static constexpr int kMathRegs = 232;             // setmaxnreg for warpgroups 1, 2

  using dtype_t = cutlass::bfloat16_t;
  using TileShape = cute::Shape<cute::Int<kBM>, cute::Int<kBN>, cute::Int<kBK>>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::_1, cute::_1>;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      dtype_t, LayoutA, 8,                     // A: M x K, K contiguous (row-major) or M contiguous
      dtype_t, LayoutB, 8,                     // B: K x N, N contiguous (row-major) or K contiguous
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCount<kNumStages>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

  using StrideA = typename Mainloop::StrideA;
  using StrideB = typename Mainloop::StrideB;
  using TiledMma = typename Mainloop::TiledMma;
  using MainloopPipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;

  static_assert(kAColMajor ? cute::is_same_v<StrideA, cute::Stride<cute::Int<1>, int64_t, int64_t>>
                           : cute::is_same_v<StrideA, cute::Stride<int64_t, cute::Int<1>, int64_t>>,
                "A row-major (K contiguous) or column-major (M contiguous)");
  static_assert(kBColMajor ? cute::is_same_v<StrideB, cute::Stride<int64_t, cute::Int<1>, int64_t>>
                           : cute::is_same_v<StrideB, cute::Stride<cute::Int<1>, int64_t, int64_t>>,
                "B row-major (N contiguous) or column-major (K contiguous)");

  // A viewed as (M, K, L), batch stride `batch` elements: (K, 1, batch) row-major,
  // (1, M, batch) column-major (element (m, k) at k*M + m: the K x M row-major storage).
  static StrideA stride_a(int M, int K, int64_t batch) {
    if constexpr (kAColMajor) {
      return cute::make_stride(cute::Int<1>{}, int64_t(M), batch);
    } else {
      return cute::make_stride(int64_t(K), cute::Int<1>{}, batch);
    }
  }
  // B viewed as (N, K, L): (1, N, K*N) row-major, (K, 1, N*K) column-major.
  static StrideB stride_b(int N, int K) {
    if constexpr (kBColMajor) {
      return cute::make_stride(int64_t(K), cute::Int<1>{}, int64_t(N) * K);
    } else {
      return cute::make_stride(cute::Int<1>{}, int64_t(N), int64_t(K) * N);
    }
  }
  static_assert(cute::size(TiledMma{}) == kNumMathThreads, "cooperative schedule: 2 math warpgroups");

  // Epilogue staging (kStagedEpilogue): per math warp, one 16 x 64 bf16 sub-tile with rows
  // padded to 144 B (128 B of data + 16 B, so the fragment writes hit 32 distinct banks):
  // 8 warps * 16 rows * 144 B = 18,432 B. Separate from the mainloop ring, so the loader can
  // keep prefetching the next tile while the math warps store this one.
  static constexpr int kEpiRowBytes = 144;
  static constexpr int kEpiWarpBytes = 16 * kEpiRowBytes;
  static constexpr int kEpiBytes = kStagedEpilogue ? (kNumMathThreads / 32) * kEpiWarpBytes : 16;

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;
    alignas(16) typename MainloopPipeline::SharedStorage pipeline;
    alignas(16) uint8_t epilogue[kEpiBytes];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "builder shared memory exceeds the sm_90 per-block limit");

  // Everything the builder needs, by value (kernel parameter: TMA descriptors inside must live
  // in param/const/global memory, so pass the enclosing struct as __grid_constant__).
  struct Params {
    typename Mainloop::Params mainloop;
    dtype_t* C;
    int M, N, K;
    int num_m_blk, num_n_blk, num_k_blk;
  };

  // ---------------------------------------------------------------------------- host side
  // Returns nullptr when (M, N, K, pointers) are supported, else a message saying why not.
  static const char* validate(const void* A, const void* B, const void* C, int M, int N, int K) {
    if (M <= 0 || N <= 0 || K <= 0) return "sm90 builder: M, N, K must be positive";
    if (K % 8 != 0) return "sm90 builder: K must be a multiple of 8 (TMA: A's row stride must be 16-byte aligned)";
    if (N % 8 != 0) return "sm90 builder: N must be a multiple of 8 (TMA: B's and C's row stride must be 16-byte aligned)";
    if (kAColMajor && M % 8 != 0) return "sm90 builder: M must be a multiple of 8 (TMA: A^T's row stride must be 16-byte aligned)";
    if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B) | reinterpret_cast<uintptr_t>(C)) % 16 != 0)
      return "sm90 builder: A, B and C must be 16-byte aligned";
    return nullptr;
  }

  // Builds the TMA descriptors (host; calls the driver through cudaGetDriverEntryPoint).
  static Params make_params(const void* A, const void* B, void* C, int M, int N, int K) {
    auto problem = cute::make_shape(M, N, K, 1);
    // A viewed as (M, K, L): stride_a; B viewed as (N, K, L): stride_b.
    StrideA dA = stride_a(M, K, int64_t(M) * K);
    StrideB dB = stride_b(N, K);
    typename Mainloop::Arguments args{static_cast<const dtype_t*>(A), dA, static_cast<const dtype_t*>(B), dB};
    Params p;
    p.mainloop = Mainloop::to_underlying_arguments(problem, args, nullptr);
    p.C = static_cast<dtype_t*>(C);
    p.M = M;
    p.N = N;
    p.K = K;
    p.num_m_blk = (M + kBM - 1) / kBM;
    p.num_n_blk = (N + kBN - 1) / kBN;
    p.num_k_blk = (K + kBK - 1) / kBK;
    return p;
  }

  // --------------------------------------------------------------------------- device side
  enum class Role { kLoader, kMath, kNone };

  // Which role a thread has, from its warpgroup (0: loader, 1 and 2: math).
  CUTLASS_DEVICE static Role role_of(int thread_idx) {
    return thread_idx < 128 ? Role::kLoader : (thread_idx < kNumThreads ? Role::kMath : Role::kNone);
  }

  // Per-thread builder state. Construct in ALL threads of the CTA (the barrier initialisation
  // is done by warp 0), then fence: __syncthreads() before the first produce/consume.
  CUTLASS_DEVICE BuilderSm90(SharedStorage& smem, Params const& params, Role role)
      : smem_(smem), params_(params), pipeline_(smem.pipeline, pipeline_params(role), ClusterShape{}),
        write_state_(cutlass::make_producer_start_state<MainloopPipeline>()), read_state_() {}

  // Loader: issue the TMA loads of all k-blocks of tile (m_blk, n_blk), blocking only while
  // the ring is full. Call with one whole warp of warpgroup 0 (one lane issues).
  CUTLASS_DEVICE void produce(int m_blk, int n_blk) {
    Mainloop mainloop;
    auto problem = cute::make_shape(params_.M, params_.N, params_.K, 1);
    auto load_inputs = mainloop.load_init(problem, params_.mainloop);
    auto k_tile_iter = cute::make_coord_iterator(cute::shape<3>(cute::get<0>(load_inputs)));
    auto blk_coord = cute::make_coord(m_blk, n_blk, cute::_, 0);
    uint32_t const rank_in_cluster = kClusterM > 1 ? cute::block_rank_in_cluster() : 0u;
    mainloop.load(params_.mainloop, pipeline_, write_state_, load_inputs, blk_coord, k_tile_iter,
                  params_.num_k_blk, int(threadIdx.x % 32), rank_in_cluster, smem_.tensors);
    write_state_.advance(params_.num_k_blk);
  }

  // Loader: before the CTA exits (or repurposes the ring's memory), wait until the math
  // warps have released every stage.
  CUTLASS_DEVICE void produce_tail() {
    Mainloop mainloop;
    mainloop.load_tail(pipeline_, write_state_);
  }

  // Math: all 256 math threads. MMAs over every k-block of tile (m_blk, n_blk), then the
  // epilogue (fp32 -> bf16, masked stores straight from registers to C).
  CUTLASS_DEVICE void consume(int m_blk, int n_blk) {
    using namespace cute;
    Mainloop mainloop;
    TiledMma tiled_mma;
    int const math_idx = int(threadIdx.x) - 128;
    Tensor accum = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));  // (MMA, MMA_M, MMA_N) fp32
    mainloop.mma(pipeline_, read_state_, accum, params_.num_k_blk, math_idx, smem_.tensors, params_.mainloop);
    mainloop.mma_tail(pipeline_, read_state_, params_.num_k_blk);
    read_state_.advance(params_.num_k_blk);
    if constexpr (kStagedEpilogue) {
      store_tile_staged(accum, math_idx, m_blk, n_blk);
    } else {
      store_tile(accum, tiled_mma, math_idx, m_blk, n_blk);
    }
  }

  // ------------------------------------------------ per-tile sources and destinations
  // For kernels whose tiles come from several A matrices and go to arbitrary places in C
  // (the fused AG+GEMM: A_r or a peer's band of the gathered buffer). The pipeline state is
  // shared with produce()/consume(): mix them freely, in the same order on both sides.

  // Loader: like produce(), with the TMA descriptors of `mp` (built by make_mainloop_params)
  // instead of the constructor's: A viewed as (rows_a, K, batches_a), tile rows
  // m_blk*kBM.. of batch l_a (TMA zero-fills rows >= rows_a of that batch: a batch is one
  // rank's band, so partial tiles never read another rank's rows); B from batch 0, columns
  // n_blk*kBN... K and N are the constructor's params_.K / params_.N.
  //
  // kwait (optional): `int kwait(int k)` blocks until k-block k of the tile's A is in place
  // and returns how many leading k-blocks are (> k); called by the issuing lane before the
  // first load of each k-block not yet known to be there, so that a tile can start while its
  // A still arrives in K order (the fused kernel's streamed K-slices). Its waits must be
  // bounded (watchdog): the loads are issued either way, so the math warps never block.
  //
  // hook (optional): `void hook(int k)`, called by the issuing lane before each k-block's load,
  // once that k-block's A is there (the fused kernel signals its scheduler a few k-blocks before
  // the tile's last load; a tile still waiting for its K-slice claims nothing ahead).
  struct AllThere {
    CUTLASS_DEVICE int operator()(int) const { return 1 << 30; }
  };
  struct NoHook {
    CUTLASS_DEVICE void operator()(int) const {}
  };
  template <class KWait = AllThere, class KHook = NoHook>
  CUTLASS_DEVICE void produce_at(typename Mainloop::Params const& mp, int rows_a, int batches_a, int m_blk,
                                 int n_blk, int l_a, KWait kwait = {}, KHook hook = {}) {
    produce_grouped(mp, rows_a, batches_a, l_a, m_blk, params_.N, params_.K, params_.num_k_blk, 1, 0, n_blk, kwait,
                    hook);
  }

  // Loader: the general form of produce_at, for kernels whose tiles have different K and B
  // matrices (grouped GEMMs: one B per expert): A viewed as (rows_a, K, batches_a), tile rows
  // m_blk*kBM.. of batch l_a; B viewed as (N, K, batches_b) (K x N row-major per batch),
  // columns n_blk*kBN.. of batch l_b; num_k_blk k-blocks. The descriptors of `mp` must have
  // been built for these extents (make_grouped_params). The math side calls mma_k with the
  // same num_k_blk. k0: the tile's first k-block (a wgrad tile over one expert's segment of
  // the token rows, tokens as K: segments start at a k-block boundary); kwait / hook see k
  // relative to it.
  template <class KWait = AllThere, class KHook = NoHook>
  CUTLASS_DEVICE void produce_grouped(typename Mainloop::Params const& mp, int rows_a, int batches_a, int l_a,
                                      int m_blk, int N, int K, int num_k_blk, int batches_b, int l_b, int n_blk,
                                      KWait kwait = {}, KHook hook = {}, int k0 = 0) {
    static_assert(kClusterM == 1, "produce_at loads whole tiles (no multicast)");
    using namespace cute;
    if (cute::elect_one_sync()) {
      Tensor sA = make_tensor(make_smem_ptr(smem_.tensors.smem_A.data()), typename Mainloop::SmemLayoutA{});
      Tensor sB = make_tensor(make_smem_ptr(smem_.tensors.smem_B.data()), typename Mainloop::SmemLayoutB{});
      Tensor mA = mp.tma_load_a.get_tma_tensor(make_shape(rows_a, K, batches_a));  // (m, k, l)
      Tensor mB = mp.tma_load_b.get_tma_tensor(make_shape(N, K, batches_b));       // (n, k, l)
      Tensor gA_mkl = local_tile(mA, TileShape{}, make_coord(_, _, _), Step<_1, Underscore, _1>{});
      Tensor gB_nkl = local_tile(mB, TileShape{}, make_coord(_, _, _), Step<Underscore, _1, _1>{});
      Tensor gA = gA_mkl(_, _, m_blk, _, l_a);  // (BLK_M, BLK_K, k)
      Tensor gB = gB_nkl(_, _, n_blk, _, l_b);  // (BLK_N, BLK_K, k)
      auto block_tma_a = mp.tma_load_a.get_slice(0);
      auto block_tma_b = mp.tma_load_b.get_slice(0);
      Tensor tAgA = block_tma_a.partition_S(gA);
      Tensor tAsA = block_tma_a.partition_D(sA);
      Tensor tBgB = block_tma_b.partition_S(gB);
      Tensor tBsB = block_tma_b.partition_D(sB);
      PipelineState st = write_state_;
      int there = 0;  // leading k-blocks known to be in place
      CUTLASS_PRAGMA_NO_UNROLL
      for (int k = 0; k < num_k_blk; ++k) {
        if (k >= there) there = kwait(k);
        hook(k);
        pipeline_.producer_acquire(st);
        auto* bar = pipeline_.producer_get_barrier(st);
        int const stage = st.index();
        copy(mp.tma_load_a.with(*bar, uint16_t(0)), tAgA(_, _, _, k0 + k), tAsA(_, _, _, stage));
        copy(mp.tma_load_b.with(*bar, uint16_t(0)), tBgB(_, _, _, k0 + k), tBsB(_, _, _, stage));
        ++st;
      }
    }
    __syncwarp();
    write_state_.advance(num_k_blk);
  }

  // Loader: a tile whose K is `segs` segments of params_.K each, taken in one fixed rotated
  // order: segment `first`, first+1, ..., segs-1, 0, ..., first-1 (the wgrad GEMMs: K = tokens,
  // segment p = rank p's rows, own rows first, then the peers' in ring order). A is viewed as
  // (rows_a, K, segs) by `mp` (batch = segment) except segment `first`, read from `own` (batch 0,
  // same box and layout: the own rows in place, not in the gathered buffer); B always from `mp`,
  // viewed as (N, K, segs) (make_mainloop_params with batches_a = segs: B batch l is the K x N
  // block at B + l*K*N). A segment's last k-block past K is zero-filled in both operands' views
  // (TMA), so no k-block ever reads another segment's rows. The math side consumes
  // segs * params_.num_k_blk k-blocks (consume_to's num_k_blk). kwait / hook take the tile's
  // k-block index in this order (0 .. segs*num_k_blk - 1), as in produce_grouped. Its own
  // entry point, so produce_at / produce_grouped are unchanged for the other kernels.
  template <class KWait = AllThere, class KHook = NoHook>
  CUTLASS_DEVICE void produce_rotated(typename Mainloop::Params const& own, typename Mainloop::Params const& mp,
                                      int rows_a, int segs, int first, int m_blk, int n_blk, KWait kwait = {},
                                      KHook hook = {}) {
    produce_segments(own, mp, rows_a, segs, first, segs, true, 0, params_.num_k_blk, m_blk, n_blk, kwait, hook);
  }

  // Loader: one span of a produce_rotated tile (the wgrad band items: a band group's partial):
  // k-blocks [kb0, kb0 + nkb) of nseg segments from l on (rotated), A from `own` (batch 0) for
  // the first when own_a, else from `mp` batch l..; B from `mp` batch l... The math side consumes
  // nseg * nkb k-blocks (mma_k). hook takes the span's k-block index (0 .. nseg * nkb - 1).
  template <class KHook = NoHook>
  CUTLASS_DEVICE void produce_span(typename Mainloop::Params const& own, typename Mainloop::Params const& mp,
                                   int rows_a, int segs, int l, int nseg, bool own_a, int kb0, int nkb, int m_blk,
                                   int n_blk, KHook hook = {}) {
    produce_segments(own, mp, rows_a, segs, l, nseg, own_a, kb0, nkb, m_blk, n_blk, AllThere{}, hook);
  }

  // produce_rotated / produce_span: nseg segments from `first` on (rotated), k-blocks
  // [kb0, kb0 + nkb) of each; the first segment's A from `own` when own_first.
  template <class KWait, class KHook>
  CUTLASS_DEVICE void produce_segments(typename Mainloop::Params const& own, typename Mainloop::Params const& mp,
                                       int rows_a, int segs, int first, int nseg, bool own_first, int kb0, int nkb,
                                       int m_blk, int n_blk, KWait kwait, KHook hook) {
    static_assert(kClusterM == 1, "produce_rotated loads whole tiles (no multicast)");
    using namespace cute;
    if (cute::elect_one_sync()) {
      Tensor sA = make_tensor(make_smem_ptr(smem_.tensors.smem_A.data()), typename Mainloop::SmemLayoutA{});
      Tensor sB = make_tensor(make_smem_ptr(smem_.tensors.smem_B.data()), typename Mainloop::SmemLayoutB{});
      Tensor mA = mp.tma_load_a.get_tma_tensor(make_shape(rows_a, params_.K, segs));    // (m, k, l)
      Tensor mB = mp.tma_load_b.get_tma_tensor(make_shape(params_.N, params_.K, segs));  // (n, k, l)
      Tensor gA_mkl = local_tile(mA, TileShape{}, make_coord(_, _, _), Step<_1, Underscore, _1>{});
      Tensor gB_nkl = local_tile(mB, TileShape{}, make_coord(_, _, _), Step<Underscore, _1, _1>{});
      Tensor gA = gA_mkl(_, _, m_blk, _, _);  // (BLK_M, BLK_K, k, l)
      Tensor gB = gB_nkl(_, _, n_blk, _, _);  // (BLK_N, BLK_K, k, l)
      auto block_tma_a = mp.tma_load_a.get_slice(0);
      auto block_tma_b = mp.tma_load_b.get_slice(0);
      Tensor tAgA = block_tma_a.partition_S(gA);  // (TMA, TMA_M, TMA_K, k, l)
      Tensor tAsA = block_tma_a.partition_D(sA);
      Tensor tBgB = block_tma_b.partition_S(gB);
      Tensor tBsB = block_tma_b.partition_D(sB);
      PipelineState st = write_state_;
      int there = 0;  // leading k-blocks (tile order) known to be in place
      int l = first;
      CUTLASS_PRAGMA_NO_UNROLL
      for (int s = 0; s < nseg; ++s) {
        CUTLASS_PRAGMA_NO_UNROLL
        for (int j = 0; j < nkb; ++j) {
          int const i = s * nkb + j, kb = kb0 + j;
          if (i >= there) there = kwait(i);
          hook(i);
          pipeline_.producer_acquire(st);
          auto* bar = pipeline_.producer_get_barrier(st);
          int const stage = st.index();
          if (s == 0 && own_first) {
            copy(own.tma_load_a.with(*bar, uint16_t(0)), tAgA(_, _, _, kb, 0), tAsA(_, _, _, stage));
          } else {
            copy(mp.tma_load_a.with(*bar, uint16_t(0)), tAgA(_, _, _, kb, l), tAsA(_, _, _, stage));
          }
          copy(mp.tma_load_b.with(*bar, uint16_t(0)), tBgB(_, _, _, kb, l), tBsB(_, _, _, stage));
          ++st;
        }
        l = (l + 1 == segs) ? 0 : l + 1;
      }
    }
    __syncwarp();
    write_state_.advance(nseg * nkb);
  }

  // Math: a fresh accumulator fragment of one tile (fp32, kBN/2 values per math thread).
  CUTLASS_DEVICE static auto make_accum() {
    TiledMma tiled_mma;
    return cute::partition_fragment_C(tiled_mma, cute::take<0, 2>(TileShape{}));
  }

  // Math: all 256 math threads. MMAs over the next tile's num_k_blk k-blocks into accum (as
  // produce_grouped loaded them); the epilogue is the caller's (store_staged_to, or its own:
  // the accumulator layout is documented at store_staged_to).
  template <class Accum>
  CUTLASS_DEVICE void mma_k(Accum& accum, int num_k_blk) {
    Mainloop mainloop;
    int const math_idx = int(threadIdx.x) - 128;
    mainloop.mma(pipeline_, read_state_, accum, num_k_blk, math_idx, smem_.tensors, params_.mainloop);
    mainloop.mma_tail(pipeline_, read_state_, num_k_blk);
    read_state_.advance(num_k_blk);
  }

  // The staged epilogue's shared memory (kEpiBytes): free for the math warps' own use between
  // tiles (a caller's epilogue that does not use store_staged_to).
  CUTLASS_DEVICE uint8_t* epilogue_smem() { return smem_.epilogue; }

  // The pipeline states, for a kernel that runs two builder types (A row- and column-major)
  // over ONE SharedStorage and mainloop ring (the MoE backward's cooperative form; its ping-pong
  // form does the same with PingpongBuilderSm90's pair): the loader hands the
  // write state, the math warps the read state, to the builder of the next tile's type.
  // Both types must have the same stages, tile shape and SharedStorage size (the kernel
  // static_asserts it); a tile is produced and consumed by the same type.
  CUTLASS_DEVICE PipelineState& write_state() { return write_state_; }
  CUTLASS_DEVICE PipelineState& read_state() { return read_state_; }

  // Host: mainloop params for produce_grouped: A viewed as (rows_a, K, batches_a) with batch
  // stride a_batch_stride elements (row stride K); B as (N, K, batches_b): batch l is the
  // K x N row-major matrix at B + l * K * N. Same requirements as validate().
  static typename Mainloop::Params make_grouped_params(const void* A, int rows_a, int batches_a,
                                                       int64_t a_batch_stride, const void* B, int N, int K,
                                                       int batches_b) {
    StrideA dA = stride_a(rows_a, K, a_batch_stride);
    StrideB dB = cute::make_stride(cute::Int<1>{}, int64_t(N), int64_t(K) * N);
    // the mainloop builds both descriptors with one batch count: build each with its own
    typename Mainloop::Arguments args{static_cast<const dtype_t*>(A), dA, static_cast<const dtype_t*>(B), dB};
    auto pa = Mainloop::to_underlying_arguments(cute::make_shape(rows_a, N, K, batches_a), args, nullptr);
    auto pb = Mainloop::to_underlying_arguments(cute::make_shape(rows_a, N, K, batches_b), args, nullptr);
    pa.tma_load_b = pb.tma_load_b;
    return pa;
  }

  // Math: like consume(), storing the tile to C_tile (row stride ldc elements, 16-byte
  // aligned, ldc % 8 == 0), rows < rows and columns < cols only (cols % 8 == 0). num_k_blk:
  // the k-blocks the loader issued for the tile (params_.num_k_blk; produce_rotated: segs times that).
  CUTLASS_DEVICE void consume_to(dtype_t* C_tile, int64_t ldc, int rows, int cols, int num_k_blk) {
    static_assert(kStagedEpilogue, "consume_to needs the staged epilogue");
    using namespace cute;
    Mainloop mainloop;
    TiledMma tiled_mma;
    int const math_idx = int(threadIdx.x) - 128;
    Tensor accum = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));
    mainloop.mma(pipeline_, read_state_, accum, num_k_blk, math_idx, smem_.tensors, params_.mainloop);
    mainloop.mma_tail(pipeline_, read_state_, num_k_blk);
    read_state_.advance(num_k_blk);
    store_staged_to(accum, math_idx, reinterpret_cast<__nv_bfloat16*>(C_tile), ldc, rows, cols);
  }

  // Host: the mainloop params (TMA descriptors) for A viewed as (rows_a, K, batches_a) with
  // batch stride batch_stride elements (row stride K), and B (K x N in LayoutB). For
  // produce_at. Same requirements as validate(), plus batch_stride % 8 == 0.
  static typename Mainloop::Params make_mainloop_params(const void* A, int rows_a, int batches_a,
                                                        int64_t batch_stride, const void* B, int N, int K) {
    auto problem = cute::make_shape(rows_a, N, K, batches_a);
    StrideA dA = stride_a(rows_a, K, batch_stride);
    StrideB dB = stride_b(N, K);  // only batch 0 is read
    typename Mainloop::Arguments args{static_cast<const dtype_t*>(A), dA, static_cast<const dtype_t*>(B), dB};
    return Mainloop::to_underlying_arguments(problem, args, nullptr);
  }

 private:
  static CUTLASS_DEVICE typename MainloopPipeline::Params pipeline_params(Role role) {
    typename MainloopPipeline::Params pp;
    pp.role = role == Role::kLoader ? MainloopPipeline::ThreadCategory::Producer
            : role == Role::kMath   ? MainloopPipeline::ThreadCategory::Consumer
                                    : MainloopPipeline::ThreadCategory::NonParticipant;
    pp.is_leader = (threadIdx.x % 128) == 0;
    pp.num_consumers = kNumMathThreads;
    pp.transaction_bytes = Mainloop::TmaTransactionBytes;
    return pp;
  }

  // Staged epilogue: each math warp owns 16 rows x kBN columns of the tile; per 64-column
  // chunk it writes its fragment (bf16x2) into its smem sub-tile, then reads it back as rows
  // of 16-byte vectors and stores whole 128-byte row segments to C (coalesced; masked by M
  // and N, which is a multiple of 8 so a 16-byte vector is all in or all out).
  // Accumulator layout of wgmma m64nNk16 (PTX ISA), thread t of a warpgroup, value v:
  //   row = 16*(t/32) + (t%32)/4 + 8*((v/2)%2),   col = 8*(v/4) + 2*(t%4) + v%2
  // and math warpgroup g (= math_idx/128) holds rows 64*g .. 64*g+63 of the tile.
  template <class Accum>
  CUTLASS_DEVICE void store_tile_staged(Accum const& accum, int math_idx, int m_blk, int n_blk) {
    int const m0 = m_blk * kBM, n0 = n_blk * kBN;
    store_staged_to(accum, math_idx, reinterpret_cast<__nv_bfloat16*>(params_.C) + int64_t(m0) * params_.N + n0,
                    params_.N, params_.M - m0, params_.N - n0);
  }

  // (store_staged_to is public: see below.)

 public:
  // The staged epilogue proper: tile origin C (row stride ldc), valid rows < M, cols < N;
  // the first kCols columns of the tile (values v < kCols/2 of each thread: a caller's
  // epilogue may compute kCols < kBN output columns into the leading values, e.g. SwiGLU).
  template <int kCols = kBN, class Accum>
  CUTLASS_DEVICE void store_staged_to(Accum const& accum, int math_idx, __nv_bfloat16* C, int64_t ldc, int M,
                                      int N) {
    static_assert(kBM == 128 && kBN % 64 == 0 && kCols % 64 == 0 && kCols <= kBN, "staged epilogue assumes 2 x m64nN atoms");
    static_assert(decltype(cute::size(accum))::value == kBN / 2, "one m64nN atom per thread");
    int const lane = math_idx % 32;
    int const warp = math_idx / 32;  // 0..7: warpgroup = warp/4, 16-row slab = warp%4
    uint8_t* stage = smem_.epilogue + warp * kEpiWarpBytes;
    int const row0 = (warp / 4) * 64 + (warp % 4) * 16;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kCols / 64; ++j) {
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < 8; ++b) {
        int const v0 = (j * 8 + b) * 4;
        int const off = (lane / 4) * kEpiRowBytes + (b * 8 + 2 * (lane % 4)) * 2;
        *reinterpret_cast<__nv_bfloat162*>(stage + off) = __floats2bfloat162_rn(accum(v0), accum(v0 + 1));
        *reinterpret_cast<__nv_bfloat162*>(stage + off + 8 * kEpiRowBytes) =
            __floats2bfloat162_rn(accum(v0 + 2), accum(v0 + 3));
      }
      __syncwarp();
      int const col = j * 64 + (lane % 8) * 8;
      CUTLASS_PRAGMA_UNROLL
      for (int it = 0; it < 4; ++it) {
        int const r = it * 4 + lane / 8;
        uint4 const val = *reinterpret_cast<uint4 const*>(stage + r * kEpiRowBytes + (lane % 8) * 16);
        int const row = row0 + r;
        if (row < M && col < N) *reinterpret_cast<uint4*>(C + int64_t(row) * ldc + col) = val;
      }
      __syncwarp();
    }
  }


 private:
  // Epilogue. The wgmma accumulator layout gives each thread pairs of adjacent columns
  // (values 2i, 2i+1), so the stores are 4-byte bf16x2, masked by M and N (N is even).
  template <class Accum>
  CUTLASS_DEVICE void store_tile(Accum const& accum, TiledMma const& tiled_mma, int math_idx, int m_blk, int n_blk) {
    using namespace cute;
    auto thr_mma = tiled_mma.get_thread_slice(math_idx);
    Tensor cC = make_identity_tensor(make_shape(Int<kBM>{}, Int<kBN>{}));
    Tensor tCcC = thr_mma.partition_C(cC);  // same shape as accum: (row, col) inside the tile
    static_assert(decltype(size(tCcC))::value == decltype(size(accum))::value, "epilogue layout");
    int const m0 = m_blk * kBM;
    int const n0 = n_blk * kBN;
    int const M = params_.M, N = params_.N;
    __nv_bfloat16* C = reinterpret_cast<__nv_bfloat16*>(params_.C);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accum); i += 2) {
      int const r = m0 + get<0>(tCcC(i));
      int const c = n0 + get<1>(tCcC(i));
      int const r1 = m0 + get<0>(tCcC(i + 1));
      int const c1 = n0 + get<1>(tCcC(i + 1));
      if (r1 == r && c1 == c + 1) {
        if (r < M && c < N) {
          *reinterpret_cast<__nv_bfloat162*>(C + int64_t(r) * N + c) = __floats2bfloat162_rn(accum(i), accum(i + 1));
        }
      } else {  // not expected for the wgmma layout; kept so the epilogue is right for any layout
        if (r < M && c < N) C[int64_t(r) * N + c] = __float2bfloat16_rn(accum(i));
        if (r1 < M && c1 < N) C[int64_t(r1) * N + c1] = __float2bfloat16_rn(accum(i + 1));
      }
    }
  }

  SharedStorage& smem_;
  Params const& params_;
  MainloopPipeline pipeline_;
  PipelineState write_state_;
  PipelineState read_state_;
};

// ---------------------------------------------------------------------------------------------
// PingpongBuilderSm90: the ping-pong form (CUTLASS's KernelTmaWarpSpecializedPingpong schedule,
// inside a persistent item loop), used by both MoE kernels (the backward with a column-major-A
// twin for its wgrad tiles). Its own type, so BuilderSm90's instantiations (the GEMM, AG and
// GEMM+RS kernels) are untouched.
//
//   * each math warpgroup (128 threads) computes whole kBM x kBN tiles alone (kBM = 128: two
//     m64n(kBN)k16 wgmmas per k16 step: kAccum = kBM * kBN / 128 fp32 accumulators a thread, 128 at kBN 128);
//   * one mainloop ring serves both: the loader issues every tile's k-blocks in ring order; the
//     warpgroup that owns a tile waits for its stages and releases them (the pipeline's consumer
//     count is ONE warpgroup), the other warpgroup skips them (skip_k: advances its read state
//     by the tile's k-blocks without touching the barriers). Both must therefore see every tile
//     in the same order (the caller's item ring: both warpgroups pop every item) and agree on
//     each tile's k-block count;
//   * the caller orders the two warpgroups' MMAs (mma_k's after_issue: hand the turn to the
//     other warpgroup once this tile's last wgmma is issued), so one warpgroup's epilogue runs
//     under the other's mainloop;
//   * epilogue staging: per math warp 16 rows x 144 B as BuilderSm90 (8 warps, 18,432 B); a
//     warpgroup's 4 warps use their own 4 slots, so the two warpgroups' epilogues never share
//     shared memory (epilogue_smem(wg): the warpgroup's half, 9,216 B).
// Accumulator of a warpgroup's tile (thread t = 0..127 of the warpgroup, value v = 64*h + a,
// h = the m64 half, a = 0..kBN/2-1; PTX ISA wgmma m64nNk16 layout):
//   row = 64*h + 16*(t/32) + (t%32)/4 + 8*((a/2)%2),   col = 8*(a/4) + 2*(t%4) + a%2.
// Requirements as BuilderSm90 (produce_grouped's). B row-major; A row-major (LayoutA_ RowMajor,
// the forward and the backward's dgrad GEMMs) or column-major (ColumnMajor: A is read
// transposed, M contiguous, an M x K view of a K x M row-major tensor: the backward's wgrad
// GEMMs, tokens as K). The two A layouts of one (kBN, kNumStages) have the same stage bytes,
// SharedStorage and pipeline, so a kernel may run both over ONE SharedStorage and ring, handing
// the pipeline states across (write_state / read_state), as it does with BuilderSm90.
template <int kBN_ = 128, int kNumStages_ = 6, class LayoutA_ = cutlass::layout::RowMajor>
struct PingpongBuilderSm90 {
  using LayoutA = LayoutA_;
  static constexpr bool kAColMajor = cute::is_same_v<LayoutA, cutlass::layout::ColumnMajor>;
  static_assert(kAColMajor || cute::is_same_v<LayoutA, cutlass::layout::RowMajor>, "A row- or column-major");
  static constexpr int kBM = 128;
  static constexpr int kBN = kBN_;
  static constexpr int kBK = 64;
  static constexpr int kNumStages = kNumStages_;
  static constexpr int kNumThreads = 384;      // 1 loader + 2 math warpgroups
  static constexpr int kNumMathThreads = 256;  // both math warpgroups (they pop every item)
  static constexpr int kWgThreads = 128;       // one math warpgroup: a tile's consumer
  static constexpr int kAccum = kBM * kBN / kWgThreads;  // fp32 accumulators a thread
  static constexpr int kAtomVals = kAccum / 2;           // values of one m64 half

  using dtype_t = cutlass::bfloat16_t;
  using TileShape = cute::Shape<cute::Int<kBM>, cute::Int<kBN>, cute::Int<kBK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, dtype_t, LayoutA, 8, dtype_t,
      cutlass::layout::RowMajor, 8, float, TileShape, ClusterShape, cutlass::gemm::collective::StageCount<kNumStages>,
      cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;
  using StrideA = typename Mainloop::StrideA;
  using StrideB = typename Mainloop::StrideB;
  using TiledMma = typename Mainloop::TiledMma;
  using MainloopPipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;
  static_assert(cute::size(TiledMma{}) == kWgThreads, "ping-pong: one math warpgroup per tile");
  static_assert(kAColMajor ? cute::is_same_v<StrideA, cute::Stride<cute::Int<1>, int64_t, int64_t>>
                           : cute::is_same_v<StrideA, cute::Stride<int64_t, cute::Int<1>, int64_t>>,
                "A row-major (K contiguous) or column-major (M contiguous)");

  static constexpr int kEpiRowBytes = 144;
  static constexpr int kEpiWarpBytes = 16 * kEpiRowBytes;
  static constexpr int kEpiWgBytes = 4 * kEpiWarpBytes;
  static constexpr int kEpiBytes = 2 * kEpiWgBytes;

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;
    alignas(16) typename MainloopPipeline::SharedStorage pipeline;
    alignas(16) uint8_t epilogue[kEpiBytes];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));

  enum class Role { kLoader, kMath, kNone };
  CUTLASS_DEVICE static Role role_of(int thread_idx) {
    return thread_idx < 128 ? Role::kLoader : (thread_idx < kNumThreads ? Role::kMath : Role::kNone);
  }

  // Host: mainloop params for produce_grouped (as BuilderSm90::make_grouped_params): A viewed as
  // (rows_a, K, batches_a), batch stride a_batch_stride elements (row-major: row stride K;
  // column-major: element (m, k) at k * rows_a + m); B as (N, K, batches_b), batch l the K x N
  // row-major matrix at B + l * K * N.
  static typename Mainloop::Params make_grouped_params(const void* A, int rows_a, int batches_a,
                                                       int64_t a_batch_stride, const void* B, int N, int K,
                                                       int batches_b) {
    StrideA dA;
    if constexpr (kAColMajor) {
      dA = cute::make_stride(cute::Int<1>{}, int64_t(rows_a), a_batch_stride);
    } else {
      dA = cute::make_stride(int64_t(K), cute::Int<1>{}, a_batch_stride);
    }
    StrideB dB = cute::make_stride(cute::Int<1>{}, int64_t(N), int64_t(K) * N);
    typename Mainloop::Arguments args{static_cast<const dtype_t*>(A), dA, static_cast<const dtype_t*>(B), dB};
    auto pa = Mainloop::to_underlying_arguments(cute::make_shape(rows_a, N, K, batches_a), args, nullptr);
    auto pb = Mainloop::to_underlying_arguments(cute::make_shape(rows_a, N, K, batches_b), args, nullptr);
    pa.tma_load_b = pb.tma_load_b;
    return pa;
  }

  // Construct in ALL threads of the CTA (warp 0 initialises the barriers), then __syncthreads().
  // mp: any of the kernel's mainloop params (the wgmma reads shared memory only).
  CUTLASS_DEVICE PingpongBuilderSm90(SharedStorage& smem, typename Mainloop::Params const& mp, Role role)
      : smem_(smem), mp_(mp), pipeline_(smem.pipeline, pipeline_params(role), ClusterShape{}),
        write_state_(cutlass::make_producer_start_state<MainloopPipeline>()), read_state_() {}

  CUTLASS_DEVICE static void prefetch(typename Mainloop::Params const& mp) { Mainloop::prefetch_tma_descriptors(mp); }

  // Loader (one whole warp of warpgroup 0): the k-blocks of tile rows m_blk*kBM.. of batch l_a of
  // A (rows_a x K) and columns n_blk*kBN.. of batch l_b of B (K x N); num_k_blk k-blocks from
  // k-block k0 on (a wgrad tile over one expert's segment of the token rows, tokens as K).
  CUTLASS_DEVICE void produce_grouped(typename Mainloop::Params const& mp, int rows_a, int batches_a, int l_a,
                                      int m_blk, int N, int K, int num_k_blk, int batches_b, int l_b, int n_blk,
                                      int k0 = 0) {
    using namespace cute;
    if (cute::elect_one_sync()) {
      Tensor sA = make_tensor(make_smem_ptr(smem_.tensors.smem_A.data()), typename Mainloop::SmemLayoutA{});
      Tensor sB = make_tensor(make_smem_ptr(smem_.tensors.smem_B.data()), typename Mainloop::SmemLayoutB{});
      Tensor mA = mp.tma_load_a.get_tma_tensor(make_shape(rows_a, K, batches_a));  // (m, k, l)
      Tensor mB = mp.tma_load_b.get_tma_tensor(make_shape(N, K, batches_b));       // (n, k, l)
      Tensor gA_mkl = local_tile(mA, TileShape{}, make_coord(_, _, _), Step<_1, Underscore, _1>{});
      Tensor gB_nkl = local_tile(mB, TileShape{}, make_coord(_, _, _), Step<Underscore, _1, _1>{});
      Tensor gA = gA_mkl(_, _, m_blk, _, l_a);  // (BLK_M, BLK_K, k)
      Tensor gB = gB_nkl(_, _, n_blk, _, l_b);  // (BLK_N, BLK_K, k)
      auto block_tma_a = mp.tma_load_a.get_slice(0);
      auto block_tma_b = mp.tma_load_b.get_slice(0);
      Tensor tAgA = block_tma_a.partition_S(gA);
      Tensor tAsA = block_tma_a.partition_D(sA);
      Tensor tBgB = block_tma_b.partition_S(gB);
      Tensor tBsB = block_tma_b.partition_D(sB);
      PipelineState st = write_state_;
      CUTLASS_PRAGMA_NO_UNROLL
      for (int k = 0; k < num_k_blk; ++k) {
        pipeline_.producer_acquire(st);
        auto* bar = pipeline_.producer_get_barrier(st);
        int const stage = st.index();
        copy(mp.tma_load_a.with(*bar, uint16_t(0)), tAgA(_, _, _, k0 + k), tAsA(_, _, _, stage));
        copy(mp.tma_load_b.with(*bar, uint16_t(0)), tBgB(_, _, _, k0 + k), tBsB(_, _, _, stage));
        ++st;
      }
    }
    __syncwarp();
    write_state_.advance(num_k_blk);
  }

  // The pipeline states, for a kernel that runs both A layouts over one SharedStorage and ring
  // (csrc/moe_bwd_sm90.cu): the loader hands the write state, each math warpgroup its read state,
  // to the builder of the next tile's type (a tile is produced and consumed, or skipped, by the
  // same type; skip_k only advances the state, so either type may skip).
  CUTLASS_DEVICE PipelineState& write_state() { return write_state_; }
  CUTLASS_DEVICE PipelineState& read_state() { return read_state_; }

  // Loader: before the CTA exits, wait until the math warpgroups released every stage.
  CUTLASS_DEVICE void produce_tail() {
    Mainloop mainloop;
    mainloop.load_tail(pipeline_, write_state_);
  }

  // Math: a fresh accumulator fragment of one warpgroup tile (kAccum fp32 a thread).
  CUTLASS_DEVICE static auto make_accum() {
    TiledMma tiled_mma;
    return cute::partition_fragment_C(tiled_mma, cute::take<0, 2>(TileShape{}));
  }
  // The fragment is (atom values, m64 halves, 1), compact: value v = a + kAtomVals * h (the
  // epilogues' indexing, class comment).
  using AccumLayout = typename decltype(cute::partition_fragment_C(TiledMma{}, cute::take<0, 2>(TileShape{})))::layout_type;
  static_assert(decltype(cute::size<0>(AccumLayout{}))::value == kAtomVals &&
                    decltype(cute::size<1>(AccumLayout{}))::value == 2 &&
                    decltype(cute::size<2>(AccumLayout{}))::value == 1 &&
                    decltype(cute::stride<1>(AccumLayout{}))::value == kAtomVals,
                "ping-pong accumulator: two m64 halves, one after the other");

  // Math, the 128 threads of the warpgroup that owns the tile: its num_k_blk k-blocks into
  // accum; after_issue() runs once every wgmma is issued (the last still in flight: hand the
  // turn to the other warpgroup there), then the wgmmas complete and the stages are released.
  template <class Accum, class AfterIssue>
  CUTLASS_DEVICE void mma_k(Accum& accum, int num_k_blk, AfterIssue after_issue) {
    static_assert(decltype(cute::size(accum))::value == kAccum, "one warpgroup tile");
    Mainloop mainloop;
    mainloop.mma(pipeline_, read_state_, accum, num_k_blk, int(threadIdx.x) % kWgThreads, smem_.tensors, mp_);
    after_issue();
    mainloop.mma_tail(pipeline_, read_state_, num_k_blk);
    read_state_.advance(num_k_blk);
  }

  // Math, the other warpgroup: the tile's k-blocks are not its own (no wait, no release).
  CUTLASS_DEVICE void skip_k(int num_k_blk) { read_state_.advance(num_k_blk); }

  // The staged epilogue's shared memory of warpgroup wg (kEpiWgBytes): free for its own use
  // between its tiles.
  CUTLASS_DEVICE uint8_t* epilogue_smem(int wg) { return smem_.epilogue + wg * kEpiWgBytes; }

  // Math, the tile's warpgroup (t = its thread 0..127, warp = the CTA's math warp 0..7): the
  // 64-column chunk j of the tile (values a in [32j, 32j + 32) of both m64 halves) to C (the
  // chunk's column 0, row stride ldc elements, 16-byte aligned, ldc % 8 == 0), rows < M and
  // columns < N only (N % 8 == 0). Per m64 half, each warp writes its 16 x 64 fragment (bf16x2)
  // into its staging slot, then stores whole 128-byte row segments (coalesced).
  template <class Accum>
  CUTLASS_DEVICE void store_chunk(Accum const& accum, int j, __nv_bfloat16* C, int64_t ldc, int M, int N) {
    static_assert(decltype(cute::size(accum))::value == kAccum, "one warpgroup tile");
    int const math_idx = int(threadIdx.x) - 128;
    int const lane = math_idx % 32;
    int const warp = math_idx / 32;  // its staging slot; rows 16*(warp%4).. of each m64 half
    uint8_t* stage = smem_.epilogue + warp * kEpiWarpBytes;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < 8; ++b) {
        int const v0 = h * kAtomVals + (j * 8 + b) * 4;
        int const off = (lane / 4) * kEpiRowBytes + (b * 8 + 2 * (lane % 4)) * 2;
        *reinterpret_cast<__nv_bfloat162*>(stage + off) = __floats2bfloat162_rn(accum(v0), accum(v0 + 1));
        *reinterpret_cast<__nv_bfloat162*>(stage + off + 8 * kEpiRowBytes) =
            __floats2bfloat162_rn(accum(v0 + 2), accum(v0 + 3));
      }
      __syncwarp();
      int const col = (lane % 8) * 8;
      CUTLASS_PRAGMA_UNROLL
      for (int it = 0; it < 4; ++it) {
        int const r = it * 4 + lane / 8;
        uint4 const val = *reinterpret_cast<uint4 const*>(stage + r * kEpiRowBytes + (lane % 8) * 16);
        int const row = h * 64 + (warp % 4) * 16 + r;
        if (row < M && col < N) *reinterpret_cast<uint4*>(C + int64_t(row) * ldc + col) = val;
      }
      __syncwarp();
    }
  }

  // The first kChunks 64-column chunks of the tile to C (its column 0), rows < M, columns < N.
  template <int kChunks = kBN / 64, class Accum>
  CUTLASS_DEVICE void store_tile(Accum const& accum, __nv_bfloat16* C, int64_t ldc, int M, int N) {
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kChunks; ++j) store_chunk(accum, j, C + j * 64, ldc, M, N - j * 64);
  }

 private:
  static CUTLASS_DEVICE typename MainloopPipeline::Params pipeline_params(Role role) {
    typename MainloopPipeline::Params pp;
    pp.role = role == Role::kLoader ? MainloopPipeline::ThreadCategory::Producer
            : role == Role::kMath   ? MainloopPipeline::ThreadCategory::Consumer
                                    : MainloopPipeline::ThreadCategory::NonParticipant;
    pp.is_leader = (threadIdx.x % 128) == 0;
    pp.num_consumers = kWgThreads;  // a stage is released by the one warpgroup that computes on it
    pp.transaction_bytes = Mainloop::TmaTransactionBytes;
    return pp;
  }

  SharedStorage& smem_;
  typename Mainloop::Params const& mp_;
  MainloopPipeline pipeline_;
  PipelineState write_state_;
  PipelineState read_state_;
};

}  // namespace sm90
}  // namespace kosmos
