// The train and eval loops.
#include "trainer/session/train.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "common/bytes.h"
#include "trainer/checkpoint/model_checkpoint.h"
#include "trainer/data/loader.h"
#include "trainer/session/checkpoints.h"
#include "trainer/session/metrics.h"
#include "trainer/session/session.h"

namespace ferry {

namespace fs = std::filesystem;

namespace {

std::shared_ptr<const Dataset> open_configured_dataset(const Config& config, uint64_t seed) {
  DatasetSpec spec;
  spec.source = std::string(to_string(config.data.source));
  spec.path = config.data.path;
  spec.labels_path = config.data.labels;
  spec.image_shape = Shape{config.model.input[0], config.model.input[1], config.model.input[2]};
  spec.classes = config.model.classes;
  spec.samples = config.data.samples;
  spec.seed = seed;
  std::shared_ptr<const Dataset> dataset = open_dataset(spec);
  if (dataset->image_shape() != spec.image_shape) {
    throw ConfigError(fmt::format("the dataset's images are {} but model.input is [{}, {}, {}]",
                                  dataset->image_shape().str(), config.model.input[0],
                                  config.model.input[1], config.model.input[2]),
                      "set model.input to the dataset's (C, H, W)");
  }
  if (dataset->classes() > config.model.classes) {
    throw ConfigError(fmt::format("the dataset has {} classes but model.classes is {}",
                                  dataset->classes(), config.model.classes));
  }
  return dataset;
}

LoaderOptions loader_options(const Config& config, Device& device) {
  LoaderOptions o;
  o.batch_size = config.data.batch_size;
  o.shuffle = config.data.shuffle;
  o.seed = config.run.seed;
  o.mean.assign(config.data.mean.begin(), config.data.mean.end());
  o.stddev.assign(config.data.std.begin(), config.data.std.end());
  o.drop_last = config.data.drop_last;
  o.allocator = &device.pinned();
  return o;
}

void print_banner(Session& session, const Config& config, const Dataset& data) {
  const PersistentBytes bytes = session.store().bytes();
  const Program& p = session.executor().program(config.data.batch_size, true);
  const MemoryPlan& plan = p.plan;
  std::printf("device   %s\n", session.device().name().c_str());
  std::printf("model    %s: %s parameters, %zu layers, input (%lld, %lld, %lld), %lld classes\n",
              config.model.name.c_str(), fmt::format("{}", session.graph().parameter_count()).c_str(),
              session.graph().nodes().size(), static_cast<long long>(config.model.input[0]),
              static_cast<long long>(config.model.input[1]), static_cast<long long>(config.model.input[2]),
              static_cast<long long>(config.model.classes));
  std::printf("data     %s, batch %lld\n", data.describe().c_str(),
              static_cast<long long>(config.data.batch_size));
  std::printf("memory   weights %s, gradients %s, optimizer %s, buffers %s\n",
              format_bytes(bytes.weights).c_str(), format_bytes(bytes.gradients).c_str(),
              format_bytes(bytes.optimizer).c_str(), format_bytes(bytes.buffers).c_str());
  std::printf("plan     policy %s, predicted peak %s (activations %s, gradients %s, workspace %s), "
              "offloaded %s/step, host pool %s, budget %s\n",
              std::string(policy_name(plan.policy)).c_str(), format_bytes(plan.peak_bytes()).c_str(),
              format_bytes(plan.activation_bytes).c_str(), format_bytes(plan.gradient_bytes).c_str(),
              format_bytes(plan.workspace_bytes).c_str(), format_bytes(plan.offload_bytes).c_str(),
              format_bytes(plan.host_bytes).c_str(), format_bytes(config.memory.budget).c_str());
  std::fflush(stdout);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw DataError("cannot write " + path, "check run.dir is writable");
}

}  // namespace

TrainResult train(const Config& config) {
  fs::create_directories(config.run.dir);
  const std::string resolved = to_yaml(config);
  std::printf("%s\n", resolved.c_str());
  write_text((fs::path(config.run.dir) / "config.yaml").string(), resolved);

  Session session(config, /*training=*/true);
  Device& device = session.device();
  Stream& compute = device.stream(StreamKind::kCompute);
  auto dataset = open_configured_dataset(config, config.run.seed);
  LoaderOptions lo = loader_options(config, device);

  TrainingState state{0, 0, 0, config.run.seed, config.model.name};
  const std::string resume = resolve_resume(config.checkpoint.resume, config.checkpoint.dir);
  if (!resume.empty()) {
    state = load_checkpoint(resume, session.store(), session.optimizer_slot_names());
    session.optimizer().set_steps_taken(state.step);
    lo.start = LoaderPosition{state.epoch, state.batch_in_epoch};
    std::printf("resumed  %s at step %lld\n", resume.c_str(), static_cast<long long>(state.step));
  }
  DataLoader loader(dataset, lo);
  print_banner(session, config, *dataset);

  const LrSchedule schedule = lr_schedule(config);
  MetricsLog log((fs::path(config.run.dir) / "metrics.jsonl").string());
  TrainResult result;
  double interval_loss = 0, interval_correct = 0, interval_samples = 0;
  auto interval_start = std::chrono::steady_clock::now();
  const auto run_start = interval_start;
  int64_t interval_steps = 0;

  StepTrace trace;
  for (int64_t step = state.step + 1; step <= config.run.steps; ++step) {
    if (config.debug.fail_at_step == step) {
      throw Error(fmt::format("debug.fail_at_step: injected failure at step {}", step));
    }
    const bool traced = config.run.trace && step >= config.run.trace_steps[0] &&
                        step <= config.run.trace_steps[1];
    session.executor().set_trace(traced ? &trace : nullptr);
    Batch batch = loader.next();
    const float lr = schedule.at(step - 1);
    session.executor().enqueue({batch.images(), batch.labels(), batch.size()}, true,
                               static_cast<uint64_t>(step));
    session.optimizer().step(device.kernels(), compute, session.store(), lr);
    const StepMetrics m = session.executor().read_metrics();  // waits for the step
    const int64_t samples = batch.size();
    batch.release();
    if (!std::isfinite(m.loss)) {
      throw Error(fmt::format("the loss became {} at step {}", m.loss, step),
                  "lower optim.lr, add optim.warmup_steps, or check the data normalisation");
    }
    if (step == state.step + 1) result.first_loss = m.loss;
    result.last_loss = m.loss;
    result.steps = step;
    interval_loss += m.loss;
    interval_correct += m.correct;
    interval_samples += static_cast<double>(samples);
    ++interval_steps;

    if (step % config.run.log_every == 0 || step == config.run.steps) {
      const auto now = std::chrono::steady_clock::now();
      const double seconds = std::chrono::duration<double>(now - interval_start).count();
      StepReport r;
      r.step = step;
      r.steps = config.run.steps;
      r.loss = interval_loss / static_cast<double>(interval_steps);
      r.accuracy = interval_correct / std::max(1.0, interval_samples);
      r.lr = lr;
      r.samples_per_s = interval_samples / std::max(seconds, 1e-9);
      r.device_peak_bytes = device.memory().stats().peak;
      r.device_capacity = device.memory().capacity();
      r.elapsed_s = std::chrono::duration<double>(now - run_start).count();
      std::printf("%s\n", progress_line(r).c_str());
      std::fflush(stdout);
      log.write(r);
      interval_loss = interval_correct = interval_samples = 0;
      interval_steps = 0;
      interval_start = now;
    }
    if (traced && (step == config.run.trace_steps[1] || step == config.run.steps)) {
      session.executor().set_trace(nullptr);
      const std::string path = (fs::path(config.run.dir) / "trace_rank0.json").string();
      trace.write(path);
      std::printf("trace    steps %lld-%lld -> %s (open in ui.perfetto.dev)\n",
                  static_cast<long long>(config.run.trace_steps[0]),
                  static_cast<long long>(step), path.c_str());
    }
    if (config.checkpoint.every > 0 && step % config.checkpoint.every == 0) {
      fs::create_directories(config.checkpoint.dir);
      const LoaderPosition next = loader.position();
      save_checkpoint(checkpoint_path(config.checkpoint.dir, step), session.store(),
                      session.optimizer_slot_names(),
                      TrainingState{step, next.epoch, next.batch, config.run.seed, config.model.name});
      prune_checkpoints(config.checkpoint.dir, config.checkpoint.keep);
    }
  }
  result.device_peak_bytes = device.memory().stats().peak;
  return result;
}

EvalResult evaluate(const Config& config) {
  fs::create_directories(config.run.dir);
  Config c = config;
  if (c.model.init_from.empty()) {
    const auto all = list_checkpoints(c.checkpoint.dir);
    if (all.empty()) {
      throw ConfigError("nothing to evaluate: model.init_from is empty and checkpoint.dir (" +
                            c.checkpoint.dir + ") holds no checkpoint",
                        "set model.init_from to a weights file, or train first");
    }
    c.model.init_from = all.back().second;
  }
  Session session(c, /*training=*/false);
  auto dataset = open_configured_dataset(c, c.run.seed);
  LoaderOptions lo = loader_options(c, session.device());
  lo.shuffle = false;
  lo.drop_last = false;
  lo.epochs = 1;
  DataLoader loader(dataset, lo);
  std::printf("eval     %s on %s with %s\n", c.model.name.c_str(), dataset->describe().c_str(),
              c.model.init_from.c_str());
  double loss_sum = 0;
  int64_t correct = 0, samples = 0;
  while (Batch batch = loader.next()) {
    if (batch.size() == 0) continue;
    session.executor().enqueue({batch.images(), batch.labels(), batch.size()}, false, 0);
    const StepMetrics m = session.executor().read_metrics();
    loss_sum += static_cast<double>(m.loss) * static_cast<double>(batch.size());
    correct += m.correct;
    samples += batch.size();
  }
  EvalResult r{samples ? loss_sum / static_cast<double>(samples) : 0.0,
               samples ? static_cast<double>(correct) / static_cast<double>(samples) : 0.0, samples};
  nlohmann::json j = {{"loss", r.loss}, {"accuracy", r.accuracy}, {"samples", r.samples},
                      {"model", c.model.name}, {"weights", c.model.init_from}};
  write_text((fs::path(c.run.dir) / "eval.json").string(), j.dump(2) + "\n");
  std::printf("eval     loss %.4f  accuracy %.4f  samples %lld  -> %s\n", r.loss, r.accuracy,
              static_cast<long long>(r.samples), (fs::path(c.run.dir) / "eval.json").c_str());
  return r;
}

}  // namespace ferry
