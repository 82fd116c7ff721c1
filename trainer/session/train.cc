// The training loop.
//
// Note [No host wait inside a step]
// A training step only enqueues work: the batch's buffers go back to the loader after an event
// (its thread waits, not this one), the loss and correct count are staged into pinned memory
// on the device (Note [Metrics without a host wait] in trainer/exec/metrics_ring.h), and the host
// reads them, with one wait, only on steps that need them: logging, checkpoint and traced steps
// and the last. A non-finite loss is therefore detected at the next such step, and reported
// with the step it happened at; the logged loss keeps its meaning (the mean of the interval's
// per-step losses). TrainResult counts the host waits of the other steps: zero.
#include "trainer/session/train.h"
#include "trainer/configured/model.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/fault.h"
#include "common/bytes.h"
#include "common/file_write.h"
#include "device/backend_traits.h"
#include "device/host_waits.h"
#include "trainer/checkpoint/model_checkpoint.h"
#include "trainer/configured/dataset.h"
#include "trainer/data/loader.h"
#include "trainer/plan/shape_plans.h"
#include "trainer/session/checkpoints.h"
#include "trainer/session/metrics.h"
#include "trainer/session/node_files.h"
#include "trainer/session/rank_log.h"
#include "trainer/session/rank_placement.h"
#include "trainer/session/run_dir.h"
#include "trainer/session/session.h"
#include "trainer/session/train_report.h"
#include "trainer/share/budget.h"
#include "trainer/share/lease.h"

namespace ferry {

namespace fs = std::filesystem;

// Note [Saying when the prediction is off] in train.h.
std::string timing_mismatch(double predicted_s, double measured_s, bool measured_cost_model,
                            const std::string& cache_path) {
  if (!(predicted_s > 0) || !(measured_s > 0)) return "";
  const double ratio = predicted_s / measured_s;
  if (ratio <= 2.0 && ratio >= 0.5) return "";
  const std::string head =
      fmt::format("predicted/measured {:.2f} is off by more than 2x: likely ", ratio);
  const std::string cache = cache_path.empty() ? "the cost cache" : cache_path;
  if (ratio > 2.0) {
    return head + (measured_cost_model
                       ? fmt::format("kernel timings from a cold or busy first measurement; "
                                     "delete {} and run again on a quiet machine",
                                     cache)
                       : "the FLOP model's device rate is below this device's; set "
                         "memory.measure: true to time the kernels");
  }
  return head + (measured_cost_model
                     ? "a machine busy while training (other processes, more threads than "
                       "cores) or time the cost model does not price (data loading, waits "
                       "between ranks); compare with a run on a quiet machine"
                     : "the FLOP model's device rate is above what this device reaches; set "
                       "memory.measure: true to time the kernels");
}

namespace {

// Whether any rank passed true (every rank calls it at the same point): one host broadcast per
// rank, for the rare decisions all ranks must share (Note [Dropping oversize batches]).
bool any_rank(Communicator& comm, const RankInfo& ranks, bool mine) {
  if (ranks.size == 1) return mine;
  bool any = false;
  for (int r = 0; r < ranks.size; ++r) {
    uint8_t v = ranks.rank == r && mine ? 1 : 0;
    comm.broadcast_host(&v, sizeof(v), r);
    any = any || v != 0;
  }
  return any;
}

// An event after everything enqueued on the compute stream so far.
std::shared_ptr<Event> compute_done(Device& device) {
  std::shared_ptr<Event> done = device.create_event();
  device.stream(StreamKind::kCompute).record(*done);
  return done;
}

// Note [Injected faults] debug.fail_at_step throws on the chosen rank(s) at a step, as a failing
// kernel would; debug.stall_at_step stops the process (SIGSTOP) as a hung rank would, so that
// the other ranks' watchdog must end the job.
void inject_debug_faults(const Config& config, const RankInfo& ranks, int64_t step) {
  const bool here = config.debug.fail_rank < 0 || config.debug.fail_rank == ranks.rank;
  if (config.debug.fail_at_step == step && here) {
    throw Error(fmt::format("debug.fail_at_step: injected failure at step {}", step),
                "remove debug.fail_at_step");
  }
  if (config.debug.stall_at_step == step && here) {
    std::fprintf(stderr, "%sdebug.stall_at_step: stopping this rank (SIGSTOP) at step %lld\n",
                 rank_prefix(ranks).c_str(), static_cast<long long>(step));
    std::fflush(stderr);
    raise(SIGSTOP);  // until killed (the other ranks' watchdog ends the job) or continued
  }
}

// Whether `step` logs (every run.log_every steps and the last) or checkpoints (every
// checkpoint.every steps and the last, so a finished run leaves its weights).
bool logs_at(const Config& config, int64_t step) {
  return step % config.run.log_every == 0 || step == config.run.steps;
}
bool checkpoints_at(const Config& config, int64_t step) {
  return config.checkpoint.every > 0 &&
         (step % config.checkpoint.every == 0 || step == config.run.steps);
}

// The batch as the executor takes it. One of `micro_batches` per update: its loss divides by
// that many times its own divisor (Note [Accumulating micro-batches] in accumulation.h).
HostBatch host_batch(const Batch& batch, int64_t micro_batches = 1) {
  float divisor = batch.loss_divisor();
  if (micro_batches > 1) {
    const float own = divisor > 0 ? divisor : static_cast<float>(batch.labelled());
    divisor = static_cast<float>(micro_batches) * own;
  }
  return {batch.input(), batch.labels(), batch.size(), batch.shape(), batch.segments(), divisor};
}

// Everything around the step: the batches and their shapes' plans, the metrics accumulated
// between drains, the trace, the log. The loop in run() calls it in the words of the algorithm.
class StepBookkeeping {
 public:
  StepBookkeeping(const Config& config, Session& session, RankLog& log, DataLoader& loader,
                  ShapePlans& shapes, const Dataset& dataset, SharedBudget* shared,
                  const RunStart& start, int64_t first_step, TrainResult& result)
      : config_(config),
        session_(session),
        ranks_(session.ranks()),
        log_(log),
        loader_(loader),
        shapes_(shapes),
        dataset_(dataset),
        shared_(shared),
        metrics_(ranks_.is_root() ? (fs::path(config.run.dir) / "metrics.jsonl").string() : "",
                 /*fresh=*/start.resume.empty()),
        trace_(ranks_.rank),
        first_step_(first_step),
        drained_step_(first_step - 1),
        result_(result) {}

