// Reading what a trainer run wrote, for the tests of runs whose input shape changes per step
// (data.scales, data.documents): metrics.jsonl's losses and shapes, summary.json's plans per
// shape, the input shape of each progress line of a rank's log, and the check that a budgeted run
// trains bitwise like memory.policy none (Note [Bitwise like none]).
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {

// A run's metrics.jsonl: the loss and the input shape of every logged step.
struct Logged {
  std::vector<double> losses;
  std::vector<std::vector<int64_t>> shapes;
};

inline Logged read_metrics(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  Logged out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    out.losses.push_back(j["loss"].get<double>());
    out.shapes.push_back(j["shape"].get<std::vector<int64_t>>());
  }
  return out;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Every step of `logged` at the shape of `reference`'s and with its loss, bit for bit.
inline void expect_same_steps(const Logged& logged, const Logged& reference) {
  ASSERT_EQ(logged.losses.size(), reference.losses.size());
  for (size_t i = 0; i < logged.losses.size(); ++i) {
    EXPECT_EQ(logged.shapes[i], reference.shapes[i]) << "step " << i + 1;
    EXPECT_EQ(logged.losses[i], reference.losses[i]) << "step " << i + 1 << " (bitwise)";
  }
}

// The planned peak of each shape in a run's summary.json, by dimension `dim` of the shape (2:
// an image's side, 1: a token row's length).
inline std::map<int64_t, uint64_t> planned_peaks(const nlohmann::json& summary, size_t dim) {
  std::map<int64_t, uint64_t> out;
  for (const auto& shape : summary["shapes"]) {
    out[shape["shape"][dim].get<int64_t>()] = shape["planned_peak_bytes"].get<uint64_t>();
  }
  return out;
}

// What the plans of a run's summary.json gave up to fit: bytes moved, FLOPs rebuilt.
struct GivenUp {
  double moved = 0, rebuilt = 0;
};

// Every shape of a run's summary.json measured the peak it planned, within `budget`; returns what
// the plans moved and rebuilt, summed over the shapes.
inline GivenUp expect_shapes_within(const nlohmann::json& summary, uint64_t budget) {
  GivenUp out;
  for (const auto& shape : summary["shapes"]) {
    SCOPED_TRACE(shape["shape"].dump());
    EXPECT_EQ(shape["measured_peak_bytes"].get<uint64_t>(),
              shape["planned_peak_bytes"].get<uint64_t>());
    EXPECT_LE(shape["planned_peak_bytes"].get<uint64_t>(), budget);
    out.moved += shape["offload_bytes"].get<double>();
    out.rebuilt += shape["recompute_flops"].get<double>();
  }
  return out;
}

// `input`'s group 2 on every progress line of a rank's log that it matches.
inline std::vector<int64_t> logged_inputs(const std::string& log, const std::regex& input) {
  std::ifstream in(log);
  std::vector<int64_t> out;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, input)) out.push_back(std::stoll(m[2]));
  }
  return out;
}

// The input side of every progress line in a rank's log ("... input (2, 3, 40, 40)").
inline std::vector<int64_t> logged_sides(const std::string& log) {
  static const std::regex input(R"(^step .* input \((\d+), 3, (\d+), (\d+)\))");
  return logged_inputs(log, input);
}

// The row length of every progress line in a rank's log ("... input (4, 96)").
inline std::vector<int64_t> logged_lengths(const std::string& log) {
  static const std::regex input(R"(^step .* input \((\d+), (\d+)\))");
  return logged_inputs(log, input);
}

// Note [Bitwise like none]
// A run whose input shape changes per step plans each shape under a budget. It must train
// exactly as memory.policy none with unlimited memory does (same shapes, same losses bit for bit,
// poison mode on) while every shape's measured peak equals its planned one within the budget.
// The reference run also gives the budget: a third of the way from the smallest shape's planned
// peak to the largest's, so the largest shape cannot keep everything resident and the smallest
// can.

// The reference: a run of memory.policy none with unlimited memory.
struct NoneReference {
  Logged steps;                       // every step's loss and shape
  std::map<int64_t, uint64_t> peaks;  // planned peak per shape, by the shape's dimension `dim`
  std::string output;                 // what the run printed
};

// Runs `command` (the reference run, writing into `dir`) and reads its `steps` steps and its
// planned peaks by dimension `dim` of the shape (2: an image's side, 1: a token row's length).
inline void run_none_reference(const std::string& command, const std::string& dir, int steps,
                               size_t dim, NoneReference& out) {
  const Exit e = run(command);
  out.output = e.output;
  ASSERT_EQ(e.code, 0) << e.output;
  out.steps = read_metrics(dir);
  ASSERT_EQ(out.steps.losses.size(), static_cast<size_t>(steps));
  out.peaks = planned_peaks(read_json(dir + "/summary.json"), dim);
}

// `1 / parts` of the way from the smallest shape's planned peak to the largest's.
inline uint64_t budget_between(const std::map<int64_t, uint64_t>& peaks, uint64_t parts = 3) {
  const uint64_t smallest = peaks.begin()->second, largest = peaks.rbegin()->second;
  return smallest + (largest - smallest) / parts;
}

// A budgeted run checked against its reference.
struct BudgetedRun {
  Exit exit;
  nlohmann::json summary;
  GivenUp given_up;
};

// Runs `command` (the reference's run under a plan with `budget`, writing into `dir`) and checks
// it against `none`: exit 0, every step bitwise the reference's, at most one step waited for its
// plan, the same shapes, each within the budget at its planned peak, something moved or rebuilt
// (the largest shape needed it) and the whole run's device peak within the budget.
inline void expect_bitwise_like_none(const std::string& command, const std::string& dir,
                                     const NoneReference& none, uint64_t budget, BudgetedRun& out) {
  out.exit = run(command);
  ASSERT_EQ(out.exit.code, 0) << out.exit.output;
  ASSERT_NO_FATAL_FAILURE(expect_same_steps(read_metrics(dir), none.steps));
  out.summary = read_json(dir + "/summary.json");
  EXPECT_LE(out.summary["plan_waited_steps"].get<int64_t>(), 1);
  ASSERT_EQ(out.summary["shapes"].size(), none.peaks.size());
  out.given_up = expect_shapes_within(out.summary, budget);
  EXPECT_GT(out.given_up.moved + out.given_up.rebuilt, 0)
      << "the largest shape had to move or rebuild something";
  // The whole run's device high-water mark: one arena for every plan, never a sum.
  EXPECT_LE(out.summary["device_peak_bytes"].get<uint64_t>(), budget);
}

}  // namespace ferry::testing
