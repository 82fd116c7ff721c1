// The model state's collectives, host copies and device update laid onto a node simulation's
// input.
#include "trainer/simulate/model_state_traffic.h"

#include <algorithm>
#include <vector>

namespace ferry {

namespace {

// `total` cut in proportion to `weights`: part k is floor(total * (w_0 + .. + w_k) / sum) less
// the parts before it, so the parts sum to `total` exactly (all of it in the last part when the
// weights sum to 0).
std::vector<uint64_t> proportional(uint64_t total, const std::vector<uint64_t>& weights) {
  unsigned __int128 sum = 0;
  for (uint64_t w : weights) sum += w;
  std::vector<uint64_t> parts(weights.size(), 0);
  if (weights.empty()) return parts;
  if (sum == 0) {
    parts.back() = total;
    return parts;
  }
  unsigned __int128 cumulative = 0;
  uint64_t given = 0;
  for (size_t k = 0; k < weights.size(); ++k) {
    cumulative += weights[k];
    const auto upto = static_cast<uint64_t>(cumulative * total / sum);
    parts[k] = upto - given;
    given = upto;
  }
  return parts;
}

}  // namespace

uint64_t device_update_bytes(const ModelState& state, int slots, bool bf16) {
  const bool sharded = state.choice.zero != ZeroStage::k0 && state.ranks > 1;
  // The padded block: under bf16 the working copy holds all of it, two bytes a parameter (with
  // the masters apart `weights` is only the shard's and the fp32 weights).
  const uint64_t block_floats =
      bf16 && state.working_weights > 0 ? state.working_weights / 2 : state.weights / sizeof(float);
  const uint64_t updated = sharded ? state.shard_floats : block_floats;
  const uint64_t per_float = (2 * static_cast<uint64_t>(std::max(slots, 0)) + 3) * sizeof(float);
  // bf16: the rounding into the working copy, of the whole block, or of the shard where the
  // masters are apart (Note [Sharded master weights]).
  const uint64_t rounded = state.masters_apart ? updated : block_floats;
  return updated * per_float + (bf16 ? rounded * 2 : 0);
}

double add_device_update(std::vector<SimRank>& ranks, int update_step, uint64_t bytes,
                         double memory_gbps) {
  if (memory_gbps <= 0 || bytes == 0) return 0;
  const double seconds = static_cast<double>(bytes) / (memory_gbps * 1e9);
  for (SimRank& r : ranks) {
    if (r.step_seconds.empty()) continue;
    const int n = static_cast<int>(r.step_seconds.size());
    const int update = update_step >= 0 && update_step < n ? update_step : n - 1;
    r.step_seconds[static_cast<size_t>(update)] += seconds;
  }
  return seconds;
}

ModelStateTraffic add_model_state_traffic(NodeSimInput& in, const ModelState& state, int job_ranks,
                                          const ModelStateSteps& steps) {
  ModelStateTraffic t;
  t.state = state;
  t.job_ranks = job_ranks;
  if (!t.active() || in.ranks.empty()) return t;
  const bool sharded = state.choice.zero != ZeroStage::k0 && job_ranks > 1;
  const bool host = state.choice.optimizer == OptimizerPlacement::kHost;
  const auto update_of = [&](const SimRank& r) {
    const int n = static_cast<int>(r.step_seconds.size());
    return in.update_step >= 0 && in.update_step < n ? in.update_step : n - 1;
  };

  std::vector<SimBucket> reduce = in.buckets;  // the gradients' buckets, in launch order
  std::vector<SimBucket> gather;
  if (sharded) {
    const int after_backward = update_of(in.ranks[0]) - 1;
    uint64_t total = 0;
    for (SimBucket& b : reduce) {
      b.collective = SimCollective::kReduceScatter;
      if (state.choice.zero == ZeroStage::k1)
        b.ready_after = std::max(b.ready_after, after_backward);
      total += b.bytes;
    }
    // The updated parameters, all-gathered in pieces of comm.bucket_mb per rank; bf16 with the
    // masters apart gathers the working copy and the fp32 weights (Note [Sharded master weights]).
    if (state.masters_apart) total = total / 2 + state.fp32_weights;
    const uint64_t piece =
        std::max<uint64_t>(steps.bucket_bytes, 1) * static_cast<uint64_t>(job_ranks);
    for (uint64_t left = total; left > 0;) {
      const uint64_t bytes = std::min(piece, left);
      gather.push_back({bytes, -1, SimCollective::kAllGather, steps.first_forward});
      left -= bytes;
    }
  }
  in.buckets = gather;
  in.buckets.insert(in.buckets.end(), reduce.begin(), reduce.end());
  if (!host) return t;

  t.to_host_bytes = state.host_gradients;
  // bf16 host masters go up as their bf16 rounding (the fp32 weights beside it left out).
  t.to_device_bytes = state.masters_apart ? state.host_gradients / 2 : state.host_weights;
  if (steps.host_update_gbps > 0)
    t.host_update_seconds = (2.0 * steps.slots + 3) * static_cast<double>(state.host_gradients) /
                            (steps.host_update_gbps * 1e9);
  std::vector<uint64_t> reduced;
  for (const SimBucket& b : reduce) reduced.push_back(b.bytes);
  const std::vector<uint64_t> down = proportional(state.host_gradients, reduced);
  // The parameters go up in the all-gather's pieces (sharded), else in comm.bucket_mb pieces.
  std::vector<uint64_t> pieces;
  if (sharded) {
    for (const SimBucket& b : gather) pieces.push_back(b.bytes);
  } else {
    const uint64_t piece = std::max<uint64_t>(steps.bucket_bytes, 1);
    for (uint64_t left = t.to_device_bytes; left > 0; left -= std::min(piece, left))
      pieces.push_back(std::min(piece, left));
  }
  const std::vector<uint64_t> up = proportional(t.to_device_bytes, pieces);
  for (SimRank& rank : in.ranks) {
    const int update = update_of(rank);
    rank.step_seconds[static_cast<size_t>(update)] = t.host_update_seconds;
    rank.model_state_transfers = rank.transfers.size();
    rank.transfer_after_bucket.resize(rank.transfers.size(), -1);
    rank.bucket_after_transfer.assign(in.buckets.size(), -1);
    for (size_t k = 0; k < up.size(); ++k) {
      if (sharded) rank.bucket_after_transfer[k] = static_cast<int>(rank.transfers.size());
      rank.transfers.push_back({false, up[k], -1, steps.first_forward});
      rank.transfer_after_bucket.push_back(-1);
    }
    for (size_t k = 0; k < down.size(); ++k) {
      rank.transfers.push_back({true, down[k], reduce[k].ready_after, update});
      rank.transfer_after_bucket.push_back(static_cast<int>(gather.size() + k));
    }
  }
  return t;
}

}  // namespace ferry
