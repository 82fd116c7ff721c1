// cuDNN convolutions: descriptors per (pass, geometry), the algorithm chosen once (Note
// [Choosing convolution algorithms] in conv_cudnn.h), and the launches. Invariant: a launch uses
// exactly its plan's algorithm, math type and workspace bytes.
//
// Note [Convolutions in bf16]
// In bf16 storage (x, w, y, dy, dx bf16; bias, dw, dbias fp32: Note [Storage dtype of a kernel]
// in device/kernels.h) the descriptors are CUDNN_DATA_BFLOAT16 with fp32 compute
// (CUDNN_DATA_FLOAT on the convolution descriptor) and tensor-op math: cuDNN's BFLOAT16 config,
// fp32 accumulation on tensor cores, each output rounded once. device.tf32 does not apply (it
// is about fp32 products); determinism does. cuDNN's legacy API takes one data type for x, y and
// w, so two steps leave cuDNN: the fp32 bias is added by a kernel to the bf16 output (rounded a
// second time, where oneDNN on the CPU rounds once after the bias), and the weight gradient is
// computed bf16 into the workspace, after the algorithm's own bytes, and widened into the fp32
// dw (the bf16 rounding of the gradient PyTorch's autocast also makes). dbias is summed by a
// fixed-order kernel into fp32. The algorithm cache keys bf16 choices apart from fp32 ones: the
// key's pass is the fp32 pass + 3 (conv_pass_key).
#include "device/cuda/conv_cudnn.h"

#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "device/cuda/algorithm_cache.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_stream.h"
#include "device/cuda/elementwise.h"
#include "device/dtype.h"
#include "device/kernel_checks.h"

