// The node-wide job ledger: one POSIX shared-memory block per node and user that every ferry job
// with shared memory attaches (Note [What the job ledger holds]). Invariant: on every GPU the sum
// of the jobs' `granted` bytes is at most the capacity (bar its fall); each holds at most its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/shm_block.h"
#include "jobs/share_controller.h"

// Note [What the job ledger holds]
// Per GPU: its capacity and the jobs on it (lower bound, peak, ladder, share, granted, held, step
// times). There is no daemon: whoever changes the ledger re-divides the GPU's capacity under its
// robust mutex (jobs/share_controller.h). Only a fall of the capacity itself can leave the grants
// above it (Note [A capacity that follows the jobs]).

namespace ferry {

// Note [Handing memory over between jobs]
// A job's `share` is the controller's target; `granted` is what it may hold now. When the
// division changes, a job whose share shrinks keeps its old grant until it re-plans for the new
// share and confirms (report() with held <= share): only then does its grant fall to the share.
// A job whose share grows gets it all at once, and only when the grants of every job on the GPU,
// the still-shrinking ones' old grants included, fit the capacity with it; growing jobs are
// served in arrival order. One exception: a job not admitted yet whose lower bound fits in what
// is free now is granted what is free (at least its lower bound, less than its share) and starts
// on it, rather than wait for the others to shrink; it grows to its share later, all at once. A job
// never holds more than its grant (report() refuses it), so the sum of what jobs hold never exceeds
// the capacity, at any instant. A job is admitted (leaves `waiting`) when its grant reaches its
// lower bound. A job that dies is reaped by the next job that touches the ledger (every wait looks
// at least every slice): its grant is freed and the GPU re-divided.

// What a job registers for its GPU.
struct JobRequest {
  std::string device;  // the GPU's key on this node (the CPU backend: its emulated device)
  uint64_t capacity =
      0;               // the job's idea of the capacity; the earliest live job's on the GPU holds
  std::string config;  // the job's config file and run directory, shown by `trainer jobs`
  std::string run_dir;
  int rank = 0;
  ShareCurve curve;
  ShareObjective objective = ShareObjective::kThroughput;  // as `capacity`
};

// Note [A capacity that follows the jobs]
// Jobs on one GPU may disagree about its capacity (their device.memory) and objective; the GPU's
// are those of its earliest job still on it, re-decided whenever the jobs change. So when the job
// that set them leaves or dies, the next live job's apply (a capacity set by a job that is gone
// would otherwise bind every later job until the GPU emptied: issue 27, item 10). When the
// capacity falls below the grants already given, no grant grows until the jobs above their new
// shares have confirmed them and the grants fit again (Note [Handing memory over between jobs]).

// Note [The ledger's record of held memory]
// The ledger keeps a record of what the jobs on each GPU hold: whenever the sum of their held
// bytes, the sum of their grants or their number changes, one entry (a ring of the last
// kHistory, numbered across the ledger) with the time and the sums. `held` is what each job has
// reported, and a job reports so that its record is never below what it holds: before its
// device memory grows (report() with the size it will hold, refused above its grant), after it
// shrinks (confirm() once the memory is freed). So at every instant the record's sum bounds
// what the jobs actually hold, and since grants sum to at most the capacity and report() refuses
// more than the grant, no entry can exceed the capacity. Tests read the record (history());
// `trainer jobs` shows its largest sum so far (LedgerGpu::peak_held).

// A job's standing, as it reads it.
struct JobGrant {
  uint64_t id = 0;          // the job's entry (also its arrival order)
  uint64_t capacity = 0;    // the GPU's
  uint64_t share = 0;       // the controller's target
  uint64_t granted = 0;     // what the job may hold now
  bool waiting = true;      // not admitted yet: granted < its lower bound
  uint64_t generation = 0;  // changes whenever share, granted or waiting do
  bool gone = false;        // the entry is no longer in the ledger (left, or reaped)
  // What last changed the share or the grant: "job 3 (pid 4242) arrived", "... left", "... died
  // (reaped)", "... re-registered its curve (<why>)", "... confirmed its smaller share".
  std::string reason;
};

// One job in a snapshot.
struct LedgerJob {
  uint64_t id = 0;
  int pid = 0;
  int rank = 0;
  std::string config;
  std::string run_dir;
  ShareCurve curve;  // as registered (thinned to kMaxLadder points)
  uint64_t share = 0;
  uint64_t granted = 0;
  uint64_t held = 0;
  double predicted_step_s = 0;  // at its share (0 while waiting)
  double measured_step_s = 0;   // 0: not measured yet
  bool waiting = true;
  uint64_t generation = 0;
  double age_s = 0;    // since it joined
  std::string reason;  // JobGrant::reason
};

// One entry of the held record (Note [The ledger's record of held memory]).
struct HeldRecord {
  uint64_t seq = 0;  // 1, 2, ... across the ledger: a gap means entries were overwritten
  double t = 0;      // CLOCK_MONOTONIC seconds
  std::string device;
  int jobs = 0;           // entries on the GPU
  uint64_t held = 0;      // the sum of their held bytes
  uint64_t granted = 0;   // the sum of their grants
  uint64_t capacity = 0;  // the GPU's
  uint64_t job = 0;       // the job whose change made the entry (0: a re-division)
  uint64_t job_held = 0;  // what that job holds now
};

// One GPU in a snapshot.
struct LedgerGpu {
  std::string device;
  uint64_t capacity = 0;
  ShareObjective objective = ShareObjective::kThroughput;
  uint64_t generation = 0;      // bumped at every re-division
  uint64_t peak_held = 0;       // the largest sum of held bytes the ledger has recorded
  std::vector<LedgerJob> jobs;  // in arrival order
};

struct JobLedgerOptions {
  double slice_s = 0.05;  // a waiting job re-reads the ledger (and reaps the dead) this often
};

class JobLedger {
 public:
  static constexpr int kMaxGpus = 32;
  static constexpr int kMaxJobs = 128;
  static constexpr int kMaxLadder = 32;
  static constexpr int kHistory = 1024;

