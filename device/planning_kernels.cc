// Kernels for planning on a machine that may lack the configured backend's device: the
// backend's own when they can answer, else the CPU kernels, with a cuda workspace model.
#include "common/error.h"
#include "device/backend_traits.h"

namespace ferry {

namespace {

// Note [Workspaces without a GPU]
// Planning for the CUDA backend on a machine with no GPU to ask (no CUDA build, or no device):
// the real workspaces are those of the algorithms cuDNN finds on the GPU, which cannot be known
// here, so the plan assumes cuDNN's implicit-GEMM convolutions, which need none (the algorithms
// vDNN falls back to under memory pressure). Which kernels run in which storage is no guess: a
// CUDA build answers from its kernel table (cuda_kernel_runs, the pure function CudaKernels
// answers from on a GPU), so a kernel the CUDA backend lacks in bf16 is refused when the plan is
// made, not when a run starts; only a build without CUDA falls back to the CPU kernels' answer.
// With a GPU the CUDA kernels answer themselves.
class CudaWorkspaceModel : public Kernels {
 public:
  explicit CudaWorkspaceModel(std::unique_ptr<Kernels> cpu) : cpu_(std::move(cpu)) {}
  bool supports(KernelKind kind, DType dtype) const override {
    return backend_built(Backend::kCuda) ? cuda_kernel_runs(kind, dtype)
                                         : cpu_->supports(kind, dtype);
  }
  uint64_t workspace_bytes(const KernelArgs&) override { return 0; }
  void launch(const KernelArgs& args, Stream&) override {
    throw UnsupportedError(std::string("planning-only kernels cannot run ") +
                           std::string(kernel_name(args)));
  }

 private:
  std::unique_ptr<Kernels> cpu_;
};

}  // namespace

PlanningKernels create_planning_kernels(DeviceOptions options) {
  options.cuda.algorithms = AlgorithmSearch::kHeuristic;
  PlanningKernels p;
  if (device_present(options)) p.kernels = create_kernels(options);
  if (p.kernels && p.kernels->supports(kernel_kind<ConvForward>(), DType::kF32)) return p;
  // This backend cannot size its workspaces here: model them.
  const bool gpu = backend_traits(options.backend).real_gpus;
  options.backend = Backend::kCpu;
  p.kernels = create_kernels(options);
  if (gpu) {
    p.kernels = std::make_unique<CudaWorkspaceModel>(std::move(p.kernels));
    p.substitute = "no GPU here: cuda workspaces modelled as zero-workspace cuDNN algorithms";
  } else {
    p.substitute = "workspace sizes from the CPU kernels";
  }
  return p;
}

}  // namespace ferry
