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
  log.print("data     {}, batch {} per rank ({} global)", data.describe(), config.data.batch_size,
            config.data.batch_size * ranks.size);
  log.print("memory   weights {}, gradients {}, optimizer {}, buffers {}",
            format_bytes(bytes.weights), format_bytes(bytes.gradients),
            format_bytes(bytes.optimizer), format_bytes(bytes.buffers));
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
      "cost     {}; predicted step {:.4f}s (stall {:.4f}s)",
      profile ? describe_profile(*profile) : std::string("FLOP model (memory.measure: false)"),
      plan.prediction.step_seconds, plan.prediction.stall_seconds);
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

}  // namespace ferry
