// Measuring a model's kernels and the link on the device, with a JSON cache per device.
// Cache layout (one file may hold several devices and models):
//   {"format": "ferry cost profile 1",
//    "devices": {"<device key>": {"kernels": {"<kernel key>": {"seconds": s, "launches": n}},
//                                 "links": {"d2h": {"<bytes>": gbps}, "h2d": {...}}}}}
#include "trainer/plan/device_profile.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "device/kernel_timing.h"
#include "trainer/checkpoint/atomic_file.h"
#include "trainer/configured/options.h"
#include "trainer/exec/step_kernels.h"
#include "trainer/plan/host_update_timing.h"

namespace ferry {

namespace {

constexpr const char* kFormat = "ferry cost profile 1";

nlohmann::json read_cache(const std::string& path) {
  if (path.empty() || !std::filesystem::exists(path)) return nlohmann::json::object();
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  // An unreadable or foreign file is measured over, not trusted.
  if (!j.is_object() || j.value("format", "") != kFormat) return nlohmann::json::object();
  return j;
}

void write_cache(const std::string& path, const nlohmann::json& j) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  AtomicFileWriter out(path);
  const std::string text = j.dump(1) + "\n";
  out.write(text.data(), text.size());
  out.commit();
}

// The rate of the largest size measured in one direction (0 when none).
double link_rate(const nlohmann::json& sizes) {
  double rate = 0;
  uint64_t largest = 0;
  for (const auto& [bytes, gbps] : sizes.items()) {
    const uint64_t b = std::stoull(bytes);
    if (b >= largest && gbps.is_number()) {
      largest = b;
      rate = gbps.get<double>();
    }
  }
  return rate;
}

}  // namespace

KernelArgs update_kernel(const Config& config, int64_t param_floats) {
  const OptimizerOptions o = optimizer_options(config);
  if (o.kind == OptimizerKind::kAdamW) {
    return AdamWUpdate{param_floats, 0.0f, o.beta1, o.beta2, o.eps, o.weight_decay, 1};
  }
  return SgdUpdate{param_floats, 0.0f, o.momentum, o.weight_decay, o.nesterov};
}

std::string profile_device_key(const Device& device, double link_gbps) {
  // "cuda:1 (NVIDIA H100 80GB HBM3)" -> "cuda (NVIDIA H100 80GB HBM3)": the ranks of one
  // machine drive the same kind of device and share its entry.
  std::string name = device.name();
  const size_t colon = name.find(':');
  size_t digits = colon == std::string::npos ? 0 : colon + 1;
  while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) ++digits;
  if (colon != std::string::npos && digits > colon + 1) name.erase(colon, digits - colon);
  return link_gbps > 0 ? fmt::format("{} link {} GB/s", name, link_gbps) : name;
}