  // Whether `step` is traced (run.trace_steps); the executor records it when it is.
  bool begin_trace(int64_t step) {
    const bool traced = config_.run.trace && step >= config_.run.trace_steps[0] &&
                        step <= config_.run.trace_steps[1];
    session_.executor().set_trace(traced ? &trace_ : nullptr);
    return traced;
  }

  // The loader's next batch whose shape has a plan on every rank: batches of a shape no plan fits
  // are dropped under memory.oversize skip (Note [Dropping oversize batches] in shape_plans.cc,
  // the same batches on every rank). The loader knows what comes next: new shapes are planned
  // while this step runs.
  Batch next_batch(int64_t step) {
    Batch batch = draw();
    while (!shapes_.admit(batch.shape())) {
      if (const std::string line = shapes_.skip(batch.shape(), step); !line.empty())
        log_.line(line);
      loader_.skip_shape(batch.shape());  // dropped from now on: no longer generated
      batch.release();
      batch = draw();
    }
    for (const std::string& w : dataset_.take_warnings()) log_.print("{}", w);
    return batch;
  }

  void after_forward_backward(const Shape& input, int64_t step) {
    if (const std::string line = shapes_.after_step(input, step); !line.empty()) log_.line(line);
  }

  // Stages the micro-batch's metrics on the device (the gradient norm with the update's last),
  // counts its rows and gives its buffers back to the loader once the device is done with them
  // (Note [No host wait inside a step]).
  void finish_step(Batch& batch, int64_t step, const MicroBatch& micro) {
    session_.executor().stage_metrics(static_cast<uint64_t>(step),
                                      micro.last() ? session_.grad_norm_sq() : nullptr);
    labels_ += static_cast<double>(batch.labelled());
    if (config_.data.documents) {
      OwnMean& own = own_mean_[static_cast<uint64_t>(step)];
      own.divisors.push_back(host_batch(batch, micro.count).loss_divisor);
      own.labelled += static_cast<double>(batch.labelled());
    }
    // Documents: the global batch's real tokens (Note [The mean over real tokens]).
    tokens_ += static_cast<double>(batch.loss_divisor()) * ranks_.size;
    const int64_t samples = batch.size() * ranks_.size;
    batch.release_after(compute_done(session_.device()));
    result_.steps = step;
    samples_ += static_cast<double>(samples);
  }

