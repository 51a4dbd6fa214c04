// gemm_sm90.cu — standalone persistent world=1 GEMM on the Hopper builder.
//
// C (M x N) = A (M x K) @ B (K x N), bf16 in/out, fp32 accumulate, all row-major.
// grid = min(#SMs, #tiles) CTAs of 384 threads; each CTA claims output tiles from one global
// atomic ticket counter and hands them to its builder (builder_sm90.cuh) one at a time.
// This is the builder role of the fused KOSMOS kernels without the movers.
//
// Inside a CTA:
//   warp 0 (loader warpgroup) : claims a tile, pushes its index into the tile ring (ItemRing), issues
//                               the tile's TMA loads (runs ahead by up to kNumStages k-blocks,
//                               so the next tile's first stages load during this tile's tail
//                               and epilogue); after the last tile it pushes -1.
//   warps 1-3                 : idle (in the fused kernel: mover work).
//   warpgroups 1, 2 (math)    : pop a tile index from the tile ring, consume() it.
//
// The ticket counter is never reset: launch j claims tickets [base_j, base_j + tiles + grid)
// (every CTA takes exactly one failing ticket), so the host advances base by tiles + grid.
// Launches on one device must therefore be ordered (one stream at a time).
//
// Built into a torch-free shared library with a C ABI (loaded with ctypes).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "kosmos/builder_sm90.cuh"

namespace kosmos {
namespace sm90 {

// Compiled variants (runtime `variant` argument): 0 is the default.
//   0: 128x256x64, 4 stages, staged (coalesced) epilogue      — the production config
//   1: 128x256x64, 3 stages, staged epilogue                  — more smem left for movers
//   2: 128x256x64, 4 stages, direct register->global epilogue — reference point
//   3: variant 0 in 2-CTA clusters along M, B multicast (static pair schedule, no tickets)
using Builder = BuilderSm90<128, 256, 64, 4, true>;
using BuilderS3 = BuilderSm90<128, 256, 64, 3, true>;
using BuilderDirect = BuilderSm90<128, 256, 64, 4, false>;
using BuilderPair = BuilderSm90<128, 256, 64, 4, true, 2>;
constexpr int kNumVariants = 4;
constexpr int kClaimDepth = 4;  // tiles in flight between the loader warp and the math warps
using TileRing = ItemRing<kClaimDepth, int>;  // tile index, -1 = no more work

// Shared memory of the standalone kernel:
//   builder        : BuilderT::SharedStorage (see builder_sm90.cuh)    = BuilderT::kSmemBytes
//   tiles          : TileRing (2 * kClaimDepth mbarriers + kClaimDepth ints) = 20 * kClaimDepth B
template <class BuilderT>
struct GemmShared {
  typename BuilderT::SharedStorage builder;
  TileRing::SharedStorage tiles;
};
template <class BuilderT>
constexpr int smem_bytes() { return int(sizeof(GemmShared<BuilderT>)); }
static_assert(smem_bytes<Builder>() <= 227 * 1024, "standalone GEMM shared memory exceeds 227 KB");
static_assert(smem_bytes<BuilderDirect>() <= 227 * 1024, "standalone GEMM shared memory exceeds 227 KB");

template <class BuilderT>
struct GemmParams {
  typename BuilderT::Params builder;
  unsigned long long* ticket;      // global claim counter (never reset)
  unsigned long long ticket_base;  // this launch's first ticket
  int num_tiles;
  int group_m;                     // tile raster: groups of group_m row bands, m fastest
};

// Tile t -> (m_blk, n_blk): groups of `group_m` row bands; inside a group, walk down the
// band's rows first, then across N. Keeps the CTAs in flight on ~group_m bands and
// ~#SMs/group_m column panels, so A and B are both reused from L2.
__device__ __forceinline__ void tile_coords(int t, int num_m, int num_n, int group_m, int& m_blk, int& n_blk) {
  int const per_group = group_m * num_n;
  int const g = t / per_group;
  int const first_m = g * group_m;
  int const gm = min(group_m, num_m - first_m);
  int const r = t - g * per_group;
  m_blk = first_m + r % gm;
  n_blk = r / gm;
}

template <class Builder>
__global__ void __launch_bounds__(Builder::kNumThreads, 1)
gemm_sm90_kernel(const __grid_constant__ GemmParams<Builder> params) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  GemmShared<Builder>& smem = *reinterpret_cast<GemmShared<Builder>*>(smem_raw);

