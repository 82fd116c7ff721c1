// Training-step time of a config on this machine, per memory policy, measured in one process so
// the policies share the same machine state (Note [Step time bench usage]). Prints each policy's
// mean step time and its ratio to the first policy.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "common/error.h"
#include "common/strings.h"
#include "trainer/configured/dataset.h"
#include "trainer/data/loader.h"
#include "trainer/session/session.h"

// Note [Step time bench usage]
// `bench_step_time CONFIG [key=value ...] [--policies none,vdnn-all] [--steps N] [--warmup N]
// [--trace DIR]`. With --trace, it also writes a Chrome trace per policy. "CPU/step" is the
// process's CPU time per measured step (every thread's): with device.threads 1 on a loaded
// machine, the step's own work, which time slicing does not stretch as it does wall time.

namespace ferry {
namespace {

double process_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Result {
  std::string policy;
  double mean_s = 0;
  double min_s = 0;
  double cpu_mean_s = 0;  // process CPU time per measured step (all threads)
  uint64_t peak = 0;
  uint64_t offload = 0;
};

Result measure(Config c, int warmup, int steps, const std::string& trace_dir) {
  Session session(c, RankInfo{}, true);
  const std::shared_ptr<const Dataset> dataset = open_configured_dataset(c);
  LoaderOptions lo;
  lo.batch_size = c.data.batch_size;
  lo.allocator = &session.device().pinned();
  DataLoader loader(dataset, lo);
  StepTrace trace;
  std::vector<double> times;
  double cpu_s = 0;
  for (int step = 1; step <= warmup + steps; ++step) {
    const bool traced = !trace_dir.empty() && step == warmup + 1;
    session.executor().set_trace(traced ? &trace : nullptr);
    Batch batch = loader.next();
    const double cpu0 = process_cpu_s();
    const double t = timed_step(session, {batch.input(), batch.labels(), batch.size()},
                                static_cast<uint64_t>(step), static_cast<float>(c.optim.lr));
    if (step > warmup) {
      times.push_back(t);
      cpu_s += process_cpu_s() - cpu0;
    }
  }
  session.executor().set_trace(nullptr);
  Result r;
  r.policy = std::string(to_string(c.memory.policy));
  r.mean_s = std::accumulate(times.begin(), times.end(), 0.0) / static_cast<double>(times.size());
  r.min_s = *std::min_element(times.begin(), times.end());
  r.cpu_mean_s = cpu_s / static_cast<double>(times.size());
  r.peak = session.device().memory().stats().peak;
  r.offload = session.executor().program(c.data.batch_size, true).plan.offload_bytes;
  if (!trace_dir.empty()) {
    std::filesystem::create_directories(trace_dir);
    trace.write(fmt::format("{}/trace_{}.json", trace_dir, r.policy));
  }
  return r;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"Training-step time per memory policy"};
  std::string config_path, policies = "none", trace_dir;
  std::vector<std::string> overrides;
  int steps = 5, warmup = 2;
  app.add_option("config", config_path)->required();
  app.add_option("overrides", overrides);
  app.add_option("--policies", policies);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--trace", trace_dir,
                 "write a Chrome trace of the first measured step per policy");
  CLI11_PARSE(app, argc, argv);
  const Config base = load_config(config_path, overrides);
  std::vector<Result> results;
  for (const std::string& name : split(policies, ',')) {
    Config c = base;
    const auto p = from_string<MemoryPolicy>(name);
    if (!p) throw ConfigError("unknown policy " + name);
    c.memory.policy = *p;
    results.push_back(measure(c, warmup, steps, trace_dir));
  }
  std::printf("%-10s %12s %12s %12s %12s %14s %8s\n", "policy", "mean step", "min step", "CPU/step",
              "peak", "offload/step", "ratio");
  for (const Result& r : results) {
    std::printf("%-10s %11.3fs %11.3fs %11.3fs %12s %14s %8.3f\n", r.policy.c_str(), r.mean_s,
                r.min_s, r.cpu_mean_s, fmt::format("{:.1f} MiB", r.peak / 1048576.0).c_str(),
                fmt::format("{:.1f} MiB", r.offload / 1048576.0).c_str(),
                r.mean_s / results.front().mean_s);
  }
  nlohmann::json j = nlohmann::json::array();
  for (const Result& r : results) {
    j.push_back({{"policy", r.policy},
                 {"mean_s", r.mean_s},
                 {"min_s", r.min_s},
                 {"cpu_mean_s", r.cpu_mean_s},
                 {"peak_bytes", r.peak},
                 {"offload_bytes", r.offload}});
  }
  std::printf("json %s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::bench_main(ferry::main_impl, argc, argv); }
