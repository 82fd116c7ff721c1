// Finding the source tree at run time (source_root.h): the environment, then the directories
// above the binary and above the working directory.
#include "tests/support/source_root.h"

#include <cstdlib>
#include <stdexcept>
#include <system_error>

namespace ferry::test {

namespace fs = std::filesystem;

std::optional<fs::path> find_tree_root(const std::vector<fs::path>& starts,
                                       const fs::path& marker) {
  for (const fs::path& start : starts) {
    if (start.empty()) continue;
    std::error_code ec;
    fs::path dir = fs::weakly_canonical(fs::absolute(start, ec), ec);
    if (ec) continue;
    while (true) {
      if (fs::exists(dir / marker, ec)) return dir;
      if (!dir.has_parent_path() || dir.parent_path() == dir) break;
      dir = dir.parent_path();
    }
  }
  return std::nullopt;
}

fs::path source_root(const fs::path& marker) {
  if (const char* env = std::getenv("FERRY_SOURCE_ROOT"); env != nullptr && *env != '\0') {
    if (!fs::exists(fs::path(env) / marker)) {
      throw std::runtime_error("FERRY_SOURCE_ROOT=" + std::string(env) + " holds no " +
                               marker.string());
    }
    return fs::path(env);
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path cwd = fs::current_path(ec);
  if (auto root = find_tree_root({ec ? fs::path() : exe.parent_path(), cwd}, marker)) return *root;
  throw std::runtime_error(
      "no source tree holding " + marker.string() + " above the test binary (" + exe.string() +
      ") or the working directory (" + cwd.string() + "); set FERRY_SOURCE_ROOT to the tree");
}

std::string source_file(const fs::path& relative) {
  const fs::path path = source_root() / relative;
  if (!fs::exists(path)) throw std::runtime_error(path.string() + " does not exist");
  return path.string();
}

}  // namespace ferry::test
