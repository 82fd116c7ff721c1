// Reading hardware profiles from YAML (strict: unknown and repeated keys, and values outside
// Note [Hardware profile ranges], are errors naming the file, line and key).
#include "sim/hardware_profile.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "topology/pci.h"
#include "topology/yaml_reader.h"

#ifndef FERRY_SOURCE_DIR
#define FERRY_SOURCE_DIR "."
#endif

namespace ferry {

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> search_dirs() {
  return {fs::path("configs") / "hardware", fs::path(FERRY_SOURCE_DIR) / "configs" / "hardware"};
}

// Note [Hardware profile ranges]
// What a profile may state, wide around today's hardware (an H100: 67-162 TFLOP/s, 3000 GB/s of
// HBM, 49-55 GB/s over PCIe gen5, 8 us per step): compute 0.01-10000 TFLOP/s, memory 1-100000
// GB/s, links as in topology files (kMinPlausibleLinkGbps to kMaxPlausibleLinkGbps), a step
// overhead of 0 to 1 s, device memory of 256 MiB to 16 TiB.
constexpr double kMinTflops = 0.01;
constexpr double kMaxTflops = 10000;
constexpr double kMinMemoryGbps = 1;
constexpr double kMaxMemoryGbps = 100000;
constexpr double kMaxStepOverheadUs = 1e6;
constexpr uint64_t kMinDeviceMemory = uint64_t{256} << 20;
constexpr uint64_t kMaxDeviceMemory = uint64_t{16} << 40;

bool is_file_name(const std::string& s) {
  return s.find('/') != std::string::npos || s.ends_with(".yaml") || s.ends_with(".yml");
}

}  // namespace

double HardwareProfile::efficiency(TransferDirection d) const {
  const double rate =
      d == TransferDirection::kToHost ? gpu_link.to_host_gbps : gpu_link.to_device_gbps;
  return nominal_gbps > 0 ? std::min(1.0, rate / nominal_gbps) : 1.0;
}

std::vector<std::string> hardware_profile_names() {
  std::vector<std::string> names;
  for (const fs::path& dir : search_dirs()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() != ".yaml") continue;
      const std::string n = e.path().stem().string();
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
    if (!names.empty()) break;
  }
  std::sort(names.begin(), names.end());
  return names;
}

