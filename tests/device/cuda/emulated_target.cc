// The op parity suite's target without a GPU: the CUDA kernel sources compiled for the host
// (Note [Host emulation of the CUDA kernels] in host_emulation/device/cuda/launch.cuh), called
// through the real argument checks of cuda_ops.cc. Memory is host memory.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <variant>
#include <vector>

#include "common/error.h"
#include "device/cuda/cuda_ops.h"
#include "device/cuda/elementwise.h"
#include "tests/device/cuda/parity_target.h"

// The kernels, each .cu once, against the emulated launch.cuh.
#include "device/cuda/activation.cu"
#include "device/cuda/attention.cu"
#include "device/cuda/batchnorm.cu"
#include "device/cuda/elementwise.cu"
#include "device/cuda/flash_attention.cu"
#include "device/cuda/llama.cu"
#include "device/cuda/loss.cu"
#include "device/cuda/optim.cu"
#include "device/cuda/pool.cu"
#include "device/cuda/transformer.cu"

namespace ferry::test {
namespace {

class EmulatedTarget : public ParityTarget {
 public:
  ~EmulatedTarget() override {
    for (void* p : blocks_) std::free(p);
  }
  void* alloc(size_t bytes) override {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    std::memset(p, 0xff, bytes == 0 ? 1 : bytes);
    blocks_.push_back(p);
    return p;
  }
  void copy_in(void* dst, const void* host, size_t bytes) override {
    std::memcpy(dst, host, bytes);
  }
  void copy_out(void* host, const void* src, size_t bytes) override {
    std::memcpy(host, src, bytes);
  }
  void launch(const KernelArgs& args) override {
    std::visit(
        [this](const auto& a) {
          using T = std::decay_t<decltype(a)>;
          if constexpr (std::is_same_v<T, CopyDevice>) {
            std::memcpy(a.dst, a.src, a.bytes);  // cudaMemcpyAsync on the GPU
          } else if constexpr (requires { cuda::run(a, cudaStream_t{}); }) {
            cuda::run(a, cudaStream_t{});
          } else if constexpr (requires { cuda::run(a, cudaStream_t{}, scratch()); }) {
            cuda::run(a, cudaStream_t{}, scratch());
          } else {
            throw UnsupportedError("no emulated kernel for " + std::string(kernel_name(T{})));
          }
        },
        args);
  }

  uint64_t workspace_bytes(const KernelArgs&) override { return 0; }
  void set_sm_count(int sm_count) override { sm_count_ = sm_count; }

 private:
  // The CUDA device's fixed reduction scratch, NaN-poisoned like every fresh buffer.
  cuda::ReductionScratch scratch() { return {scratch_.data(), sm_count_}; }

  std::vector<void*> blocks_;
  std::vector<double> scratch_ = std::vector<double>(cuda::kReductionScratchDoubles, NAN);
  int sm_count_ = 132;  // an H100's
};

}  // namespace

std::unique_ptr<ParityTarget> make_parity_target(std::string*) {
  return std::make_unique<EmulatedTarget>();
}

}  // namespace ferry::test
