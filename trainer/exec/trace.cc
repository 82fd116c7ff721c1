// Chrome-trace JSON output.
#include "trainer/exec/trace.h"

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

}  // namespace ferry
