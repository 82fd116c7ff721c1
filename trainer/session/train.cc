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
#include "trainer/session/model_of.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "comm/fault.h"
#include "common/bytes.h"
#include "common/file_write.h"
#include "device/host_waits.h"
#include "trainer/checkpoint/model_checkpoint.h"
#include "trainer/data/loader.h"
#include "trainer/session/checkpoints.h"
#include "trainer/session/data_setup.h"
#include "trainer/session/metrics.h"
#include "trainer/session/node_files.h"
#include "trainer/session/placement.h"
#include "trainer/session/rank_log.h"
#include "trainer/session/run_dir.h"
#include "trainer/session/session.h"
#include "trainer/session/shape_plans.h"
#include "trainer/share/budget.h"
#include "trainer/share/lease.h"

namespace ferry {

namespace fs = std::filesystem;

namespace {

// The rank bindings table of every node of the job (collective). Each node places and binds its
// own ranks from its own topology; its first local rank sends "node HOST (first rank R)" and
// its table, and rank 0 gets them all in rank order. One node: `table` itself.
std::string every_nodes_bindings(Communicator& comm, const RankInfo& ranks,
                                 const std::string& table) {
  if (ranks.local_size == ranks.size) return table;
  const std::string mine = speaks_for_node(ranks)
                               ? fmt::format("{}\n{}", node_heading(ranks, host_name()), table)
                               : std::string();
  std::string out;
  for (int r = 0; r < ranks.size; ++r) {
    uint64_t length = ranks.rank == r ? mine.size() : 0;
    comm.broadcast_host(&length, sizeof(length), r);
    if (length == 0) continue;
    std::string text = ranks.rank == r ? mine : std::string(static_cast<size_t>(length), '\0');
    comm.broadcast_host(text.data(), length, r);
    out += text;
  }
  return out;
}

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

// What this rank runs: ranks, placement, device, model, data, memory and the step's plan.
void print_banner(RankLog& log, Session& session, const Config& config, const Dataset& data,
                  const MemoryPlan& plan) {
  const RankInfo& ranks = session.ranks();
  const PersistentBytes bytes = session.store().bytes();
  log.print("ranks    {} ({} on this machine), communicator {}, topology {}{}", ranks.size,
            ranks.local_size, session.communicator().backend_name(), session.placement().source,
            session.placement().bound ? ", bound" : "");
  log.line(every_nodes_bindings(session.communicator(), ranks, session.placement().table));
  if (!session.placement().link_path.empty()) {
    log.print("link     {}: bottleneck {:.2f} GB/s{}", session.placement().link_path,
              session.placement().link_gbps,
              emulates_server_links(config) ? " (emulated by this rank's copies)" : "");
  }
  log.print("device   {}", session.device().name());
  const Graph& graph = session.graph();
  log.print("model    {}: {} parameters, {} layers, {}, {} {}", config.model.name,
            graph.parameter_count(), graph.nodes().size(), input_text(config),
            graph.tensor(graph.logits()).desc.shape[1],
            model_info(config.model.name).tokens ? "tokens in the vocabulary" : "classes");
  log.print("data     {}, batch {} per rank ({} global)", data.describe(), config.data.batch_size,
            config.data.batch_size * ranks.size);
  log.print("memory   weights {}, gradients {}, optimizer {}, buffers {}",
            format_bytes(bytes.weights), format_bytes(bytes.gradients),
            format_bytes(bytes.optimizer), format_bytes(bytes.buffers));
  const OptimizerOptions& opt = session.optimizer().options();
  const size_t runs = decay_runs(session.store().params(), session.store().param_floats(),
                                 opt.decay, opt.weight_decay)
                          .size();
  const size_t launches = runs + (opt.clip_norm > 0 ? 2 : 0);
  log.print("optim    {}, weight decay {} on {} parameters, clip_norm {}: {} launch{} per update",
            to_string(opt.kind), opt.weight_decay,
            opt.decay == WeightDecayGroups::kMatrices ? "2+ dimensional" : "all",
            opt.clip_norm > 0 ? fmt::format("{}", opt.clip_norm) : std::string("off"), launches,
            launches == 1 ? "" : "es");
  log.print(
      "plan     policy {}, predicted peak {} (activations {}, gradients {}, workspace {}), "
      "offloaded {}/step, recomputed {:.3g} GFLOP/step, host pool {}, budget {}",
      policy_name(plan.policy), format_bytes(plan.peak_bytes()),
      format_bytes(plan.activation_bytes), format_bytes(plan.gradient_bytes),
      format_bytes(plan.workspace_bytes), format_bytes(plan.offload_bytes),
      plan.recompute_flops / 1e9, format_bytes(plan.host_bytes),
      format_bytes(config.memory.budget));
  const DeviceProfile* profile = session.cost_profile();
  log.print(
      "cost     {}; predicted step {:.4f}s (stall {:.4f}s)",
      profile ? describe_profile(*profile) : std::string("FLOP model (memory.measure: false)"),
      plan.prediction.step_seconds, plan.prediction.stall_seconds);
}

// The end-of-run comparison of the planner's predicted step time with the measured one, on the
// console and in <run.dir>/summary.json.
// Steps are timed per logging interval (the host waits for the device only there, Note [No host
// wait inside a step]): `intervals` holds (steps, seconds) from one drain of the metrics to the
// next.
void report_timing(RankLog& log, Session& session, const Config& config, const MemoryPlan& plan,
                   const std::vector<std::pair<int64_t, double>>& intervals,
                   const TrainResult& result, const ShapePlans& shapes) {
  if (intervals.empty()) return;
  // The first interval pays for first touches and algorithm choices: leave it out when we can.
  const size_t skip = intervals.size() > 1 ? 1 : 0;
  double seconds = 0;
  int64_t counted = 0;
  for (size_t i = skip; i < intervals.size(); ++i) {
    counted += intervals[i].first;
    seconds += intervals[i].second;
  }
  if (counted == 0) return;
  const double measured = seconds / static_cast<double>(counted);
  // Several input shapes (data.scales): the mean of their predictions over the steps run.
  const double predicted =
      shapes.shape_count() > 1 ? shapes.predicted_mean_step() : plan.prediction.step_seconds;
  const char* model = session.cost_profile() ? "measured" : "FLOP";
  log.print(
      "timing   step {:.4f}s measured (mean of {} step{}{}), {:.4f}s predicted by the {} cost "
      "model (predicted/measured {:.2f})",
      measured, counted, counted == 1 ? "" : "s", skip ? " after the first logging interval" : "",
      predicted, model, measured > 0 ? predicted / measured : 0.0);
  if (!session.ranks().is_root()) return;
  nlohmann::json j = {{"model", config.model.name},
                      {"batch", config.data.batch_size},
                      {"ranks", session.ranks().size},
                      {"policy", policy_name(plan.policy)},
                      {"device", session.device().name()},
                      {"steps", result.steps},
                      {"first_loss", result.first_loss},
                      {"last_loss", result.last_loss},
                      {"measured_step_s", measured},
                      {"measured_steps", counted},
                      {"predicted_step_s", predicted},
                      {"predicted_stall_s", plan.prediction.stall_seconds},
                      {"predicted_compute_s", plan.prediction.compute_seconds},
                      {"cost_model", session.cost_profile() ? "measured" : "flops"},
                      {"planned_peak_bytes", plan.peak_bytes()},
                      {"device_peak_bytes", result.device_peak_bytes},
                      {"offload_bytes", plan.offload_bytes},
                      {"plan_waited_steps", result.plan_waited_steps},
                      {"shapes", shapes.summary()},
                      {"oversize_skipped", result.oversize_skipped},
                      {"skipped_shapes", shapes.skipped_summary()}};
  if (const DeviceProfile* p = session.cost_profile()) {
    j["cost_profile"] = {{"kernels", p->kernels},
                         {"from_cache", p->from_cache},
                         {"not_timed", p->failed},
                         {"steps_measured", p->steps_measured},
                         {"steps", p->steps_total},
                         {"d2h_gbps", p->link_gbps_to_host},
                         {"h2d_gbps", p->link_gbps_to_device},
                         {"seconds", p->seconds},
                         {"cache", p->cache_path}};
  }
  write_run_file((fs::path(config.run.dir) / "summary.json").string(), j.dump(2) + "\n");
}

// An event after everything enqueued on the compute stream so far.
std::shared_ptr<Event> compute_done(Device& device) {
  std::shared_ptr<Event> done = device.create_event();
  device.stream(StreamKind::kCompute).record(*done);
  return done;
}

// Adds the last step's all-reduces to the trace, on the comm track.
void trace_reductions(Session& session, StepTrace& trace) {
  for (const BucketSpan& s : session.reduce_spans()) {
    const double start = session.executor().trace_time_us(s.start_ns);
    trace.add({TraceTrack::kComm,
               fmt::format("all-reduce bucket {}", s.bucket),
               start,
               static_cast<double>(s.end_ns - s.start_ns) / 1000.0,
               {{"bytes", s.bytes}, {"queued_us", session.executor().trace_time_us(s.launch_ns)}}});
  }
}

// The ledger's measurements: <run.dir>/links.json (per link and direction: emulated capacity,
// bytes carried, peak rate over a measurement bin) and the busiest link on the console.
// Each node has its own ledger: a job over several nodes writes one file per node,
// links.<hostname>.json.
void write_link_usage(const Config& config, const RankInfo& ranks,
                      const std::vector<LinkUsage>& usage, RankLog& log) {
  nlohmann::json links = nlohmann::json::array();
  const LinkUsage* busiest = nullptr;
  double busiest_ratio = -1;
  for (const LinkUsage& u : usage) {
    links.push_back({{"name", u.name},
                     {"capacity_gbps", {u.capacity.to_host_gbps, u.capacity.to_device_gbps}},
                     {"bytes", {u.bytes[0], u.bytes[1]}},
                     {"peak_gbps", {u.peak_gbps[0], u.peak_gbps[1]}}});
    for (int d = 0; d < 2; ++d) {
      const double cap = d ? u.capacity.to_device_gbps : u.capacity.to_host_gbps;
      if (cap > 0 && u.peak_gbps[d] / cap > busiest_ratio) {
        busiest_ratio = u.peak_gbps[d] / cap;
        busiest = &u;
      }
    }
  }
  nlohmann::json j = {{"scheduler", to_string(config.topology.scheduler)},
                      {"emulation_scale", config.topology.emulation_scale},
                      {"duplex_factor", config.topology.duplex_factor},
                      {"bin_s", usage.front().bin_s},
                      {"directions", {"to_host", "to_device"}},
                      {"links", links}};
  const std::string path =
      (fs::path(config.run.dir) / node_links_file(ranks, host_name())).string();
  write_run_file(path, j.dump(2) + "\n");
  if (busiest) {
    log.print("links    busiest {}: peak {:.0f}% of its emulated capacity -> {}", busiest->name,
              100 * busiest_ratio, path);
  }
}

// The loop itself; train() wraps it so that a failure on one rank ends the job. `share`: the
// job's lease on its shared device (memory.share), else null.
TrainResult run(const Config& config, Session& session, RankLog& log, const RunStart& start,
                MemoryShareLease* share) {
  const RankInfo& ranks = session.ranks();
  Device& device = session.device();
  auto dataset = open_configured_dataset(config);
  LoaderOptions lo = loader_options(config, device);
  lo.world_size = ranks.size;
  lo.rank = ranks.rank;
  lo.scales = config.data.scales;
  // Every rank takes part in every step: a partial global batch would leave some without rows.
  if (ranks.size > 1) lo.drop_last = true;

  TrainingState state{0, 0, 0, config.run.seed, config.model.name};
  for (const std::string& note : start.notes) log.line(note);
  if (!start.resume.empty()) {
    state = load_checkpoint(start.resume, session.store(), session.optimizer_slot_names());
    if (state.step > config.run.steps) {
      throw ConfigError(fmt::format("checkpoint.resume: '{}' is at step {}, past run.steps={}",
                                    start.resume, state.step, config.run.steps),
                        fmt::format("set run.steps above {} to train on from it", state.step));
    }
    session.optimizer().set_steps_taken(state.step);
    lo.start = LoaderPosition{state.epoch, state.batch_in_epoch};
    log.print("resumed  {} at step {}{}", start.resume, state.step,
              state.step == config.run.steps ? " = run.steps: nothing left to train" : "");
  }
  DataLoader loader(dataset, lo);
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
  MetricsLog metrics(ranks.is_root() ? (fs::path(config.run.dir) / "metrics.jsonl").string() : "",
                     /*fresh=*/start.resume.empty());
  TrainResult result;
  double interval_loss = 0, interval_correct = 0, interval_samples = 0;
  // Labels this rank scored in the interval, and real tokens of the global batches (documents).
  double interval_labels = 0, interval_tokens = 0;
  // Documents: per step not yet drained, what turns the rank's loss (its sum over the global
  // batch's mean divisor) into the mean over its own real tokens, the number it logs (Note [The
  // mean over real tokens] in trainer/data/documents.h).
  std::map<uint64_t, double> own_mean;
  std::optional<float> grad_norm;  // of the last step drained (optim.clip_norm > 0)
  int64_t interval_steps = 0;
  auto interval_start = std::chrono::steady_clock::now();
  const auto run_start = interval_start;
  StepTrace trace(ranks.rank);
  // (steps, seconds) between drains of the metrics, for the predicted/measured comparison.
  std::vector<std::pair<int64_t, double>> timed_intervals;
  auto drained_at = std::chrono::steady_clock::now();
  int64_t drained_step = state.step;

  for (int64_t step = state.step + 1; step <= config.run.steps; ++step) {
    if (config.debug.fail_at_step == step &&
        (config.debug.fail_rank < 0 || config.debug.fail_rank == ranks.rank)) {
      throw Error(fmt::format("debug.fail_at_step: injected failure at step {}", step),
                  "remove debug.fail_at_step");
    }
    if (config.debug.stall_at_step == step &&
        (config.debug.fail_rank < 0 || config.debug.fail_rank == ranks.rank)) {
      std::fprintf(stderr, "%sdebug.stall_at_step: stopping this rank (SIGSTOP) at step %lld\n",
                   rank_prefix(ranks).c_str(), static_cast<long long>(step));
      std::fflush(stderr);
      raise(SIGSTOP);  // until killed (the other ranks' watchdog ends the job) or continued
    }
    const bool traced =
        config.run.trace && step >= config.run.trace_steps[0] && step <= config.run.trace_steps[1];
    session.executor().set_trace(traced ? &trace : nullptr);

    const uint64_t waits_before = host_waits_on_this_thread();
    Batch batch = loader.next();
    // The loader knows what comes next: plan new shapes while this step runs.
    shapes.plan_ahead(loader.position());
    shapes.before_step(batch.shape());
    // Note [Dropping oversize batches] (shape_plans.cc): the same batches on every rank.
    while (!shapes.admit(batch.shape())) {
      if (const std::string line = shapes.skip(batch.shape(), step); !line.empty()) log.line(line);
      batch.release();
      batch = loader.next();
      shapes.plan_ahead(loader.position());
      shapes.before_step(batch.shape());
    }
    for (const std::string& w : dataset->take_warnings()) log.print("{}", w);
    const float lr = schedule.at(step - 1);
    const Shape input = batch.shape();
    if (shared) shared->before_step(input, step);
    session.forward_backward({batch.input(), batch.labels(), batch.size(), input, batch.segments(),
                              batch.loss_divisor()},
                             static_cast<uint64_t>(step));
    if (const std::string line = shapes.after_step(input, step); !line.empty()) log.line(line);
    session.reduce_gradients();
    session.update(lr);
    session.executor().stage_metrics(static_cast<uint64_t>(step), session.grad_norm_sq());
    const int64_t samples = batch.size() * ranks.size;
    interval_labels += static_cast<double>(batch.labelled());
    if (config.data.documents && batch.labelled() > 0) {
      own_mean[static_cast<uint64_t>(step)] =
          static_cast<double>(batch.loss_divisor()) / static_cast<double>(batch.labelled());
    }
    // Documents: the global batch's real tokens (Note [The mean over real tokens]).
    interval_tokens += static_cast<double>(batch.loss_divisor()) * ranks.size;
    batch.release_after(compute_done(device));
    result.steps = step;
    interval_samples += static_cast<double>(samples);

    const bool logging = step % config.run.log_every == 0 || step == config.run.steps;
    // Every checkpoint.every steps, and the last step, so a finished run leaves its weights.
    const bool checkpointing = config.checkpoint.every > 0 &&
                               (step % config.checkpoint.every == 0 || step == config.run.steps);
    if (logging || checkpointing || traced) {
      // The one host wait (Note [No host wait inside a step]).
      for (StagedMetrics m : session.executor().drain_metrics()) {
        if (!std::isfinite(m.loss)) {
          throw Error(fmt::format("the loss became {} at step {}", m.loss, m.step),
                      "lower optim.lr, add optim.warmup_steps, or check the data normalisation");
        }
        if (auto it = own_mean.find(m.step); it != own_mean.end()) {
          m.loss = static_cast<float>(m.loss * it->second);
          own_mean.erase(it);
        }
        if (m.step == static_cast<uint64_t>(state.step + 1)) result.first_loss = m.loss;
        result.last_loss = m.loss;
        interval_loss += m.loss;
        interval_correct += m.correct;
        ++interval_steps;
        grad_norm = m.grad_norm;
      }
      const auto now = std::chrono::steady_clock::now();
      timed_intervals.emplace_back(step - drained_step,
                                   std::chrono::duration<double>(now - drained_at).count());
      shapes.interval(timed_intervals.back().second);
      if (shared) shared->drained(timed_intervals.back().first, timed_intervals.back().second);
      drained_at = now;
      drained_step = step;
    } else {
      result.unlogged_step_host_waits += host_waits_on_this_thread() - waits_before;
    }

    if (traced) {
      trace_reductions(session, trace);
      if (step == config.run.trace_steps[1] || step == config.run.steps) {
        session.executor().set_trace(nullptr);
        const std::string path =
            (fs::path(config.run.dir) / fmt::format("trace_rank{}.json", ranks.rank)).string();
        trace.write(path);
        log.print("trace    steps {}-{} -> {} (open in ui.perfetto.dev)", config.run.trace_steps[0],
                  step, path);
      }
    }
    if (logging) {
      const auto now = std::chrono::steady_clock::now();
      const double seconds = std::chrono::duration<double>(now - interval_start).count();
      StepReport r;
      r.step = step;
      r.steps = config.run.steps;
      r.loss = interval_loss / static_cast<double>(interval_steps);
      // Correct counts are this rank's, over the labels it scored (one per sample, one per
      // token for a token model, one per real token of documents).
      r.accuracy = interval_correct / std::max(1.0, interval_labels);
      r.lr = lr;
      r.samples_per_s = interval_samples / std::max(seconds, 1e-9);
      r.device_peak_bytes = device.memory().stats().peak;
      r.device_capacity = device.memory().capacity();
      r.elapsed_s = std::chrono::duration<double>(now - run_start).count();
      if (!config.data.scales.empty() || config.data.documents) r.shape = input.str();
      if (config.data.documents) r.tokens_per_s = interval_tokens / std::max(seconds, 1e-9);
      log.line(progress_line(r));
      // The logged step's gradient norm before clipping, as nanoGPT logs it.
      nlohmann::json extra = {{"shape", input.dims()}, {"budget", session.executor().budget()}};
      if (shared) extra.update(shared->fields());
      if (config.data.documents) extra["tokens_per_s"] = r.tokens_per_s;
      if (const Program* p = shapes.program(input)) {
        extra["planned_peak_bytes"] = p->plan.peak_bytes();
        extra["shape_peak_bytes"] = shapes.measured_peak(*p);
      }
      if (config.memory.oversize == OversizeAction::kSkip) {
        extra["oversize_skipped"] = shapes.skipped_batches();
      }
      if (grad_norm) extra["grad_norm"] = *grad_norm;
      metrics.write(r, extra);
      interval_loss = interval_correct = interval_samples = interval_labels = interval_tokens = 0;
      interval_steps = 0;
      interval_start = now;
    }
    if (checkpointing && ranks.is_root()) {
      const LoaderPosition next = loader.position();
      const std::string path = checkpoint_path(config.checkpoint.dir, step);
      save_checkpoint(
          path, session.store(), session.optimizer_slot_names(),
          TrainingState{step, next.epoch, next.batch, config.run.seed, config.model.name});
      prune_checkpoints(config.checkpoint.dir, config.checkpoint.keep);
      log.print("saved    {}", path);
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
  log.line(shapes.end_line());
  if (shared) log.line(shared->end_line());
  if (!session.link_usage().empty()) {
    session.communicator().barrier();  // every rank's copies are through
    if (speaks_for_node(ranks)) write_link_usage(config, ranks, session.link_usage(), log);
  }
  report_timing(log, session, config, plan, timed_intervals, result, shapes);
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
  const std::string resolved = to_yaml(config);
  log.line(resolved);
  if (ranks.is_root())
    write_run_file((fs::path(config.run.dir) / "config.yaml").string(), resolved);
  // memory.share: admitted by the node's job ledger, the job plans within its grant.
  std::unique_ptr<MemoryShareLease> share;
  Config granted = config;
  if (config.memory.share) {
    // A CUDA rank's GPU by its bus id, from the placement the session will make again.
    std::optional<PciAddress> gpu;
    if (config.device.backend == Backend::kCuda)
      gpu = place_this_rank(config, ranks).binding.gpu_pci;
    share = std::make_unique<MemoryShareLease>(
        config, ranks, share_curve(config), [&](const std::string& s) { log.line(s); }, gpu);
    granted.memory.budget = share->budget();
  }
  Session session(granted, ranks, /*training=*/true);
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
