// builder.cuh — the GEMM tile builder of the persistent kernels (ag_gemm.cu, gemm_rs.cu):
// the one preprocessor choice outside platform.cuh. Both builders offer
//   struct TileArgs;  template <class Cfg> __device__ void build_tile(const TileArgs&, char* smem);
// and a config with kThreads and kSmemBytes (the Hopper builder, builder_sm90.cuh, is the
// sm90 kernel's own and is not chosen here).
#pragma once
#include "platform.cuh"

#if KOSMOS_PLATFORM_HIP
#include "builder_mfma.cuh"
namespace kosmos {
using BuilderCfg = MfmaBuilderConfig;
}
#else
#include "builder_mma.cuh"
namespace kosmos {
using BuilderCfg = MmaBuilderConfig;
}
#endif
