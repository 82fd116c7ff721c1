// The job ledger's shared block layout (private to jobs/job_ledger*.cc): fixed-size plain data
// behind a robust process-shared mutex. Invariant: kVersion is in the block's name and changes
// whenever the layout does, so builds of different layouts never read each other's block.
#pragma once

#include <pthread.h>

#include <cstdint>
#include <string>

#include "jobs/job_ledger.h"

namespace ferry {
namespace job_ledger_impl {

constexpr uint64_t kMagic = 0x6665727279'6a6f62ULL;  // "ferryjob"
// 3: each job's capacity and objective (Note [A capacity that follows the jobs] in job_ledger.h)
constexpr uint32_t kVersion = 3;
constexpr int kText = 256;

struct GpuSlot {
  int32_t used = 0;
  int32_t objective = 0;  // ShareObjective: its earliest job's
  char device[kText] = {};
  uint64_t capacity = 0;  // its earliest job's
  uint64_t generation = 0;
  uint64_t peak_held = 0;
  // The sums of the GPU's last entry in the held record: a change of any appends one.
  uint64_t recorded_held = 0;
  uint64_t recorded_granted = 0;
  int32_t recorded_jobs = 0;
  int32_t pad = 0;
};

// A ShareCurve as stored: at most JobLedger::kMaxLadder points.
struct CurveSlot {
  uint64_t lower = 0;
  uint64_t peak = 0;
  int32_t n_ladder = 0;
  int32_t pad = 0;
  SharePoint ladder[JobLedger::kMaxLadder] = {};
};

struct JobSlot {
  int32_t used = 0;
  int32_t gpu = 0;  // index into gpus
  int32_t pid = 0;
  int32_t rank = 0;
  uint64_t start = 0;  // the process's start time (shm_names::ProcessId)
  uint64_t id = 0;     // also its arrival order
  char config[kText] = {};
  char run_dir[kText] = {};
  CurveSlot curve;
  int32_t waiting = 1;
  int32_t admitted = 0;   // by the controller (its lower bound fits after earlier arrivals')
  int32_t objective = 0;  // ShareObjective: the job's idea of the GPU's division
  uint64_t capacity = 0;  // the job's idea of the GPU's capacity
  uint64_t share = 0;
  uint64_t granted = 0;
  uint64_t held = 0;
  double predicted_step_s = 0;
  double measured_step_s = 0;
  uint64_t generation = 0;
  double joined = 0;        // CLOCK_MONOTONIC seconds
  char reason[kText] = {};  // what last changed its share or grant
};

// One entry of the held record, as stored (HeldRecord's fields).
struct RecordSlot {
  uint64_t seq = 0;
  double t = 0;
  char device[64] = {};
  int32_t jobs = 0;
  int32_t pad = 0;
  uint64_t held = 0;
  uint64_t granted = 0;
  uint64_t capacity = 0;
  uint64_t job = 0;
  uint64_t job_held = 0;
};

}  // namespace job_ledger_impl

struct JobLedger::Shared {
  uint64_t magic;
  uint32_t version;
  int32_t pad;
  pthread_mutex_t mu;
  uint64_t next_id;
  job_ledger_impl::GpuSlot gpus[kMaxGpus];
  job_ledger_impl::JobSlot jobs[kMaxJobs];
  uint64_t next_seq;                              // of the held record's next entry (from 1)
  job_ledger_impl::RecordSlot history[kHistory];  // the held record, a ring
};

namespace job_ledger_impl {

// The checked open's test of a block's body (Note [A block is input] in common/shm_block.h),
// with its mutex held: "" when every field the ledger reads through is in range, else what is
// wrong. After a holder died, a sound block's GPUs are re-divided.
std::string check_block(JobLedger::Shared* s, bool owner_died);

}  // namespace job_ledger_impl

}  // namespace ferry
