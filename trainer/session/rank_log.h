// A rank's output: every line goes to <run.dir>/rank<R>.log; rank 0's also to the console, so a
// job of N ranks prints one copy. Lines are flushed as written: a crash loses nothing logged.
#pragma once

#include <cstdio>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "comm/ranks.h"

namespace ferry {

class RankLog {
 public:
  RankLog(const RankInfo& ranks, const std::string& run_dir);
  // One line (or several, "\n"-separated).
  void line(const std::string& text);
  // To the log file only: for text the console gets another way (main prints a failure once).
  void file_line(const std::string& text);
  template <typename... Args>
  void print(fmt::format_string<Args...> format, Args&&... args) {
    line(fmt::format(format, std::forward<Args>(args)...));
  }
  const std::string& path() const { return path_; }

 private:
  bool console_;
  std::string path_;
  std::ofstream file_;
};

}  // namespace ferry
