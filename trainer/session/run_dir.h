// Owning a run directory. Invariant: one job at a time writes into a run.dir, both run.dir and
// checkpoint.dir are known writable before any training time is spent, and a fresh run never
// mixes its checkpoints and metrics with another run's (Note [Who owns a run directory]).
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/ranks.h"
#include "trainer/config/config.h"

namespace ferry {

// Creates `dir` (and its parents) and checks that a file can be created in it. ConfigError
// naming `key` and the reason (read-only, a file in the way, a name too long, ...) otherwise.
void ensure_writable_dir(const std::string& dir, const std::string& key);

// Writes `text` to `path` (a file of the run: config.yaml, summary.json, eval.json, ...).
// DataError naming it when it cannot be written whole (a full disk included).
void write_run_file(const std::string& path, const std::string& text);

// An exclusive lock on `<dir>/.lock`, held while the object lives. The kernel drops it when the
// process dies, so a crashed job never leaves a stale one. ConfigError naming the holder's pid
// when another job holds it.
class RunDirLock {
 public:
  explicit RunDirLock(const std::string& dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// The first screen's account of the config, a few lines: where the resolved config is written
// (<run.dir>/config.yaml; `trainer config` prints it whole) and every key whose value differs
// from the defaults, as key=value in schema order.
std::string config_summary(const Config& config);

// What a training run starts from, decided before its first step.
struct RunStart {
  std::string resume;              // the checkpoint to resume, "" for a fresh start
  std::vector<std::string> notes;  // lines for the log (stale files removed, overwrite, ...)
};

// Resolves checkpoint.resume and, on the rank that writes checkpoints (`owner`), prepares
// checkpoint.dir: checks it writable, removes temp files of dead writers, and refuses a fresh
// run into a folder that holds another run's checkpoints unless run.overwrite (which deletes
// them). ConfigError (exit 2) for every refusal, naming the key to change.
RunStart prepare_run_start(const Config& config, bool owner);

// Collective: every rank resumes what rank 0 resumes. Rank 0's `resume` is broadcast; a rank
// that resolved another file (checkpoint.resume: latest over a checkpoint.dir its host does not
// share), or cannot read rank 0's, throws ConfigError naming itself and its host, which ends
// the job before any rank trains from the wrong weights.
void check_same_resume(Communicator& comm, const RankInfo& ranks, const std::string& resume);

}  // namespace ferry
