// The op parity suite's target on a real GPU: the CUDA device's kernels on its compute stream,
// memory from cudaMalloc. No target (a skip) without a GPU.
#include <cuda_runtime_api.h>

#include <vector>

#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_device.h"
#include "device/cuda/cuda_stream.h"
#include "device/device.h"
#include "tests/device/cuda/parity_target.h"

namespace ferry::test {
namespace {

class CudaTarget : public ParityTarget {
 public:
  CudaTarget() {
    DeviceOptions options;
    options.backend = Backend::kCuda;
    options.memory = 64ull << 20;  // the suite's tensors come from alloc(), not the heap
    device_ = create_device(options);
  }
  ~CudaTarget() override {
    device_->synchronize();
    for (void* p : blocks_) CUDA_WARN(cudaFree(p));
  }
  // Fills and copies are ordered on the compute stream the kernels run on, then waited for:
  // never the legacy default stream, which the device's non-blocking streams do not wait for
  // (and a pageable cudaMemcpy may return before its DMA has landed).
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
    blocks_.push_back(p);
    CUDA_CHECK(cudaMemsetAsync(p, 0xff, bytes == 0 ? 1 : bytes, handle()));
    compute().synchronize();
    return p;
  }
  void copy_in(void* dst, const void* host, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, handle()));
    compute().synchronize();
  }
  void copy_out(void* host, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, handle()));
    compute().synchronize();
  }
  void launch(const KernelArgs& args) override {
    device_->kernels().launch(args, compute());
    compute().synchronize();
  }
  uint64_t workspace_bytes(const KernelArgs& args) override {
    return device_->kernels().workspace_bytes(args);
  }
  void set_sm_count(int sm_count) override {
    auto& kernels = static_cast<cuda::CudaKernels&>(device_->kernels());
    kernels.set_reduction_scratch(kernels.reduction_scratch(), sm_count);
  }

 private:
  Stream& compute() { return device_->stream(StreamKind::kCompute); }
  cudaStream_t handle() { return cuda::as_cuda(compute()).handle(); }

  std::unique_ptr<Device> device_;
  std::vector<void*> blocks_;
};

}  // namespace

std::unique_ptr<ParityTarget> make_parity_target(std::string* skip_reason) {
  if (cuda::device_count() == 0) {
    *skip_reason = "no CUDA device present";
    return nullptr;
  }
  return std::make_unique<CudaTarget>();
}

}  // namespace ferry::test