  // The one host wait (Note [No host wait inside a step]): the staged metrics of every step
  // since the last drain, and the interval's time for the predicted/measured comparison.
  void drain(int64_t step) {
    for (StagedMetrics m : session_.executor().drain_metrics()) {
      if (!std::isfinite(m.loss)) {
        throw Error(fmt::format("the loss became {} at step {}", m.loss, m.step),
                    "lower optim.lr, add optim.warmup_steps, or check the data normalisation");
      }
      // Documents: the rank's loss as the mean over its own real tokens (Note [The mean over
      // real tokens] in trainer/data/documents.h), of all the update's micro-batches.
      if (auto it = own_mean_.find(m.step); it != own_mean_.end()) {
        OwnMean& own = it->second;
        const double divisor = own.divisors[own.next++];
        if (own.labelled > 0) m.loss = static_cast<float>(m.loss * (divisor / own.labelled));
        if (own.next == own.divisors.size()) own_mean_.erase(it);
      }
      // An update's loss is the sum of its micro-batches' (each divided by their count).
      update_loss_ += m.loss;
      update_correct_ += m.correct;
      if (++micro_drained_ < config_.optim.accumulate) continue;
      if (m.step == static_cast<uint64_t>(first_step_)) result_.first_loss = update_loss_;
      result_.last_loss = update_loss_;
      loss_ += update_loss_;
      correct_ += update_correct_;
      ++drained_steps_;
      grad_norm_ = m.grad_norm;
      update_loss_ = update_correct_ = 0;
      micro_drained_ = 0;
    }
    const auto now = std::chrono::steady_clock::now();
    timed_.emplace_back(step - drained_step_,
                        std::chrono::duration<double>(now - drained_at_).count());
    shapes_.interval(timed_.back().second);
    // The shared budget times plan steps: an update runs optim.accumulate of them.
    if (shared_) {
      shared_->drained(timed_.back().first * config_.optim.accumulate, timed_.back().second);
    }
    drained_at_ = now;
    drained_step_ = step;
  }

  // The traced steps' all-reduces; at the last traced step, the trace file.
  void trace(int64_t step) {
    trace_reductions(session_, trace_);
    if (step != config_.run.trace_steps[1] && step != config_.run.steps) return;
    session_.executor().set_trace(nullptr);
    const std::string path =
        (fs::path(config_.run.dir) / fmt::format("trace_rank{}.json", ranks_.rank)).string();
    trace_.write(path);
    log_.print("trace    steps {}-{} -> {} (open in ui.perfetto.dev)", config_.run.trace_steps[0],
               step, path);
  }

  // The interval's progress line on the console and its record in metrics.jsonl.
  void log(int64_t step, float lr, const Shape& input) {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - interval_start_).count();
    Device& device = session_.device();
    StepReport r;
    r.step = step;
    r.steps = config_.run.steps;
    r.loss = loss_ / static_cast<double>(drained_steps_);
    // Correct counts are this rank's, over the labels it scored (one per sample, one per
    // token for a token model, one per real token of documents).
    r.accuracy = correct_ / std::max(1.0, labels_);
    r.lr = lr;
    r.samples_per_s = samples_ / std::max(seconds, 1e-9);
    r.device_peak_bytes = device.memory().stats().peak;
    r.device_capacity = device.memory().capacity();
    r.elapsed_s = std::chrono::duration<double>(now - run_start_).count();
    if (!config_.data.scales.empty() || config_.data.documents) r.shape = input.str();
    if (config_.data.documents) r.tokens_per_s = tokens_ / std::max(seconds, 1e-9);
    const int64_t micro = config_.optim.accumulate, b = config_.data.batch_size;
    if (micro > 1)
      r.batch = fmt::format("{} ({}x{}x{})", b * micro * ranks_.size, b, micro, ranks_.size);
    log_.line(progress_line(r));
    // The logged step's gradient norm before clipping, as nanoGPT logs it.
    nlohmann::json extra = {{"shape", input.dims()}, {"budget", session_.executor().budget()}};
    if (shared_) extra.update(shared_->fields());
    if (config_.data.documents) extra["tokens_per_s"] = r.tokens_per_s;
    if (const Program* p = shapes_.program(input)) {
      extra["planned_peak_bytes"] = p->plan.peak_bytes();
      extra["shape_peak_bytes"] = shapes_.measured_peak(*p);
    }
    if (config_.memory.oversize == OversizeAction::kSkip) {
      extra["oversize_skipped"] = shapes_.skipped_batches();
    }
    if (grad_norm_) extra["grad_norm"] = *grad_norm_;
    if (micro > 1) {
      extra["micro_batches"] = micro;
      extra["effective_batch"] = b * micro * ranks_.size;
    }
    metrics_.write(r, extra);
    loss_ = correct_ = samples_ = labels_ = tokens_ = 0;
    drained_steps_ = 0;
    interval_start_ = now;
  }

