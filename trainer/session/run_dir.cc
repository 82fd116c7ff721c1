// Run directory ownership: a lock file, writability probes and the fresh-run check.
#include "trainer/session/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_write.h"
#include "trainer/checkpoint/atomic_file.h"
#include "trainer/session/checkpoints.h"

// Note [Who owns a run directory]
// A run directory holds one run's story: its config, logs, metrics.jsonl and checkpoints. Two
// jobs writing into one interleave all of it, and a fresh run into the folder of an older one
// used to prune the older run's checkpoints by step order (deleting its own) and append to its
// metrics. So: rank 0 holds an flock on <run.dir>/.lock for the whole run (a second job is
// refused, naming the first one's pid; the kernel releases the lock when a job dies); a fresh
// run (no checkpoint.resume) into a checkpoint.dir that holds checkpoints is refused unless
// run.overwrite says to start over (Hugging Face's overwrite_output_dir), and then the old
// checkpoints are deleted; a fresh run starts metrics.jsonl anew, a resumed one appends.

namespace ferry {

namespace fs = std::filesystem;

void ensure_writable_dir(const std::string& dir, const std::string& key) {
  const std::string hint = fmt::format("set {} to a folder this user can write", key);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw ConfigError(fmt::format("{}: cannot create the folder '{}': {}", key, dir,
                                  ec ? ec.message() : "a file of that name is in the way"),
                      hint);
  }
  const std::string probe = (fs::path(dir) / fmt::format(".write-probe.{}", ::getpid())).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    throw ConfigError(
        fmt::format("{}: cannot write in the folder '{}': {}", key, dir, std::strerror(err)), hint);
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void write_run_file(const std::string& path, const std::string& text) {
  write_file(path, text, "check that run.dir is writable and its disk has space");
}

RunDirLock::RunDirLock(const std::string& dir) {
  const std::string path = (fs::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    throw ConfigError(fmt::format("run.dir: cannot create '{}': {}", path, std::strerror(err)),
                      "set run.dir to a folder this user can write");
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    throw ConfigError(fmt::format("run.dir '{}' is in use by another job{}", dir,
                                  pid.empty() ? std::string() : fmt::format(" (pid {})", pid)),
                      "wait for that job to end, or give this one another run.dir");
  }
  const std::string mine = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size())) {
    // The lock holds without the pid; only the message of a refused job loses it.
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

namespace {

// Deletes every step_<N>.safetensors of `dir`; returns how many.
size_t delete_checkpoints(const std::string& dir) {
  size_t n = 0;
  for (const auto& [step, path] : list_checkpoints(dir)) {
    std::error_code ec;
    if (fs::remove(path, ec)) ++n;
  }
  return n;
}

}  // namespace

RunStart prepare_run_start(const Config& config, bool owner) {
  RunStart start;
  const CheckpointConfig& ck = config.checkpoint;
  if (config.run.overwrite && !ck.resume.empty()) {
    throw ConfigError(fmt::format("run.overwrite=true starts over, but checkpoint.resume='{}' "
                                  "continues a run",
                                  ck.resume),
                      "set one of them: run.overwrite=false to resume, or checkpoint.resume=\"\" "
                      "to start over");
  }
  const bool writes_checkpoints = ck.every > 0;
  if (owner && (writes_checkpoints || fs::exists(ck.dir))) {
    if (writes_checkpoints) ensure_writable_dir(ck.dir, "checkpoint.dir");
    for (const std::string& path : remove_stale_temp_files(ck.dir)) {
      start.notes.push_back(fmt::format("removed  {} (left by a writer that died)", path));
    }
  }
  start.resume = resolve_resume(ck.resume, ck.dir);
  if (ck.resume == "latest" && start.resume.empty()) {
    start.notes.push_back(fmt::format(
        "resume   checkpoint.resume=latest: no checkpoint in '{}' yet, starting fresh", ck.dir));
  }
  if (!owner || !start.resume.empty()) return start;
  const auto existing = list_checkpoints(ck.dir);
  if (existing.empty()) return start;
  if (!config.run.overwrite) {
    throw ConfigError(
        fmt::format("checkpoint.dir '{}' holds another run's checkpoints ({} of them, steps {} to "
                    "{}), and this run starts fresh",
                    ck.dir, existing.size(), existing.front().first, existing.back().first),
        "set checkpoint.resume=latest to continue that run, run.overwrite=true to delete them "
        "and start over, or another run.dir");
  }
  const size_t n = delete_checkpoints(ck.dir);
  start.notes.push_back(
      fmt::format("overwrite deleted {} checkpoint{} of an earlier run in '{}' "
                  "(run.overwrite)",
                  n, n == 1 ? "" : "s", ck.dir));
  return start;
}

void check_same_resume(Communicator& comm, const RankInfo& ranks, const std::string& resume) {
  if (ranks.size <= 1) return;
  uint64_t length = ranks.is_root() ? resume.size() : 0;
  comm.broadcast_host(&length, sizeof(length), 0);
  std::string root_resume(static_cast<size_t>(length), '\0');
  if (ranks.is_root()) root_resume = resume;
  if (length > 0) comm.broadcast_host(root_resume.data(), length, 0);
  if (ranks.is_root()) return;
  const std::string hint =
      "put checkpoint.dir on a filesystem every host of the job mounts at the same path";
  std::error_code ec;
  const bool readable = length == 0 || (fs::is_regular_file(root_resume, ec) &&
                                        ::access(root_resume.c_str(), R_OK) == 0);
  if (root_resume != resume || !readable) {
    throw ConfigError(fmt::format("checkpoint.resume: rank 0 resumes {} but rank {} (host {}) {}",
                                  length == 0 ? std::string("nothing (a fresh start)")
                                              : fmt::format("'{}'", root_resume),
                                  ranks.rank, host_name(),
                                  !readable        ? "cannot read it"
                                  : resume.empty() ? "finds no checkpoint in checkpoint.dir"
                                                   : fmt::format("resolved '{}'", resume)),
                      hint);
  }
}

std::string config_summary(const Config& config) {
  const nlohmann::json mine = to_json(config), defaults = to_json(default_config());
  std::vector<std::string> changed;
  for (const auto& [section, keys] : mine.items()) {
    for (const auto& [key, value] : keys.items()) {
      const nlohmann::json* other = defaults.contains(section) && defaults[section].contains(key)
                                        ? &defaults[section][key]
                                        : nullptr;
      if (other && *other == value) continue;
      changed.push_back(fmt::format("{}.{}={}", section, key,
                                    value.is_string() ? value.get<std::string>() : value.dump()));
    }
  }
  std::string out = fmt::format("config   {} (resolved; `trainer config` prints it)",
                                (fs::path(config.run.dir) / "config.yaml").string());
  // Wrapped at 100 columns under a 9-column indent, as the banner's other lines.
  std::string line = "changed ";
  if (changed.empty()) line += " nothing: every key at its default";
  for (size_t i = 0; i < changed.size(); ++i) {
    const std::string item = changed[i] + (i + 1 < changed.size() ? "," : "");
    if (line.size() + 1 + item.size() > 100 && line.size() > 9) {
      out += "\n" + line;
      line = std::string(8, ' ');
    }
    line += " " + item;
  }
  return out + "\n" + line;
}

}  // namespace ferry
