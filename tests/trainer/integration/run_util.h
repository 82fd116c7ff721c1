// Running the trainer binary from tests: a command line, its exit code and output, and reading
// the parameters of a checkpoint it wrote. Every run has scratch and a link ledger of its test
// process's own (Note [Scratch per process], Note [A link ledger per test process]).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/support/scratch.h"
#include "tests/support/temp_dir.h"
#include "trainer/checkpoint/safetensors.h"

namespace ferry::testing {

// Note [A link ledger per test process]
// A run with topology.file attaches the node's link ledger, a well-known block in /dev/shm that
// every ferry job of the user shares (Note [One link ledger per node] in links/link_ledger.h).
// Test processes that ctest runs side by side, and the user's own jobs, would then arbitrate each
// other's copies and read each other's link records. So each test process that runs the trainer
// sets FERRY_LINK_LEDGER to a base of its own before its first test (the trainers it starts, and
// mpirun's local ranks, inherit it) and removes that base's blocks when it ends. A test that
// means to share a ledger between jobs sets its own base (shared_links_test).
class PrivateLinkLedgers {
 public:
  PrivateLinkLedgers() : owner_(::getpid()) {
    // "/ferrytest-links-<pid>-<microseconds>": unique on the machine while this process lives.
    base_ = "ferrytest-links-" + std::to_string(owner_) + "-" +
            std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count());
    ::setenv("FERRY_LINK_LEDGER", ("/" + base_).c_str(), 1);
  }
  ~PrivateLinkLedgers() {
    if (::getpid() != owner_) return;  // a forked child leaves the parent's blocks alone
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with(base_ + "-")) ::shm_unlink(("/" + name).c_str());
    }
  }
  PrivateLinkLedgers(const PrivateLinkLedgers&) = delete;
  PrivateLinkLedgers& operator=(const PrivateLinkLedgers&) = delete;

 private:
  pid_t owner_;
  std::string base_;  // without the leading '/'
};
inline const PrivateLinkLedgers private_link_ledgers;

struct Exit {
  int code = -1;
  std::string output;  // stdout and stderr
  double seconds = 0;
};

// Runs `command` through the shell with stderr folded into stdout.
inline Exit run(const std::string& command) {
  const auto start = std::chrono::steady_clock::now();
  Exit e;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return e;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) e.output.append(buffer, n);
  const int status = pclose(pipe);
  e.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return e;
}

// One error line containing `what`, a hint line, exit 2, and no training step.
inline void expect_user_error(const Exit& e, const std::string& what) {
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("error: "), std::string::npos) << e.output;
  EXPECT_NE(e.output.find(what), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("hint: "), std::string::npos) << e.output;
  EXPECT_EQ(e.output.find("\nstep "), std::string::npos) << "no step may run:\n" << e.output;
}

// A job that must end by itself: non-zero, before its `timeout` wrapper's 124, within `seconds`.
inline void expect_ended_within(const Exit& e, double seconds) {
  EXPECT_NE(e.code, 0) << e.output;
  EXPECT_NE(e.code, 124) << "the job hung until the timeout";
  EXPECT_LT(e.seconds, seconds) << e.output;
}

inline std::string trainer() { return std::string(FERRY_BINARY_DIR) + "/trainer"; }

// mpirun for `ranks` processes on this machine (as root, oversubscribed if needed).
inline std::string mpirun(int ranks) {
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_rmaps_base_oversubscribe=1 "
         "mpirun -np " +
         std::to_string(ranks) + " --bind-to none ";
}

inline bool have_mpirun() { return run("command -v mpirun").code == 0; }

// How often `what` occurs in `text` (overlapping occurrences counted).
inline size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A fresh directory <build>/test-runs/<program>.<pid>/<name>, this process's own (Note [Scratch
// per process] in tests/support/scratch.h) and kept when a test fails (to read the run's output);
// tests that need no such record use TempDir (tests/support/temp_dir.h).
inline std::string scratch(const std::string& name) {
  return kept_scratch(std::filesystem::path(FERRY_BINARY_DIR) / "test-runs", name);
}

// Every F32 tensor of a checkpoint that is not optimizer state, by name.
inline std::map<std::string, std::vector<float>> parameters(const std::string& path) {
  std::map<std::string, std::vector<float>> out;
  const SafetensorsFile file = read_safetensors(path);
  for (const auto& e : file.entries()) {
    if (e.dtype != DType::kF32 || e.name.rfind("optimizer.", 0) == 0) continue;
    std::vector<float> v(e.bytes.size() / sizeof(float));
    std::memcpy(v.data(), e.bytes.data(), e.bytes.size());
    out[e.name] = std::move(v);
  }
  return out;
}

// max |a - b| / max(|b|) over each tensor is within `rel`; bitwise when rel == 0.
// The largest, over the tensors, of max |a - b| / max |b| (expect_same_parameters' measure).
inline double max_relative_difference(const std::string& a, const std::string& b) {
  const auto pa = parameters(a);
  const auto pb = parameters(b);
  double worst = 0;
  for (const auto& [name, va] : pa) {
    const auto& vb = pb.at(name);
    double scale = 1e-12, err = 0;
    for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(vb[i])));
      err = std::max(err, static_cast<double>(std::fabs(va[i] - vb[i])));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

inline void expect_same_parameters(const std::string& a, const std::string& b, double rel) {
  const auto pa = parameters(a);
  const auto pb = parameters(b);
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& [name, va] : pa) {
    const auto& vb = pb.at(name);
    ASSERT_EQ(va.size(), vb.size()) << name;
    if (rel == 0) {
      EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)), 0) << name;
      continue;
    }
    double scale = 1e-12, err = 0;
    for (size_t i = 0; i < va.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(vb[i])));
      err = std::max(err, static_cast<double>(std::fabs(va[i] - vb[i])));
    }
    EXPECT_LE(err / scale, rel) << name;
  }
}

}  // namespace ferry::testing
