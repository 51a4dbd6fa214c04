// pcie_probe.cu — how fast can SMs pull pinned host memory over PCIe, compared with the
// copy engine? Decides the host-fabric mover design (issue 4): 16-byte ld.global.cg per
// thread (the mover.cuh path) versus TMA bulk copies (cp.async.bulk) through shared memory,
// for several CTA counts / thread counts, each CTA claiming 256 KiB chunks from a counter
// (the way mover items are claimed). Prints one line per variant: GB/s, median of 5.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc scripts/probes/pcie_probe.cu -o pcie_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "kosmos/platform.cuh"

using namespace kosmos;

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e = (x);                                                              \
    if (e != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

constexpr size_t kChunk = 256 << 10;

template <int U>
__global__ void ld_copy(char* dst, const char* src, size_t bytes, unsigned* counter) {
  __shared__ unsigned c;
  const size_t nchunks = bytes / kChunk;
  for (;;) {
    if (threadIdx.x == 0) c = atomicAdd(counter, 1u);
    __syncthreads();
    const size_t ch = c;
    __syncthreads();
    if (ch >= nchunks) return;
    const char* s = src + ch * kChunk;
    char* d = dst + ch * kChunk;
    const int n16 = kChunk / 16, nthr = blockDim.x;
    for (int base = threadIdx.x; base < n16; base += U * nthr) {
      int4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = base + u * nthr;
        if (i < n16) v[u] = ld_cg_16(s + size_t(i) * 16);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = base + u * nthr;
        if (i < n16) st_16(d + size_t(i) * 16, v[u]);
      }
    }
  }
}

// One thread per CTA issues bulk copies: stages x sbytes of smem, global->smem on mbarriers,
// smem->global as bulk groups.
__global__ void bulk_copy(char* dst, const char* src, size_t bytes, unsigned* counter, int stages, int sbytes) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) uint64_t bars[16];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < stages; ++s) mbar_init(smem_addr(bars + s), 1);
  fence_proxy_async_smem();
  const size_t nchunks = bytes / kChunk;
  const int per = kChunk / sbytes;
  uint32_t phase_ctr = 0;  // global stage-use counter across chunks
  const uint32_t s0 = smem_addr(smem);
  for (;;) {
    const size_t ch = atomicAdd(counter, 1u);
    if (ch >= nchunks) break;
    const char* s = src + ch * kChunk;
    char* d = dst + ch * kChunk;
    auto issue = [&](int i) {
      const uint32_t k = phase_ctr + i, st = k % stages;
      mbar_expect_tx(smem_addr(bars + st), sbytes);
      bulk_g2s(s0 + st * sbytes, s + size_t(i) * sbytes, sbytes, smem_addr(bars + st));
    };
    for (int i = 0; i < per && i < stages; ++i) issue(i);
    for (int i = 0; i < per; ++i) {
      const uint32_t k = phase_ctr + i, st = k % stages, parity = (k / stages) & 1;
      const uint64_t t0 = globaltimer_ns();
      while (!mbar_try_wait(smem_addr(bars + st), parity)) {
        if (globaltimer_ns() - t0 > 2000000000ull) {  // watchdog: 2 s on one stage
          printf("bulk_copy: stage %u never completed\n", st);
          __trap();
        }
      }
      bulk_s2g(d + size_t(i) * sbytes, s0 + st * sbytes, sbytes);
      bulk_commit();
      if (i + stages < per) {
        bulk_wait_read<0>();
        issue(i + stages);
      }
    }
    bulk_wait_read<0>();
    phase_ctr += per;
  }
  bulk_wait_all();
}

template <class F>
float time_ms(F&& f, unsigned* counter) {
  std::vector<float> ts;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int r = 0; r < 7; ++r) {
    CK(cudaMemset(counter, 0, 4));
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 2) ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

int main() {
  const size_t bytes = size_t(7) * 2048 * 8192 * 2;  // 7 peer shards of 2048 x 8192 bf16 (235 MB)
  char *h, *d;
  unsigned* counter;
  CK(cudaHostAlloc(&h, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  for (size_t i = 0; i < bytes; i += 4096) h[i] = char(i);
  CK(cudaMalloc(&d, bytes));
  CK(cudaMalloc(&counter, 4));
  char* hd;
  CK(cudaHostGetDevicePointer(&hd, h, 0));
  auto gbs = [&](float ms) { return bytes / (ms * 1e6); };
  printf("probe bytes=%zu chunk=%zu\n", bytes, kChunk);
  float ce = time_ms([&] { CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice)); }, counter);
  printf("%-28s %7.1f GB/s\n", "copy-engine", gbs(ce));
  for (int g : {4, 8, 12, 16, 24, 32, 64, 132}) {
    for (int t : {96, 128, 256}) {
      float ms8 = time_ms([&] { ld_copy<8><<<g, t>>>(d, hd, bytes, counter); }, counter);
      float ms16 = time_ms([&] { ld_copy<16><<<g, t>>>(d, hd, bytes, counter); }, counter);
      printf("ld   ctas=%-3d thr=%-3d u=8   %7.1f GB/s   u=16 %7.1f GB/s\n", g, t, gbs(ms8), gbs(ms16));
    }
  }
  CK(cudaFuncSetAttribute(bulk_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
  for (int g : {2, 4, 8, 16, 32, 132}) {
    for (const auto& cfg : std::vector<std::pair<int, int>>{{2, 16384}, {4, 16384}, {4, 32768}, {8, 16384}}) {
      const int st = cfg.first, sb = cfg.second;
      float ms = time_ms([&] { bulk_copy<<<g, 32, st * sb>>>(d, hd, bytes, counter, st, sb); }, counter);
      printf("bulk ctas=%-3d stages=%d x %5d B        %7.1f GB/s\n", g, st, sb, gbs(ms));
    }
  }
  return 0;
}