  // (steps, seconds) between drains of the metrics, for the predicted/measured comparison.
  const std::vector<std::pair<int64_t, double>>& timed_intervals() const { return timed_; }

 private:
  // The loader's next batch, the shapes after it planned ahead.
  Batch draw() {
    Batch batch = loader_.next();
    shapes_.plan_ahead(loader_.position());
    shapes_.before_step(batch.shape());
    return batch;
  }

  const Config& config_;
  Session& session_;
  const RankInfo& ranks_;
  RankLog& log_;
  DataLoader& loader_;
  ShapePlans& shapes_;
  const Dataset& dataset_;
  SharedBudget* shared_;
  MetricsLog metrics_;
  StepTrace trace_;
  const int64_t first_step_;
  // The logging interval's sums. Labels this rank scored, and real tokens of the global batches
  // (documents).
  double loss_ = 0, correct_ = 0, samples_ = 0, labels_ = 0, tokens_ = 0;
  int64_t drained_steps_ = 0;
  // Documents: per step not yet drained, what turns the rank's loss (its sum over the global
  // batch's mean divisor) into the mean over its own real tokens, the number it logs: each
  // micro-batch's divisor and the update's labels on this rank.
  struct OwnMean {
    std::vector<double> divisors;
    double labelled = 0;
    size_t next = 0;  // micro-batches drained
  };
  std::map<uint64_t, OwnMean> own_mean_;
  // The update being drained: its micro-batches' loss and correct count so far.
  double update_loss_ = 0, update_correct_ = 0;
  int64_t micro_drained_ = 0;
  std::optional<float> grad_norm_;  // of the last step drained (optim.clip_norm > 0)
  std::chrono::steady_clock::time_point interval_start_ = std::chrono::steady_clock::now();
  const std::chrono::steady_clock::time_point run_start_ = interval_start_;
  std::chrono::steady_clock::time_point drained_at_ = interval_start_;
  int64_t drained_step_;
  std::vector<std::pair<int64_t, double>> timed_;
  TrainResult& result_;
};

// Rank 0 saves the step's checkpoint with the loader's position after it, and prunes old ones.
void save_step_checkpoint(const Config& config, Session& session, const DataLoader& loader,
                          int64_t step, RankLog& log) {
  const LoaderPosition next = loader.position();
  const std::string path = checkpoint_path(config.checkpoint.dir, step);
  save_checkpoint(path, session.store(), session.optimizer_slot_names(),
                  TrainingState{step, next.epoch, next.batch, config.run.seed, config.model.name,
                                run_shape(config)});
  prune_checkpoints(config.checkpoint.dir, config.checkpoint.keep);
  log.print("saved    {}", path);
}

// Where training starts: step 0, or the checkpoint `start` resumes (its weights and optimizer
// state loaded, the optimizer's step count set). ConfigError when it is past run.steps.
TrainingState resume(const Config& config, Session& session, RankLog& log, const RunStart& start) {
  const std::map<std::string, std::string> shape = run_shape(config);
  TrainingState state{0, 0, 0, config.run.seed, config.model.name, shape};
  if (start.resume.empty()) return state;
  state = load_checkpoint(start.resume, session.store(), session.optimizer_slot_names(), shape);
  session.scatter_optimizer_state();  // Note [One file for every shard] in session.cc
  if (!state.unchecked.empty()) {
    log.print("resume   {} records no {} (an older checkpoint): not checked", start.resume,
              fmt::join(state.unchecked, ", "));
  }
  if (state.step > config.run.steps) {
    throw ConfigError(fmt::format("checkpoint.resume: '{}' is at step {}, past run.steps={}",
                                  start.resume, state.step, config.run.steps),
                      fmt::format("set run.steps above {} to train on from it", state.step));
  }
  session.optimizer().set_steps_taken(state.step);
  log.print("resumed  {} at step {}{}", start.resume, state.step,
            state.step == config.run.steps ? " = run.steps: nothing left to train" : "");
  return state;
}

// The loader of this rank's share of every global batch, from the position `state` reached.
// `shared`: the job runs on a memory.share lease (its budget can grow later).
LoaderOptions training_loader_options(const Config& config, Session& session,
                                      const TrainingState& state, bool shared) {
  LoaderOptions lo = loader_options(config, session.device());
  lo.world_size = session.ranks().size;
  lo.rank = session.ranks().rank;
  lo.scales = config.data.scales;
  // Note [Batches too large to train] (loader.cc): no budget holds a larger input.
  lo.max_input_bytes = config.memory.budget > 0 ? config.memory.budget : config.device.memory;
  // Under skip, the sides no plan fits are neither allocated nor drawn (a shared budget can
  // grow later: then only by size). The plans made here are the ones the steps use.
  if (config.memory.oversize == OversizeAction::kSkip && !shared) {
    for (int64_t side : config.data.scales) {
      const Shape input = configured_input(config, config.data.batch_size, side);
      if (input.numel() * 4 > static_cast<int64_t>(lo.max_input_bytes)) continue;
      try {
        (void)session.executor().program(input, /*training=*/true);
      } catch (const BudgetError&) {
        lo.skip_shapes.push_back(input);
      }
    }
  }
  // Every rank takes part in every step: a partial global batch would leave some without rows.
  if (session.ranks().size > 1) lo.drop_last = true;
  lo.start = LoaderPosition{state.epoch, state.batch_in_epoch};
  return lo;
}

// The loop itself; train() wraps it so that a failure on one rank ends the job. `share`: the
// job's lease on its shared device (memory.share), else null.
TrainResult run(const Config& config, Session& session, RankLog& log, const RunStart& start,
                MemoryShareLease* share) {
  const RankInfo& ranks = session.ranks();
  Device& device = session.device();
  auto dataset = open_configured_dataset(config);
  for (const std::string& note : start.notes) log.line(note);
  const TrainingState state = resume(config, session, log, start);
  DataLoader loader(dataset, training_loader_options(config, session, state, share != nullptr));
  // Every side of data.scales must make a graph of this model: checked before any step.
  if (!config.data.scales.empty()) {
    for (const Shape& s : loader.input_shapes()) (void)build_configured_model(config, s);
  }
  // The next batches' shapes are planned in the background from here on, the first one's here.
  ShapePlans shapes(session.executor(), device, loader, config.memory.oversize,
                    [&](bool mine) { return any_rank(session.communicator(), ranks, mine); });
  shapes.plan_ahead(loader.position());
  // Plan the first step before any runs (Note [Life of an offloaded activation] in
  // trainer/exec/executor.h, step 2): planned once per input shape and mode, every step follows
  // its shape's plan; the shapes of the next batches are planned ahead, in the background. Under
  // memory.oversize skip the first batch trained may come later.
  const LoaderPosition first = shapes.first_admitted(loader.position());
  // A whole per-rank batch's input at `p`: at its side (data.scales) or length (data.documents).
  const auto batch_input = [&](LoaderPosition p) {
    return config.data.documents ? Shape{config.data.batch_size, loader.length(p)}
                                 : configured_input(config, config.data.batch_size, loader.side(p));
  };
  const MemoryPlan& plan = session.executor()
                               .program(batch_input(first),
                                        /*training=*/true)
                               .plan;
  print_banner(log, session, config, *dataset, plan);
  // memory.share: the budget follows the grant, re-planned between steps.
  std::optional<SharedBudget> shared;
  if (share) {
    shared.emplace(config, *share, session.executor(), device, batch_input(loader.position()),
                   session.cost_profile() != nullptr,
                   [&](const std::string& line) { log.line(line); });
  }

  const LrSchedule schedule = lr_schedule(config);
  TrainResult result;
  StepBookkeeping books(config, session, log, loader, shapes, *dataset, shared ? &*shared : nullptr,
                        start, state.step + 1, result);
  // The step (one update), as the algorithm reads: load, forward and backward, all-reduce,
  // update, log. Under optim.accumulate its micro-batches each load and run forward and
  // backward, and the last one reduces and updates (Note [Accumulating micro-batches]).
  for (int64_t step = state.step + 1; step <= config.run.steps; ++step) {
    inject_debug_faults(config, ranks, step);  // Note [Injected faults]
    const bool traced = books.begin_trace(step);
    const uint64_t waits_before = host_waits_on_this_thread();
    const float lr = schedule.at(step - 1);
    Shape input;
    for (MicroBatch micro{0, config.optim.accumulate}; micro.index < micro.count; ++micro.index) {
      Batch batch = books.next_batch(step);  // load: the next batch whose shape has a plan
      input = batch.shape();
      if (shared) shared->before_step(input, step);  // Note [Life of a memory share], step 5
      // Forward and backward; each gradient bucket's all-reduce starts as backward fills it.
      session.forward_backward(host_batch(batch, micro.count), micro.seed_step(step), micro);
      books.after_forward_backward(input, step);
      if (micro.last()) {
        session.reduce_gradients();  // the rest of the all-reduce
        session.update(lr);
      }
      books.finish_step(batch, step, micro);
      // A traced update records every micro-batch: the trace of each is read before the next.
      if (traced && !micro.last()) (void)session.metrics();
    }

    const bool logging = logs_at(config, step), checkpointing = checkpoints_at(config, step);
    if (logging || checkpointing || traced) {
      books.drain(step);  // the one host wait (Note [No host wait inside a step])
    } else {
      result.unlogged_step_host_waits += host_waits_on_this_thread() - waits_before;
    }
    if (traced) books.trace(step);
    if (logging) books.log(step, lr, input);
    if (checkpointing) {
      session.gather_optimizer_state();  // Note [One file for every shard] (collective)
      if (ranks.is_root()) save_step_checkpoint(config, session, loader, step, log);
      (void)session.store().take_optimizer_image();
    }
  }
  for (const std::string& w : dataset->take_warnings()) log.print("{}", w);
  if (dataset->skipped() > 0) {
    log.print("data     {} unreadable image{} skipped (data.skip_bad)", dataset->skipped(),
              dataset->skipped() == 1 ? "" : "s");
  }
  result.device_peak_bytes = device.memory().stats().peak;
  result.shapes = static_cast<int64_t>(shapes.shape_count());
  result.plan_waited_steps = shapes.waited_steps();
  result.oversize_skipped = shapes.skipped_batches();
  if (const GradientBuckets* b = session.gradient_buckets()) {
    result.gradient_reductions = static_cast<int64_t>(b->reductions());
    result.allreduce_calls = static_cast<int64_t>(b->collectives());
  }
  log.line(shapes.end_line());
  if (shared) log.line(shared->end_line());
  if (!session.link_usage().empty()) {
    session.communicator().barrier();  // every rank's copies are through
    if (speaks_for_node(ranks)) write_link_usage(config, ranks, session.link_usage(), log);
  }
  report_timing(log, session, config, plan, books.timed_intervals(), result, shapes);
  return result;
}

}  // namespace

