// Planning every rank of a described server and running the node simulator.
#include "trainer/simulate/simulation.h"
#include "trainer/configured/model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/bucket_plan.h"
#include "common/error.h"
#include "links/link_capacities.h"
#include "topology/load.h"
#include "trainer/config/enums.h"
#include "trainer/model/zoo/zoo.h"
#include "trainer/plan/planning.h"

namespace ferry {

namespace {

std::string scheduler_name(const Config& config) {
  return std::string(to_string(config.topology.scheduler));
}

// Gradient buckets in launch order (PyTorch DDP's rule, comm/bucket_plan), each ready after the
// planned step that produces its last gradient.
std::vector<SimBucket> gradient_buckets(const Config& config, const Lowered& lowered,
                                        const MemoryPlan& plan) {
  const Graph graph = build_configured_model(config, 1);
  std::vector<GradSlice> slices;
  std::vector<int> ready;
  std::map<TensorId, size_t> slice_of;  // a tied weight is one slice, ready at its last writer
  uint64_t offset = 0;
  for (size_t s = 0; s < plan.tape.steps.size(); ++s) {
    if (plan.tape.steps[s].phase != StepPhase::kBackward) continue;
    const int origin = plan.origin[s];
    for (int slot : lowered.bindings[static_cast<size_t>(origin)].grad_params) {
      if (!is_persistent_slot(slot)) continue;
      const TensorId param = persistent_id(slot);
      if (auto it = slice_of.find(param); it != slice_of.end()) {
        ready[it->second] = static_cast<int>(s);
        continue;
      }
      const uint64_t bytes = graph.tensor(param).desc.bytes();
      slice_of.emplace(param, slices.size());
      slices.push_back({offset, bytes});
      ready.push_back(static_cast<int>(s));
      offset += bytes;
    }
  }
  std::vector<size_t> order(slices.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto cap = static_cast<uint64_t>(config.comm.bucket_mb * 1024 * 1024);
  std::vector<SimBucket> out;
  for (const Bucket& b : assign_buckets(slices, order, std::max<uint64_t>(cap, 1))) {
    // comm.dtype bf16: buckets cut by the fp32 gradients' bytes cross the wire at 2 bytes each.
    SimBucket sb{b.bytes / sizeof(float) * dtype_size(narrow_dtype(config.comm.dtype)), 0};
    for (size_t p : b.params) sb.ready_after = std::max(sb.ready_after, ready[p]);
    out.push_back(sb);
  }
  return out;
}

// A tape step's name in the executor's trace ("fwd conv1"; trainer/exec/executor.cc).
std::string traced_name(const TapeStep& s) {
  static constexpr const char* kPhase[] = {"load", "fwd", "bwd", "acc", "update", "recompute"};
  return fmt::format("{} {}", kPhase[static_cast<int>(s.phase)], s.name);
}

// The mean duration in seconds of each compute span of `file` (a trainer trace), by name.
std::map<std::string, double> traced_step_seconds(const std::string& file) {
  std::ifstream in(file);
  if (!in)
    throw ConfigError(fmt::format("--emulated: cannot read '{}'", file),
                      "train with run.trace=true into that run directory first");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("--emulated: '{}' is not a trace: {}", file, e.what()), "");
  }
  std::map<std::string, std::pair<double, int>> sum;
  for (const auto& e : j.value("traceEvents", nlohmann::json::array())) {
    if (e.value("ph", "") != "X" || e.value("tid", 0) != 1) continue;  // the compute track
    auto& [s, n] = sum[e.value("name", "")];
    s += e.value("dur", 0.0) * 1e-6;
    ++n;
  }
  std::map<std::string, double> out;
  for (const auto& [name, sn] : sum) out[name] = sn.first / sn.second;
  return out;
}

// Rank `r`'s step times measured by the emulation in `dir`. A load step's span is its input
// upload over the emulated link, which the simulator moves as a copy instead: it computes for 0.
std::vector<double> measured_step_seconds(const std::string& dir, size_t r, const Tape& tape) {
  const std::string file =
      (std::filesystem::path(dir) / fmt::format("trace_rank{}.json", r)).string();
  const std::map<std::string, double> spans = traced_step_seconds(file);
  std::vector<double> out;
  for (const TapeStep& s : tape.steps) {
    if (s.phase == StepPhase::kLoad) {
      out.push_back(0);
      continue;
    }
    const auto it = spans.find(traced_name(s));
    if (it == spans.end())
      throw ConfigError(fmt::format("--emulated: '{}' has no step '{}': it traced another plan",
                                    file, traced_name(s)),
                        "simulate the config of that run (its config.yaml)");
    out.push_back(it->second);
  }
  return out;
}

}  // namespace

