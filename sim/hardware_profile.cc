// Reading hardware profiles from YAML (strict: unknown keys and non-positive rates are errors).
#include "sim/hardware_profile.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

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
  rd.check_keys(root, {"name", "gpu", "device_memory", "compute", "link"}, "profile");
  HardwareProfile p;
  p.source = where;
  p.name = root["name"] ? rd.string(root["name"], "name") : file.stem().string();
  if (root["gpu"]) p.gpu = rd.string(root["gpu"], "gpu");
  if (root["device_memory"]) p.device_memory = rd.bytes(root["device_memory"], "device_memory");
  constexpr double kMax = 1e9;
  const auto need = [&](const YAML::Node& map, const char* k, const std::string& section) {
    if (!map[k])
      throw rd.error(map, fmt::format("{}.{}: required", section, k), "see configs/hardware/");
    return rd.number(map[k], section + "." + k, 0, kMax);
  };
  const YAML::Node c = root["compute"];
  if (!c) throw rd.error(root, "compute: required", "see configs/hardware/");
  rd.check_keys(
      c, {"op_tflops", "default_tflops", "memory_gbps", "op_memory_gbps", "step_overhead_us"},
      "compute");
  p.cost.compute_flops = need(c, "default_tflops", "compute") * 1e12;
  p.cost.memory_gbps = need(c, "memory_gbps", "compute");
  // Per op kind ("conv2d", "linear", "batchnorm2d", "maxpool", ...: the ops' kind names).
  const auto per_op = [&](const char* k, double scale,
                          std::vector<std::pair<std::string, double>>& into) {
    const YAML::Node m = c[k];
    if (!m) return;
    rd.expect_map(m, std::string("compute.") + k);
    for (const auto& kv : m) {
      const std::string op = rd.string(kv.first, std::string("compute.") + k + " key");
      into.emplace_back(
          op, rd.number(kv.second, std::string("compute.") + k + "." + op, 0, kMax) * scale);
    }
  };
  per_op("op_tflops", 1e12, p.cost.op_flops);
  per_op("op_memory_gbps", 1.0, p.cost.op_memory_gbps);
  if (c["step_overhead_us"])
    p.cost.step_overhead_s =
        rd.number(c["step_overhead_us"], "compute.step_overhead_us", -1, kMax) * 1e-6;
  const YAML::Node l = root["link"];
  if (!l) throw rd.error(root, "link: required", "see configs/hardware/");
  rd.check_keys(l, {"to_host_gbps", "to_device_gbps", "duplex_factor", "nominal_gbps"}, "link");
  p.gpu_link.to_host_gbps = need(l, "to_host_gbps", "link");
  p.gpu_link.to_device_gbps = need(l, "to_device_gbps", "link");
  p.duplex_given = static_cast<bool>(l["duplex_factor"]);
  p.gpu_link.duplex_factor =
      l["duplex_factor"] ? rd.number(l["duplex_factor"], "link.duplex_factor", 0, 1) : 1.0;
  p.nominal_gbps = l["nominal_gbps"] ? rd.number(l["nominal_gbps"], "link.nominal_gbps", 0, kMax)
                                     : std::max(p.gpu_link.to_host_gbps, p.gpu_link.to_device_gbps);
  p.cost.link_gbps = std::min(p.gpu_link.to_host_gbps, p.gpu_link.to_device_gbps);
  return p;
}

}  // namespace ferry
