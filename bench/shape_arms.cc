// Step time of a config whose input shape changes per step (data.scales) under three memory arms,
// in one process, interleaved step by step (Note [Shape arms]). Invariant: every arm sees the
// same batches in the same order, each step timed alone. Printed, never asserted.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "common/error.h"
#include "trainer/configured/dataset.h"
#include "trainer/data/loader.h"
#include "trainer/session/session.h"

// Note [Shape arms]
// Usage: `bench_shape_arms CONFIG [key=value ...] --budget BYTES [--steps N] [--warmup N]`.
// The arms: memory.policy none with unlimited memory, auto with a plan per shape, and auto with
// one static plan (memory.per_shape false), both within --budget. Each arm's loader draws the
// same batches; step k of every arm runs before step k+1 of any, each timed alone (the host
// waits for its end), so load that changes slower than a step falls on every arm alike. Every
// shape is planned before the timed steps.

namespace ferry {
namespace {

struct Arm {
  std::string name;
  std::unique_ptr<Session> session;
  std::unique_ptr<DataLoader> loader;
  std::vector<double> seconds;  // per timed step
  std::vector<std::string> shapes;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  in >> one;
  return one;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"per-shape plans, one static plan and none, interleaved step by step"};
  std::string config_path;
  std::vector<std::string> overrides;
  uint64_t budget = 0;
  int steps = 30, warmup = 3;
  app.add_option("config", config_path)->required();
  app.add_option("overrides", overrides);
  app.add_option("--budget", budget, "memory.budget of the auto arms, bytes")->required();
  app.add_option("--steps", steps, "timed steps per arm");
  app.add_option("--warmup", warmup, "untimed steps per arm first");
  CLI11_PARSE(app, argc, argv);
  const Config base = load_config(config_path, overrides);
  if (base.data.scales.empty()) throw ConfigError("bench_shape_arms: give data.scales", "");
  std::vector<Arm> arms;
  for (const std::string name : {"none", "per_shape", "static"}) {
    Config c = base;
    c.memory.policy = name == "none" ? MemoryPolicy::kNone : MemoryPolicy::kAuto;
    c.memory.budget = name == "none" ? c.device.memory : budget;
    c.memory.per_shape = name != "static";
    Arm a;
    a.name = name;
    a.session = std::make_unique<Session>(c, RankInfo{}, /*training=*/true);
    LoaderOptions lo = loader_options(c, a.session->device());
    lo.scales = c.data.scales;
    a.loader = std::make_unique<DataLoader>(open_configured_dataset(c), lo);
    for (const Shape& s : a.loader->input_shapes()) (void)a.session->executor().program(s, true);
    arms.push_back(std::move(a));
  }
  const std::string load_before = load_average();
  for (int step = 1; step <= warmup + steps; ++step) {
    for (Arm& a : arms) {
      Batch batch = a.loader->next();
      const Shape input = batch.shape();
      const double t = timed_step(*a.session, {batch.input(), batch.labels(), batch.size(), input},
                                  static_cast<uint64_t>(step), static_cast<float>(base.optim.lr));
      if (step > warmup) {
        a.seconds.push_back(t);
        a.shapes.push_back(input.str());
      }
    }
  }
  const std::string load_after = load_average();
  const Arm& none = arms.front();
  const double none_mean =
      std::accumulate(none.seconds.begin(), none.seconds.end(), 0.0) / none.seconds.size();
  std::printf("%-10s %12s %10s %22s\n", "arm", "mean step", "vs none", "median paired vs none");
  nlohmann::json j = {{"load_before", load_before}, {"load_after", load_after}};
  for (const Arm& a : arms) {
    const double mean = std::accumulate(a.seconds.begin(), a.seconds.end(), 0.0) / a.seconds.size();
    std::vector<double> ratio;
    for (size_t i = 0; i < a.seconds.size(); ++i) ratio.push_back(a.seconds[i] / none.seconds[i]);
    std::printf("%-10s %11.4fs %+9.1f%% %+21.1f%%\n", a.name.c_str(), mean,
                100 * (mean / none_mean - 1), 100 * (median(ratio) - 1));
    j[a.name] = {{"mean_s", mean}, {"paired_median_ratio", median(ratio)}, {"steps", a.seconds}};
  }
  // Per shape: the mean step of each arm.
  std::map<std::string, std::vector<std::vector<double>>> by_shape;
  for (size_t k = 0; k < arms.size(); ++k) {
    for (size_t i = 0; i < arms[k].seconds.size(); ++i) {
      auto& cell = by_shape[arms[k].shapes[i]];
      cell.resize(arms.size());
      cell[k].push_back(arms[k].seconds[i]);
    }
  }
  for (const auto& [shape, cells] : by_shape) {
    std::string line = fmt::format("  {:<18} x{:<3}", shape, cells[0].size());
    for (size_t k = 0; k < arms.size(); ++k) {
      line += fmt::format(" {} {:.4f}s", arms[k].name,
                          std::accumulate(cells[k].begin(), cells[k].end(), 0.0) / cells[k].size());
    }
    std::printf("%s\n", line.c_str());
  }
  std::printf("load average (1 min) %s before, %s after\njson %s\n", load_before.c_str(),
              load_after.c_str(), j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::bench_main(ferry::main_impl, argc, argv); }
