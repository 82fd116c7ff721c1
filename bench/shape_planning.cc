// Planning time per new input shape (issue 18) against the step it hides behind, for VGG-16,
// ResNet-50 and gpt2 over a range of shapes (Note [Shape planning arms]).
// Invariant: arms interleaved, medians of fresh planners. Printed, never asserted.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "common/bytes.h"
#include "common/error.h"
#include "sim/hardware_profile.h"
#include "trainer/configured/model.h"
#include "trainer/plan/planning.h"

// Note [Shape planning arms]
// VGG-16 and ResNet-50 (ImageNet, batch 256, sides 160-288) and gpt2 (batch 16, 256-1024 tokens
// per row) under memory.budget 24 GiB with h100-pcie5's rates. Each shape is built, lowered and
// planned as a training run's background thread does: cuda config (without a GPU the planning
// stand-ins size cuDNN's workspaces, and no algorithm search runs) with a plan of its own and
// with the largest shape's decisions (memory.per_shape false), and cpu config (oneDNN primitives
// size them), against the step the planner predicts for it on the H100. Medians of `--reps`
// fresh planners, the arms interleaved.

namespace ferry {
namespace {

struct Model {
  std::string name;
  int64_t batch;
  std::vector<int64_t> sizes;  // sides, or tokens per row
};

// The arms: a plan per shape (cuda), the largest shape's decisions (cuda), a plan per shape
// lowered with the CPU backend's kernels (oneDNN primitives size the workspaces).
enum class Arm { kOwn, kStatic, kCpu };

Config config_of(const Model& m, Arm arm) {
  Config c = default_config();
  c.model.name = m.name;
  c.data.batch_size = m.batch;
  c.device.backend = arm == Arm::kCpu ? Backend::kCpu : Backend::kCuda;
  c.device.memory = uint64_t{80} << 30;
  c.memory.policy = MemoryPolicy::kAuto;
  c.memory.budget = uint64_t{24} << 30;
  c.memory.per_shape = arm != Arm::kStatic;
  if (model_info(m.name).tokens) {
    c.data.source = DataSource::kTokens;
    c.data.path = "unused.bin";  // planning reads shapes only
  } else {
    c.model.classes = 1000;
    c.model.input = {3, 224, 224};
    c.data.scales = m.sizes;
  }
  return c;
}

Shape input_of(const Config& c, int64_t size) {
  return model_info(c.model.name).tokens ? Shape{c.data.batch_size, size}
                                         : configured_input(c, c.data.batch_size, size);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void table(const Model& m, const CostModel& cost, int reps) {
  std::printf("\n%s, batch %lld, memory.budget 24 GiB, h100-pcie5 rates\n", m.name.c_str(),
              static_cast<long long>(m.batch));
  std::printf("%-20s %12s %12s %12s %14s %12s %10s\n", "input", "plan s", "static s", "cpu plan s",
              "predicted step", "plan / step", "peak");
  // The static arm's one-time plan of the largest shape is made before its timings start.
  const size_t n = m.sizes.size();
  std::vector<std::vector<std::vector<double>>> seconds(3, std::vector<std::vector<double>>(n));
  std::vector<MemoryPlan> plans(n);
  std::vector<std::vector<std::string>> errors(3, std::vector<std::string>(n));
  for (int rep = 0; rep < reps; ++rep) {
    for (Arm arm : {Arm::kOwn, Arm::kStatic, Arm::kCpu}) {
      const Config c = config_of(m, arm);
      OfflinePlanner planner(c);
      planner.set_cost(cost);
      if (arm == Arm::kStatic) {
        try {
          (void)planner.plan_shape(MemoryPolicy::kAuto, largest_input(c));
        } catch (const ConfigError&) {
        }
      }
      for (size_t i = 0; i < m.sizes.size(); ++i) {
        const Shape input = input_of(c, m.sizes[i]);
        const auto start = std::chrono::steady_clock::now();
        try {
          MemoryPlan p = planner.plan_shape(MemoryPolicy::kAuto, input);
          if (arm == Arm::kOwn) plans[i] = std::move(p);
        } catch (const ConfigError& e) {
          errors[static_cast<size_t>(arm)][i] = e.what();
        }
        seconds[static_cast<size_t>(arm)][i].push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    }
  }
  std::vector<std::string> notes;
  for (size_t i = 0; i < n; ++i) {
    const Shape input = input_of(config_of(m, Arm::kOwn), m.sizes[i]);
    std::string cells[3];
    for (size_t a = 0; a < 3; ++a) {
      cells[a] = errors[a][i].empty() ? fmt::format("{:.4f}", median(seconds[a][i])) : "no fit";
      if (!errors[a][i].empty()) {
        notes.push_back(
            fmt::format("{} {}: {}", input.str(), a == 2 ? "cpu" : "cuda", errors[a][i]));
      }
    }
    const bool planned = errors[0][i].empty();
    const double step = planned ? plans[i].prediction.step_seconds : 0;
    std::printf("%-20s %12s %12s %12s %14s %12s %10s\n", input.str().c_str(), cells[0].c_str(),
                cells[1].c_str(), cells[2].c_str(),
                planned ? fmt::format("{:.4f}", step).c_str() : "-",
                planned ? fmt::format("{:.3f}", median(seconds[0][i]) / step).c_str() : "-",
                planned ? format_bytes(plans[i].peak_bytes()).c_str() : "-");
  }
  for (const std::string& note : notes) std::printf("  %s\n", note.c_str());
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  CLI::App app{"planning time per new input shape against its predicted step"};
  int reps = 3;
  app.add_option("--reps", reps, "fresh planners per shape (median)")->check(CLI::Range(1, 99));
  CLI11_PARSE(app, argc, argv);
  try {
    const ferry::CostModel cost = ferry::load_hardware_profile("h100-pcie5").cost;
    ferry::table({"vgg16", 256, {160, 192, 224, 256, 288}}, cost, reps);
    ferry::table({"resnet50", 256, {160, 192, 224, 256, 288}}, cost, reps);
    ferry::table({"gpt2", 16, {256, 512, 768, 1024}}, cost, reps);
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  std::printf(
      "\nplan / step below 1: the shape is planned within one step; training plans the next "
      "4 batches' shapes ahead\n");
  return 0;
}
