// The plan table of issue 28, fp32 against bf16 (device.precision): VGG-16 and ResNet-50 on
// ImageNet at batch 256 and gpt2 at 8 x 1024 tokens (cuda config, zero-workspace cuDNN model):
// none's and vdnn-all's peaks, the lower bound, the smallest budget auto accepts, and the largest
// batch none and auto fit in 12 and 24 GiB. Printed, never asserted.
#include <cstdio>

#include <fmt/format.h>

#include "bench/smallest_budget.h"
#include "common/bytes.h"
#include "trainer/config/config.h"
#include "trainer/plan/planning.h"

namespace ferry {
namespace {

Config model_config(const std::string& model, Precision precision) {
  std::string yaml;
  if (model == "gpt2") {
    yaml = "model: {name: gpt2}\ndata: {source: tokens, path: x.bin, batch_size: 8}\n";
  } else {
    yaml = "model: {name: " + model +
           ", classes: 1000, input: [3, 224, 224]}\ndata: {batch_size: 256}\n";
  }
  yaml += "device: {backend: cuda, memory: 1TiB}\n";
  return parse_config_text(
      yaml, {std::string("device.precision=") + (precision == Precision::kBf16 ? "bf16" : "fp32")});
}

int64_t max_batch(Config c, MemoryPolicy policy, uint64_t budget) {
  c.memory.budget = budget;
  return OfflinePlanner(c).max_batch(policy, 4096);
}

void row(const std::string& model, Precision precision) {
  const Config c = model_config(model, precision);
  const int64_t batch = c.data.batch_size;
  OfflinePlanner planner(c);
  const MemoryPlan none = planner.plan(MemoryPolicy::kNone, batch, false);
  const MemoryPlan all = planner.plan(MemoryPolicy::kVdnnAll, batch, false);
  const uint64_t lb = none.lower_bound;
  const uint64_t min_auto = smallest_auto_budget(c, batch, lb, none.peak_bytes());
  const uint64_t gib = uint64_t{1} << 30;
  std::printf("| %s | %s | %s | %s (%s/step) | %s | %s | %lld / %lld | %lld / %lld |\n",
              model.c_str(), precision == Precision::kBf16 ? "bf16" : "fp32",
              format_bytes(none.peak_bytes()).c_str(), format_bytes(all.peak_bytes()).c_str(),
              format_bytes(all.offload_bytes).c_str(), format_bytes(lb).c_str(),
              format_bytes(min_auto).c_str(),
              static_cast<long long>(max_batch(c, MemoryPolicy::kNone, 12 * gib)),
              static_cast<long long>(max_batch(c, MemoryPolicy::kAuto, 12 * gib)),
              static_cast<long long>(max_batch(c, MemoryPolicy::kNone, 24 * gib)),
              static_cast<long long>(max_batch(c, MemoryPolicy::kAuto, 24 * gib)));
  std::fflush(stdout);
}

}  // namespace
}  // namespace ferry

int main() {
  std::printf(
      "| model (batch) | precision | none peak | vdnn-all peak (offloaded) | lower bound | "
      "smallest auto budget | max batch 12 GiB none / auto | max batch 24 GiB none / "
      "auto |\n|---|---|---|---|---|---|---|---|\n");
  for (const char* model : {"vgg16", "resnet50", "gpt2"}) {
    ferry::row(model, ferry::Precision::kFp32);
    ferry::row(model, ferry::Precision::kBf16);
  }
  return 0;
}
