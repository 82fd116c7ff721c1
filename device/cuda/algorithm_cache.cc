// The process-wide cache of convolution algorithm choices (Note [One algorithm per geometry per
// process] in algorithm_cache.h).
#include "device/cuda/algorithm_cache.h"

namespace ferry::cuda {

ConvAlgorithmKey conv_algorithm_key(const DeviceOptions& options, int pass, const ConvGeom& g) {
  ConvAlgorithmKey key;
  key.ordinal = options.ordinal;
  key.pass = pass;
  key.geometry = {g.n, g.c,        g.h,        g.w,     g.k,     g.r,
                  g.s, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.groups};
  key.conv_tf32 = options.conv_tf32;
  key.deterministic = options.deterministic;
  key.search = options.algorithms;
  key.workspace_limit = options.workspace_limit;
  return key;
}

ConvAlgorithm ConvAlgorithmCache::get(const ConvAlgorithmKey& key,
                                      const std::function<ConvAlgorithm()>& choose) {
  std::lock_guard lock(mutex_);
  auto it = choices_.find(key);
  if (it != choices_.end()) return it->second;
  const ConvAlgorithm chosen = choose();
  choices_.emplace(key, chosen);
  return chosen;
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