namespace ferry::cuda {

namespace {

// An owned cuDNN descriptor of one kind.
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class Descriptor {
 public:
  Descriptor() { CUDNN_CHECK(Create(&desc_)); }
  ~Descriptor() {
    if (desc_ != nullptr) (void)Destroy(desc_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  T get() const { return desc_; }

 private:
  T desc_ = nullptr;
};

using TensorDesc =
    Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc =
    Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc = Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                            cudnnDestroyConvolutionDescriptor>;

// The backend-neutral rule (device/kernel_checks.h), then cuDNN's: its 4-d descriptors hold int
// dimensions and strides.
void check(const ConvGeom& g, const char* what) {
  check_conv_geom(g, what);
  const bool fits = g.n * g.c * g.h * g.w <= INT_MAX &&
                    g.n * g.k * g.out_h() * g.out_w() <= INT_MAX &&
                    g.k * (g.c / g.groups) * g.r * g.s <= INT_MAX;
  if (!fits) {
    throw UnsupportedError(
        fmt::format("{}: a tensor of {} has more than {} elements, cuDNN's 4-d limit", what,
                    conv_geom_text(g), INT_MAX),
        "lower data.batch_size");
  }
}

int i32(int64_t v) { return static_cast<int>(v); }

bool bf16(DType dtype) { return dtype == DType::kBF16; }

// The kernel's storage dtype, kF32 or kBF16 (anything else is refused by name).
DType storage(DType dtype, const char* what) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    throw UnsupportedError(fmt::format("{}: the CUDA convolution stores {} as fp32 or bf16 only",
                                       what, dtype_name(dtype)),
                           "set device.precision to fp32 or bf16");
  }
  return dtype;
}

// The bf16 weight gradient's block after the algorithm's workspace (Note [Convolutions in bf16]):
// it starts at the next 256-byte boundary, so its bytes plus that much slack.
constexpr uint64_t kDwAlign = 256;
uint64_t bf16_dw_bytes(const ConvGeom& g) {
  const auto bytes = static_cast<uint64_t>(g.k * (g.c / g.groups) * g.r * g.s) * 2;
  return kDwAlign + (bytes + kDwAlign - 1) / kDwAlign * kDwAlign;
}

// Where that block starts in `ws`, after `algo_bytes`.
float* bf16_dw_block(const Workspace& ws, uint64_t algo_bytes) {
  const auto at = reinterpret_cast<uintptr_t>(ws.ptr) + algo_bytes;
  return reinterpret_cast<float*>((at + kDwAlign - 1) / kDwAlign * kDwAlign);
}

const char* pass_name(int pass) {
  static constexpr const char* kNames[] = {"conv_forward", "conv_backward_data",
                                           "conv_backward_weights"};
  return kNames[pass];
}

// A private non-blocking stream for a timed search, destroyed at scope end: Find and its scratch
// fills never touch the legacy default stream, and never wait for (or hold up) the device's own
// streams.
class SearchStream {
 public:
  SearchStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~SearchStream() {
    if (stream_ != nullptr) CUDA_WARN(cudaStreamDestroy(stream_));
  }
  SearchStream(const SearchStream&) = delete;
  SearchStream& operator=(const SearchStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// cudaMalloc'd scratch for finding algorithms, zeroed on `stream`, freed at scope end. ok() is
// false when the GPU had no room (not an error: the caller falls back to heuristics).
class DeviceScratch {
 public:
  DeviceScratch(uint64_t bytes, cudaStream_t stream) {
    if (bytes == 0) return;
    const cudaError_t status = cudaMalloc(&ptr_, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky; keep it out of later checks
      ptr_ = nullptr;
      return;
    }
    if (status != cudaSuccess)
      throw_cuda_error(status, "cudaMalloc(&ptr_, bytes)", __FILE__, __LINE__);
    // Timing on zeros: no NaN or denormal slow paths in the measurements.
    CUDA_CHECK(cudaMemsetAsync(ptr_, 0, bytes, stream));
  }
  ~DeviceScratch() {
    if (ptr_ != nullptr) CUDA_WARN(cudaFree(ptr_));
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  void* get() const { return ptr_; }
  bool ok() const { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
};

}  // namespace

struct ConvPlan {
  TensorDesc x, y, bias;  // x (N, C, H, W), y (N, K, OH, OW), bias (1, K, 1, 1)
  FilterDesc w;           // (K, C/groups, R, S)
  ConvDesc conv;
  int algo = 0;  // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t, by pass
  uint64_t workspace = 0;
};

namespace {

// The descriptors of `g` with the math type the options allow (Note [TF32 and determinism]); in
// bf16 storage, bf16 tensors with fp32 compute on tensor cores (Note [Convolutions in bf16]).
void describe_plan(ConvPlan& p, const ConvGeom& g, bool tf32, DType dtype) {
  const cudnnDataType_t data = bf16(dtype) ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.x.get(), CUDNN_TENSOR_NCHW, data, i32(g.n), i32(g.c),
                                         i32(g.h), i32(g.w)));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.y.get(), CUDNN_TENSOR_NCHW, data, i32(g.n), i32(g.k),
                                         i32(g.out_h()), i32(g.out_w())));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.bias.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1,
                                         i32(g.k), 1, 1));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(p.w.get(), data, CUDNN_TENSOR_NCHW, i32(g.k),
                                         i32(g.c / g.groups), i32(g.r), i32(g.s)));
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(p.conv.get(), i32(g.pad_h), i32(g.pad_w),
                                              i32(g.stride_h), i32(g.stride_w), 1, 1,
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_CHECK(cudnnSetConvolutionGroupCount(p.conv.get(), i32(g.groups)));
  const cudnnMathType_t math = bf16(dtype) ? CUDNN_TENSOR_OP_MATH
                               : tf32      ? CUDNN_DEFAULT_MATH
                                           : CUDNN_FMA_MATH;
  CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv.get(), math));
  // cuDNN's output size must be ConvGeom's (PyTorch's floor rule).
  int n = 0, k = 0, oh = 0, ow = 0;
  CUDNN_CHECK(
      cudnnGetConvolution2dForwardOutputDim(p.conv.get(), p.x.get(), p.w.get(), &n, &k, &oh, &ow));
  FERRY_ASSERT(n == g.n && k == g.k && oh == g.out_h() && ow == g.out_w(),
               "cuDNN's convolution output shape differs from ConvGeom's");
}

// One pass's cuDNN entry points, so that choose() is written once.
struct ForwardOps {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  static int max_count(cudnnHandle_t h) {
    int n = 0;
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &n));
    return n;
  }
  static cudnnStatus_t find(cudnnHandle_t h, const ConvPlan& p, void* x, void* w, void* y, int n,
                            int* got, Perf* perf, void* ws, size_t ws_bytes) {
    return cudnnFindConvolutionForwardAlgorithmEx(h, p.x.get(), x, p.w.get(), w, p.conv.get(),
                                                  p.y.get(), y, n, got, perf, ws, ws_bytes);
  }
  static void heuristic(cudnnHandle_t h, const ConvPlan& p, int n, int* got, Perf* perf) {
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p.x.get(), p.w.get(), p.conv.get(),
                                                       p.y.get(), n, got, perf));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, int algo, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, p.x.get(), p.w.get(), p.conv.get(), p.y.get(),
                                                   static_cast<cudnnConvolutionFwdAlgo_t>(algo),
                                                   bytes);
  }
};

