// Checkpoint folder housekeeping and the run shape resume checks.
#include "trainer/session/checkpoints.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "common/strings.h"
#include "trainer/configured/model.h"

namespace ferry {

namespace fs = std::filesystem;

std::map<std::string, std::string> run_shape(const Config& config) {
  std::map<std::string, std::string> shape{{"model.name", config.model.name}};
  if (model_info(config.model.name).tokens) {
    const TransformerSizes s = resolved_sizes(config);
    shape["model.layers"] = std::to_string(s.layers);
    shape["model.heads"] = std::to_string(s.heads);
    shape["model.width"] = std::to_string(s.width);
    shape["model.vocab"] = std::to_string(s.vocab);
    shape["model.context"] = std::to_string(s.context);
    if (model_info(config.model.name).llama()) {
      shape["model.kv_heads"] = std::to_string(s.kv_heads);
      shape["model.ffn"] = std::to_string(s.ffn);
      shape["model.tie_embeddings"] = *s.tie_embeddings ? "true" : "false";
      shape["model.rope_theta"] = fmt::format("{}", s.rope_theta);
      shape["model.norm_eps"] = fmt::format("{}", s.norm_eps);
    }
    shape["data.seq_len"] = std::to_string(tokens_per_row(config));
  } else {
    shape["model.input"] = fmt::format("[{}]", fmt::join(config.model.input, ", "));
    shape["model.classes"] = std::to_string(config.model.classes);
  }
  return shape;
}

std::string checkpoint_path(const std::string& dir, int64_t step) {
  return (fs::path(dir) / fmt::format("step_{}.safetensors", step)).string();
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    constexpr std::string_view kPrefix = "step_", kSuffix = ".safetensors";
    if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
        !name.ends_with(kSuffix)) {
      continue;
    }
    const std::string digits =
        name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
    // Not ours unless the whole middle is a step number that fits (step_9999...9 is skipped).
    const std::optional<int64_t> step = parse_digits<int64_t>(digits);
    if (!step) continue;
    out.emplace_back(*step, entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void prune_checkpoints(const std::string& dir, int64_t keep) {
  if (keep <= 0) return;
  auto all = list_checkpoints(dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i].second, ec);
  }
}

std::string resolve_resume(const std::string& resume, const std::string& dir) {
  if (resume.empty()) return "";
  if (resume == "latest") {
    auto all = list_checkpoints(dir);
    return all.empty() ? "" : all.back().second;
  }
  if (!fs::exists(resume)) {
    throw DataError(fmt::format("checkpoint.resume: no such file '{}'", resume),
                    "give a step_<N>.safetensors file, or 'latest'");
  }
  return resume;
}

}  // namespace ferry
