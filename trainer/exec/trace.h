// A Chrome-trace recording (viewable in Perfetto or chrome://tracing): spans on the compute,
// device-to-host and host-to-device tracks (and the host optimizer's copies on tracks of their
// own), and a device-memory counter, for the traced steps
// of one rank, and the tracer that resolves a step's device events into it. Times are
// microseconds from the first traced step's start.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/device.h"
#include "prefetch/transfer_engine.h"

namespace ferry {

// kOptimizerToHost and kOptimizerToDevice: memory.optimizer host's gradient and weight copies
// ("optimizer d2h", "optimizer h2d"), named only in traces that have them.
enum class TraceTrack {
  kCompute = 1,
  kDeviceToHost = 2,
  kHostToDevice = 3,
  kComm = 4,
  kOptimizerToHost = 5,
  kOptimizerToDevice = 6
};

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

// The executor's side of tracing: timing events on the compute stream after each tape step
// (and after each wait for copies) while a step is traced, resolved into a StepTrace once the
// host waits for the device anyway (a metrics read), with the transfer engine's copy events.
class StepTracer {
 public:
  explicit StepTracer(Device& device) : device_(device) {}

  // Starts recording into `trace`; nullptr stops and drops what was not resolved.
  void set(StepTrace* trace);
  bool active() const { return trace_ != nullptr; }
  // A traced step has marks that resolve() has not added yet.
  bool pending() const { return trace_ && step_origin_; }

  // Before a traced step's first work: its origin (and, the first time, the trace's).
  void begin_step();
  // A span `name` ending after the work enqueued on compute so far, with `device_bytes` in use.
  void mark(std::string name, uint64_t device_bytes);
  // Waits for compute and the copies it adds: the step's spans, its memory counter and
  // `transfers` (the transfer engine's traced copies), except the optimizer's weight copies up,
  // which the next resolve (or set) adds (Note [Weights going up across a traced step's end]).
  void resolve(std::vector<TracedTransfer> transfers);

  // A host steady_clock time (ns) on the trace's time axis (us), once a traced step has been
  // resolved: for spans measured on the host, such as all-reduces.
  double time_us(int64_t steady_ns) const {
    return static_cast<double>(steady_ns - host_origin_ns_) / 1000.0;
  }

 private:
  struct StepMark {
    std::string name;
    std::unique_ptr<Event> end;
    uint64_t device_bytes;
  };
  Device& device_;
  StepTrace* trace_ = nullptr;
  std::unique_ptr<Event> trace_origin_;  // the first traced step's start
  int64_t host_origin_ns_ = 0;           // steady_clock time of trace_origin_
  std::unique_ptr<Event> step_origin_;   // the current step's start, until resolved
  std::vector<StepMark> marks_;
  std::vector<TracedTransfer> carried_;  // weight copies up, added at the next resolve
  // Adds `transfers` (complete) to the trace.
  void add_transfers(std::vector<TracedTransfer>& transfers);
};

}  // namespace ferry
