// metrics.jsonl and the progress line.
#include "trainer/session/metrics.h"

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "common/file_write.h"

namespace ferry {

MetricsLog::MetricsLog(const std::string& path, bool fresh) : path_(path) {
  if (path.empty()) return;
  out_.open(path, fresh ? std::ios::trunc : std::ios::app);
  if (!out_) throw DataError("cannot open metrics file " + path, "check run.dir is writable");
}

void MetricsLog::write(const StepReport& r, const nlohmann::json& extra) {
  if (!out_.is_open()) return;
  nlohmann::json j = {{"step", r.step},
                      {"loss", r.loss},
                      {"accuracy", r.accuracy},
                      {"lr", r.lr},
                      {"samples_per_s", r.samples_per_s},
                      {"device_peak_bytes", r.device_peak_bytes},
                      {"elapsed_s", r.elapsed_s}};
  for (const auto& [k, v] : extra.items()) j[k] = v;
  out_ << j.dump() << '\n';
  check_stream(out_, path_, "check that run.dir's disk has space");
}

std::string progress_line(const StepReport& r) {
  std::string eta;
  if (r.step > 0 && r.step < r.steps) {
    const auto left = static_cast<int64_t>(r.elapsed_s / static_cast<double>(r.step) *
                                           static_cast<double>(r.steps - r.step));
    eta = left >= 60 ? fmt::format("  eta {}m{:02d}s", left / 60, left % 60)
                     : fmt::format("  eta {}s", left);
  }
  const int width = static_cast<int>(std::to_string(r.steps).size());
  return fmt::format(
      "step {:>{}}/{}  loss {:.4f}  acc {:.3f}  lr {:.4g}  {:.1f} samples/s{}  "
      "mem {} / {}{}{}{}",
      r.step, width, r.steps, r.loss, r.accuracy, r.lr, r.samples_per_s,
      r.tokens_per_s >= 0 ? fmt::format(" ({:.0f} tokens/s)", r.tokens_per_s) : std::string(),
      format_bytes(r.device_peak_bytes), format_bytes(r.device_capacity),
      r.shape.empty() ? "" : "  input " + r.shape, r.batch.empty() ? "" : "  batch " + r.batch,
      eta);
}

}  // namespace ferry
