// The process-wide cache of convolution algorithm choices: one choice per (GPU, options, pass,
// geometry) for the whole process (Note [One algorithm per geometry per process]). Invariant:
// once a key has a choice, every later lookup of that key returns it, whatever device, session
// or budget asks. Pure C++ (no cuDNN), so its rules are tested without a GPU.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

#include "device/device.h"

namespace ferry::cuda {

// Note [One algorithm per geometry per process]
// A timed search (cudnnFind*) picks the fastest algorithm, and on small convolutions several
// time within noise: two sessions of one process (a run and its comparison run, or every policy
// variant of a test) could pick different ones and produce different bits, which deterministic
// mode promises not to. So a choice is made once per key and kept for the process: every later
// CudnnConv of the same GPU and options reuses it (no second Find, no second cudaMalloc of
// scratch). The key holds everything that may change the choice: the GPU, the pass, the
// geometry, TF32, determinism, how algorithms are chosen and the workspace limit. The session
// keeps the limit independent of memory.budget in deterministic runs (device_options), so runs
// of different budgets share their choices. Across processes (a resumed run) only
// device.algorithms=heuristic repeats the choice, as PyTorch's deterministic && !benchmark.
struct ConvAlgorithmKey {
  int ordinal = 0;  // the GPU, in this process's CUDA enumeration
  int pass = 0;     // forward, backward data, backward filter
  // n, c, h, w, k, r, s, stride_h, stride_w, pad_h, pad_w, groups
  std::array<int64_t, 12> geometry{};
  bool conv_tf32 = true;
  bool deterministic = false;
  AlgorithmSearch search = AlgorithmSearch::kTimed;
  uint64_t workspace_limit = 0;
  auto operator<=>(const ConvAlgorithmKey&) const = default;
};

// The key of a convolution pass under `options`.
ConvAlgorithmKey conv_algorithm_key(const DeviceOptions& options, int pass, const ConvGeom& g);

// One choice: a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t, the cudnnMathType_t it ran with,
// and its workspace bytes.
struct ConvAlgorithm {
  int algo = 0;
  int math_type = 0;
  uint64_t workspace = 0;
  bool timed = false;  // chosen by timing (Find), not by heuristics
  bool operator==(const ConvAlgorithm&) const = default;
};

class ConvAlgorithmCache {
 public:
  // The choice of `key`: the cached one, or choose() now (its exception propagates and nothing
  // is cached). Choices are made one at a time, so two devices never time at once.
  ConvAlgorithm get(const ConvAlgorithmKey& key, const std::function<ConvAlgorithm()>& choose);
  // How many keys have a choice.
  size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::map<ConvAlgorithmKey, ConvAlgorithm> choices_;
};

// The one cache of this process.
ConvAlgorithmCache& process_conv_algorithms();

}  // namespace ferry::cuda
