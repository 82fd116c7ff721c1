// Output files: a write that fails says which file and why (the OS's reason), whether written
// whole or through a stream; a write that succeeds leaves exactly the text.
#include "common/file_write.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "common/error.h"
#include "tests/support/temp_dir.h"

namespace ferry {
namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    EXPECT_FALSE(e.hint().empty());
    return e.what();
  }
  return "no error";
}

TEST(WriteFile, WritesTheTextWhole) {
  const testing::TempDir dir;
  const std::string path = dir.file("ferry_file_write_test.txt");
  write_file(path, "line 1\nline 2\n");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "line 1\nline 2\n");
}

TEST(WriteFile, AFullDiskNamesTheFileAndTheReason) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "needs /dev/full";
  EXPECT_EQ(message_of([] { write_file("/dev/full", std::string(100000, 'x')); }),
            "cannot write /dev/full: No space left on device");
  EXPECT_EQ(message_of([] { write_file("/dev/full", "x", "a hint"); }),
            "cannot write /dev/full: No space left on device");
  EXPECT_EQ(message_of([] { write_file("/nonexistent-dir/f.json", "{}"); }),
            "cannot write /nonexistent-dir/f.json: No such file or directory");
}

TEST(CheckStream, AFailedFlushNamesTheFileAndTheReason) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "needs /dev/full";
  std::ofstream out("/dev/full", std::ios::app);
  ASSERT_TRUE(out);
  out << "{\"step\": 1}\n";
  EXPECT_EQ(message_of([&] { check_stream(out, "/dev/full"); }),
            "cannot write /dev/full: No space left on device");
  std::ostringstream fine;
  fine << "ok";
  check_stream(fine, "memory");  // no error
}

}  // namespace
}  // namespace ferry