SimRank simulated_rank(const MemoryPlan& plan, const CostModel& cost, const std::vector<int>& path,
                       const std::string& name, bool names) {
  SimRank rank;
  rank.name = name;
  for (const TapeStep& s : plan.tape.steps) {
    rank.step_seconds.push_back(cost.step_seconds(s, plan.tape));
    if (names) rank.step_names.push_back(s.name);
  }
  rank.transfers = plan_transfers(plan);
  rank.path = path;
  return rank;
}

SimulationReport simulate_config(const Config& base, const SimulateOptions& o) {
  Config config = base;
  if (!o.scheduler.empty()) {
    const auto k = from_string<LinkSchedulerKind>(o.scheduler);
    if (!k && o.scheduler != "topology")
      throw ConfigError(fmt::format("--scheduler: unknown scheduler '{}'", o.scheduler),
                        "use fifo or topology");
    if (k) config.topology.scheduler = *k;
  }
  const bool emulated = !o.emulated_run.empty();
  if (emulated && !o.hardware.empty())
    throw ConfigError("--emulated: the emulation's own times replace --hardware",
                      "give one of --emulated and --hardware");
  int gpus = o.gpus;
  if (emulated && gpus == 0) {  // the ranks that traced
    while (std::filesystem::exists(std::filesystem::path(o.emulated_run) /
                                   fmt::format("trace_rank{}.json", gpus)))
      ++gpus;
  }
  Server server = load_server(config, o.topology_file, gpus, o.hardware);
  SimulationReport rep;
  rep.topology = server.topology.name();
  rep.hardware = server.profile ? server.profile->name
                 : emulated     ? "CPU emulation measured in " + o.emulated_run
                                : "config cost model";
  // --scheduler overrides the config's topology.scheduler.
  const bool topology = o.scheduler == "topology" || scheduler_name(config) == "topology";
  rep.scheduler = topology ? "topology" : scheduler_name(config);
  rep.policy = config.memory.policy;
  rep.batch = config.data.batch_size;
  rep.link_kinds = server.links.kinds;
  rep.precision = std::string(to_string(config.device.precision));
  rep.comm_dtype = std::string(to_string(config.comm.dtype));

  OfflinePlanner planner(config);
  CostModel cost =
      server.profile ? profile_cost(*server.profile, config.device.precision) : cost_model(config);
  const size_t n = server.bindings.size();
  // Note [Model state per rank] for the whole job; auto resolved as training resolves it.
  const int job_ranks = static_cast<int>(n) * o.nodes;
  planner.set_ranks(job_ranks);
  if (config.memory.zero == ZeroStage::kAuto ||
      config.memory.optimizer == OptimizerPlacement::kAuto) {
    planner.set_cost(cost);
    planner.resolve_model_state(config.memory.policy, config.data.batch_size);
  }
  NodeSimInput& in = rep.input;
  in.links = server.links.links;
  in.ring = server.links.ring;
  if (emulated) {
    // The ledger's capacities (session.cc); the ranks' all-reduce goes through MPI, not links.
    LinkOptions lo;
    lo.default_pcie_gbps = config.topology.unknown_link_gbps;
    const std::vector<LinkCapacity> caps =
        link_capacities(LinkMap(server.topology, lo), config.topology.duplex_factor,
                        config.topology.emulation_scale);
    for (size_t l = 0; l < in.links.size(); ++l) in.links[l].capacity = caps.at(l);
    in.ring.clear();
  }
  if (o.nodes > 1) {
    // Note [Rings across nodes] in sim/node_links.h: one node simulated, its rings leaving it
    // through its NICs.
    if (emulated) {
      throw ConfigError("--nodes: the CPU emulation ran on one node",
                        "simulate a described server (--hardware) across nodes instead");
    }
    LinkOptions lo;
    lo.default_pcie_gbps = config.topology.unknown_link_gbps;
    NodeLinks crossing = server.links;
    in.ring = cross_node_rings(server.topology, server.bindings, crossing,
                               server.profile ? server.profile->nic_gbps : 0.0, lo);
    in.links = crossing.links;
    rep.link_kinds = crossing.kinds;
    in.job_ranks = static_cast<int>(n) * o.nodes;
  }
  rep.nodes = o.nodes;
  in.topology_scheduler = topology;
  in.chunk_bytes = o.chunk_bytes > 0 ? o.chunk_bytes
                                     : static_cast<uint64_t>(config.topology.chunk_mb * 1048576.0);
  in.trace = o.trace;
  const ShapeSchedule schedule = o.shapes.empty()
                                     ? shape_schedule(config, static_cast<int>(n) * o.nodes)
                                     : parse_shape_schedule(config, o.shapes, "--shapes");
  if (emulated && schedule.shapes.size() > 1)
    throw ConfigError("--emulated: the emulation traced the steps of one input shape",
                      "simulate it with data.scales=[] and without --shapes");
  rep.schedule = schedule.source;
  rep.per_shape = config.memory.per_shape;
  // memory.per_shape false: every shape takes the decisions of the schedule's largest.
  planner.set_static_input(schedule.largest().input);
  const NodeSimInput node = in;
  ModelStateSteps state_steps;
  state_steps.bucket_bytes = static_cast<uint64_t>(config.comm.bucket_mb * 1048576.0);
  state_steps.slots = planner.model_state_inputs().slots;
  state_steps.host_update_gbps = cost.host_update_gbps;
  for (const ScheduledShape& shape : schedule.shapes) {
    NodeSimInput sin = node;
    ShapeSimulation sim;
    sim.shape = shape;
    std::map<double, MemoryPlan> plans;  // by assumed link rate
    for (size_t r = 0; r < n; ++r) {
      // Under --scheduler topology, auto plans contention-aware, as the config's
      // topology.scheduler: topology makes it do in training (unless --planning says otherwise).
      std::optional<bool> aware = o.contention_aware;
      if (!aware && topology && config.memory.policy == MemoryPolicy::kAuto) aware = true;
      const AssumedLink a = assumed_link(config, server.links, static_cast<int>(r), aware);
      if (rep.assumed.size() < n) rep.assumed.push_back(a);
      auto it = plans.find(a.gbps);
      if (it == plans.end()) {
        CostModel c = cost;
        c.link_gbps = emulated ? a.gbps / config.topology.emulation_scale : a.gbps;
        planner.set_cost(c);
        planner.set_contention_aware(a.contention_aware);
        it = plans.emplace(a.gbps, planner.plan_shape(config.memory.policy, shape.input)).first;
      }
      const MemoryPlan& plan = it->second;
      SimRank rank = simulated_rank(plan, cost, server.links.paths[r],
                                    fmt::format("GPU{}", server.links.gpus[r]), o.trace);
      if (emulated) {
        rank.step_seconds = measured_step_seconds(o.emulated_run, r, plan.tape);
        // The input batch crosses the link before its load step ends (Executor::run_step).
        for (size_t s = 0; s < plan.tape.steps.size(); ++s) {
          const TapeStep& step = plan.tape.steps[s];
          if (step.phase != StepPhase::kLoad) continue;
          uint64_t bytes = 0;
          for (int w : step.writes) bytes += plan.tape.tensors[static_cast<size_t>(w)].bytes;
          rank.transfers.insert(
              rank.transfers.begin(),
              SimTransfer{false, bytes, static_cast<int>(s) - 1, static_cast<int>(s)});
        }
      }
      sin.ranks.push_back(std::move(rank));
      if (r == 0) {
        sim.peak_bytes = plan.peak_bytes();
        sim.offload_bytes = plan.offload_bytes;
        sim.recompute_flops = plan.recompute_flops;
        sim.planned = plan.prediction;
        if (n > 1 || o.nodes > 1 ||
            planner.model_state().choice.optimizer == OptimizerPlacement::kHost)
          sin.buckets = gradient_buckets(config, planner.lowered_shape(shape.input), plan);
        for (size_t s = 0; s < plan.tape.steps.size(); ++s) {
          if (plan.tape.steps[s].phase != StepPhase::kForward) continue;
          state_steps.first_forward = static_cast<int>(s);
          break;
        }
      }
    }
    if (!emulated && planner.model_state().choice.optimizer == OptimizerPlacement::kDevice) {
      // Note [The device update's cost]; an emulation's update step was measured.
      rep.device_update_bytes = device_update_bytes(planner.model_state(), state_steps.slots,
                                                    config.device.precision == Precision::kBf16);
      rep.memory_gbps = cost.memory_gbps;
      rep.device_update_seconds =
          add_device_update(sin.ranks, sin.update_step, rep.device_update_bytes, cost.memory_gbps);
    }
    rep.model_state = add_model_state_traffic(sin, planner.model_state(), job_ranks, state_steps);
    sim.result = simulate_node(sin);
    sim.samples_per_s = sim.result.step_seconds > 0
                            ? static_cast<double>(config.data.batch_size) * static_cast<double>(n) *
                                  static_cast<double>(o.nodes) / sim.result.step_seconds
                            : 0;
    if (&shape == &schedule.largest()) {
      rep.tensor_bytes = tape_dtype_bytes(planner.lowered_shape(shape.input).tape);
      rep.input = std::move(sin);
      rep.result.spans = sim.result.spans;
      rep.result.samples = sim.result.samples;
    }
    sim.result.spans.clear();
    sim.result.samples.clear();
    rep.shapes.push_back(std::move(sim));
  }
  // Note [Simulating a shape schedule]: means over the schedule.
  NodeSimResult& mean = rep.result;
  mean.ranks.assign(n, SimRankStats{});
  mean.links.assign(rep.input.links.size(), SimLinkStats{});
  for (const ShapeSimulation& sim : rep.shapes) {
    const double w = sim.shape.weight;
    const NodeSimResult& r = sim.result;
    mean.step_seconds += w * r.step_seconds;
    mean.stall_seconds += w * r.stall_seconds;
    mean.allreduce_bytes += w * r.allreduce_bytes;
    mean.reduce_scatter_bytes += w * r.reduce_scatter_bytes;
    mean.all_gather_bytes += w * r.all_gather_bytes;
    for (size_t k = 0; k < n; ++k) {
      mean.ranks[k].step_seconds += w * r.ranks[k].step_seconds;
      mean.ranks[k].compute_seconds += w * r.ranks[k].compute_seconds;
      mean.ranks[k].stall_seconds += w * r.ranks[k].stall_seconds;
      mean.ranks[k].copy_bytes += w * r.ranks[k].copy_bytes;
    }
    for (size_t l = 0; l < mean.links.size(); ++l) {
      mean.links[l].to_host_bytes += w * r.links[l].to_host_bytes;
      mean.links[l].to_device_bytes += w * r.links[l].to_device_bytes;
      mean.links[l].busy_seconds += w * r.links[l].busy_seconds;
    }
    rep.peak_bytes = std::max(rep.peak_bytes, sim.peak_bytes);
    rep.offload_bytes += static_cast<uint64_t>(w * static_cast<double>(sim.offload_bytes));
    rep.recompute_flops += w * sim.recompute_flops;
    rep.planned.step_seconds += w * sim.planned.step_seconds;
    rep.planned.stall_seconds += w * sim.planned.stall_seconds;
    rep.planned.compute_seconds += w * sim.planned.compute_seconds;
  }
  rep.samples_per_s = mean.step_seconds > 0
                          ? static_cast<double>(config.data.batch_size) * static_cast<double>(n) *
                                static_cast<double>(o.nodes) / mean.step_seconds
                          : 0;
  return rep;
}

}  // namespace ferry
