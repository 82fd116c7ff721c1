// The plan table of issue 3 for VGG-16 and ResNet-50 on ImageNet: each policy's peak and its
// reduction against none, the lower bound, and auto's smallest budget (Note [The plan table]).
// Goals: vdnn-all plans VGG-16 at batch 256 within 12 GiB, auto's smallest budget <= 1.15x.
#include <cstdio>

#include <fmt/format.h>

#include "bench/smallest_budget.h"
#include "common/bytes.h"
#include "trainer/config/config.h"
#include "trainer/plan/planning.h"

// Note [The plan table]
// Cuda config, zero-workspace cuDNN model, at batch 64, 128 and 256. The smallest budget auto
// accepts is shown as a multiple of the lower bound. 12 GiB is vDNN's Titan X.

namespace ferry {
namespace {

void table(const std::string& model) {
  Config c = default_config();
  c.model.name = model;
  c.model.classes = 1000;
  c.model.input = {3, 224, 224};
  c.device.backend = Backend::kCuda;
  c.device.memory = uint64_t{1} << 40;
  c.memory.budget = c.device.memory;
  std::printf("\n%s (ImageNet, SGD with momentum; cuda, zero-workspace cuDNN model)\n",
              model.c_str());
  std::printf("%6s %12s %18s %18s %18s %12s %12s %8s\n", "batch", "none", "vdnn-conv", "vdnn-all",
              "auto (min budget)", "lower bound", "all/bound", "auto/LB");
  for (int64_t batch : {64, 128, 256}) {
    OfflinePlanner planner(c);
    const MemoryPlan none = planner.plan(MemoryPolicy::kNone, batch, false);
    const MemoryPlan conv = planner.plan(MemoryPolicy::kVdnnConv, batch, false);
    const MemoryPlan all = planner.plan(MemoryPolicy::kVdnnAll, batch, false);
    const uint64_t lb = none.lower_bound;
    const uint64_t min_auto = smallest_auto_budget(c, batch, lb, none.peak_bytes());
    const auto cell = [&](const MemoryPlan& p) {
      return fmt::format("{} ({:+.0f}%)", format_bytes(p.peak_bytes()),
                         -100.0 * (1.0 - static_cast<double>(p.peak_bytes()) /
                                             static_cast<double>(none.peak_bytes())));
    };
    std::printf("%6lld %12s %18s %18s %18s %12s %12.3f %8.3f\n", static_cast<long long>(batch),
                format_bytes(none.peak_bytes()).c_str(), cell(conv).c_str(), cell(all).c_str(),
                format_bytes(min_auto).c_str(), format_bytes(lb).c_str(),
                static_cast<double>(all.peak_bytes()) / static_cast<double>(lb),
                static_cast<double>(min_auto) / static_cast<double>(lb));
  }
}

}  // namespace
}  // namespace ferry

int main() {
  ferry::table("vgg16");
  ferry::table("resnet50");
  std::printf("\ngoals: vdnn-all VGG-16 at batch 256 <= 12 GiB; auto/LB <= 1.15\n");
  return 0;
}
