// Tests of jobs sharing a device through a private job ledger: the ledger's name (removed however
// the test ends), starting a trainer in the background, and waiting on the ledger or a run's
// metrics.jsonl with a deadline.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "links/job_ledger.h"
#include "links/shm_names.h"

namespace ferry::testing {

// A private ledger's name ("/ferry-jobs-<what>-<token>"), removed however the test ends.
struct PrivateLedger {
  explicit PrivateLedger(const std::string& what)
      : name("/ferry-jobs-" + what + "-" + shm_names::job_token()) {}
  ~PrivateLedger() { JobLedger::unlink(name); }
  std::string name;
};

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

}  // namespace ferry::testing
