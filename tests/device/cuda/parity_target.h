// The backend the op parity suite (kernel_parity_test.cc) checks against the CPU backend: the
// real GPU (cuda_target.cc), or the same CUDA kernel sources compiled for the host
// (emulated_target.cc, Note [Host emulation of the CUDA kernels]). One suite, two executables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "device/kernels.h"

namespace ferry::test {

class ParityTarget {
 public:
  virtual ~ParityTarget() = default;
  // `bytes` of the target's memory filled with 0xff bytes (NaN floats), freed with the target.
  virtual void* alloc(size_t bytes) = 0;
  virtual void copy_in(void* dst, const void* host, size_t bytes) = 0;
  virtual void copy_out(void* host, const void* src, size_t bytes) = 0;
  // Runs `args` on the target's kernels and waits for it.
  virtual void launch(const KernelArgs& args) = 0;
  // The workspace `args` needs on the target (the cuBLAS attention's; 0 for the emulated
  // kernels, which have none).
  virtual uint64_t workspace_bytes(const KernelArgs& args) = 0;
  // Sizes the reducing kernels' grids as for a GPU of `sm_count` multiprocessors (their results
  // must not change: Note [Deterministic multi-block reductions]).
  virtual void set_sm_count(int sm_count) = 0;
};

// The target, or null with `skip_reason` saying which resource is missing.
std::unique_ptr<ParityTarget> make_parity_target(std::string* skip_reason);

}  // namespace ferry::test
