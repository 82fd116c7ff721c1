// Per-rank log files.
#include "trainer/session/rank_log.h"

#include <filesystem>

#include "common/error.h"

namespace ferry {

RankLog::RankLog(const RankInfo& ranks, const std::string& run_dir)
    : console_(ranks.is_root()),
      path_((std::filesystem::path(run_dir) / fmt::format("rank{}.log", ranks.rank)).string()) {
  std::filesystem::create_directories(run_dir);
  file_.open(path_, std::ios::app);
  if (!file_) throw DataError("cannot open " + path_, "check run.dir is writable");
}

void RankLog::file_line(const std::string& text) {
  file_ << text << '\n';
  file_.flush();
}

void RankLog::line(const std::string& text) {
  file_line(text);
  if (console_) {
    std::fputs(text.c_str(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
}

}  // namespace ferry
