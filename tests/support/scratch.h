// Scratch folders that outlive their test (to read a failed run's output), one set per test
// process. Invariant: two processes never share a scratch folder (Note [Scratch per process]);
// a process whose tests all passed leaves none behind.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"

namespace ferry::testing {

// Note [Scratch per process]
// ctest runs every test case as a process of its own, several at once (scripts/test.sh uses
// -j), and gtest_discover_tests gives all of a binary's cases the same working folder. A folder
// named only by the test ("documents_data") is then emptied by one process while another reads
// from it: `Documents.*` failed one run in a few with "cannot open token file". So every kept
// scratch folder lives under a folder of its own process, <root>/<program>.<pid>, and a name may
// not climb out of it. Within a process the tests run one after another, so a name stays fixed
// there (a fixture generated once per process, like documents_test's token files, reuses it).
// When the process ends with every test passed, its folder goes; after a failure it stays, and
// the process prints where.

// <root>/<program>.<pid>: this process's folder of kept scratch.
inline std::filesystem::path process_scratch_root(const std::filesystem::path& root) {
  return root / (std::string(program_invocation_short_name) + "." + std::to_string(::getpid()));
}

namespace detail {

// Removes this process's scratch folder when every test passed, else says where it is.
class ScratchCleaner : public ::testing::EmptyTestEventListener {
 public:
  explicit ScratchCleaner(std::filesystem::path dir) : dir_(std::move(dir)) {}
  void OnTestProgramEnd(const ::testing::UnitTest& unit_test) override {
    if (unit_test.Passed()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    } else {
      std::printf("scratch of the failed run kept in %s\n", dir_.c_str());
    }
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace detail

// A fresh, empty folder <root>/<program>.<pid>/<name>, kept while the process runs (and after
// it when a test failed). `name` is one plain path component; anything else (empty, ".", "..",
// a '/') throws std::invalid_argument: it could reach another process's folder.
inline std::string kept_scratch(const std::filesystem::path& root, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    throw std::invalid_argument("scratch name '" + name +
                                "' is not one plain folder name (Note [Scratch per process])");
  }
  const std::filesystem::path mine = process_scratch_root(root);
  static std::mutex mutex;
  static std::set<std::filesystem::path> registered;  // one cleaner per process folder
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (registered.insert(mine).second) {
      ::testing::UnitTest::GetInstance()->listeners().Append(new detail::ScratchCleaner(mine));
    }
  }
  return fresh_directory(mine / name).string();
}

}  // namespace ferry::testing
