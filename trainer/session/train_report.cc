// What a training run reports beyond its progress lines: the start-up banner, the trace's
// all-reduce spans and the links' usage.
#include "trainer/session/train_report.h"

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/bytes.h"
#include "trainer/configured/model.h"
#include "trainer/model/zoo/zoo.h"
#include "trainer/plan/planning.h"
#include "trainer/session/node_files.h"
#include "trainer/session/rank_placement.h"
#include "trainer/session/run_dir.h"

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

}  // namespace

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
  log.print("data     {}, {}", data.describe(), batch_text(config, ranks.size));
  log.print("memory   weights {}, gradients {}{}, optimizer {}, buffers {}{}",
            format_bytes(bytes.weights), format_bytes(bytes.gradients),
            session.store().accumulation_block() ? " (with the accumulation block)" : "",
            format_bytes(bytes.optimizer), format_bytes(bytes.buffers),
            bytes.working_weights > 0
                ? fmt::format(", bf16 working weights {}", format_bytes(bytes.working_weights))
                : std::string());
  log.print("dtypes   precision {}, all-reduce in {}; the step's tensors: {}",
            to_string(config.device.precision), to_string(config.comm.dtype),
            dtype_bytes_text(tape_dtype_bytes(plan.tape)));
  if (!session.model_state_line().empty()) log.line(session.model_state_line());
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
      "cost     {}; predicted step {:.4f}s (stall {:.4f}s){}",
      profile ? describe_profile(*profile) : std::string("FLOP model (memory.measure: false)"),
      plan.prediction.step_seconds, plan.prediction.stall_seconds,
      session.model_state_seconds() > 0
          ? fmt::format(", host optimizer {:.4f}s per update", session.model_state_seconds())
          : std::string());
}

std::string batch_text(const Config& config, int ranks) {
  const int64_t b = config.data.batch_size, n = config.optim.accumulate;
  if (n == 1) return fmt::format("batch {} per rank ({} global)", b, b * ranks);
  return fmt::format("batch {} per rank x {} micro-batches x {} rank{} = {} per update", b, n,
                     ranks, ranks == 1 ? "" : "s", b * n * ranks);
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

// Steps (updates) are timed per logging interval (the host waits for the device only there).
// An update of optim.accumulate micro-batches is predicted as that many plan steps.
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
  // memory.optimizer host: plus the update's copies and host work, once per update.
  const double predicted =
      (shapes.shape_count() > 1 ? shapes.predicted_mean_step() : plan.prediction.step_seconds) *
          static_cast<double>(config.optim.accumulate) +
      session.model_state_seconds();
  const char* model = session.cost_profile() ? "measured" : "FLOP";
  log.print(
      "timing   step {:.4f}s measured (mean of {} step{}{}), {:.4f}s predicted by the {} cost "
      "model (predicted/measured {:.2f})",
      measured, counted, counted == 1 ? "" : "s", skip ? " after the first logging interval" : "",
      predicted, model, measured > 0 ? predicted / measured : 0.0);
  const DeviceProfile* profile = session.cost_profile();
  const std::string off =
      timing_mismatch(predicted, measured, profile != nullptr, profile ? profile->cache_path : "");
  if (!off.empty()) log.print("timing   {}", off);
  if (!session.ranks().is_root()) return;
  nlohmann::json j = {
      {"model", config.model.name},
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
      {"predicted_model_state_s", session.model_state_seconds()},
      {"predicted_compute_s", plan.prediction.compute_seconds},
      {"cost_model", session.cost_profile() ? "measured" : "flops"},
      {"planned_peak_bytes", plan.peak_bytes()},
      {"device_peak_bytes", result.device_peak_bytes},
      {"offload_bytes", plan.offload_bytes},
      {"plan_waited_steps", result.plan_waited_steps},
      {"shapes", shapes.summary()},
      {"oversize_skipped", result.oversize_skipped},
      {"skipped_shapes", shapes.skipped_summary()},
      {"accumulate", config.optim.accumulate},
      {"effective_batch", config.data.batch_size * config.optim.accumulate * session.ranks().size},
      // Rank 0's persistent device bytes by class (Note [Model state per rank]).
      {"weights_bytes", session.store().bytes().weights},
      {"gradients_bytes", session.store().bytes().gradients},
      {"optimizer_bytes", session.store().bytes().optimizer}};
  // Note [Accumulating micro-batches]: one reduction per update, counted.
  if (const GradientBuckets* b = session.gradient_buckets()) {
    j["gradient_reductions"] = b->reductions();
    j["allreduce_calls"] = b->collectives();
    j["overlapped_buckets"] = b->overlapped_buckets();
  }
  // The last update's parameter all-gather (Note [Sharded master weights]: bf16 moves half).
  if (const ModelStateStep* m = session.model_state_step()) {
    j["gathered_bytes"] = m->gathered_bytes();
    j["working_weights_bytes"] = session.store().bytes().working_weights;
  }
  if (const DeviceProfile* p = session.cost_profile()) {
    j["cost_profile"] = {{"kernels", p->kernels},
                         {"from_cache", p->from_cache},
                         {"not_timed", p->failed},
                         {"steps_measured", p->steps_measured},
                         {"steps", p->steps_total},
                         {"d2h_gbps", p->link_gbps_to_host},
                         {"h2d_gbps", p->link_gbps_to_device},
                         {"host_update_gbps", p->host_update_gbps},
                         {"seconds", p->seconds},
                         {"cache", p->cache_path}};
  }
  write_run_file((fs::path(config.run.dir) / "summary.json").string(), j.dump(2) + "\n");
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

}  // namespace ferry
