// Where a test finds the tree's files at run time, for binaries that run on another machine
// under another root (the GPU bundle unpacks build/tests/NAME into the tree there): never a path
// baked in at build time. Invariant: the root returned holds the marker file it was found by.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace ferry::test {

// The nearest directory holding `marker` (a path relative to it) among each of `starts` and its
// ancestors, tried start by start, nearest first; nullopt when none holds it.
std::optional<std::filesystem::path> find_tree_root(
    const std::vector<std::filesystem::path>& starts, const std::filesystem::path& marker);

// The source tree of the running test: $FERRY_SOURCE_ROOT when set, else the nearest directory
// holding `marker` above the test binary (/proc/self/exe), else above the working directory.
// Throws std::runtime_error saying where it looked.
std::filesystem::path source_root(
    const std::filesystem::path& marker = std::filesystem::path("configs") / "quickstart.yaml");

// source_root() / relative as a string; throws std::runtime_error when that file is absent.
std::string source_file(const std::filesystem::path& relative);

}  // namespace ferry::test
