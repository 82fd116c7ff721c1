// `trainer plan`: the memory plan of a config, per policy, without training.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/bytes.h"
#include "common/file_write.h"
#include "common/strings.h"
#include "device/backend_traits.h"
#include "sim/hardware_profile.h"
#include "sim/node_links.h"
#include "trainer/cli/commands.h"
#include "trainer/config/config.h"
#include "trainer/configured/model.h"
#include "trainer/data/documents.h"
#include "trainer/model/zoo/zoo.h"
#include "trainer/plan/assumed_link.h"
#include "trainer/plan/device_profile.h"
#include "trainer/plan/planning.h"
#include "trainer/plan/server.h"
#include "trainer/session/session.h"

namespace ferry {

namespace {

std::vector<MemoryPolicy> requested(const PlanArgs& args, const Config& config) {
  if (args.policy.empty()) return {config.memory.policy};
  if (args.policy == "all") {
    return {MemoryPolicy::kNone, MemoryPolicy::kVdnnConv, MemoryPolicy::kVdnnAll,
            MemoryPolicy::kAuto};
  }
  std::vector<MemoryPolicy> out;
  for (const std::string& name : split(args.policy, ',')) {
    const auto p = from_string<MemoryPolicy>(name);
    if (!p) {
      throw ConfigError(fmt::format("--policy: unknown policy '{}'", name),
                        "use none, vdnn-conv, vdnn-all, auto, or all");
    }
    out.push_back(*p);
  }
  return out;
}

struct Row {
  MemoryPolicy policy;
  bool fits = false;
  std::string error;
  MemoryPlan plan;
  int64_t max_batch = -1;
};

// What fills the arena at the plan's fullest step: the largest live tensors and their fate.
void explain(const MemoryPlan& plan) {
  const std::vector<uint64_t> live = arena_occupancy(plan);
  size_t fullest = 0;
  for (size_t s = 0; s < live.size(); ++s) {
    if (live[s] > live[fullest]) fullest = s;
  }
  const TapeStep& step = plan.tape.steps[fullest];
  static constexpr const char* kPhase[] = {"load",       "forward", "backward",
                                           "accumulate", "update",  "recompute"};
  std::printf("\n%s: fullest at step %zu (%s of '%s'), %s of arena in use:\n",
              std::string(policy_name(plan.policy)).c_str(), fullest,
              kPhase[static_cast<int>(step.phase)], step.name.c_str(),
              format_bytes(live[fullest]).c_str());
  std::vector<std::pair<uint64_t, std::string>> rows;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    for (const Residency& r : plan.tensors[t].residency) {
      if (r.begin > static_cast<int>(fullest) || r.end < static_cast<int>(fullest)) continue;
      rows.emplace_back(plan.tape.tensors[t].bytes,
                        fmt::format("{:<48} {:>12}  {} [{}, {}]", plan.tape.tensors[t].name,
                                    format_bytes(plan.tape.tensors[t].bytes),
                                    decision_name(plan.tensors[t].decision), r.begin, r.end));
    }
  }
  std::sort(rows.rbegin(), rows.rend());
  for (size_t i = 0; i < rows.size() && i < 12; ++i) std::printf("  %s\n", rows[i].second.c_str());
  if (rows.size() > 12) std::printf("  ... and %zu smaller\n", rows.size() - 12);
}

// What one sample of the model reads: (C, H, W) of an image model, (T) tokens of a token model.
std::vector<int64_t> input_dims(const Config& config) {
  if (model_info(config.model.name).tokens) return {tokens_per_row(config)};
  return {config.model.input.begin(), config.model.input.end()};
}

// Whether `trainer plan` times the model on a device here: asked, or a GPU is present.
bool measure_here(const PlanArgs& args, const Config& config) {
  if (args.no_measure) return false;
  if (args.measure) return true;
  if (!args.hardware.empty()) return false;  // planning for a named GPU, not this one
  // A GPU is present (ordinal 0): its own times beat the FLOP model's guesses.
  DeviceOptions here;
  here.backend = config.device.backend;
  return backend_traits(here.backend).real_gpus && device_present(here);
}

// Times the config's model at its batch size on a device of its backend (the profile cache in
// run.dir is reused and extended) and plans with those times from then on.
DeviceProfile measure_for_plan(const Config& config, OfflinePlanner& planner) {
  const DeviceOptions d = device_options(config);  // the numerics and workspace limit of training
  std::unique_ptr<Device> device = create_device(d);
  const Graph graph = build_configured_model(config, config.data.batch_size);
  const Lowered lowered = lower_graph(graph, device->kernels(), /*training=*/true);
  ProfileOptions po;
  po.cache_path = (std::filesystem::path(config.run.dir) / "cost_profile.json").string();
  po.device_key = profile_device_key(*device, d.cpu.link_gbps);
  // bf16 with the masters apart holds fewer fp32 weights than the update covers: the block's.
  const auto params = static_cast<int64_t>((planner.model_state().masters_apart
                                                ? planner.model_state_inputs().param_bytes
                                                : planner.persistent().weights) /
                                           sizeof(float));
  // memory.optimizer host or auto: the host update is weighed, so time it too.
  if (config.memory.optimizer != OptimizerPlacement::kDevice)
    po.host_update = optimizer_options(config);
  DeviceProfile profile =
      measure_device(*device, graph, lowered, update_kernel(config, params), po);
  CostModel cost = planner.cost();
  apply_profile(profile, lowered.tape, cost, config.memory.link_gbps > 0);
  planner.set_cost(cost);
  return profile;
}

// One input shape of data.scales (a side) or of data.documents (a length), planned under the
// configured policy.
struct ShapeRow {
  int64_t side = 0;  // or the length, for documents
  Shape input;
  MemoryPlan plan;
  bool fits = false;
  std::string error;
};

// The sides of data.scales (in the order given), or the lengths a padded batch of documents can
// take (length_buckets: data.len_bucket, 2 data.len_bucket, ..., data.seq_len).
std::vector<int64_t> shape_keys(const Config& config) {
  if (config.data.documents && !config.data.pack) {
    return length_buckets(config.data.len_bucket, tokens_per_row(config));
  }
  return config.data.scales;
}

// Shapes planned without a word; past this many (data.len_bucket 1 gives one per length, 16,384
// of them for model.context 16384), stderr says how many and how far planning has come.
constexpr size_t kQuietShapes = 64;
constexpr double kProgressEveryS = 5.0;

// The plans training would use, one per side of data.scales or length of data.documents.
std::vector<ShapeRow> shape_rows(const Config& config, OfflinePlanner& planner) {
  std::vector<ShapeRow> out;
  const bool lengths = config.data.documents;
  std::vector<int64_t> keys;
  for (int64_t side : shape_keys(config))
    if (std::find(keys.begin(), keys.end(), side) == keys.end()) keys.push_back(side);
  const bool progress = keys.size() > kQuietShapes;
  const auto start = std::chrono::steady_clock::now();
  auto said = start;
  if (progress) {
    std::fprintf(
        stderr, "plan: planning %zu %s (%s), one plan each; progress every %.0f s\n", keys.size(),
        lengths ? "lengths" : "sides",
        lengths ? fmt::format("data.len_bucket {}", config.data.len_bucket).c_str() : "data.scales",
        kProgressEveryS);
    std::fflush(stderr);
  }
  for (int64_t side : keys) {
    if (progress) {
      const auto now = std::chrono::steady_clock::now();
      if (std::chrono::duration<double>(now - said).count() >= kProgressEveryS) {
        std::fprintf(stderr, "plan: %zu of %zu planned (%.0f s)\n", out.size(), keys.size(),
                     std::chrono::duration<double>(now - start).count());
        std::fflush(stderr);
        said = now;
      }
    }
    ShapeRow r;
    r.side = side;
    r.input = lengths ? Shape{config.data.batch_size, side}
                      : configured_input(config, config.data.batch_size, side);
    try {
      r.plan = planner.plan_shape(config.memory.policy, r.input);
      r.fits = true;
    } catch (const ConfigError& e) {
      r.error = e.what();
      r.plan = planner.plan_shape(config.memory.policy, r.input, /*enforce_budget=*/false);
    }
    out.push_back(std::move(r));
  }
  return out;
}

const char* zero_text(ZeroStage z) {
  return z == ZeroStage::k0 ? "0" : z == ZeroStage::k1 ? "1" : z == ZeroStage::k2 ? "2" : "auto";
}
const char* placement_text(OptimizerPlacement p) {
  return p == OptimizerPlacement::kDevice ? "device"
         : p == OptimizerPlacement::kHost ? "host"
                                          : "auto";
}

// Every stage and placement weighed (Note [Model state per rank]), and the one the config gets.
struct StateReport {
  ModelStateDecision all;  // the six combinations
  std::string chosen;      // describe() of the adopted one
  std::string error;       // no allowed combination fits
  std::string note;        // zero with one rank
};

StateReport weigh_states(const Config& config, OfflinePlanner& planner, int64_t batch) {
  StateReport r;
  r.all = planner.weigh_model_states(
      config.memory.policy, batch,
      model_state_candidates(ZeroStage::kAuto, OptimizerPlacement::kAuto));
  // When no combination fits, the smallest budget that would (a bisection of auto plans, minutes
  // for a deep network) is training's refusal to name, not the plan table's.
  if (r.all.chosen < 0) {
    r.error = fmt::format(
        "no memory.zero / memory.optimizer combination fits memory.budget under memory.policy "
        "{} (trainer train names the smallest budget that fits)",
        std::string(policy_name(config.memory.policy)));
  } else {
    try {
      planner.resolve_model_state(config.memory.policy, batch);
    } catch (const ConfigError& e) {
      r.error = std::string(e.what()) + (e.hint().empty() ? "" : " (" + e.hint() + ")");
    }
  }
  r.chosen = describe(planner.model_state().choice);
  if (planner.ranks() == 1 &&
      (config.memory.zero == ZeroStage::k1 || config.memory.zero == ZeroStage::k2)) {
    r.note = fmt::format(
        "memory.zero {} on one rank changes nothing: every shard is the whole "
        "block (plan for a job with --ranks N)",
        zero_text(config.memory.zero));
  }
  return r;
}

nlohmann::json state_json(const ModelState& s) {
  return {{"zero", zero_text(s.choice.zero)},     {"optimizer", placement_text(s.choice.optimizer)},
          {"weights_bytes", s.weights},           {"gradients_bytes", s.gradients},
          {"optimizer_bytes", s.optimizer},       {"host_optimizer_bytes", s.host_optimizer},
          {"host_weights_bytes", s.host_weights}, {"host_gradients_bytes", s.host_gradients},
          {"device_bytes", s.device_bytes()},     {"host_bytes", s.host_bytes()}};
}

}  // namespace

