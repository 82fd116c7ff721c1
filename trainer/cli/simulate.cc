// `trainer simulate`: one training step of a config on a described server, on a virtual clock
// (trainer/simulate/simulation.h), as means over the input shapes training draws; --json for
// scripts, --trace for a Chrome trace (Note [What trainer simulate prints]).
#include <algorithm>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/bytes.h"
#include "common/error.h"
#include "common/file_write.h"
#include "trainer/cli/commands.h"
#include "trainer/cli/simulate_options.h"
#include "trainer/config/config.h"

// Note [What trainer simulate prints]
// Step and stall time, samples/s of the whole job, and what every link carried, as means over
// the input shapes training draws (a table per shape when there are several).

namespace ferry {

namespace {

// Note [Model state on the node] (sim/node_sim.h): absent under zero 0 with the optimizer on the
// device, so those reports read as before.
nlohmann::json state_json(const ModelStateTraffic& t, const NodeSimResult& res) {
  const ModelState& s = t.state;
  const char* zero = s.choice.zero == ZeroStage::k0   ? "0"
                     : s.choice.zero == ZeroStage::k1 ? "1"
                                                      : "2";
  return {{"zero", zero},
          {"optimizer", s.choice.optimizer == OptimizerPlacement::kHost ? "host" : "device"},
          {"ranks", t.job_ranks},
          {"weights_bytes", s.weights},
          {"gradients_bytes", s.gradients},
          {"optimizer_bytes", s.optimizer},
          {"host_bytes", s.host_bytes()},
          {"allreduce_bytes", res.allreduce_bytes},
          {"reduce_scatter_bytes", res.reduce_scatter_bytes},
          {"all_gather_bytes", res.all_gather_bytes},
          {"to_host_bytes", t.to_host_bytes},
          {"to_device_bytes", t.to_device_bytes},
          {"host_update_s", t.host_update_seconds}};
}

double utilisation(const NamedLink& l, const SimLinkStats& s, double seconds) {
  if (seconds <= 0) return 0;
  const double out = s.to_host_bytes / (l.capacity.to_host_gbps * 1e9 * seconds);
  const double in = s.to_device_bytes / (l.capacity.to_device_gbps * 1e9 * seconds);
  return std::max(out, in);
}

}  // namespace

int run_simulate(const SimulateArgs& args) {
  if (!args.mix.empty()) return run_simulate_mix(args);
  if (args.config.empty())
    throw ConfigError("simulate: give a CONFIG or --mix FILE",
                      "trainer simulate CONFIG [options], or trainer simulate --mix FILE");
  const Config config = load_config(args.config, args.overrides);
  const SimulateOptions o = parse_simulate_options(args);
  const SimulationReport rep = simulate_config(config, o);
  const NodeSimResult& res = rep.result;
  const double step = res.step_seconds;

  if (!args.trace.empty()) {
    write_file(args.trace, chrome_trace(rep.input, res),
               "--trace: give a path on a filesystem with space, in a writable directory");
  }
  if (args.json) {
    nlohmann::json links = nlohmann::json::array();
    for (size_t l = 0; l < rep.input.links.size(); ++l) {
      const NamedLink& link = rep.input.links[l];
      const SimLinkStats& s = res.links[l];
      links.push_back(
          {{"name", link.name},
           {"kind", rep.link_kinds[l]},
           {"capacity_gbps", std::min(link.capacity.to_host_gbps, link.capacity.to_device_gbps)},
           {"to_host_gbps", link.capacity.to_host_gbps},
           {"to_device_gbps", link.capacity.to_device_gbps},
           {"duplex_factor", link.capacity.duplex_factor},
           {"bytes", s.to_host_bytes + s.to_device_bytes},
           {"to_host_bytes", s.to_host_bytes},
           {"to_device_bytes", s.to_device_bytes},
           {"busy_s", s.busy_seconds},
           {"utilisation", utilisation(link, s, step)}});
    }
    nlohmann::json ranks = nlohmann::json::array();
    for (size_t r = 0; r < rep.input.ranks.size(); ++r) {
      ranks.push_back({{"name", rep.input.ranks[r].name},
                       {"step_s", res.ranks[r].step_seconds},
                       {"compute_s", res.ranks[r].compute_seconds},
                       {"stall_s", res.ranks[r].stall_seconds},
                       {"copy_bytes", res.ranks[r].copy_bytes},
                       {"assumed_link_gbps", rep.assumed[r].gbps},
                       {"contention_aware", rep.assumed[r].contention_aware},
                       {"assumed_link_why", rep.assumed[r].why}});
    }
    nlohmann::json out = {{"model", config.model.name},
                          {"topology", rep.topology},
                          {"hardware", rep.hardware},
                          {"gpus", rep.input.ranks.size()},
                          {"batch_per_gpu", rep.batch},
                          {"policy", policy_name(rep.policy)},
                          {"scheduler", rep.scheduler},
                          {"precision", rep.precision},
                          {"comm_dtype", rep.comm_dtype},
                          {"tensor_bytes",
                           {{"bf16", rep.tensor_bytes.bf16},
                            {"fp32", rep.tensor_bytes.f32},
                            {"other", rep.tensor_bytes.other},
                            {"workspace", rep.tensor_bytes.workspace}}},
                          {"budget_bytes", config.memory.budget},
                          {"step_s", step},
                          {"stall_s", res.stall_seconds},
                          {"samples_per_s", rep.samples_per_s},
                          {"peak_bytes", rep.peak_bytes},
                          {"offload_bytes", rep.offload_bytes},
                          {"recompute_flops", rep.recompute_flops},
                          {"allreduce_bytes", res.allreduce_bytes},
                          {"planned_step_s", rep.planned.step_seconds},
                          {"ranks", ranks},
                          {"links", links}};
    if (rep.nodes > 1) out["nodes"] = rep.nodes;  // gpus is per node
    if (rep.model_state.active()) out["model_state"] = state_json(rep.model_state, res);
    if (rep.device_update_bytes > 0) {
      out["device_update"] = {{"bytes", rep.device_update_bytes},
                              {"memory_gbps", rep.memory_gbps},
                              {"s", rep.device_update_seconds}};
    }
    // Note [Simulating a shape schedule]: the figures above are its means.
    nlohmann::json shapes = nlohmann::json::array();
    for (const ShapeSimulation& sim : rep.shapes) {
      shapes.push_back({{"input", sim.shape.input.dims()},
                        {"size", sim.shape.size},
                        {"weight", sim.shape.weight},
                        {"step_s", sim.result.step_seconds},
                        {"stall_s", sim.result.stall_seconds},
                        {"samples_per_s", sim.samples_per_s},
                        {"peak_bytes", sim.peak_bytes},
                        {"offload_bytes", sim.offload_bytes},
                        {"recompute_flops", sim.recompute_flops},
                        {"planned_step_s", sim.planned.step_seconds}});
    }
    out["schedule"] = rep.schedule;
    out["per_shape"] = rep.per_shape;
    out["shapes"] = std::move(shapes);
    std::printf("%s\n", out.dump(2).c_str());
    check_stdout();
    return 0;
  }
  const std::string nodes = rep.nodes > 1 ? fmt::format(" on each of {} nodes", rep.nodes) : "";
  std::printf("simulate: %s, batch %lld per GPU, %zu GPUs of %s%s, hardware %s\n",
              config.model.name.c_str(), static_cast<long long>(rep.batch), rep.input.ranks.size(),
              rep.topology.c_str(), nodes.c_str(), rep.hardware.c_str());
  std::printf("memory.policy %s, memory.budget %s, scheduler %s\n",
              std::string(policy_name(rep.policy)).c_str(),
              format_bytes(config.memory.budget).c_str(), rep.scheduler.c_str());
  std::printf("precision %s, all-reduce in %s; the step's tensors: %s\n", rep.precision.c_str(),
              rep.comm_dtype.c_str(), dtype_bytes_text(rep.tensor_bytes).c_str());
  if (rep.model_state.active()) {
    const ModelStateTraffic& t = rep.model_state;
    const ModelState& s = t.state;
    std::printf(
        "model state: %s on %d rank%s: per rank weights %s, gradients %s, optimizer %s on the "
        "device, %s on the host\n",
        describe(s.choice).c_str(), t.job_ranks, t.job_ranks == 1 ? "" : "s",
        format_bytes(s.weights).c_str(), format_bytes(s.gradients).c_str(),
        format_bytes(s.optimizer).c_str(), format_bytes(s.host_bytes()).c_str());
    const auto b = [](double x) { return format_bytes(static_cast<uint64_t>(x)); };
    std::printf(
        "moved per rank and step: all-reduce %s, reduce-scatter %s, all-gather %s sent; "
        "gradients to host %s, parameters to device %s; host update %.4f s\n",
        b(res.allreduce_bytes).c_str(), b(res.reduce_scatter_bytes).c_str(),
        b(res.all_gather_bytes).c_str(), format_bytes(t.to_host_bytes).c_str(),
        format_bytes(t.to_device_bytes).c_str(), t.host_update_seconds);
  }
  if (rep.device_update_bytes > 0) {
    std::printf("optimizer update on the device: %s per rank at %.0f GB/s, %.4f s\n",
                format_bytes(rep.device_update_bytes).c_str(), rep.memory_gbps,
                rep.device_update_seconds);
  }
  const bool several = rep.shapes.size() > 1;
  std::printf(
      "plan (GPU 0): peak %s, offload %s per step, recompute %.3g GF; planner alone: %.4f s%s\n",
      format_bytes(rep.peak_bytes).c_str(), format_bytes(rep.offload_bytes).c_str(),
      rep.recompute_flops / 1e9, rep.planned.step_seconds,
      several ? " (largest peak; the rest are means over the shapes)" : "");
  if (several) {
    // Note [Simulating a shape schedule] (trainer/simulate/simulation.h).
    std::printf("\nshapes: %s; %s\n", rep.schedule.c_str(),
                rep.per_shape || rep.policy != MemoryPolicy::kAuto
                    ? "a plan per shape"
                    : "one static plan: the largest shape's decisions for every shape "
                      "(memory.per_shape false)");
    std::printf("%-22s %7s %12s %12s %12s %10s %10s %10s %12s\n", "input", "weight", "peak",
                "offload", "recompute", "planned s", "step s", "stall s", "samples/s");
    for (const ShapeSimulation& sim : rep.shapes) {
      std::printf("%-22s %7.3f %12s %12s %9.3g GF %10.4f %10.4f %10.4f %12.1f\n",
                  sim.shape.input.str().c_str(), sim.shape.weight,
                  format_bytes(sim.peak_bytes).c_str(), format_bytes(sim.offload_bytes).c_str(),
                  sim.recompute_flops / 1e9, sim.planned.step_seconds, sim.result.step_seconds,
                  sim.result.stall_seconds, sim.samples_per_s);
    }
  }
  std::printf("\n%sstep %.4f s, stall %.4f s (mean per GPU), %.1f samples/s (whole job)\n\n",
              several ? "mean over the shapes: " : "", step, res.stall_seconds, rep.samples_per_s);
  std::printf("%-8s %10s %10s %10s %12s  %s\n", "rank", "step s", "stall s", "link GB/s", "copied",
              "planned against");
  for (size_t r = 0; r < rep.input.ranks.size(); ++r) {
    std::printf("%-8s %10.4f %10.4f %10.2f %12s  %s\n", rep.input.ranks[r].name.c_str(),
                res.ranks[r].step_seconds, res.ranks[r].stall_seconds, rep.assumed[r].gbps,
                format_bytes(static_cast<uint64_t>(res.ranks[r].copy_bytes)).c_str(),
                rep.assumed[r].why.c_str());
  }
  std::printf("\n%-44s %16s %12s %12s %7s\n", "link", "GB/s out/in", "to host", "to device",
              "util");
  for (size_t l = 0; l < rep.input.links.size(); ++l) {
    const NamedLink& link = rep.input.links[l];
    const SimLinkStats& s = res.links[l];
    std::printf("%-44s %7.2f/%-8.2f %12s %12s %6.1f%%\n", link.name.c_str(),
                link.capacity.to_host_gbps, link.capacity.to_device_gbps,
                format_bytes(static_cast<uint64_t>(s.to_host_bytes)).c_str(),
                format_bytes(static_cast<uint64_t>(s.to_device_bytes)).c_str(),
                100 * utilisation(link, s, step));
  }
  if (!args.trace.empty()) {
    std::printf("\ntrace: %s%s\n", args.trace.c_str(),
                several ? " (the largest shape's step)" : "");
  }
  check_stdout();
  return 0;
}

}  // namespace ferry
