// fail_job: print this rank's failure, then end the whole job (Note [Ending a job on one rank's
// failure] in comm/fault.h).
#include "comm/fault.h"

#include <cstdio>
#include <sstream>

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {

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
  if (ranks.under_mpi || mpi_active()) abort_job(code);
  return code;
}

int fail_job(const RankInfo& ranks, const std::exception& error, int code) {
  const auto* typed = dynamic_cast<const Error*>(&error);
  return fail_job(ranks, error.what(), typed != nullptr ? typed->hint() : std::string(), code);
}

}  // namespace ferry
