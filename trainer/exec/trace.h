// A Chrome-trace recording (viewable in Perfetto or chrome://tracing): spans on the compute,
// device-to-host and host-to-device tracks, and a device-memory counter, for the traced steps
// of one rank. Times are microseconds from the first traced step's start.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry {

enum class TraceTrack { kCompute = 1, kDeviceToHost = 2, kHostToDevice = 3, kComm = 4 };

struct TraceSpan {
  TraceTrack track = TraceTrack::kCompute;
  std::string name;
  double start_us = 0;
  double duration_us = 0;
  nlohmann::json args;
};

struct TraceCounter {
  double time_us = 0;
  uint64_t device_bytes = 0;
};

class StepTrace {
 public:
  explicit StepTrace(int rank = 0) : rank_(rank) {}
  void add(TraceSpan span) { spans_.push_back(std::move(span)); }
  void counter(double time_us, uint64_t device_bytes) {
    counters_.push_back({time_us, device_bytes});
  }
  // Shifts later additions by `offset_us` (a traced step's start relative to the first one).
  double origin_us = 0;

  const std::vector<TraceSpan>& spans() const { return spans_; }
  const std::vector<TraceCounter>& counters() const { return counters_; }
  // {"traceEvents": [...], "displayTimeUnit": "ms"} with track names as thread metadata.
  nlohmann::json to_json() const;
  // Writes to_json() to `path` (DataError when it cannot).
  void write(const std::string& path) const;

 private:
  int rank_;
  std::vector<TraceSpan> spans_;
  std::vector<TraceCounter> counters_;
};

}  // namespace ferry
