// fail_job: print this rank's failure, then end the whole job (Note [Ending a job on one rank's
// failure] in comm/fault.h).
#include "comm/fault.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {

namespace {

struct FaultActions {
  std::mutex mutex;
  std::vector<std::function<void()>*> actions;  // in registration order
};

FaultActions& fault_actions() {
  static FaultActions registry;
  return registry;
}

}  // namespace

ScopedFaultAction::ScopedFaultAction(std::function<void()> action) : action_(std::move(action)) {
  FaultActions& r = fault_actions();
  std::lock_guard lock(r.mutex);
  r.actions.push_back(&action_);
}

ScopedFaultAction::~ScopedFaultAction() {
  FaultActions& r = fault_actions();
  std::lock_guard lock(r.mutex);
  r.actions.erase(std::remove(r.actions.begin(), r.actions.end(), &action_), r.actions.end());
}

void run_fault_actions() {
  FaultActions& r = fault_actions();
  std::vector<std::function<void()>> run;
  {
    std::lock_guard lock(r.mutex);
    for (auto it = r.actions.rbegin(); it != r.actions.rend(); ++it) run.push_back(**it);
    r.actions.clear();
  }
  for (auto& action : run) {
    try {
      action();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry: warning: a fault action failed: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "ferry: warning: a fault action failed\n");
    }
  }
}

std::string rank_prefix(const RankInfo& ranks) {
  return ranks.size > 1 ? fmt::format("rank {} of {}: ", ranks.rank, ranks.size) : std::string();
}

int fail_job(const RankInfo& ranks, const std::string& message, const std::string& hint, int code) {
  const std::string prefix = rank_prefix(ranks);
  std::string text;
  auto add_lines = [&](const char* label, const std::string& body) {
    std::istringstream lines(body);
    std::string line;
    bool first = true;
    while (std::getline(lines, line)) {
      text += fmt::format("{}{}{}\n", prefix, first ? label : "  ", line);
      first = false;
    }
    if (first) text += fmt::format("{}{}\n", prefix, label);
  };
  add_lines("error: ", message);
  if (!hint.empty()) add_lines("hint: ", hint);
  // One write, so the lines of two failing ranks do not interleave.
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
  run_fault_actions();  // e.g. abort NCCL communicators, whose kernels could outlive MPI_Abort
  if (ranks.under_mpi || mpi_active()) abort_job(code);
  return code;
}

int fail_job(const RankInfo& ranks, const std::exception& error, int code) {
  const auto* typed = dynamic_cast<const Error*>(&error);
  return fail_job(ranks, error.what(), typed != nullptr ? typed->hint() : std::string(), code);
}

}  // namespace ferry
