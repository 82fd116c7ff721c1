// Helpers of the CUDA op parity suites (kernel_parity_test.cc, transformer_parity_test.cc):
// seeded random inputs, the tolerance and bitwise comparisons, and the target's memory. Every
// fresh buffer is NaN-poisoned, so an element a kernel forgets to write shows.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device/cpu/cpu_kernels.h"
#include "tests/device/cuda/parity_target.h"

namespace ferry {

// Whether this build of a suite runs the kernels in the host emulation (FERRY_PARITY_EMULATED,
// set by tests/device/cuda/CMakeLists.txt) rather than on a GPU.
#ifdef FERRY_PARITY_EMULATED
inline constexpr bool kEmulated = true;
#else
inline constexpr bool kEmulated = false;
#endif

inline constexpr double kRel = 1e-4;
// Absolute floor for values that are sums cancelling to about zero (gradients of batch norm).
inline constexpr double kAbs = 1e-5;

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline int64_t pick(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// |gpu - cpu| <= abs + rel * |cpu| everywhere, NaN matching NaN; names the worst element.
inline ::testing::AssertionResult close(const std::vector<float>& gpu,
                                        const std::vector<float>& cpu, double rel = kRel,
                                        double abs = kAbs) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "sizes differ";
  size_t bad = 0, worst = 0;
  double worst_err = -1.0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (std::isnan(gpu[i]) && std::isnan(cpu[i])) continue;
    const double err = std::fabs(static_cast<double>(gpu[i]) - cpu[i]);
    if (!(err <= abs + rel * std::fabs(cpu[i]))) {
      ++bad;
      const double e = std::isnan(err) ? INFINITY : err;
      if (e > worst_err) {
        worst_err = e;
        worst = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << gpu.size() << " differ; worst [" << worst
                                       << "] gpu " << gpu[worst] << " cpu " << cpu[worst];
}

template <typename T>
::testing::AssertionResult bitwise(const std::vector<T>& gpu, const std::vector<T>& cpu) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (std::memcmp(&gpu[i], &cpu[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << "first difference at [" << i << "] of " << gpu.size()
                                           << ": gpu " << +gpu[i] << " cpu " << +cpu[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// The target's memory for one test; fresh buffers are poisoned (NaN bytes) so an element a
// kernel forgets to write shows.
class GpuArena {
 public:
  explicit GpuArena(test::ParityTarget* target) : target_(target) {}
  template <typename T>
  T* alloc(size_t n) {
    return static_cast<T*>(target_->alloc(n * sizeof(T)));
  }
  template <typename T>
  T* upload(const std::vector<T>& host) {
    T* p = alloc<T>(host.size());
    target_->copy_in(p, host.data(), host.size() * sizeof(T));
    return p;
  }
  template <typename T>
  std::vector<T> download(const T* p, size_t n) {
    std::vector<T> host(n);
    target_->copy_out(host.data(), p, n * sizeof(T));
    return host;
  }

 private:
  test::ParityTarget* target_;
};

// The fixture of both suites: the target (a GPU, or the host emulation) and the CPU backend to
// compare with; skips when the target is absent, naming why.
class ParityFixture : public ::testing::Test {
 public:
  void SetUp() override {
    std::string skip_reason;
    target_ = test::make_parity_target(&skip_reason);
    if (!target_) GTEST_SKIP() << skip_reason;
    mem_ = GpuArena(target_.get());
    cpu_ = std::make_unique<cpu::CpuKernels>(2);
  }

  // Launches `args` on the target with the workspace it asks for.
  template <typename Args>
  void gpu(Args args) {
    const uint64_t bytes = target_->workspace_bytes(args);
    if constexpr (requires { args.ws; }) {
      if (bytes > 0) args.ws = Workspace{mem_.alloc<char>(bytes), bytes};
    }
    target_->launch(args);
  }
  // The CPU backend, with a host workspace when it asks for one.
  template <typename Args>
  void cpu(Args args) {
    std::vector<char> ws;
    if constexpr (requires { args.ws; }) {
      ws.resize(cpu_->workspace_bytes(args));
      if (!ws.empty()) args.ws = Workspace{ws.data(), ws.size()};
    }
    cpu_->run(args);
  }

  std::unique_ptr<test::ParityTarget> target_;
  std::unique_ptr<cpu::CpuKernels> cpu_;
  GpuArena mem_{nullptr};
};

// NaN-poisoned host outputs for the CPU side.
inline std::vector<float> poisoned(size_t n) { return std::vector<float>(n, NAN); }

}  // namespace ferry
