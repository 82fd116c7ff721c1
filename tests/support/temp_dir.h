// Scratch folders for tests: a fresh, empty folder per use under the system's temp dir, removed
// with everything in it when the test is done with it. Invariant: two TempDirs never share a
// path, within one process or across the processes ctest runs side by side.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

namespace ferry::testing {

// Removes `dir` with everything in it, creates it again empty, and returns it.
inline std::filesystem::path fresh_directory(const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A fresh folder named after the running test, removed when this object goes:
// <temp>/ferry_<pid>_<n>_<suite>.<test>[_<tag>], where <n> counts the process's TempDirs.
class TempDir {
 public:
  explicit TempDir(std::string_view tag = "") {
    static std::atomic<int> made{0};
    // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on "literal" + std::string.
    std::string name = "ferry_";
    name.append(std::to_string(::getpid())).append("_").append(std::to_string(made++));
    if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
      name.append("_").append(info->test_suite_name()).append(".").append(info->name());
    }
    if (!tag.empty()) name.append("_").append(tag);
    // Parameterized tests' names hold '/'; keep the folder one level deep.
    for (char& c : name) {
      if (c == '/' || c == ' ') c = '_';
    }
    path_ = fresh_directory(std::filesystem::temp_directory_path() / name);
  }
  ~TempDir() {
    std::error_code ignored;  // a test that made a file unremovable must not crash here
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  // path() / name, as a string (the file need not exist).
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Writes `bytes` to path() / name, creating its folders, and returns that path.
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::filesystem::path p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p.string();
  }

 private:
  std::filesystem::path path_;
};

}  // namespace ferry::testing