int run_plan(const PlanArgs& args) {
  const auto start = std::chrono::steady_clock::now();
  const Config config = load_config(args.config, args.overrides);
  OfflinePlanner planner(config);
  // The link the planner assumes: a profile's own link, or with topology.file the GPU's path,
  // shared with the other ranks when auto plans contention-aware (topology scheduler).
  CostModel cost = planner.cost();
  std::string cost_source = "FLOP model";
  std::string link_why = fmt::format("{:.2f} GB/s: the config's cost model{}", cost.link_gbps,
                                     config.memory.link_gbps > 0 ? " (memory.link_gbps)" : "");
  if (!args.hardware.empty()) {
    const HardwareProfile profile = load_hardware_profile(args.hardware);
    cost = profile_cost(profile, config.device.precision);
    cost_source = fmt::format("hardware profile {} ({}; per-op rates from {})", profile.name,
                              profile.gpu, profile.source);
    link_why = fmt::format("{:.2f} GB/s: {}'s own link (no topology.file: no sharing)",
                           cost.link_gbps, profile.name);
  }
  bool aware = false;
  if (!config.topology.file.empty() && config.memory.link_gbps == 0) {
    const Server server = load_server(config, "", args.gpus, args.hardware);
    const AssumedLink a = assumed_link(config, server.links, 0);
    cost.link_gbps = a.gbps;
    aware = a.contention_aware;
    link_why = fmt::format("{:.2f} GB/s for rank 0 of {} on {}: {}", a.gbps, server.bindings.size(),
                           server.topology.name(), a.why);
    // CPU ranks on a described server emulate its links slowed by the scale, as training does.
    const bool emulated = emulates_server_links(config) && args.hardware.empty();
    if (emulated && config.topology.emulation_scale != 1.0) {
      cost.link_gbps = a.gbps / config.topology.emulation_scale;
      link_why = fmt::format("{:.4g} GB/s emulated (topology.emulation_scale {:g}) from {}",
                             cost.link_gbps, config.topology.emulation_scale, link_why);
    }
  }
  planner.set_cost(cost);
  planner.set_contention_aware(aware);
  const int64_t batch = config.data.batch_size;
  if (measure_here(args, config)) {
    cost_source = describe_profile(measure_for_plan(config, planner));
  } else if (backend_traits(config.device.backend).real_gpus && args.hardware.empty()) {
    cost_source = "FLOP model (no GPU here: step times are estimates, not measurements)";
  }
  planner.set_ranks(args.ranks);
  const StateReport states = weigh_states(config, planner, batch);
  const ModelState& state = planner.model_state();
  std::vector<Row> rows;
  for (MemoryPolicy policy : requested(args, config)) {
    Row row{policy};
    try {
      row.plan = planner.plan(policy, batch);
      row.fits = true;
    } catch (const ConfigError& e) {
      row.error = std::string(e.what()) + (e.hint().empty() ? "" : " (" + e.hint() + ")");
      row.plan = planner.plan(policy, batch, /*enforce_budget=*/false);
    }
    if (args.max_batch) row.max_batch = planner.max_batch(policy);
    rows.push_back(std::move(row));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const uint64_t none_peak = planner.plan(MemoryPolicy::kNone, batch, false).peak_bytes();
  const DTypeBytes by_dtype = tape_dtype_bytes(planner.lowered(batch).tape);
  const std::vector<ShapeRow> shapes = shape_rows(config, planner);

  if (args.json) {
    nlohmann::json policies = nlohmann::json::array();
    for (const Row& r : rows) {
      nlohmann::json j = {
          {"name", policy_name(r.policy)},
          {"fits", r.fits},
          {"peak_bytes", r.plan.peak_bytes()},
          {"offload_bytes", r.plan.offload_bytes},
          {"recompute_flops", r.plan.recompute_flops},
          {"lower_bound_bytes", r.plan.lower_bound},
          {"max_batch", r.max_batch >= 0 ? nlohmann::json(r.max_batch) : nlohmann::json()},
          {"weights_bytes", r.plan.persistent.weights},
          {"gradients_bytes", r.plan.persistent.gradients},
          {"optimizer_bytes", r.plan.persistent.optimizer},
          {"buffers_bytes", r.plan.persistent.buffers},
          {"working_weights_bytes", r.plan.persistent.working_weights},
          {"host_optimizer_bytes", state.host_optimizer},
          {"host_weights_bytes", state.host_weights},
          {"host_gradients_bytes", state.host_gradients},
          {"activation_bytes", r.plan.activation_bytes},
          {"activation_gradient_bytes", r.plan.gradient_bytes},
          {"workspace_bytes", r.plan.workspace_bytes},
          {"host_bytes", r.plan.host_bytes},
          {"predicted_step_s", r.plan.prediction.step_seconds},
          {"predicted_stall_s", r.plan.prediction.stall_seconds}};
      if (!r.fits) j["error"] = r.error;
      policies.push_back(std::move(j));
    }
    nlohmann::json out = {{"model", config.model.name},
                          {"batch", batch},
                          {"link_gbps", cost.link_gbps},
                          {"link_why", link_why},
                          {"input", input_dims(config)},
                          {"budget_bytes", config.memory.budget},
                          {"policies", policies},
                          {"seconds", seconds},
                          {"cost_model", cost_source},
                          {"precision", to_string(config.device.precision)},
                          {"tensor_bytes",
                           {{"bf16", by_dtype.bf16},
                            {"fp32", by_dtype.f32},
                            {"other", by_dtype.other},
                            {"workspace", by_dtype.workspace}}}};
    nlohmann::json options = nlohmann::json::array();
    for (const ModelStateOption& o : states.all.options) {
      nlohmann::json j = state_json(o.state);
      j["fits"] = o.fits;
      if (o.fits) j["predicted_step_s"] = o.step_seconds;
      if (!o.fits) j["error"] = o.why_not;
      options.push_back(std::move(j));
    }
    nlohmann::json ms = state_json(state);
    ms["ranks"] = planner.ranks();
    ms["requested"] = {{"zero", zero_text(config.memory.zero)},
                       {"optimizer", placement_text(config.memory.optimizer)}};
    ms["chosen"] = states.chosen;
    ms["shard_floats"] = state.shard_floats;
    ms["options"] = std::move(options);
    if (!states.error.empty()) ms["error"] = states.error;
    if (!states.note.empty()) ms["note"] = states.note;
    out["model_state"] = std::move(ms);
    if (!shapes.empty()) {
      nlohmann::json js = nlohmann::json::array();
      for (const ShapeRow& r : shapes) {
        nlohmann::json j = {{config.data.documents ? "length" : "side", r.side},
                            {"input", r.input.dims()},
                            {"policy", policy_name(r.plan.policy)},
                            {"fits", r.fits},
                            {"peak_bytes", r.plan.peak_bytes()},
                            {"lower_bound_bytes", r.plan.lower_bound},
                            {"offload_bytes", r.plan.offload_bytes},
                            {"recompute_flops", r.plan.recompute_flops},
                            {"predicted_step_s", r.plan.prediction.step_seconds}};
        if (!r.fits) j["error"] = r.error;
        js.push_back(std::move(j));
      }
      out["shapes"] = std::move(js);
      out["per_shape"] = config.memory.per_shape;
    }
    std::printf("%s\n", out.dump(2).c_str());
    check_stdout();
    return 0;
  }

  std::printf("plan: %s, batch %lld, %s, budget %s%s\n", config.model.name.c_str(),
              static_cast<long long>(batch), input_text(config).c_str(),
              format_bytes(config.memory.budget).c_str(),
              planner.substituted() ? (" (" + planner.substitute() + ")").c_str() : "");
  std::printf("cost model: %s\n", cost_source.c_str());
  const PersistentBytes& p = planner.persistent();
  std::printf("persistent: weights %s, gradients %s, optimizer %s, buffers %s%s\n",
              format_bytes(p.weights).c_str(), format_bytes(p.gradients).c_str(),
              format_bytes(p.optimizer).c_str(), format_bytes(p.buffers).c_str(),
              p.working_weights > 0
                  ? (", bf16 working weights " + format_bytes(p.working_weights)).c_str()
                  : "");
  std::printf("precision: %s; the step's tensors: %s\n",
              std::string(to_string(config.device.precision)).c_str(),
              dtype_bytes_text(by_dtype).c_str());
  std::printf("link: %s\n", link_why.c_str());
  std::printf(
      "\nmodel state per rank, %d rank%s (memory.zero %s, memory.optimizer %s), policy %s:\n",
      planner.ranks(), planner.ranks() == 1 ? "" : "s", zero_text(config.memory.zero),
      placement_text(config.memory.optimizer),
      std::string(policy_name(config.memory.policy)).c_str());
  std::printf("  %-28s %12s %12s %12s %12s %12s %s\n", "stage + placement", "weights", "gradients",
              "optimizer", "device", "host", "predicted step");
  for (const ModelStateOption& o : states.all.options) {
    const ModelState& s = o.state;
    std::printf("  %-28s %12s %12s %12s %12s %12s %s\n", describe(s.choice).c_str(),
                format_bytes(s.weights).c_str(), format_bytes(s.gradients).c_str(),
                format_bytes(s.optimizer).c_str(), format_bytes(s.device_bytes()).c_str(),
                format_bytes(s.host_bytes()).c_str(),
                o.fits ? fmt::format("{:.3f}s", o.step_seconds).c_str() : "does not fit");
  }
  std::printf(
      "chosen: %s%s\n", states.chosen.c_str(),
      config.memory.zero == ZeroStage::kAuto || config.memory.optimizer == OptimizerPlacement::kAuto
          ? " (auto: the least predicted step that fits; no sharding or offload unless "
            "faster by 1%)"
          : " (as configured)");
  if (!states.note.empty()) std::printf("%s\n", states.note.c_str());
  if (!states.error.empty()) std::printf("model state: %s\n", states.error.c_str());
  std::printf("\n");
  std::printf("%-10s %12s %8s %12s %12s %12s %12s %12s %10s %s\n", "policy", "peak", "vs none",
              "activations", "act. grads", "workspace", "offload/step", "recompute", "max batch",
              "predicted step (stall)");
  for (const Row& r : rows) {
    const double vs = none_peak ? 100.0 * (1.0 - static_cast<double>(r.plan.peak_bytes()) /
                                                     static_cast<double>(none_peak))
                                : 0.0;
    std::printf(
        "%-10s %12s %7.1f%% %12s %12s %12s %12s %9.3g GF %10s %.3fs (%.3fs)%s\n",
        std::string(policy_name(r.policy)).c_str(), format_bytes(r.plan.peak_bytes()).c_str(), -vs,
        format_bytes(r.plan.activation_bytes).c_str(), format_bytes(r.plan.gradient_bytes).c_str(),
        format_bytes(r.plan.workspace_bytes).c_str(), format_bytes(r.plan.offload_bytes).c_str(),
        r.plan.recompute_flops / 1e9, r.max_batch >= 0 ? std::to_string(r.max_batch).c_str() : "-",
        r.plan.prediction.step_seconds, r.plan.prediction.stall_seconds,
        r.fits ? "" : "  does not fit");
  }
  if (!shapes.empty()) {
    // Note [Planning ahead] (trainer/exec/program.cc): training plans each of these once, ahead
    // of its first step, and runs them all in one arena as large as the largest.
    const bool static_plan =
        !config.memory.per_shape && config.memory.policy == MemoryPolicy::kAuto;
    const char* key = config.data.documents ? "length" : "side";
    std::printf("\nper input shape (%s), policy %s%s, one arena of the largest peak:\n",
                config.data.documents ? "data.documents, data.len_bucket" : "data.scales",
                std::string(policy_name(config.memory.policy)).c_str(),
                static_plan ? fmt::format(", the largest {}'s decisions for every {} "
                                          "(memory.per_shape false)",
                                          key, key)
                                  .c_str()
                            : "");
    std::printf("%-6s %-20s %12s %12s %12s %12s %s\n", key, "input", "peak", "lower bound",
                "offload/step", "recompute", "predicted step");
    for (const ShapeRow& r : shapes) {
      std::printf("%-6lld %-20s %12s %12s %12s %9.3g GF %.3fs%s\n", static_cast<long long>(r.side),
                  r.input.str().c_str(), format_bytes(r.plan.peak_bytes()).c_str(),
                  format_bytes(r.plan.lower_bound).c_str(),
                  format_bytes(r.plan.offload_bytes).c_str(), r.plan.recompute_flops / 1e9,
                  r.plan.prediction.step_seconds, r.fits ? "" : "  does not fit");
    }
    for (const ShapeRow& r : shapes) {
      if (!r.fits)
        std::printf("%s %lld: %s\n", key, static_cast<long long>(r.side), r.error.c_str());
    }
  }
  const MemoryPlan& any = rows.front().plan;
  std::printf("\nlower bound: %s (persistent + the largest single-step working set)\n",
              format_bytes(any.lower_bound).c_str());
  for (const Row& r : rows) {
    if (!r.fits)
      std::printf("%s: %s\n", std::string(policy_name(r.policy)).c_str(), r.error.c_str());
  }
  if (args.explain) {
    for (const Row& r : rows) explain(r.plan);
  }
  std::printf("planned in %.2fs\n", seconds);
  check_stdout();
  return 0;
}

}  // namespace ferry