DeviceProfile measure_device(Device& device, const Graph& graph, const Lowered& lowered,
                             const std::optional<KernelArgs>& update,
                             const ProfileOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  DeviceProfile p;
  p.cache_path = options.cache_path;
  nlohmann::json cache = read_cache(options.cache_path);
  cache["format"] = kFormat;
  nlohmann::json& mine = cache["devices"][options.device_key];
  nlohmann::json& known = mine["kernels"];
  if (!known.is_object()) known = nlohmann::json::object();
  bool changed = false;

  // Every distinct launch, timed once.
  const std::vector<std::vector<KernelArgs>> launches =
      step_kernels(graph, lowered, device.kernels(), update);
  std::map<std::string, double> seconds;  // by kernel key; absent: could not be timed
  for (const auto& step : launches) {
    for (const KernelArgs& args : step) {
      const std::string key = kernel_key(args);
      if (seconds.count(key)) continue;
      ++p.kernels;
      if (known.contains(key) && known[key].contains("seconds")) {
        seconds[key] = known[key]["seconds"].get<double>();
        ++p.from_cache;
        continue;
      }
      try {
        const KernelTiming t = time_kernel(device, args);
        seconds[key] = t.seconds;
        known[key] = {{"seconds", t.seconds}, {"launches", t.launches}};
        changed = true;
      } catch (const Error& e) {
        // No room for its operands, no such kernel on this backend, a geometry the library
        // refuses: the steps that launch it keep the FLOP model.
        ++p.failed;
        if (p.first_failure.empty())
          p.first_failure = std::string(kernel_name(args)) + ": " + e.what();
      }
    }
  }

  // The pinned link, per direction, at a few sizes that fit the free device memory.
  nlohmann::json& links = mine["links"];
  if (!links.is_object() || !links.contains("d2h") || !links.contains("h2d")) {
    links = nlohmann::json::object();
    const MemoryStats m = device.memory().stats();
    const uint64_t free =
        device.memory().capacity() - std::min(m.in_use, device.memory().capacity());
    for (uint64_t bytes : {uint64_t{4} << 20, uint64_t{64} << 20}) {
      if (bytes > free / 2) break;
      for (const bool to_host : {true, false}) {
        try {
          links[to_host ? "d2h" : "h2d"][std::to_string(bytes)] = time_copy(device, to_host, bytes);
          changed = true;
        } catch (const OutOfMemoryError&) {
        }
      }
    }
  }
  if (links.contains("d2h")) p.link_gbps_to_host = link_rate(links["d2h"]);
  if (links.contains("h2d")) p.link_gbps_to_device = link_rate(links["h2d"]);

  // The host update, once per optimizer kind and state (Note [A timed host update]).
  if (options.host_update) {
    const std::string key = fmt::format("{} slots", optimizer_slots(*options.host_update));
    nlohmann::json& host = mine["host_update_gbps"];
    if (!host.is_object()) host = nlohmann::json::object();
    if (!host.contains(key) || !host[key].is_number()) {
      host[key] = time_host_update(*options.host_update);
      changed = true;
    }
    p.host_update_gbps = host[key].get<double>();
  }

  // Per step: the sum of its launches, or the upload at the measured rate.
  auto steps = std::make_shared<MeasuredSteps>();
  steps->device = device.name();
  const Tape& tape = lowered.tape;
  p.steps_total = static_cast<int>(tape.steps.size());
  for (size_t s = 0; s < tape.steps.size(); ++s) {
    const TapeStep& step = tape.steps[s];
    double t = 0;
    bool complete = true;
    if (step.phase == StepPhase::kLoad) {
      uint64_t bytes = 0;
      for (int w : step.writes) bytes += tape.tensors[static_cast<size_t>(w)].bytes;
      complete = p.link_gbps_to_device > 0;
      if (complete) t = static_cast<double>(bytes) / (p.link_gbps_to_device * 1e9);
    } else {
      for (const KernelArgs& args : launches[s]) {
        const auto it = seconds.find(kernel_key(args));
        if (it == seconds.end()) {
          complete = false;
          break;
        }
        t += it->second;
      }
    }
    if (!complete) continue;
    steps->seconds[measured_step_key(step, tape)] = t;
    ++p.steps_measured;
    p.predicted_compute_s += t;
  }
  p.steps = std::move(steps);
  device.memory().reset_peak();
  if (changed && options.write_cache && !options.cache_path.empty()) {
    write_cache(options.cache_path, cache);
  }
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return p;
}

void apply_profile(const DeviceProfile& profile, const Tape& tape, CostModel& cost,
                   bool keep_link) {
  if (profile.steps) {
    auto measured = std::make_shared<MeasuredSteps>(*profile.steps);
    calibrate_estimates(*measured, tape, cost);
    cost.measured = std::move(measured);
  }
  if (profile.host_update_gbps > 0) cost.host_update_gbps = profile.host_update_gbps;
  if (keep_link) return;
  cost.link_gbps_to_host = profile.link_gbps_to_host;
  cost.link_gbps_to_device = profile.link_gbps_to_device;
}

std::string describe_profile(const DeviceProfile& p) {
  std::string s = fmt::format(
      "measured on {}: {} kernels ({} from cache{}), {}/{} steps", p.steps ? p.steps->device : "?",
      p.kernels, p.from_cache,
      p.failed ? fmt::format(", {} not timed ({})", p.failed, p.first_failure.substr(0, 120)) : "",
      p.steps_measured, p.steps_total);
  if (p.link_gbps_to_host > 0 || p.link_gbps_to_device > 0) {
    s += fmt::format(", link d2h {:.1f} GB/s h2d {:.1f} GB/s", p.link_gbps_to_host,
                     p.link_gbps_to_device);
  }
  if (p.host_update_gbps > 0) s += fmt::format(", host update {:.1f} GB/s", p.host_update_gbps);
  s += fmt::format(", {:.2f}s", p.seconds);
  if (!p.cache_path.empty()) s += ", cache " + p.cache_path;
  return s;
}

}  // namespace ferry
