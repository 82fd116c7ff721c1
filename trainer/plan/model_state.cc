// The per-rank model-state formula (Note [Model state per rank]) and auto's choice.
#include "trainer/plan/model_state.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"

namespace ferry {

std::string describe(const ModelStateChoice& c) {
  const char* zero = c.zero == ZeroStage::k0 ? "0" : c.zero == ZeroStage::k1 ? "1" : "2";
  return fmt::format("zero {} + {} optimizer", zero,
                     c.optimizer == OptimizerPlacement::kHost ? "host" : "device");
}

uint64_t shard_floats(uint64_t floats, int ranks) {
  if (ranks <= 1) return floats;
  const auto n = static_cast<uint64_t>(ranks);
  return ((floats + n - 1) / n + 63) / 64 * 64;
}

ModelState model_state(const ModelStateInputs& in, ModelStateChoice choice) {
  FERRY_ASSERT(choice.zero != ZeroStage::kAuto && choice.optimizer != OptimizerPlacement::kAuto,
               "model_state: resolve auto first");
  ModelState s;
  s.choice = choice;
  s.ranks = std::max(in.ranks, 1);
  const uint64_t floats = in.param_bytes / sizeof(float);
  const uint64_t slots = static_cast<uint64_t>(in.slots);
  const bool sharded = choice.zero != ZeroStage::k0 && s.ranks > 1;
  s.shard_floats = shard_floats(floats, s.ranks);
  const uint64_t shard = s.shard_floats * sizeof(float);
  const uint64_t block = sharded ? shard * static_cast<uint64_t>(s.ranks) : in.param_bytes;
  const uint64_t state_unit = sharded ? shard : in.param_bytes;  // what one rank updates
  s.weights = block;
  s.gradients = block;
  if (in.bf16) {
    // Note [Sharded master weights]: the working copy of the padded block; masters apart.
    s.working_weights = (block / 2 + 255) / 256 * 256;
    const bool host = choice.optimizer == OptimizerPlacement::kHost;
    if (sharded || host) {
      s.masters_apart = true;
      s.fp32_weights = in.fp32_weight_bytes;
      s.weights = (host ? 0 : shard) + s.fp32_weights;
    }
  }
  if (choice.zero == ZeroStage::k2 && sharded && !in.whole_gradients) {
    const auto slot = [&](uint64_t param) {
      return (std::max(in.bucket_bytes, param) + 255) / 256 * 256;
    };
    const uint64_t one = slot(in.held_params.empty() ? in.largest_param : in.largest_unheld);
    uint64_t staging = 2 * one;
    for (uint64_t held : in.held_params) staging += slot(held);
    if (shard + staging < block) {
      s.gradients = shard + staging;
      s.staged_gradients = true;
      s.staging_bytes = staging;
      s.staging_slot = one;
    }
  }
  if (choice.optimizer == OptimizerPlacement::kHost) {
    s.host_optimizer = slots * state_unit;
    // bf16 with the masters on the host: and the bf16 copy the upload carries.
    s.host_weights = state_unit + (s.masters_apart ? state_unit / 2 : 0);
    s.host_gradients = state_unit;
  } else {
    s.optimizer = slots * state_unit;
  }
  return s;
}

std::vector<ModelStateChoice> model_state_candidates(ZeroStage zero, OptimizerPlacement optimizer) {
  std::vector<ModelStateChoice> out;
  for (OptimizerPlacement o : {OptimizerPlacement::kDevice, OptimizerPlacement::kHost}) {
    if (optimizer != OptimizerPlacement::kAuto && optimizer != o) continue;
    for (ZeroStage z : {ZeroStage::k0, ZeroStage::k1, ZeroStage::k2}) {
      if (zero != ZeroStage::kAuto && zero != z) continue;
      out.push_back({z, o});
    }
  }
  return out;
}

double model_state_seconds(const ModelState& s, int slots, double collective_gbps, double link_gbps,
                           double host_update_gbps) {
  double t = 0;
  const bool sharded = s.choice.zero != ZeroStage::k0 && s.ranks > 1;
  if (sharded && collective_gbps > 0) {
    // bf16 with the masters apart gathers the working copy and the fp32 weights.
    const auto gathered =
        static_cast<double>(s.masters_apart ? s.working_weights + s.fp32_weights : s.weights) *
        (s.ranks - 1) / s.ranks;
    t += gathered / (collective_gbps * 1e9);
  }
  if (s.choice.optimizer == OptimizerPlacement::kHost) {
    const auto shard = static_cast<double>(s.host_gradients);
    // bf16 with the masters on the host: the weights go up as bf16.
    if (link_gbps > 0) t += (s.masters_apart ? 1.5 : 2.0) * shard / (link_gbps * 1e9);
    if (host_update_gbps > 0) t += (2.0 * slots + 3) * shard / (host_update_gbps * 1e9);
  }
  return t;
}

ModelStateDecision choose_model_state(
    const ModelStateInputs& in, const std::vector<ModelStateChoice>& candidates,
    uint64_t host_limit, const std::function<MemoryPlan(const PersistentBytes&)>& plan,
    const std::function<double(const ModelState&)>& extra_seconds) {
  ModelStateDecision d;
  for (const ModelStateChoice& c : candidates) {
    ModelStateOption o;
    o.state = model_state(in, c);
    try {
      o.plan = plan(o.state.persistent(in.buffers));
      o.fits = true;
    } catch (const ConfigError& e) {
      o.why_not = e.what();
    }
    if (o.fits && host_limit > 0 && o.state.host_bytes() + o.plan.host_bytes > host_limit) {
      o.fits = false;
      o.why_not = fmt::format(
          "memory.host_limit {} is below the {} of host memory {} needs ({} of optimizer state, "
          "weights and gradients, {} of activation offloads)",
          format_bytes(host_limit), format_bytes(o.state.host_bytes() + o.plan.host_bytes),
          describe(c), format_bytes(o.state.host_bytes()), format_bytes(o.plan.host_bytes));
    }
    if (o.fits) o.step_seconds = o.plan.prediction.step_seconds + extra_seconds(o.state);
    d.options.push_back(std::move(o));
  }
  for (size_t i = 0; i < d.options.size(); ++i) {
    if (!d.options[i].fits) continue;
    // A later (more sharded or offloaded) option must be faster by more than 1%.
    if (d.chosen < 0 || d.options[i].step_seconds < 0.99 * d.choice().step_seconds) {
      d.chosen = static_cast<int>(i);
    }
  }
  return d;
}

}  // namespace ferry
