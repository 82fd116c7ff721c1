// The process-wide cache of convolution algorithm choices (Note [One algorithm per geometry per
// process] in algorithm_cache.h).
#include "device/cuda/algorithm_cache.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ferry::cuda {

ConvAlgorithmKey conv_algorithm_key(const DeviceOptions& options, int pass, const ConvGeom& g) {
  ConvAlgorithmKey key;
  key.ordinal = options.ordinal;
  key.pass = pass;
  key.geometry = {g.n, g.c,        g.h,        g.w,     g.k,     g.r,
                  g.s, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.groups};
  key.conv_tf32 = options.cuda.conv_tf32;
  key.deterministic = options.cuda.deterministic;
  key.search = options.cuda.algorithms;
  key.workspace_limit = options.workspace_limit;
  return key;
}

std::string format_choice_line(const ConvAlgorithmKey& key, const ConvAlgorithm& choice) {
  std::ostringstream out;
  out << "conv " << key.ordinal << ' ' << key.pass;
  for (int64_t v : key.geometry) out << ' ' << v;
  out << ' ' << int(key.conv_tf32) << ' ' << int(key.deterministic) << ' '
      << static_cast<int>(key.search) << ' ' << key.workspace_limit << " -> " << choice.algo << ' '
      << choice.math_type << ' ' << choice.workspace << ' ' << int(choice.timed);
  return out.str();
}

std::optional<std::pair<ConvAlgorithmKey, ConvAlgorithm>> parse_choice_line(std::string_view line) {
  std::istringstream in{std::string(line)};
  std::string word, arrow;
  ConvAlgorithmKey key;
  ConvAlgorithm choice;
  int tf32 = 0, det = 0, search = 0, timed = 0;
  in >> word >> key.ordinal >> key.pass;
  for (int64_t& v : key.geometry) in >> v;
  in >> tf32 >> det >> search >> key.workspace_limit >> arrow >> choice.algo >> choice.math_type >>
      choice.workspace >> timed;
  if (!in || word != "conv" || arrow != "->" || (in >> word)) return std::nullopt;
  const auto flag = [](int v) { return v == 0 || v == 1; };
  if (!flag(tf32) || !flag(det) || !flag(timed) || !flag(search)) return std::nullopt;
  key.conv_tf32 = tf32 == 1;
  key.deterministic = det == 1;
  key.search = static_cast<AlgorithmSearch>(search);
  choice.timed = timed == 1;
  return std::make_pair(key, choice);
}

ConvAlgorithm ConvAlgorithmCache::get(const ConvAlgorithmKey& key,
                                      const std::function<ConvAlgorithm()>& choose,
                                      const std::string& file, const std::string& header) {
  std::lock_guard lock(mutex_);
  auto it = choices_.find(key);
  if (it != choices_.end()) return it->second;
  const ConvAlgorithm chosen = choose();
  choices_.emplace(key, chosen);
  if (!file.empty()) {
    std::error_code ec;
    const std::filesystem::path path(file);
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
    const bool fresh =
        !std::filesystem::exists(path, ec) || std::filesystem::file_size(path, ec) == 0;
    std::ofstream out(path, std::ios::app);
    if (fresh) out << header << '\n';
    out << format_choice_line(key, chosen) << '\n';
    out.flush();
    if (!out && !warned_) {
      warned_ = true;
      std::fprintf(stderr,
                   "ferry: warning: cannot write %s: a resumed run will choose its convolution "
                   "algorithms again\n",
                   file.c_str());
    }
  }
  return chosen;
}

size_t ConvAlgorithmCache::load(const std::string& file, const std::string& header) {
  std::ifstream in(file);
  std::string line;
  if (!in || !std::getline(in, line) || line != header) return 0;
  std::lock_guard lock(mutex_);
  size_t added = 0;
  while (std::getline(in, line)) {
    const auto entry = parse_choice_line(line);
    if (entry && choices_.emplace(entry->first, entry->second).second) ++added;
  }
  return added;
}

size_t ConvAlgorithmCache::size() const {
  std::lock_guard lock(mutex_);
  return choices_.size();
}

ConvAlgorithmCache& process_conv_algorithms() {
  static ConvAlgorithmCache cache;
  return cache;
}

}  // namespace ferry::cuda
