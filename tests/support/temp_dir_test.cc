// The shared scratch folders: a TempDir is fresh, empty, its own, named after its test, and gone
// with everything in it when it goes; fresh_directory() empties what was there.
#include "tests/support/temp_dir.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace ferry {
namespace {

namespace fs = std::filesystem;

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(TempDir, IsFreshEmptyAndItsOwn) {
  const testing::TempDir a;
  const testing::TempDir b("tagged");
  EXPECT_NE(a.path(), b.path());
  EXPECT_TRUE(fs::is_directory(a.path()));
  EXPECT_TRUE(fs::is_empty(a.path()));
  EXPECT_EQ(a.path().parent_path(), fs::temp_directory_path());
  const std::string name = b.path().filename().string();
  EXPECT_NE(name.find("TempDir.IsFreshEmptyAndItsOwn"), std::string::npos) << name;
  EXPECT_EQ(name.substr(name.size() - 7), "_tagged");
  EXPECT_EQ(a.file("x.txt"), (a.path() / "x.txt").string());
  EXPECT_FALSE(fs::exists(a.file("x.txt")));
}

TEST(TempDir, WritesFilesInFoldersAndRemovesThemAllWhenItGoes) {
  fs::path where;
  {
    const testing::TempDir dir;
    where = dir.path();
    const std::string path = dir.write("a/b/c.bin", std::string("x\0y", 3));
    EXPECT_EQ(path, dir.file("a/b/c.bin"));
    EXPECT_EQ(read(path), std::string("x\0y", 3));
  }
  EXPECT_FALSE(fs::exists(where));
}

TEST(FreshDirectory, EmptiesWhatWasThere) {
  const testing::TempDir dir;
  const fs::path sub = dir.path() / "run";
  dir.write("run/old.txt", "old");
  EXPECT_EQ(testing::fresh_directory(sub), sub);
  EXPECT_TRUE(fs::is_directory(sub));
  EXPECT_TRUE(fs::is_empty(sub));
}

}  // namespace
}  // namespace ferry
