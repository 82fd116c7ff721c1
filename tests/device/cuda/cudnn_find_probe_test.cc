// First-look probe for a GPU (issue 16): what cuDNN's timed search (cudnnFind*AlgorithmEx) and
// its heuristics (cudnnGet*Algorithm_v7) report on this GPU for a small convolution asked for
// with CUDNN_FMA_MATH, the math type the TF32-off filter of Note [Choosing convolution
// algorithms] (device/cuda/conv_cudnn.h) accepts. Prints one "find-probe:" line per (pass,
// search) with each candidate's algo, mathType, memory and determinism, and fails when no
// successful candidate is labelled CUDNN_FMA_MATH (the conv kernels could then choose nothing
// with device.tf32=false) or none of those is deterministic (nor with device.deterministic).
// Skips without a GPU. scripts/gpu-check.sh runs it first.
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "device/cuda/cuda_check.h"
#include "device/device.h"

namespace ferry {
namespace {

// One candidate as cuDNN reported it.
struct Candidate {
  int algo = 0;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t memory = 0;
  bool deterministic = false;
};

template <typename Perf>
std::vector<Candidate> candidates(const std::vector<Perf>& perf, int got) {
  std::vector<Candidate> out;
  for (int i = 0; i < got; ++i) {
    const Perf& p = perf[static_cast<size_t>(i)];
    out.push_back({static_cast<int>(p.algo), p.status, p.mathType, p.memory,
                   p.determinism == CUDNN_DETERMINISTIC});
  }
  return out;
}

// Prints the line and checks the two properties the TF32-off, deterministic filter needs.
void report(const std::string& what, const std::vector<Candidate>& cands) {
  int ok = 0, fma = 0, fma_det = 0;
  std::string list;
  for (const Candidate& c : cands) {
    if (c.status != CUDNN_STATUS_SUCCESS) continue;
    ++ok;
    fma += c.math == CUDNN_FMA_MATH;
    fma_det += c.math == CUDNN_FMA_MATH && c.deterministic;
    list += fmt::format(" {}:{}:{}B{}", c.algo,
                        c.math == CUDNN_FMA_MATH ? "fma" : fmt::format("math{}", int(c.math)),
                        c.memory, c.deterministic ? ":det" : "");
  }
  std::printf("find-probe: %s: %d ok, %d fma, %d fma+det |%s\n", what.c_str(), ok, fma, fma_det,
              list.c_str());
  std::fflush(stdout);
  ::testing::Test::RecordProperty(what, fmt::format("{} ok, {} fma, {} fma+det", ok, fma, fma_det));
  EXPECT_GT(fma, 0) << what << ": no successful candidate labelled CUDNN_FMA_MATH";
  EXPECT_GT(fma_det, 0) << what << ": no deterministic candidate labelled CUDNN_FMA_MATH";
}

void* device_zeros(size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
  return p;
}

#define PROBE_CUDNN(expr) ASSERT_EQ((expr), CUDNN_STATUS_SUCCESS) << #expr

TEST(CudnnFindProbe, FmaMathCandidatesExistForEveryPass) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device present";
  CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudnnHandle_t h = nullptr;
  PROBE_CUDNN(cudnnCreate(&h));
  PROBE_CUDNN(cudnnSetStream(h, stream));
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  PROBE_CUDNN(cudnnCreateTensorDescriptor(&x));
  PROBE_CUDNN(cudnnCreateTensorDescriptor(&y));
  PROBE_CUDNN(cudnnCreateFilterDescriptor(&w));
  PROBE_CUDNN(cudnnCreateConvolutionDescriptor(&conv));
  const int n = 4, c = 16, hw = 16, k = 32;  // a 3x3 "same" convolution, ResNet-like
  PROBE_CUDNN(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, hw, hw));
  PROBE_CUDNN(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, k, hw, hw));
  PROBE_CUDNN(cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, k, c, 3, 3));
  PROBE_CUDNN(cudnnSetConvolution2dDescriptor(conv, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                              CUDNN_DATA_FLOAT));
  PROBE_CUDNN(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH));
  const size_t ws_bytes = size_t{64} << 20;
  void* dx = device_zeros(sizeof(float) * n * c * hw * hw, stream);
  void* dy = device_zeros(sizeof(float) * n * k * hw * hw, stream);
  void* dw = device_zeros(sizeof(float) * k * c * 9, stream);
  void* ws = device_zeros(ws_bytes, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  int max = 0, got = 0;

  PROBE_CUDNN(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(static_cast<size_t>(max));
  PROBE_CUDNN(cudnnFindConvolutionForwardAlgorithmEx(h, x, dx, w, dw, conv, y, dy, max, &got,
                                                     fwd.data(), ws, ws_bytes));
  report("forward find", candidates(fwd, got));
  PROBE_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, conv, y, max, &got, fwd.data()));
  report("forward heuristic", candidates(fwd, got));

  PROBE_CUDNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bwd(static_cast<size_t>(max));
  PROBE_CUDNN(cudnnFindConvolutionBackwardDataAlgorithmEx(h, w, dw, y, dy, conv, x, dx, max, &got,
                                                          bwd.data(), ws, ws_bytes));
  report("backward-data find", candidates(bwd, got));
  PROBE_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, y, conv, x, max, &got, bwd.data()));
  report("backward-data heuristic", candidates(bwd, got));

  PROBE_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bwf(static_cast<size_t>(max));
  PROBE_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, x, dx, y, dy, conv, w, dw, max, &got,
                                                            bwf.data(), ws, ws_bytes));
  report("backward-filter find", candidates(bwf, got));
  PROBE_CUDNN(
      cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, y, conv, w, max, &got, bwf.data()));
  report("backward-filter heuristic", candidates(bwf, got));

  CUDA_CHECK(cudaStreamSynchronize(stream));
  for (void* p : {dx, dy, dw, ws}) CUDA_CHECK(cudaFree(p));
  cudnnDestroyConvolutionDescriptor(conv);
  cudnnDestroyFilterDescriptor(w);
  cudnnDestroyTensorDescriptor(x);
  cudnnDestroyTensorDescriptor(y);
  cudnnDestroy(h);  // before the stream it is bound to
  CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace ferry
