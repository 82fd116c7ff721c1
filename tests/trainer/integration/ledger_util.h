// Tests of jobs sharing a device through a private job ledger: the ledger's name (removed however
// the test ends), a sharing job's command, starting a trainer in the background, reading the
// ledger's held record as it grows, and waiting on the ledger or a run's metrics.jsonl with a
// deadline.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/shm_names.h"
#include "jobs/job_ledger.h"
#include "jobs/share_controller.h"
#include "trainer/config/config.h"
#include "trainer/share/lease.h"

namespace ferry::testing {

// A private ledger's name ("/ferry-jobs-<what>-<token>"), removed however the test ends.
struct PrivateLedger {
  explicit PrivateLedger(const std::string& what)
      : name("/ferry-jobs-" + what + "-" + shm_names::job_token()) {}
  ~PrivateLedger() { JobLedger::unlink(name); }
  std::string name;
};

// " a b c" for {"a", "b", "c"}: keys to append to a command line.
inline std::string joined(const std::vector<std::string>& args) {
  std::string out;
  for (const std::string& a : args) out += " " + a;
  return out;
}

// The command of a job sharing a device through `ledger`: `train` (the trainer, "train", a config
// and the keys every job of the test shares) with this job's device.memory, run.seed, run.steps
// and run.dir.
inline std::string shared_job(const PrivateLedger& ledger, const std::string& train,
                              uint64_t memory, int seed, int steps, const std::string& dir) {
  return "env FERRY_JOB_LEDGER=" + ledger.name + " " + train +
         " device.memory=" + std::to_string(memory) + " run.seed=" + std::to_string(seed) +
         " run.steps=" + std::to_string(steps) + " run.dir=" + dir;
}

// A sharing job's curve in held bytes (Note [A shared budget in held bytes]): its lower bound,
// and the share the controller gives the job alone on a large device (1 TiB).
struct ShareBounds {
  uint64_t lower = 0;
  uint64_t alone = 0;
};

inline ShareBounds share_bounds(const Config& config) {
  const ShareCurve curve = held_curve(share_curve(config), share_reserve(config));
  ShareJob job;
  job.curve = curve;
  return {curve.lower,
          divide_memory(uint64_t{1} << 40, {job}, ShareObjective::kThroughput).jobs[0].share};
}

// Starts `command` through the shell (exec'd, so the pid is the command's); stdout and stderr
// to `log`.
inline pid_t spawn(const std::string& command, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string line = "exec " + command + " > " + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// A process started by spawn(): killed (SIGKILL) and waited for when the test ends without
// having waited for it, so a failed assertion leaves no trainer running.
struct Spawned {
  pid_t pid = -1;
  bool waited = false;
  ~Spawned() {
    if (pid > 0 && !waited && kill(pid, SIGKILL) == 0) waitpid(pid, nullptr, 0);
  }
  // Its exit code (128 + the signal when killed).
  int wait() {
    int status = 0;
    waitpid(pid, &status, 0);
    waited = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

// Polls until `ready` holds, at most `timeout_s`.
inline bool await(double timeout_s, const std::function<bool()>& ready) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Polls the ledger until `ready` holds for a snapshot, at most `timeout_s`.
inline bool await_ledger(JobLedger& ledger, double timeout_s,
                         const std::function<bool(const std::vector<LedgerGpu>&)>& ready) {
  return await(timeout_s, [&] { return ready(ledger.snapshot()); });
}

// Reads the ledger's held record as it grows, on a thread (every 20 ms), until stopped. `each`,
// when given, runs on that thread after every read (and after the last).
class RecordReader {
 public:
  explicit RecordReader(const std::string& name, std::function<void()> each = nullptr)
      : ledger_(JobLedger::attach(name)), each_(std::move(each)) {
    thread_ = std::thread([this] {
      while (!stop_) {
        read();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      read();
    });
  }
  ~RecordReader() { stop(); }
  const std::vector<HeldRecord>& stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return records_;
  }
  // Whether the ring overwrote entries before they were read (the record is not contiguous).
  bool gap() const { return gap_; }
  uint64_t most_held() const { return most_held_; }

 private:
  void read() {
    for (HeldRecord& r : ledger_->history(last_)) {
      if (r.seq != last_ + 1) gap_ = true;
      last_ = r.seq;
      most_held_ = std::max(most_held_, r.held);
      records_.push_back(std::move(r));
    }
    if (each_) each_();
  }
  std::shared_ptr<JobLedger> ledger_;
  std::function<void()> each_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  uint64_t last_ = 0;
  bool gap_ = false;
  uint64_t most_held_ = 0;
  std::vector<HeldRecord> records_;
};

// The complete lines of a file being written (a last line without its newline left out).
inline std::vector<std::string> complete_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline after it: still being written
    out.push_back(line);
  }
  return out;
}

// Waits until the run in `dir` has logged `steps` steps (at most `timeout_s`).
inline bool await_steps(const std::string& dir, size_t steps, double timeout_s) {
  return await(timeout_s, [&] { return complete_lines(dir + "/metrics.jsonl").size() >= steps; });
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The end of a job's log (its last 3000 characters), for a message.
inline std::string tail_of(const std::string& path) {
  const std::string text = read_text(path);
  return text.substr(text.size() - std::min<size_t>(text.size(), 3000));
}

}  // namespace ferry::testing
