// Creator-stamped shared-memory names (Note [Shared-memory names that outlive nothing] in
// shm_names.h). Processes are identified through /proc; POSIX shared memory lives in /dev/shm on
// Linux, which is the one place its names can be listed.
#include "common/shm_names.h"

#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include <fmt/format.h>

namespace ferry::shm_names {
namespace {

struct ProcStat {
  char state = '?';
  uint64_t start = 0;
};

// State and start time from /proc/<pid>/stat; nullopt when there is no such process.
std::optional<ProcStat> read_stat(int pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  ProcStat s;
  fields >> s.state;  // field 3
  std::string skip;
  for (int field = 4; field < 22; ++field) fields >> skip;
  fields >> s.start;  // field 22
  if (!fields) return std::nullopt;
  return s;
}

template <typename T>
bool parse(std::string_view text, T& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

// The creator in "<prefix>-<pid>.<start>-<token>"; nullopt for a name of another form.
std::optional<ProcessId> creator_of(std::string_view name, const std::string& prefix) {
  if (!name.starts_with(prefix) || name.substr(prefix.size(), 1) != "-") return std::nullopt;
  name.remove_prefix(prefix.size() + 1);
  const size_t dot = name.find('.');
  const size_t dash = name.find('-');
  if (dot == std::string_view::npos || dash == std::string_view::npos || dot > dash)
    return std::nullopt;
  ProcessId id;
  if (!parse(name.substr(0, dot), id.pid) || id.pid <= 0 ||
      !parse(name.substr(dot + 1, dash - dot - 1), id.start))
    return std::nullopt;
  return id;
}

std::string without_slash(const std::string& prefix) {
  return prefix.starts_with('/') ? prefix.substr(1) : prefix;
}

}  // namespace

ProcessId self() {
  const int pid = static_cast<int>(getpid());
  const std::optional<ProcStat> s = read_stat(pid);
  return {pid, s ? s->start : 0};
}

bool alive(const ProcessId& id) {
  const std::optional<ProcStat> s = read_stat(id.pid);
  if (s) return s->state != 'Z' && s->state != 'X' && s->start == id.start;
  // No /proc entry: gone, unless /proc is not there to ask (then trust kill).
  if (std::filesystem::exists("/proc/self/stat")) return false;
  return kill(id.pid, 0) == 0 || errno == EPERM;
}

std::string job_token() {
  std::random_device rd;
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return fmt::format("{}-{}-{:08x}", getpid(),
                     static_cast<long long>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000, rd());
}

std::string block_name(const std::string& prefix, const std::string& token) {
  const ProcessId me = self();
  return fmt::format("/{}-{}.{}-{}", without_slash(prefix), me.pid, me.start, token);
}

std::string find_block(const std::string& prefix, const std::string& token,
                       const std::string& dir) {
  const std::string head = fmt::format("{}-", without_slash(prefix));
  const std::string tail = fmt::format("-{}", token);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(head) && name.ends_with(tail) && creator_of(name, without_slash(prefix)))
      return fmt::format("/{}", name);
  }
  return "";
}

std::vector<std::string> remove_stale_blocks(const std::string& prefix, const std::string& dir) {
  std::vector<std::filesystem::path> stale;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::optional<ProcessId> creator =
        creator_of(entry.path().filename().string(), without_slash(prefix));
    if (creator && !alive(*creator)) stale.push_back(entry.path());
  }
  std::vector<std::string> removed;
  for (const std::filesystem::path& path : stale) {
    const std::string shm = fmt::format("/{}", path.filename().string());
    const bool gone =
        dir == "/dev/shm" ? shm_unlink(shm.c_str()) == 0 : std::filesystem::remove(path, ec);
    if (gone) removed.push_back(shm);
  }
  return removed;
}

}  // namespace ferry::shm_names
