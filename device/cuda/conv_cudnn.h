// Convolutions on cuDNN's descriptor API: forward (+ bias by cudnnAddTensor), backward data,
// backward filter (+ bias by cudnnConvolutionBackwardBias), any groups, strides and padding.
// Invariant: each (pass, geometry) runs one algorithm, chosen once per process; the workspace
// it is launched with is the one workspace_bytes() reported for that geometry.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <cuda_runtime_api.h>

#include "device/device.h"
#include "device/kernels.h"

struct cudnnContext;

namespace ferry::cuda {

struct ConvPlan;  // descriptors, algorithm and workspace of one (pass, geometry, dtype)

// The pass of an algorithm cache key (ConvAlgorithmKey::pass): the fp32 pass (0 forward, 1
// backward data, 2 backward filter), plus 3 in bf16 storage, whose algorithms are other ones.
constexpr int conv_pass_key(int pass, DType dtype) {
  return dtype == DType::kBF16 ? pass + 3 : pass;
}

// Note [Choosing convolution algorithms]
// The first query of a geometry in the process (workspace_bytes, or a launch that was never
// sized; Note [One algorithm per geometry per process] in algorithm_cache.h) chooses. Under
// DeviceOptions::cuda.algorithms = kTimed it times every algorithm with cudnnFind*AlgorithmEx on a
// private non-blocking stream and scratch buffers of the real sizes, allocated with cudaMalloc
// outside the device block and freed right after, and keeps the fastest that
//  - needs at most DeviceOptions::workspace_limit bytes (a launch never sized: also at most the
//    workspace it was given),
//  - reports CUDNN_DETERMINISTIC when DeviceOptions::cuda.deterministic, and
//  - ran with CUDNN_FMA_MATH when TF32 is off (Note [TF32 and determinism], cuda_kernels.h).
// Its workspace is then fixed: the planner lays it out in the arena, so the plan's peak holds
// the real bytes. Under kHeuristic (device.algorithms=heuristic, offline planning), or when the
// scratch cannot be allocated (the GPU is nearly full), cuDNN's heuristics
// (cudnnGet*Algorithm_v7) choose under the same filters without running anything: the first
// ranked algorithm that passes, as PyTorch does under deterministic && !benchmark.

class CudnnConv {
 public:
  explicit CudnnConv(const DeviceOptions& options);
  ~CudnnConv();
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  uint64_t workspace_bytes(const ConvForward& args);
  uint64_t workspace_bytes(const ConvBackwardData& args);
  uint64_t workspace_bytes(const ConvBackwardWeights& args);

  // Enqueue on `stream` (of options.ordinal's GPU, current on the calling thread). Throw
  // ConfigError for an invalid geometry and UnsupportedError when args.ws is smaller than the
  // chosen algorithm's workspace.
  void launch(const ConvForward& args, cudaStream_t stream);
  void launch(const ConvBackwardData& args, cudaStream_t stream);
  void launch(const ConvBackwardWeights& args, cudaStream_t stream);

 private:
  enum class Pass : int { kForward, kBackwardData, kBackwardFilter };
  // The cached plan of (pass, g, dtype); chosen now under `limit` bytes of workspace if new.
  const ConvPlan& plan(Pass pass, const ConvGeom& g, uint64_t limit, DType dtype);
  // The plan a launch of (pass, g, dtype) with `ws` runs, the handle bound to `stream`. A
  // geometry never sized chooses within ws; UnsupportedError when ws is smaller than the plan's
  // workspace plus extra_bytes.
  const ConvPlan& launch_plan(Pass pass, const ConvGeom& g, const Workspace& ws,
                              cudaStream_t stream, DType dtype);
  // Workspace a pass needs after its algorithm's (bf16's weight gradient: Note [Convolutions in
  // bf16] in conv_cudnn.cc).
  static uint64_t extra_bytes(Pass pass, const ConvGeom& g, DType dtype);
  cudnnContext* handle();  // created at first use, on options_.ordinal's GPU

  DeviceOptions options_;
  std::mutex mutex_;  // guards the handle (its stream) and the plan cache
  cudnnContext* handle_ = nullptr;
  std::string file_header_;  // of options_.algorithm_file, once loaded
  std::map<std::array<int64_t, 13>, std::unique_ptr<ConvPlan>> plans_;
};

}  // namespace ferry::cuda
