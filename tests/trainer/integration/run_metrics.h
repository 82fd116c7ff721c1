// Reading what a trainer run wrote, for the tests of runs whose input shape changes per step
// (data.scales, data.documents): metrics.jsonl's losses and shapes, summary.json's plans per
// shape, and the input shape of each progress line of a rank's log.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

}  // namespace ferry::testing
