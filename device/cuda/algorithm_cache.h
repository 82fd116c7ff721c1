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
#include <optional>
#include <string>
#include <string_view>
#include <utility>

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
// of different budgets share their choices. Across processes (a resumed run) the heuristics
// repeat their choice by themselves (device.algorithms=heuristic, as PyTorch's deterministic &&
// !benchmark); timed choices repeat through a file (Note [Timed choices across processes]).
//
// Note [Timed choices across processes]
// With DeviceOptions::cuda.algorithm_file set (the session sets it for deterministic runs with
// timed search: one file per rank in run.dir), every choice made by timing is appended to the file,
// one line per key, and the file is loaded before the first choice of a process, so a resumed run
// takes the algorithms of the run it resumes instead of timing again. The file's first line names
// cuDNN's version and the GPU; a file with another first line is ignored (its algorithm ids may
// mean nothing there), and a line that does not parse is skipped.
struct ConvAlgorithmKey {
  int ordinal = 0;  // the GPU, in this process's CUDA enumeration
  int pass = 0;     // forward, backward data, backward filter; + 3 in bf16 (conv_pass_key)
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

// One line of an algorithm file: "conv <key fields> -> <algo> <math_type> <workspace> <timed>".
std::string format_choice_line(const ConvAlgorithmKey& key, const ConvAlgorithm& choice);
// The key and choice of a line format_choice_line wrote; nullopt for any other text.
std::optional<std::pair<ConvAlgorithmKey, ConvAlgorithm>> parse_choice_line(std::string_view line);

class ConvAlgorithmCache {
 public:
  // The choice of `key`: the cached one, or choose() now (its exception propagates and nothing
  // is cached). Choices are made one at a time, so two devices never time at once. With a
  // `file`, a choice made now is appended to it (`header` first when the file is new or empty);
  // a file that cannot be written is reported on stderr once and the choice still holds.
  ConvAlgorithm get(const ConvAlgorithmKey& key, const std::function<ConvAlgorithm()>& choose,
                    const std::string& file = {}, const std::string& header = {});
  // Adds the choices in `file` whose keys have none yet, when its first line is `header`;
  // returns how many. An absent file adds nothing.
  size_t load(const std::string& file, const std::string& header);
  // How many keys have a choice.
  size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::map<ConvAlgorithmKey, ConvAlgorithm> choices_;
  bool warned_ = false;  // an unwritable file is reported once
};

// The one cache of this process.
ConvAlgorithmCache& process_conv_algorithms();

}  // namespace ferry::cuda