TrainResult train(const Config& config, const RankInfo& ranks) {
  // Note [Who owns a run directory]: every check before any training time is spent.
  ensure_writable_dir(config.run.dir, "run.dir");
  std::optional<RunDirLock> lock;
  if (ranks.is_root()) lock.emplace(config.run.dir);
  const RunStart start = prepare_run_start(config, /*owner=*/ranks.is_root());
  RankLog log(ranks, config.run.dir);
  // The whole resolved config goes to its file (and `trainer config`); the console gets where it
  // is and what differs from the defaults.
  if (ranks.is_root())
    write_run_file((fs::path(config.run.dir) / "config.yaml").string(), to_yaml(config));
  log.line(config_summary(config));
  // memory.share: admitted by the node's job ledger, the job plans within its grant (Note [Life
  // of a memory share] in trainer/share/lease.h, steps 1 and 4).
  std::unique_ptr<MemoryShareLease> share;
  Config granted = config;
  std::optional<RankPlacement> placement;
  if (config.memory.share) {
    // A GPU rank's device by its bus id: the rank is placed (and bound) here, once, and the
    // session takes that placement.
    std::optional<PciAddress> gpu;
    if (backend_traits(config.device.backend).real_gpus) {
      placement = place_this_rank(config, ranks);
      gpu = placement->binding.gpu_pci;
    }
    share = std::make_unique<MemoryShareLease>(
        config, ranks, share_curve(config), [&](const std::string& s) { log.line(s); }, gpu);
    granted.memory.budget = share->budget();
  }
  Session session(granted, ranks, /*training=*/true, std::move(placement));
  try {
    check_same_resume(session.communicator(), ranks, start.resume);
    return run(granted, session, log, start, share.get());
  } catch (const std::exception& e) {
    // The log file keeps it; the console gets it once, from fail_job (here or in main).
    log.file_line(fmt::format("error: {}", e.what()));
    // The session is still alive: end the job before unwinding could wait on a collective the
    // other ranks never join (Note [Ending a job on one rank's failure]).
    if (ranks.size > 1) fail_job(ranks, e, exit_code_for(e));
    throw;
  }
}

}  // namespace ferry