  int const warp_idx = cutlass::canonical_warp_idx_sync();
  int const lane = int(threadIdx.x % 32);
  auto const role = Builder::role_of(int(threadIdx.x));

  TileRing tiles(smem.tiles, warp_idx == 0, role == Builder::Role::kMath, Builder::kNumMathThreads);
  Builder builder(smem.builder, params.builder, role);
  if (threadIdx.x == 0) Builder::Mainloop::prefetch_tma_descriptors(params.builder.mainloop);
  __syncthreads();

  int const num_m = params.builder.num_m_blk;
  int const num_n = params.builder.num_n_blk;

  if (role == Builder::Role::kLoader) {
    cutlass::arch::warpgroup_reg_dealloc<Builder::kLoaderRegs>();
    if (warp_idx == 0) {
      while (true) {
        int t = -1;
        if (lane == 0) {
          unsigned long long const ticket = atomicAdd(params.ticket, 1ull) - params.ticket_base;
          t = ticket < (unsigned long long)params.num_tiles ? int(ticket) : -1;
          tiles.push(t);
        }
        t = __shfl_sync(0xffffffffu, t, 0);
        if (t < 0) break;
        int m_blk, n_blk;
        tile_coords(t, num_m, num_n, params.group_m, m_blk, n_blk);
        builder.produce(m_blk, n_blk);
      }
      builder.produce_tail();
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Builder::kMathRegs>();
    while (true) {
      int const t = tiles.pop();
      if (t < 0) break;
      int m_blk, n_blk;
      tile_coords(t, num_m, num_n, params.group_m, m_blk, n_blk);
      builder.consume(m_blk, n_blk);
    }
  }
}

// Variant 3: 2-CTA clusters along M. Cluster c builds the tile pairs c, c + #clusters, ...
// (static: both CTAs must take the same pairs in the same order, which a shared ticket would
// need DSMEM to agree on); pair (m_pair, n_blk) in the raster of tile_coords over pairs, CTA
// rank r of the pair builds m_blk = 2 * m_pair + r (past the last band: zero-filled loads,
// masked stores, so both CTAs keep the same k-block sequence).
template <class Builder>
__global__ void __launch_bounds__(Builder::kNumThreads, 1)
gemm_sm90_pair_kernel(const __grid_constant__ GemmParams<Builder> params) {
  static_assert(Builder::kClusterM == 2, "pair kernel needs the 2-CTA builder");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  GemmShared<Builder>& smem = *reinterpret_cast<GemmShared<Builder>*>(smem_raw);
  int const warp_idx = cutlass::canonical_warp_idx_sync();
  auto const role = Builder::role_of(int(threadIdx.x));
  Builder builder(smem.builder, params.builder, role);
  if (threadIdx.x == 0) Builder::Mainloop::prefetch_tma_descriptors(params.builder.mainloop);
  cute::cluster_arrive_relaxed();  // both CTAs' barriers initialised before any multicast or remote release
  cute::cluster_wait();

  int const rank = int(cute::block_rank_in_cluster());
  int const cluster = int(blockIdx.x) / 2, clusters = int(gridDim.x) / 2;
  int const num_m = params.builder.num_m_blk, num_n = params.builder.num_n_blk;
  int const num_pm = (num_m + 1) / 2;
  int const pairs = num_pm * num_n;
  int const group = max(1, params.group_m / 2);
  if (role == Builder::Role::kLoader) {
    cutlass::arch::warpgroup_reg_dealloc<Builder::kLoaderRegs>();
    if (warp_idx == 0) {
      for (int t = cluster; t < pairs; t += clusters) {
        int pm, n_blk;
        tile_coords(t, num_pm, num_n, group, pm, n_blk);
        builder.produce(2 * pm + rank, n_blk);
      }
      builder.produce_tail();
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Builder::kMathRegs>();
    for (int t = cluster; t < pairs; t += clusters) {
      int pm, n_blk;
      tile_coords(t, num_pm, num_n, group, pm, n_blk);
      builder.consume(2 * pm + rank, n_blk);
    }
  }
}

// ------------------------------------------------------------------------------ host side
namespace {

constexpr int kMaxDevices = 64;
struct DeviceState {
  unsigned long long* ticket = nullptr;  // device counter, allocated on first use
  unsigned long long next_base = 0;
  int num_sms = 0;
  bool attr_set[kNumVariants] = {};
};
DeviceState g_devices[kMaxDevices];
std::mutex g_mutex;
thread_local char g_error[512] = "";

int fail(int code, const char* what) {
  std::snprintf(g_error, sizeof(g_error), "%s", what);
  return code;
}
int fail_cuda(cudaError_t err, const char* where) {
  std::snprintf(g_error, sizeof(g_error), "%s: %s (%s)", where, cudaGetErrorString(err), cudaGetErrorName(err));
  return 2;
}

#define KB_CUDA(call)                                  \
  do {                                                 \
    cudaError_t err_ = (call);                         \
    if (err_ != cudaSuccess) return fail_cuda(err_, #call); \
  } while (0)

}  // namespace

template <class BuilderT>
int launch(DeviceState& st, int variant, const void* A, const void* B, void* C, int M, int N, int K,
           int group_m, int max_ctas, cudaStream_t stream) {
  constexpr int kSmem = smem_bytes<BuilderT>();
  if (!st.attr_set[variant]) {
    KB_CUDA(cudaFuncSetAttribute(gemm_sm90_kernel<BuilderT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    st.attr_set[variant] = true;
  }
  GemmParams<BuilderT> p;
  p.builder = BuilderT::make_params(A, B, C, M, N, K);
  p.num_tiles = p.builder.num_m_blk * p.builder.num_n_blk;
  p.group_m = group_m;
  p.ticket = st.ticket;
  int grid = st.num_sms;
  if (max_ctas > 0 && max_ctas < grid) grid = max_ctas;
  if (grid > p.num_tiles) grid = p.num_tiles;
  p.ticket_base = st.next_base;
  gemm_sm90_kernel<BuilderT><<<grid, BuilderT::kNumThreads, kSmem, stream>>>(p);
  KB_CUDA(cudaGetLastError());
  st.next_base += (unsigned long long)p.num_tiles + (unsigned long long)grid;
  return 0;
}

int launch_pair(DeviceState& st, const void* A, const void* B, void* C, int M, int N, int K, int group_m,
                int max_ctas, cudaStream_t stream) {
  using BuilderT = BuilderPair;
  constexpr int kSmem = smem_bytes<BuilderT>();
  static int max_clusters[kMaxDevices] = {};
  int dev = 0;
  KB_CUDA(cudaGetDevice(&dev));
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(BuilderT::kNumThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (!st.attr_set[3]) {
    KB_CUDA(cudaFuncSetAttribute(gemm_sm90_pair_kernel<BuilderT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    cfg.gridDim = dim3(st.num_sms);
    KB_CUDA(cudaOccupancyMaxActiveClusters(&max_clusters[dev], gemm_sm90_pair_kernel<BuilderT>, &cfg));
    if (max_clusters[dev] < 1) return fail(1, "sm90 gemm: no 2-CTA cluster fits (variant 3)");
    st.attr_set[3] = true;
  }
  GemmParams<BuilderT> p;
  p.builder = BuilderT::make_params(A, B, C, M, N, K);
  int const pairs = ((p.builder.num_m_blk + 1) / 2) * p.builder.num_n_blk;
  p.num_tiles = pairs;
  p.group_m = group_m;
  p.ticket = st.ticket;
  p.ticket_base = 0;
  int clusters = max_clusters[dev];
  if (max_ctas > 0 && max_ctas / 2 < clusters) clusters = max_ctas / 2 > 0 ? max_ctas / 2 : 1;
  if (clusters > pairs) clusters = pairs;
  cfg.gridDim = dim3(2 * clusters);
  KB_CUDA(cudaLaunchKernelEx(&cfg, gemm_sm90_pair_kernel<BuilderT>, p));
  return 0;
}

int gemm_sm90(const void* A, const void* B, void* C, int M, int N, int K, int group_m, int max_ctas,
              int variant, cudaStream_t stream) {
  if (const char* why = Builder::validate(A, B, C, M, N, K)) return fail(1, why);
  if (group_m <= 0) return fail(1, "sm90 gemm: group_m must be positive");
  int dev = 0;
  KB_CUDA(cudaGetDevice(&dev));
  if (dev >= kMaxDevices) return fail(1, "sm90 gemm: device index too large");
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& st = g_devices[dev];
  if (st.ticket == nullptr) {
    int major = 0, minor = 0;
    KB_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    KB_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9 || minor != 0) return fail(3, "sm90 gemm: needs a compute capability 9.0 (Hopper, sm_90a) GPU");
    KB_CUDA(cudaDeviceGetAttribute(&st.num_sms, cudaDevAttrMultiProcessorCount, dev));
    KB_CUDA(cudaMalloc(&st.ticket, sizeof(unsigned long long)));
    KB_CUDA(cudaMemset(st.ticket, 0, sizeof(unsigned long long)));
    KB_CUDA(cudaDeviceSynchronize());
    st.next_base = 0;
  }
  switch (variant) {
    case 0: return launch<Builder>(st, 0, A, B, C, M, N, K, group_m, max_ctas, stream);
    case 1: return launch<BuilderS3>(st, 1, A, B, C, M, N, K, group_m, max_ctas, stream);
    case 2: return launch<BuilderDirect>(st, 2, A, B, C, M, N, K, group_m, max_ctas, stream);
    case 3: return launch_pair(st, A, B, C, M, N, K, group_m, max_ctas, stream);
    default: return fail(1, "sm90 gemm: unknown variant");
  }
}

}  // namespace sm90
}  // namespace kosmos

// ----------------------------------------------------------------------------------- C ABI
extern "C" {

// 0 on success; 1 unsupported arguments, 2 CUDA error, 3 wrong device. Message: kb_sm90_last_error().
// variant: 0 default (see kNumVariants above).
int kb_sm90_gemm(const void* A, const void* B, void* C, int M, int N, int K, int group_m, int max_ctas,
                 int variant, void* stream) {
  return kosmos::sm90::gemm_sm90(A, B, C, M, N, K, group_m, max_ctas, variant, static_cast<cudaStream_t>(stream));
}

// nullptr-free: "" when the last call on this thread succeeded.
const char* kb_sm90_last_error() { return kosmos::sm90::g_error; }

// Validation only (no GPU): nullptr/"" when supported, else why not.
const char* kb_sm90_validate(int M, int N, int K) {
  const char* why = kosmos::sm90::Builder::validate(nullptr, nullptr, nullptr, M, N, K);
  return why ? why : "";
}

// Configuration of the default variant, for logs: tile sizes, stages, threads, smem bytes.
void kb_sm90_config(int* out6) {
  using B = kosmos::sm90::Builder;
  out6[0] = B::kBM;
  out6[1] = B::kBN;
  out6[2] = B::kBK;
  out6[3] = B::kNumStages;
  out6[4] = B::kNumThreads;
  out6[5] = kosmos::sm90::smem_bytes<B>();
}

}  // extern "C"
