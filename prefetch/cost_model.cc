// Step costs and the virtual-clock simulation.
#include "prefetch/cost_model.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace ferry {

// Note [Measured step times]
// A device profile times every kernel a step launches (on scratch operands, on the device
// itself) and sums them per step; the load step is its upload at the measured host-to-device
// rate. The key ties a time to the work, not to a position on the tape: recompute steps find
// their forward's time, and a tape of another batch size (a last partial batch, max-batch
// searches) finds nothing and uses the FLOP model rather than a wrong measurement.
std::string measured_step_key(const TapeStep& step, const Tape& tape) {
  const StepPhase phase = step.phase == StepPhase::kRecompute ? StepPhase::kForward : step.phase;
  uint64_t bytes = 0;
  for (int t : step.reads) bytes += tape.tensors[t].bytes;
  if (phase == StepPhase::kLoad) {
    for (int t : step.writes) bytes += tape.tensors[t].bytes;
  }
  return fmt::format("{}|{}|{}|{}", static_cast<int>(phase), step.name, step.flops, bytes);
}

double CostModel::measured_seconds(const TapeStep& step, const Tape& tape) const {
  if (!measured) return -1;
  const auto it = measured->seconds.find(measured_step_key(step, tape));
  return it == measured->seconds.end() ? -1 : it->second;
}

// Note [Estimates scaled to the measured steps]
// A measured profile times the kernels of one tape: the first input shape. A later shape
// (data.scales, data.documents) brings new geometries, costed by the FLOP model, whose rates are
// nominal (memory.measure: false uses them alone): on this machine's CPU they came out 2.3x too
// slow, so a plan for a new shape believed its copies hidden behind compute that was not there
// and moved where it should have rebuilt. So once a profile is applied, each kind of step (op and
// phase) that was measured scales its estimates by measured / FLOP-model seconds summed over its
// measured steps, and a kind never measured by the same ratio over every measured step. Steps
// of one kind on another geometry run at about the rate of the measured ones (the same kernels,
// the same library); the load step is the link's and is left out.
std::string estimate_scale_key(const TapeStep& step) {
  const StepPhase phase = step.phase == StepPhase::kRecompute ? StepPhase::kForward : step.phase;
  return fmt::format("{}|{}", step.op, static_cast<int>(phase));
}

void calibrate_estimates(MeasuredSteps& measured, const Tape& tape, const CostModel& cost) {
  std::map<std::string, std::pair<double, double>> sums;  // kind -> (measured, FLOP model)
  for (const TapeStep& step : tape.steps) {
    if (step.phase == StepPhase::kLoad) continue;
    const auto it = measured.seconds.find(measured_step_key(step, tape));
    if (it == measured.seconds.end()) continue;
    const double model = cost.flop_seconds(step, tape);
    for (const std::string& key : {estimate_scale_key(step), std::string()}) {
      sums[key].first += it->second;
      sums[key].second += model;
    }
  }
  measured.estimate_scale.clear();
  for (const auto& [key, s] : sums) {
    if (s.first > 0 && s.second > 0) measured.estimate_scale[key] = s.first / s.second;
  }
}

double CostModel::step_seconds(const TapeStep& step, const Tape& tape) const {
  if (const double m = measured_seconds(step, tape); m >= 0) return m;
  const double model = flop_seconds(step, tape);
  if (!measured || measured->estimate_scale.empty() || step.phase == StepPhase::kLoad) {
    return model;
  }
  auto it = measured->estimate_scale.find(estimate_scale_key(step));
  if (it == measured->estimate_scale.end()) it = measured->estimate_scale.find("");
  return it == measured->estimate_scale.end() ? model : model * it->second;
}

double CostModel::flop_seconds(const TapeStep& step, const Tape& tape) const {
  double bytes = 0;
  for (int t : step.reads) bytes += static_cast<double>(tape.tensors[t].bytes);
  for (int t : step.writes) bytes += static_cast<double>(tape.tensors[t].bytes);
  double flops_rate = compute_flops, memory_rate = memory_gbps;
  for (const auto& [op, rate] : op_flops)
    if (op == step.op) flops_rate = rate;
  for (const auto& [op, rate] : op_memory_gbps)
    if (op == step.op) memory_rate = rate;
  return std::max(step.flops / flops_rate, bytes / (memory_rate * 1e9)) + step_overhead_s;
}

Prediction simulate(const Tape& tape, const CostModel& cost,
                    const std::vector<SimTransfer>& transfers) {
  const int steps = static_cast<int>(tape.steps.size());
  // Which transfers are issued after each step ends, and which each step waits for.
  std::vector<std::vector<size_t>> issued_after(static_cast<size_t>(steps) + 1);
  std::vector<std::vector<size_t>> waited_before(static_cast<size_t>(steps) + 1);
  for (size_t i = 0; i < transfers.size(); ++i) {
    const SimTransfer& t = transfers[i];
    issued_after[std::max(t.issue_after, -1) + 1].push_back(i);
    if (t.wait_before >= 0) waited_before[t.wait_before].push_back(i);
  }
  std::vector<double> done(transfers.size(), 0.0);
  std::vector<bool> issued(transfers.size(), false);
  double clock = 0, d2h_free = 0, h2d_free = 0;
  Prediction p;
  const auto issue = [&](size_t i, double at) {
    double& lane = transfers[i].to_host ? d2h_free : h2d_free;
    const double start = std::max(lane, at);
    done[i] = start + cost.transfer_seconds(transfers[i].bytes, transfers[i].to_host);
    lane = done[i];
    issued[i] = true;
  };
  for (size_t i : issued_after[0]) issue(i, 0.0);
  for (int s = 0; s < steps; ++s) {
    for (size_t i : waited_before[s]) {
      if (!issued[i]) issue(i, clock);  // issued and waited at the same point
      if (done[i] > clock) {
        p.stall_seconds += done[i] - clock;
        clock = done[i];
      }
    }
    const double t = cost.step_seconds(tape.steps[s], tape);
    p.compute_seconds += t;
    clock += t;
    // A copy already issued at its wait point (issue_after later than wait_before) is not
    // issued again: a second issue would be a phantom copy delaying the later ones.
    for (size_t i : issued_after[static_cast<size_t>(s) + 1])
      if (!issued[i]) issue(i, clock);
  }
  p.step_seconds = clock;
  return p;
}

}  // namespace ferry
