// Offline planning.
#include "trainer/session/planning.h"

#include <thread>

#include "common/error.h"
#include "device/device.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/model/zoo/zoo.h"
#include "trainer/optim/optimizer.h"
#include "trainer/session/session.h"

namespace ferry {

namespace {

// Planning for the CUDA backend on a machine with no GPU to ask (no CUDA build, or no device):
// the real workspaces are those of the algorithms cuDNN finds on the GPU, which cannot be known
// here, so the plan assumes cuDNN's implicit-GEMM convolutions, which need none (the algorithms
// vDNN falls back to under memory pressure). With a GPU the CUDA kernels answer themselves.
class CudaWorkspaceModel : public Kernels {
 public:
  explicit CudaWorkspaceModel(std::unique_ptr<Kernels> cpu) : cpu_(std::move(cpu)) {}
  bool supports(KernelKind kind, DType dtype) const override { return cpu_->supports(kind, dtype); }
  uint64_t workspace_bytes(const KernelArgs&) override { return 0; }
  void launch(const KernelArgs& args, Stream&) override {
    throw UnsupportedError(std::string("planning-only kernels cannot run ") +
                           std::string(kernel_name(args)));
  }

 private:
  std::unique_ptr<Kernels> cpu_;
};

}  // namespace

CostModel cost_model(const Config& config) {
  CostModel c;
  if (config.device.backend == Backend::kCuda) {
    c.compute_flops = 1e13;  // a V100/A100-class GPU at realistic utilisation
    c.memory_gbps = 700;
    c.link_gbps = 12;  // PCIe gen3 x16 as measured, per direction
  } else {
    const int64_t cores = config.device.threads > 0
                              ? config.device.threads
                              : static_cast<int64_t>(std::thread::hardware_concurrency());
    c.compute_flops = 5e10 * static_cast<double>(std::max<int64_t>(cores, 1));
    c.memory_gbps = 10;
    c.link_gbps = 8;  // a memcpy on a copy thread
  }
  if (config.device.copy_gbps > 0) c.link_gbps = config.device.copy_gbps;
  if (config.memory.link_gbps > 0) c.link_gbps = config.memory.link_gbps;
  return c;
}

OfflinePlanner::OfflinePlanner(const Config& config) : config_(config), cost_(cost_model(config)) {
  DeviceOptions d = device_options(config);
  // A plan is asked for many batch sizes: heuristics, no timing.
  d.algorithms = AlgorithmSearch::kHeuristic;
  const bool cuda_absent = d.backend == Backend::kCuda && cuda_device_count() <= d.ordinal;
  if (backend_built(d.backend) && !cuda_absent) kernels_ = create_kernels(d);
  if (!kernels_ || !kernels_->supports(kernel_kind<ConvForward>(), DType::kF32)) {
    // This backend cannot size its workspaces here: model them.
    const bool cuda = d.backend == Backend::kCuda;
    d.backend = Backend::kCpu;
    kernels_ = create_kernels(d);
    if (cuda) kernels_ = std::make_unique<CudaWorkspaceModel>(std::move(kernels_));
    substituted_ = true;
  }
  const Graph graph =
      build_model(config.model.name,
                  Shape{1, config.model.input[0], config.model.input[1], config.model.input[2]},
                  config.model.classes);
  persistent_ = ParameterStore::plan_bytes(graph, optimizer_slots(optimizer_options(config)));
}

OfflinePlanner::~OfflinePlanner() = default;

const Lowered& OfflinePlanner::lowered(int64_t batch) {
  auto it = tapes_.find(batch);
  if (it != tapes_.end()) return *it->second;
  const Graph g = build_model(
      config_.model.name,
      Shape{batch, config_.model.input[0], config_.model.input[1], config_.model.input[2]},
      config_.model.classes);
  auto lowered = std::make_unique<Lowered>(lower_graph(g, *kernels_, /*training=*/true));
  return *tapes_.emplace(batch, std::move(lowered)).first->second;
}

MemoryPlan OfflinePlanner::plan(MemoryPolicy policy, int64_t batch, bool enforce_budget) {
  PlanOptions o = plan_options(config_);
  o.keep_unhidden = contention_aware_;
  if (!enforce_budget) o.budget = 0;
  o.policy = policy;
  o.persistent = persistent_;
  o.cost = cost_;
  return plan_memory(lowered(batch).tape, o);
}

bool OfflinePlanner::fits(MemoryPolicy policy, int64_t batch) {
  try {
    plan(policy, batch);
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

int64_t OfflinePlanner::max_batch(MemoryPolicy policy, int64_t limit) {
  if (!fits(policy, 1)) return 0;
  int64_t good = 1, bad = 2;
  while (bad <= limit && fits(policy, bad)) {
    good = bad;
    bad *= 2;
  }
  if (bad > limit) return good;
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    (fits(policy, mid) ? good : bad) = mid;
  }
  return good;
}

}  // namespace ferry