HardwareProfile load_hardware_profile(const std::string& name_or_file, const std::string& key) {
  fs::path file;
  if (is_file_name(name_or_file)) {
    file = name_or_file;
    if (!fs::is_regular_file(file))
      throw ConfigError(fmt::format("{}: cannot read hardware profile '{}'", key, name_or_file),
                        "give a profile YAML file or a shipped profile's name");
  } else {
    for (const fs::path& dir : search_dirs()) {
      if (fs::is_regular_file(dir / (name_or_file + ".yaml"))) {
        file = dir / (name_or_file + ".yaml");
        break;
      }
    }
    if (file.empty()) {
      std::string known;
      for (const std::string& n : hardware_profile_names())
        known += (known.empty() ? "" : ", ") + n;
      throw ConfigError(fmt::format("{}: unknown hardware profile '{}'", key, name_or_file),
                        known.empty() ? "give a profile YAML file (see configs/hardware/)"
                                      : "use one of " + known + ", or a profile YAML file");
    }
  }
  std::ifstream is(file);
  std::stringstream text;
  text << is.rdbuf();
  const std::string where = file.string();
  const yaml::Reader rd(where);
  const YAML::Node root = yaml::parse(text.str(), where);
  rd.check_keys(root, {"name", "gpu", "device_memory", "compute", "link", "network", "host"},
                "profile");
  HardwareProfile p;
  p.source = where;
  p.name = root["name"] ? rd.string(root["name"], "name") : file.stem().string();
  if (root["gpu"]) p.gpu = rd.string(root["gpu"], "gpu");
  if (root["device_memory"]) {
    p.device_memory = rd.bytes(root["device_memory"], "device_memory");
    if (p.device_memory < kMinDeviceMemory || p.device_memory > kMaxDeviceMemory)
      throw rd.error(root["device_memory"],
                     fmt::format("device_memory must be in [256MiB, 16TiB], got {}",
                                 root["device_memory"].Scalar()),
                     "ferry is tested with GPUs of 256 MiB to 16 TiB; write e.g. 80GiB");
  }
  // Note [Hardware profile ranges]: each rate is bounded on both sides, so the planner and the
  // simulator stay in their tested envelope (a 1e-300 rate makes a step last longer than a
  // double can count).
  const auto need = [&](const YAML::Node& map, const char* k, const std::string& section, double lo,
                        double hi, const char* unit) {
    if (!map[k])
      throw rd.error(map, fmt::format("{}.{}: required", section, k), "see configs/hardware/");
    return rd.number_in(map[k], section + "." + k, lo, hi, unit);
  };
  const YAML::Node c = root["compute"];
  if (!c) throw rd.error(root, "compute: required", "see configs/hardware/");
  rd.check_keys(
      c,
      {"op_tflops", "default_tflops", "memory_gbps", "op_memory_gbps", "step_overhead_us", "bf16"},
      "compute");
  p.cost.compute_flops =
      need(c, "default_tflops", "compute", kMinTflops, kMaxTflops, "TFLOP/s") * 1e12;
  p.cost.memory_gbps = need(c, "memory_gbps", "compute", kMinMemoryGbps, kMaxMemoryGbps, "GB/s");
  // Per op kind ("conv2d", "linear", "batchnorm2d", "maxpool", ...: the ops' kind names).
  const auto per_op = [&](const char* k, double scale, double lo, double hi, const char* unit,
                          std::vector<std::pair<std::string, double>>& into) {
    const YAML::Node m = c[k];
    if (!m) return;
    rd.expect_map(m, std::string("compute.") + k);
    for (const auto& kv : m) {
      const std::string op = rd.string(kv.first, std::string("compute.") + k + " key");
      into.emplace_back(
          op,
          rd.number_in(kv.second, std::string("compute.") + k + "." + op, lo, hi, unit) * scale);
    }
  };
  per_op("op_tflops", 1e12, kMinTflops, kMaxTflops, "TFLOP/s", p.cost.op_flops);
  per_op("op_memory_gbps", 1.0, kMinMemoryGbps, kMaxMemoryGbps, "GB/s", p.cost.op_memory_gbps);
  if (const YAML::Node b = c["bf16"]) {
    rd.expect_map(b, "compute.bf16");
    rd.check_keys(b, {"peak_tflops", "op_tflops"}, "compute.bf16");
    p.bf16_peak_flops =
        need(b, "peak_tflops", "compute.bf16", kMinTflops, kMaxTflops, "TFLOP/s") * 1e12;
    if (const YAML::Node m = b["op_tflops"]) {
      rd.expect_map(m, "compute.bf16.op_tflops");
      for (const auto& kv : m) {
        const std::string op = rd.string(kv.first, "compute.bf16.op_tflops key");
        p.bf16_op_flops.emplace_back(op, rd.number_in(kv.second, "compute.bf16.op_tflops." + op,
                                                      kMinTflops, kMaxTflops, "TFLOP/s") *
                                             1e12);
      }
    }
  }
  if (c["step_overhead_us"])
    p.cost.step_overhead_s = rd.number_in(c["step_overhead_us"], "compute.step_overhead_us", 0,
                                          kMaxStepOverheadUs, "us") *
                             1e-6;
  const YAML::Node l = root["link"];
  if (!l) throw rd.error(root, "link: required", "see configs/hardware/");
  rd.check_keys(l, {"to_host_gbps", "to_device_gbps", "duplex_factor", "nominal_gbps"}, "link");
  p.gpu_link.to_host_gbps =
      need(l, "to_host_gbps", "link", kMinPlausibleLinkGbps, kMaxPlausibleLinkGbps, "GB/s");
  p.gpu_link.to_device_gbps =
      need(l, "to_device_gbps", "link", kMinPlausibleLinkGbps, kMaxPlausibleLinkGbps, "GB/s");
  p.duplex_given = static_cast<bool>(l["duplex_factor"]);
  // 0.5: the two directions share one rate (half duplex); 1: each keeps its own (full duplex).
  p.gpu_link.duplex_factor =
      l["duplex_factor"] ? rd.number_in(l["duplex_factor"], "link.duplex_factor", 0.5, 1, "") : 1.0;
  p.nominal_gbps = l["nominal_gbps"] ? rd.link_gbps(l["nominal_gbps"], "link.nominal_gbps")
                                     : std::max(p.gpu_link.to_host_gbps, p.gpu_link.to_device_gbps);
  p.cost.link_gbps = std::min(p.gpu_link.to_host_gbps, p.gpu_link.to_device_gbps);
  // memory.optimizer host: what one GPU's share of the host streams through its update.
  if (const YAML::Node h = root["host"]) {
    rd.check_keys(h, {"update_gbps"}, "host");
    p.cost.host_update_gbps =
        need(h, "update_gbps", "host", kMinMemoryGbps, kMaxMemoryGbps, "GB/s");
  }
  if (const YAML::Node net = root["network"]) {
    rd.check_keys(net, {"nic_gbps"}, "network");
    if (net["nic_gbps"]) p.nic_gbps = rd.link_gbps(net["nic_gbps"], "network.nic_gbps");
  }
  return p;
}

CostModel profile_cost(const HardwareProfile& profile, Precision precision) {
  CostModel cost = profile.cost;
  if (precision == Precision::kFp32) return cost;
  if (profile.bf16_peak_flops <= 0)
    throw ConfigError(
        fmt::format("device.precision: bf16, but hardware profile '{}' ({}) has no bf16 rate "
                    "(compute.bf16 in {})",
                    profile.name, profile.gpu, profile.source),
        "this GPU has no bf16 tensor cores: set device.precision=fp32, or use a profile with "
        "compute.bf16 (a100-pcie4, h100-pcie5)");
  for (const auto& [op, rate] : profile.bf16_op_flops) {
    auto it = std::find_if(cost.op_flops.begin(), cost.op_flops.end(),
                           [&](const auto& e) { return e.first == op; });
    if (it == cost.op_flops.end()) {
      cost.op_flops.emplace_back(op, rate);
    } else {
      it->second = rate;
    }
  }
  return cost;
}

}  // namespace ferry
