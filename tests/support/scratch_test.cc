// Kept scratch folders (Note [Scratch per process]): two processes asking for the same name get
// different folders and neither empties the other's; a name that could leave the process's
// folder is refused; the process's folder goes when every test passed and stays otherwise
// (scratch_child.cc is the process).
#include "tests/support/scratch.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

TEST(KeptScratch, IsFreshAndUnderThisProcesssFolder) {
  const testing::TempDir root;
  const std::string dir = testing::kept_scratch(root.path(), "run");
  EXPECT_EQ(fs::path(dir), testing::process_scratch_root(root.path()) / "run");
  const std::string process = fs::path(dir).parent_path().filename().string();
  EXPECT_EQ(process, std::string("test_support_test.") + std::to_string(::getpid()));
  std::ofstream(dir + "/old.txt") << "old";
  EXPECT_EQ(testing::kept_scratch(root.path(), "run"), dir);  // same process, same name
  EXPECT_TRUE(fs::is_empty(dir));                             // and emptied again
}

// The issue 27 failure: every Documents.* process rewrote one "documents_data" while another
// read it. A child process takes the same name while the parent's file is in its folder.
TEST(KeptScratch, TwoProcessesNeverShareAFolder) {
  const testing::TempDir root;
  const std::string mine = testing::kept_scratch(root.path(), "documents_data");
  std::ofstream(mine + "/train.bin") << "tokens";

  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // only async-safe-enough work, then _exit (no gtest teardown here)
    ::close(fds[0]);
    const std::string theirs = testing::kept_scratch(root.path(), "documents_data");
    std::ofstream(theirs + "/train.bin") << "other tokens";
    const ssize_t n = ::write(fds[1], theirs.data(), theirs.size());
    ::_exit(n == static_cast<ssize_t>(theirs.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string theirs;
  char buffer[512];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) theirs.append(buffer, n);
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  EXPECT_NE(theirs, mine);
  std::ifstream in(mine + "/train.bin");
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "tokens") << "the other process emptied this one's folder";
  EXPECT_TRUE(fs::exists(theirs + "/train.bin"));
}

TEST(KeptScratch, RefusesANameThatLeavesTheProcesssFolder) {
  const testing::TempDir root;
  for (const std::string name : {"", ".", "..", "../documents_data", "a/b", "/abs"}) {
    EXPECT_THROW(testing::kept_scratch(root.path(), name), std::invalid_argument) << name;
  }
  EXPECT_TRUE(fs::is_empty(root.path()));  // nothing made for a refused name
}

// A whole test process: the cleaner runs when the program ends. Passed: no folder left. Failed:
// the folder and what the run wrote stay, and the output says where.
TEST(KeptScratch, GoesWhenTheProcessPassedAndStaysWhenItFailed) {
  const testing::TempDir root;
  for (const std::string outcome : {"pass", "fail"}) {
    SCOPED_TRACE(outcome);
    const std::string command = "FERRY_SCRATCH_ROOT='" + root.str() +
                                "' FERRY_SCRATCH_OUTCOME=" + outcome + " " + FERRY_SCRATCH_CHILD +
                                " 2>&1";
    FILE* pipe = ::popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string output;
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
    const int status = ::pclose(pipe);
    ASSERT_TRUE(WIFEXITED(status)) << output;
    EXPECT_EQ(WEXITSTATUS(status), outcome == "pass" ? 0 : 1) << output;
    std::vector<fs::path> left;
    for (const auto& entry : fs::directory_iterator(root.path())) left.push_back(entry.path());
    if (outcome == "pass") {
      EXPECT_TRUE(left.empty()) << left.front();
      continue;
    }
    ASSERT_EQ(left.size(), 1u);
    EXPECT_EQ(left[0].filename().string().rfind("scratch_child.", 0), 0u) << left[0];
    EXPECT_TRUE(fs::exists(left[0] / "run" / "log.txt"));
    EXPECT_NE(output.find("scratch of the failed run kept in " + left[0].string()),
              std::string::npos)
        << output;
  }
}

}  // namespace
}  // namespace ferry