  // The node's ledger for this user: "/ferry-jobs-v<layout>-u<uid>", or $FERRY_JOB_LEDGER when
  // it is a name ("/" then no other "/"): jobs that set it share a ledger of their own (tests).
  static std::string default_name();
  // Attaches the ledger `name`, creating it when no job has (Note [A well-known block created
  // once] in common/shm_block.h). A block at the name that is not a sound ledger of this build
  // is replaced when no process maps it; throws DataError naming it when one does (Note [A block
  // is input]), LibraryError when shared memory fails.
  static std::shared_ptr<JobLedger> attach(const std::string& name = default_name(),
                                           const JobLedgerOptions& options = {});
  // Attaches an existing ledger; nullptr when there is none (or a bad one nobody maps was removed).
  static std::shared_ptr<JobLedger> open_existing(const std::string& name = default_name(),
                                                  const JobLedgerOptions& options = {});
  // Removes the name (tests). Quiet if absent.
  static void unlink(const std::string& name);

  ~JobLedger();
  JobLedger(const JobLedger&) = delete;
  JobLedger& operator=(const JobLedger&) = delete;

  // Registers this process's job on `request.device` and re-divides that GPU. Throws ConfigError
  // on a malformed ladder or a full ledger.
  JobGrant join(const JobRequest& request);
  // Removes the entry (its grant is freed) and re-divides. Quiet for an entry that is gone.
  void leave(uint64_t id);
  // The entry's standing now (reaping the dead first).
  JobGrant poll(uint64_t id);
  // The job holds `held` bytes of the GPU now, and its step measured `measured_step_s` (< 0:
  // unchanged). Throws Error when held exceeds the grant. Records the GPU's held sum.
  JobGrant report(uint64_t id, uint64_t held, double measured_step_s = -1);
  // The job runs within its current share now and holds `held` (<= share): a shrunk grant falls
  // to the share and growing jobs may take the rest (Note [Handing memory over between jobs]).
  // Throws Error when held exceeds the share.
  JobGrant confirm(uint64_t id, uint64_t held);
  // A new curve (re-planned, or with the measured cost model, or scaled after a drift);
  // re-divides the GPU. `why` goes into the reasons of the jobs whose share or grant it changes.
  JobGrant update_curve(uint64_t id, const ShareCurve& curve, const std::string& why = "");
  // Waits until the entry's generation differs from `generation`, or `timeout_s` passes.
  JobGrant wait_change(uint64_t id, uint64_t generation, double timeout_s);
  // Waits until the entry is admitted (granted >= lower) or `timeout_s` passes.
  JobGrant wait_admitted(uint64_t id, double timeout_s);
  // Removes the entries of processes that died and re-divides their GPUs; returns how many.
  int reap();
  // Every GPU with a job on it.
  std::vector<LedgerGpu> snapshot();
  // The held record's entries numbered after `after_seq` that the ring still keeps, oldest first
  // (Note [The ledger's record of held memory]).
  std::vector<HeldRecord> history(uint64_t after_seq = 0);

  struct Shared;  // the block's layout, private to job_ledger*.cc

 private:
  JobLedger(shm_block::Mapping block, const JobLedgerOptions& options);
  shm_block::Mapping block_;  // holds the flock that says a job uses it
  Shared* s_;
  JobLedgerOptions options_;
};

}  // namespace ferry