struct BackwardDataOps {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  static int max_count(cudnnHandle_t h) {
    int n = 0;
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &n));
    return n;
  }
  static cudnnStatus_t find(cudnnHandle_t h, const ConvPlan& p, void* x, void* w, void* y, int n,
                            int* got, Perf* perf, void* ws, size_t ws_bytes) {
    return cudnnFindConvolutionBackwardDataAlgorithmEx(h, p.w.get(), w, p.y.get(), y, p.conv.get(),
                                                       p.x.get(), x, n, got, perf, ws, ws_bytes);
  }
  static void heuristic(cudnnHandle_t h, const ConvPlan& p, int n, int* got, Perf* perf) {
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w.get(), p.y.get(), p.conv.get(),
                                                            p.x.get(), n, got, perf));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, int algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, p.w.get(), p.y.get(), p.conv.get(), p.x.get(),
        static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
  }
};

struct BackwardFilterOps {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  static int max_count(cudnnHandle_t h) {
    int n = 0;
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &n));
    return n;
  }
  static cudnnStatus_t find(cudnnHandle_t h, const ConvPlan& p, void* x, void* w, void* y, int n,
                            int* got, Perf* perf, void* ws, size_t ws_bytes) {
    return cudnnFindConvolutionBackwardFilterAlgorithmEx(
        h, p.x.get(), x, p.y.get(), y, p.conv.get(), p.w.get(), w, n, got, perf, ws, ws_bytes);
  }
  static void heuristic(cudnnHandle_t h, const ConvPlan& p, int n, int* got, Perf* perf) {
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x.get(), p.y.get(), p.conv.get(),
                                                              p.w.get(), n, got, perf));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, int algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, p.x.get(), p.y.get(), p.conv.get(), p.w.get(),
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
  }
};

constexpr uint64_t kMinFindWorkspace = uint64_t{1} << 20;

// The first (fastest, or best by heuristics) result that passes the filters of Note [Choosing
// convolution algorithms]. Leaves p's math type at the chosen algorithm's.
template <typename Ops>
ConvAlgorithm choose(cudnnHandle_t h, ConvPlan& p, const ConvGeom& g, uint64_t limit,
                     const DeviceOptions& options, int pass, DType dtype) {
  const int max_count = Ops::max_count(h);
  std::vector<typename Ops::Perf> perf(static_cast<size_t>(std::max(max_count, 1)));
  int got = 0;
  bool timed = false;
  if (options.cuda.algorithms == AlgorithmSearch::kTimed) {
    const uint64_t f = sizeof(float);
    SearchStream stream;
    DeviceScratch x(static_cast<uint64_t>(g.n * g.c * g.h * g.w) * f, stream.get());
    DeviceScratch w(static_cast<uint64_t>(g.k * (g.c / g.groups) * g.r * g.s) * f, stream.get());
    DeviceScratch y(static_cast<uint64_t>(g.n * g.k * g.out_h() * g.out_w()) * f, stream.get());
    if (x.ok() && w.ok() && y.ok()) {
      // The most workspace the GPU can give, up to the limit: Find skips algorithms needing more.
      uint64_t ws_bytes = limit;
      std::unique_ptr<DeviceScratch> ws;
      while (ws_bytes > 0) {
        ws = std::make_unique<DeviceScratch>(ws_bytes, stream.get());
        if (ws->ok()) break;
        ws_bytes = ws_bytes / 2 >= kMinFindWorkspace ? ws_bytes / 2 : 0;
      }
      cudaStream_t bound = nullptr;
      CUDNN_CHECK(cudnnGetStream(h, &bound));
      CUDNN_CHECK(cudnnSetStream(h, stream.get()));  // after the scratch fills, on its stream
      const cudnnStatus_t status =
          Ops::find(h, p, x.get(), w.get(), y.get(), max_count, &got, perf.data(),
                    ws_bytes > 0 ? ws->get() : nullptr, ws_bytes);
      CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      CUDNN_CHECK(cudnnSetStream(h, bound));  // never left bound to a destroyed stream
      // A failed search (cuDNN could not run its candidates here) leaves the heuristics.
      timed = status == CUDNN_STATUS_SUCCESS;
      if (timed) limit = std::min(limit, ws_bytes);
    }
  }
  if (!timed) {
    got = 0;
    Ops::heuristic(h, p, max_count, &got, perf.data());
  }
  for (int i = 0; i < got; ++i) {
    const auto& r = perf[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > limit) continue;
    if (options.cuda.deterministic && r.determinism != CUDNN_DETERMINISTIC) continue;
    // TF32 is an fp32 question; bf16 runs on tensor cores by design.
    if (!bf16(dtype) && !options.cuda.conv_tf32 && r.mathType != CUDNN_FMA_MATH) continue;
    // The workspace of this algorithm under the math type it ran with.
    CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv.get(), r.mathType));
    size_t bytes = 0;
    if (Ops::workspace(h, p, static_cast<int>(r.algo), &bytes) != CUDNN_STATUS_SUCCESS) continue;
    const uint64_t need = std::max<uint64_t>(bytes, r.memory);
    if (need > limit) continue;
    return ConvAlgorithm{.algo = static_cast<int>(r.algo),
                         .math_type = static_cast<int>(r.mathType),
                         .workspace = need,
                         .timed = timed};
  }
  throw UnsupportedError(
      fmt::format("{}: cuDNN has no algorithm for {} within {} of workspace{}{} ({} of {} "
                  "candidates {})",
                  pass_name(pass), conv_geom_text(g), format_bytes(limit),
                  options.cuda.deterministic ? ", deterministic" : "",
                  options.cuda.conv_tf32 ? "" : ", without TF32", got, max_count,
                  timed ? "timed" : "from heuristics"),
      "raise memory.workspace_limit (and memory.budget), or set device.deterministic=false or "
      "device.tf32=true");
}

constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

}  // namespace

CudnnConv::CudnnConv(const DeviceOptions& options) : options_(options) {}

CudnnConv::~CudnnConv() {
  plans_.clear();  // descriptors before the handle
  if (handle_ != nullptr) {
    CUDA_WARN(cudaSetDevice(options_.ordinal));
    (void)cudnnDestroy(handle_);
  }
}

cudnnContext* CudnnConv::handle() {
  if (handle_ == nullptr) {
    use_device(options_.ordinal);
    CUDNN_CHECK(cudnnCreate(&handle_));
  }
  return handle_;
}

const ConvPlan& CudnnConv::plan(Pass pass, const ConvGeom& g, uint64_t limit, DType dtype) {
  const int p = static_cast<int>(pass);
  check(g, pass_name(p));
  dtype = storage(dtype, pass_name(p));
  const int64_t pk = conv_pass_key(p, dtype);
  const std::array<int64_t, 13> key = {pk,  g.n,        g.c,        g.h,     g.w,     g.k,     g.r,
                                       g.s, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.groups};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  use_device(options_.ordinal);  // the scratch of choose() is this GPU's
  cudnnHandle_t h = handle();
  auto plan = std::make_unique<ConvPlan>();
  describe_plan(*plan, g, options_.cuda.conv_tf32, dtype);
  // Note [One algorithm per geometry per process] (algorithm_cache.h): chosen once per key. The
  // key holds the limit of this choice: options_.workspace_limit when sized, or less for a
  // launch never sized, which chooses within the workspace it was given.
  ConvAlgorithmKey algorithm_key = conv_algorithm_key(options_, static_cast<int>(pk), g);
  algorithm_key.workspace_limit = limit;
  if (!options_.cuda.algorithm_file.empty() && file_header_.empty()) {
    // Note [Timed choices across processes]: the choices of the run this one resumes.
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, options_.ordinal));
    file_header_ = fmt::format("# ferry conv algorithms v1: cuDNN {}, {}", cudnnGetVersion(),
                               static_cast<const char*>(prop.name));
    process_conv_algorithms().load(options_.cuda.algorithm_file, file_header_);
  }
  const ConvAlgorithm chosen = process_conv_algorithms().get(
      algorithm_key,
      [&] {
        switch (pass) {
          case Pass::kForward:
            return choose<ForwardOps>(h, *plan, g, limit, options_, p, dtype);
          case Pass::kBackwardData:
            return choose<BackwardDataOps>(h, *plan, g, limit, options_, p, dtype);
          case Pass::kBackwardFilter:
            break;
        }
        return choose<BackwardFilterOps>(h, *plan, g, limit, options_, p, dtype);
      },
      options_.cuda.algorithm_file, file_header_);
  CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv.get(),
                                          static_cast<cudnnMathType_t>(chosen.math_type)));
  plan->algo = chosen.algo;
  plan->workspace = chosen.workspace;
  return *plans_.emplace(key, std::move(plan)).first->second;
}

// A launch whose geometry was never sized chooses within the workspace it was given.
const ConvPlan& CudnnConv::launch_plan(Pass pass, const ConvGeom& g, const Workspace& ws,
                                       cudaStream_t stream, DType dtype) {
  const uint64_t given = ws.ptr != nullptr ? ws.bytes : 0;
  const uint64_t extra = extra_bytes(pass, g, dtype);
  const uint64_t room = given > extra ? given - extra : 0;
  const ConvPlan& p = plan(pass, g, std::min(room, options_.workspace_limit), dtype);
  check_workspace(ws, p.workspace + extra, pass_name(static_cast<int>(pass)), conv_geom_text(g));
  CUDNN_CHECK(cudnnSetStream(handle(), stream));
  return p;
}

