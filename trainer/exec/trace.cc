// Chrome-trace JSON output, and resolving a traced step's device events into it.
#include "trainer/exec/trace.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "common/file_write.h"

namespace ferry {

nlohmann::json StepTrace::to_json() const {
  nlohmann::json events = nlohmann::json::array();
  const auto meta = [&](TraceTrack track, const char* name) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", rank_},
                      {"tid", static_cast<int>(track)},
                      {"args", {{"name", name}}}});
  };
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", rank_},
                    {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  meta(TraceTrack::kCompute, "compute");
  meta(TraceTrack::kDeviceToHost, "device-to-host");
  meta(TraceTrack::kHostToDevice, "host-to-device");
  meta(TraceTrack::kComm, "all-reduce");
  const auto used = [&](TraceTrack track) {
    return std::any_of(spans_.begin(), spans_.end(),
                       [&](const TraceSpan& s) { return s.track == track; });
  };
  if (used(TraceTrack::kOptimizerToHost)) meta(TraceTrack::kOptimizerToHost, "optimizer d2h");
  if (used(TraceTrack::kOptimizerToDevice)) meta(TraceTrack::kOptimizerToDevice, "optimizer h2d");
  for (const TraceSpan& s : spans_) {
    nlohmann::json e = {{"ph", "X"},        {"name", s.name},
                        {"pid", rank_},     {"tid", static_cast<int>(s.track)},
                        {"ts", s.start_us}, {"dur", std::max(s.duration_us, 0.0)}};
    if (!s.args.is_null()) e["args"] = s.args;
    events.push_back(std::move(e));
  }
  for (const TraceCounter& c : counters_) {
    events.push_back({{"ph", "C"},
                      {"name", "device memory"},
                      {"pid", rank_},
                      {"ts", c.time_us},
                      {"args", {{"bytes", c.device_bytes}}}});
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

void StepTrace::write(const std::string& path) const {
  write_file(path, to_json().dump() + "\n",
             "check that run.dir is writable and its disk has space, or set run.trace: false");
}

void StepTracer::set(StepTrace* trace) {
  if (trace == trace_) return;
  // Note [Weights going up across a traced step's end]: the copies left in flight.
  if (trace_ && !carried_.empty() && trace_origin_) {
    device_.synchronize();
    add_transfers(carried_);
  }
  carried_.clear();
  trace_ = trace;
  if (!trace) {
    trace_origin_.reset();
    step_origin_.reset();
    marks_.clear();
  }
}

void StepTracer::begin_step() {
  Stream& compute = device_.stream(StreamKind::kCompute);
  step_origin_ = device_.create_timing_event();
  compute.record(*step_origin_);
  if (!trace_origin_) {
    trace_origin_ = device_.create_timing_event();
    compute.record(*trace_origin_);
  }
  marks_.clear();
}

void StepTracer::mark(std::string name, uint64_t device_bytes) {
  StepMark m{std::move(name), device_.create_timing_event(), device_bytes};
  device_.stream(StreamKind::kCompute).record(*m.end);
  marks_.push_back(std::move(m));
}

// Note [Weights going up across a traced step's end]
// memory.optimizer host's weight copies up (Note [Host copies on the links] in
// trainer/optim/model_state_step.h) are issued at the end of a step and waited for by the next
// forward piece by piece. Resolving a step waits for compute and for the copies it adds, not for
// the whole device: those copies are left in flight across the traced step's end and added with
// the next step's spans (or when tracing stops), so a trace of two steps or more shows the next
// forward's kernels running while the last pieces go up, as they do in untraced steps.
void StepTracer::resolve(std::vector<TracedTransfer> transfers) {
  std::vector<TracedTransfer> now = std::move(carried_);
  carried_.clear();
  for (TracedTransfer& t : transfers) {
    const bool up = t.request.purpose == TransferPurpose::kOptimizer &&
                    t.request.direction == TransferDirection::kToDevice;
    (up ? carried_ : now).push_back(std::move(t));
  }
  device_.stream(StreamKind::kCompute).synchronize();
  for (TracedTransfer& t : now) t.end->synchronize();  // every copy added has finished
  const auto at = [&](Event& e) { return device_.elapsed_ms(*trace_origin_, e) * 1000.0; };
  {
    // Place the origin on the host clock: an event recorded on the idle compute stream
    // completes at once, so its elapsed time from the origin is "now".
    auto now = device_.create_timing_event();
    device_.stream(StreamKind::kCompute).record(*now);
    now->synchronize();
    const int64_t host_now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count();
    host_origin_ns_ = host_now - static_cast<int64_t>(at(*now) * 1000.0);
  }
  double start = at(*step_origin_);
  for (StepMark& m : marks_) {
    const double end = at(*m.end);
    trace_->counter(start, m.device_bytes);
    trace_->add({TraceTrack::kCompute, m.name, start, end - start, {}});
    start = end;
  }
  add_transfers(now);
  step_origin_.reset();
  marks_.clear();
}

void StepTracer::add_transfers(std::vector<TracedTransfer>& transfers) {
  const auto at = [&](Event& e) { return device_.elapsed_ms(*trace_origin_, e) * 1000.0; };
  for (TracedTransfer& t : transfers) {
    const bool to_host = t.request.direction == TransferDirection::kToHost;
    const double begin = at(*t.start);
    if (t.request.purpose == TransferPurpose::kOptimizer) {
      trace_->add({to_host ? TraceTrack::kOptimizerToHost : TraceTrack::kOptimizerToDevice,
                   t.request.tensor,
                   begin,
                   at(*t.end) - begin,
                   {{"bytes", t.request.bytes}, {"deadline_s", t.request.deadline_s}}});
      continue;
    }
    trace_->add({to_host ? TraceTrack::kDeviceToHost : TraceTrack::kHostToDevice,
                 (to_host ? "offload " : "prefetch ") + t.request.tensor,
                 begin,
                 at(*t.end) - begin,
                 {{"bytes", t.request.bytes}, {"deadline_step", t.request.deadline_step}}});
  }
}

}  // namespace ferry
