// What a run reports: a progress line on the console and one JSON object per logged step in
// <run.dir>/metrics.jsonl (flushed per line, so a crash loses nothing already logged).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace ferry {

struct StepReport {
  int64_t step = 0;
  int64_t steps = 0;
  double loss = 0;
  double accuracy = 0;  // of the logged interval
  double lr = 0;
  double samples_per_s = 0;
  uint64_t device_peak_bytes = 0;
  uint64_t device_capacity = 0;
  double elapsed_s = 0;
  // The logged step's input shape, printed when set (data.scales: it changes per step).
  std::string shape;
  // Real tokens of the global batches per second (data.documents), printed when >= 0.
  double tokens_per_s = -1;
  // The effective batch of an update under optim.accumulate ("64 (8x4x2)"), printed when set.
  std::string batch;
};

class MetricsLog {
 public:
  // Opens `path`: appends (a resumed run) or starts it anew (`fresh`); "" logs to the console
  // only.
  MetricsLog(const std::string& path, bool fresh);
  void write(const StepReport& report, const nlohmann::json& extra = {});

 private:
  std::ofstream out_;
  std::string path_;
};

// "step   40/200  loss 1.8123  acc 0.312  lr 0.1000  1234.5 samples/s  mem 12.3 MiB / 4.00 GiB  eta
// 1m05s"
std::string progress_line(const StepReport& r);

}  // namespace ferry