uint64_t CudnnConv::extra_bytes(Pass pass, const ConvGeom& g, DType dtype) {
  return pass == Pass::kBackwardFilter && bf16(dtype) ? bf16_dw_bytes(g) : 0;
}

uint64_t CudnnConv::workspace_bytes(const ConvForward& a) {
  std::lock_guard lock(mutex_);
  return plan(Pass::kForward, a.g, options_.workspace_limit, a.dtype).workspace;
}

uint64_t CudnnConv::workspace_bytes(const ConvBackwardData& a) {
  std::lock_guard lock(mutex_);
  return plan(Pass::kBackwardData, a.g, options_.workspace_limit, a.dtype).workspace;
}

uint64_t CudnnConv::workspace_bytes(const ConvBackwardWeights& a) {
  std::lock_guard lock(mutex_);
  return plan(Pass::kBackwardFilter, a.g, options_.workspace_limit, a.dtype).workspace +
         extra_bytes(Pass::kBackwardFilter, a.g, a.dtype);
}

void CudnnConv::launch(const ConvForward& a, cudaStream_t stream) {
  std::lock_guard lock(mutex_);
  const ConvPlan& p = launch_plan(Pass::kForward, a.g, a.ws, stream, a.dtype);
  cudnnHandle_t h = handle();
  CUDNN_CHECK(cudnnConvolutionForward(h, &kOne, p.x.get(), a.x, p.w.get(), a.w, p.conv.get(),
                                      static_cast<cudnnConvolutionFwdAlgo_t>(p.algo),
                                      p.workspace > 0 ? a.ws.ptr : nullptr, p.workspace, &kZero,
                                      p.y.get(), a.y));
  if (a.bias == nullptr) return;
  if (bf16(a.dtype)) {  // Note [Convolutions in bf16]
    launch_channel_bias_bf16(a.g.n, a.g.k, a.g.out_h() * a.g.out_w(), a.bias, a.y, stream);
    return;
  }
  // y += bias, broadcast over N, OH, OW.
  CUDNN_CHECK(cudnnAddTensor(h, &kOne, p.bias.get(), a.bias, &kOne, p.y.get(), a.y));
}

void CudnnConv::launch(const ConvBackwardData& a, cudaStream_t stream) {
  std::lock_guard lock(mutex_);
  const ConvPlan& p = launch_plan(Pass::kBackwardData, a.g, a.ws, stream, a.dtype);
  cudnnHandle_t h = handle();
  CUDNN_CHECK(cudnnConvolutionBackwardData(h, &kOne, p.w.get(), a.w, p.y.get(), a.dy, p.conv.get(),
                                           static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo),
                                           p.workspace > 0 ? a.ws.ptr : nullptr, p.workspace,
                                           &kZero, p.x.get(), a.dx));
}

void CudnnConv::launch(const ConvBackwardWeights& a, cudaStream_t stream) {
  std::lock_guard lock(mutex_);
  const ConvPlan& p = launch_plan(Pass::kBackwardFilter, a.g, a.ws, stream, a.dtype);
  cudnnHandle_t h = handle();
  if (bf16(a.dtype)) {  // Note [Convolutions in bf16]: dw in bf16 after the workspace, widened
    float* dw16 = bf16_dw_block(a.ws, p.workspace);
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        h, &kOne, p.x.get(), a.x, p.y.get(), a.dy, p.conv.get(),
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo), p.workspace > 0 ? a.ws.ptr : nullptr,
        p.workspace, &kZero, p.w.get(), dw16));
    launch_widen_bf16(a.g.k * (a.g.c / a.g.groups) * a.g.r * a.g.s, dw16, a.dw, stream);
    if (a.dbias != nullptr) {
      launch_channel_sums_bf16(a.g.n, a.g.k, a.g.out_h() * a.g.out_w(), a.dy, a.dbias, stream);
    }
    return;
  }
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(
      h, &kOne, p.x.get(), a.x, p.y.get(), a.dy, p.conv.get(),
      static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo), p.workspace > 0 ? a.ws.ptr : nullptr,
      p.workspace, &kZero, p.w.get(), a.dw));
  // dbias = sum of dy over N, OH, OW.
  if (a.dbias != nullptr) {
    CUDNN_CHECK(
        cudnnConvolutionBackwardBias(h, &kOne, p.y.get(), a.dy, &kZero, p.bias.get(), a.dbias));
  }
}

}  // namespace ferry::cuda
