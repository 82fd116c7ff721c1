// The job ledger's operations (layout in job_ledger_impl.h, the block in job_ledger_block.cc).
// Invariant: each locks, reaps dead processes' entries, changes what it changes, then re-divides
// and settles the touched GPUs' grants (Note [Handing memory over between jobs] in job_ledger.h).
#include "jobs/job_ledger.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "common/shm_names.h"
#include "jobs/job_ledger_impl.h"

namespace ferry {

// Note [No condition variable in the job ledger]
// Jobs wait by re-reading the ledger every slice, not on a process-shared condition variable:
// glibc's condition variable keeps counts of its waiters, and a waiter killed by kill -9 is never
// taken off them, which can block the next broadcaster for ever. A killed mutex holder is safe:
// the mutex is robust, and the next locker re-divides every GPU from the entries, which are
// written with their `used` flag last.

namespace {

using namespace job_ledger_impl;
using Shared = JobLedger::Shared;

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void copy_text(char (&dst)[kText], const std::string& src) {
  std::snprintf(dst, sizeof(dst), "%s", src.c_str());
}

// The curve stored in `c` (its point count checked on open, check_block()).
ShareCurve curve_of(const CurveSlot& c) {
  return {c.lower, c.peak, {c.ladder, c.ladder + c.n_ladder}};
}

// Stores `curve` (at most kMaxLadder points: thinned()) in `c`.
void store(CurveSlot& c, const ShareCurve& curve) {
  c.lower = curve.lower;
  c.peak = curve.peak;
  c.n_ladder = static_cast<int32_t>(curve.ladder.size());
  std::copy(curve.ladder.begin(), curve.ladder.end(), c.ladder);
}

// The entries on GPU `g`, in arrival order.
std::vector<JobSlot*> jobs_on(Shared* s, int g) {
  std::vector<JobSlot*> out;
  for (JobSlot& j : s->jobs)
    if (j.used && j.gpu == g) out.push_back(&j);
  std::sort(out.begin(), out.end(),
            [](const JobSlot* a, const JobSlot* b) { return a->id < b->id; });
  return out;
}

void copy_reason(JobSlot& j, const std::string& why) {
  std::snprintf(j.reason, sizeof(j.reason), "%s", why.c_str());
}

void set(uint64_t& field, uint64_t value, JobSlot& j, const std::string& why) {
  if (field == value) return;
  field = value;
  ++j.generation;
  copy_reason(j, why);
}

// Appends an entry to the held record when GPU `g`'s sums or job count changed (Note [The
// ledger's record of held memory]); `job` made the change (0: a re-division).
void record(Shared* s, int g, uint64_t job) {
  GpuSlot& gpu = s->gpus[g];
  uint64_t held = 0, granted = 0, job_held = 0;
  int32_t n = 0;
  for (const JobSlot* j : jobs_on(s, g)) {
    held += j->held;
    granted += j->granted;
    ++n;
    if (j->id == job) job_held = j->held;
  }
  gpu.peak_held = std::max(gpu.peak_held, held);
  if (held == gpu.recorded_held && granted == gpu.recorded_granted && n == gpu.recorded_jobs)
    return;
  gpu.recorded_held = held;
  gpu.recorded_granted = granted;
  gpu.recorded_jobs = n;
  const uint64_t seq = s->next_seq++;
  RecordSlot& r = s->history[(seq - 1) % JobLedger::kHistory];
  r.seq = 0;  // an entry whose writer dies half-way is skipped by readers
  r.t = now_s();
  // Both in the block: a bounded copy, not snprintf (whose ranges must not overlap).
  const size_t length = strnlen(gpu.device, sizeof(r.device) - 1);
  std::memcpy(r.device, gpu.device, length);
  r.device[length] = '\0';
  r.jobs = n;
  r.held = held;
  r.granted = granted;
  r.capacity = gpu.capacity;
  r.job = job;
  r.job_held = job_held;
  r.seq = seq;
}

// Raises the grants of growing jobs, in arrival order, while every grant on the GPU fits the
// capacity (Note [Handing memory over between jobs]); sets `waiting`; records the sums. `why`
// becomes the reason of the jobs whose grant it raises.
void settle(Shared* s, int g, const std::string& why) {
  GpuSlot& gpu = s->gpus[g];
  const std::vector<JobSlot*> jobs = jobs_on(s, g);
  uint64_t granted = 0;
  for (const JobSlot* j : jobs) granted += j->granted;
  for (JobSlot* j : jobs) {
    if (j->share <= j->granted || granted > gpu.capacity) continue;
    const uint64_t room = gpu.capacity - granted;
    uint64_t to = j->share;
    if (j->share - j->granted > room) {
      // A job not admitted yet starts on what is free if its lower bound fits there.
      if (j->granted >= j->curve.lower || j->granted + room < j->curve.lower) continue;
      to = j->granted + room;
    }
    granted += to - j->granted;
    set(j->granted, to, *j, why);
  }
  for (JobSlot* j : jobs) {
    const int32_t waiting = !j->admitted || j->granted < j->curve.lower;
    if (waiting != j->waiting) {
      j->waiting = waiting;
      ++j->generation;
    }
  }
  record(s, g, 0);
}

// Divides GPU `g` among its entries (jobs/share_controller.h), then settles; frees the GPU's slot
// when no entry is left. The capacity and objective are the earliest entry's (Note [A capacity
// that follows the jobs] in job_ledger.h). `why` becomes the reason of the jobs whose share or
// grant changes.
void redivide(Shared* s, int g, const std::string& why) {
  GpuSlot& gpu = s->gpus[g];
  const std::vector<JobSlot*> jobs = jobs_on(s, g);
  if (jobs.empty()) {
    record(s, g, 0);  // nobody is left on it
    gpu = GpuSlot{};
    return;
  }
  gpu.capacity = jobs.front()->capacity;
  gpu.objective = jobs.front()->objective;
  std::vector<ShareJob> in;
  for (const JobSlot* j : jobs) {
    ShareJob sj;
    sj.curve = curve_of(j->curve);
    sj.order = j->id;
    sj.measured_step_s = j->measured_step_s;
    sj.current = j->granted;
    in.push_back(std::move(sj));
  }
  // Note [Life of a memory share], step 3: the live curves divided into grants.
  const ShareDivision d =
      divide_memory(gpu.capacity, in, static_cast<ShareObjective>(gpu.objective));
  for (size_t i = 0; i < jobs.size(); ++i) {
    set(jobs[i]->share, d.jobs[i].share, *jobs[i], why);
    jobs[i]->predicted_step_s = d.jobs[i].step_s;
    jobs[i]->admitted = !d.jobs[i].waiting;
  }
  ++gpu.generation;
  settle(s, g, why);
}

std::string who(const JobSlot& j) { return fmt::format("job {} (pid {})", j.id, j.pid); }

// Removes the entries of dead processes and re-divides their GPUs (every GPU when `all`).
int reap_locked(Shared* s, bool all) {
  std::string why[JobLedger::kMaxGpus];
  int reaped = 0;
  for (JobSlot& j : s->jobs) {
    if (!j.used || shm_names::alive({j.pid, j.start})) continue;
    j.used = 0;
    why[j.gpu] += fmt::format("{}{} died (reaped)", why[j.gpu].empty() ? "" : ", ", who(j));
    ++reaped;
  }
  for (int g = 0; g < JobLedger::kMaxGpus; ++g) {
    if (!s->gpus[g].used || (!all && why[g].empty())) continue;
    redivide(s, g, why[g].empty() ? "a job died while it changed the ledger" : why[g]);
  }
  return reaped;
}

// Holds the ledger's mutex; on entry reaps the dead, and after a holder died re-divides every
// GPU (what it was changing is recomputed from the entries).
class Locked {
 public:
  explicit Locked(Shared* s) : s_(s) {
    const int rc = pthread_mutex_lock(&s_->mu);
    bool recovered = false;
    if (rc == EOWNERDEAD) {
      pthread_mutex_consistent(&s_->mu);
      recovered = true;
    } else if (rc != 0) {
      throw LibraryError("posix", "pthread_mutex_lock job ledger", std::strerror(rc), __FILE__,
                         __LINE__);
    }
    try {
      reaped_ = reap_locked(s_, recovered);
    } catch (...) {
      pthread_mutex_unlock(&s_->mu);  // the destructor does not run for a throwing constructor
      throw;
    }
  }
  ~Locked() { pthread_mutex_unlock(&s_->mu); }
  int reaped() const { return reaped_; }

 private:
  Shared* s_;
  int reaped_ = 0;
};

JobSlot* find(Shared* s, uint64_t id) {
  for (JobSlot& j : s->jobs)
    if (j.used && j.id == id) return &j;
  return nullptr;
}

JobGrant grant_of(const Shared* s, const JobSlot* j, uint64_t id) {
  JobGrant g;
  g.id = id;
  if (!j) {
    g.gone = true;
    return g;
  }
  g.capacity = s->gpus[j->gpu].capacity;
  g.share = j->share;
  g.granted = j->granted;
  g.waiting = j->waiting != 0;
  g.generation = j->generation;
  g.reason = j->reason;
  return g;
}

// `curve` with at most JobLedger::kMaxLadder points: the lower bound, the peak and evenly spaced
// ones between.
ShareCurve thinned(ShareCurve curve) {
  const std::vector<SharePoint>& ladder = curve.ladder;
  const size_t n = ladder.size(), m = JobLedger::kMaxLadder;
  if (n <= m) return curve;
  std::vector<SharePoint> out;
  for (size_t k = 0; k < m; ++k) out.push_back(ladder[k * (n - 1) / (m - 1)]);
  curve.ladder = std::move(out);
  return curve;
}

// Throws ConfigError when the controller would refuse the job.
void check_curve(const ShareCurve& curve) {
  ShareJob j;
  j.curve = curve;
  try {
    divide_memory(curve.peak, {j}, ShareObjective::kThroughput);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(fmt::format("job ledger: {}", e.what()));
  }
}

// Whether the text field `text` ends within its array.
template <size_t N>
bool terminated(const char (&text)[N]) {
  return std::memchr(text, '\0', N) != nullptr;
}

bool finite_at_least_zero(double x) { return std::isfinite(x) && x >= 0; }

// What is wrong with the entry `j` (used), "" when nothing.
std::string check_job_slot(const Shared* s, const JobSlot& j) {
  if (j.gpu < 0 || j.gpu >= JobLedger::kMaxGpus || s->gpus[j.gpu].used != 1)
    return fmt::format("its GPU index {} names no GPU", j.gpu);
  if (j.pid <= 0) return fmt::format("pid {}", j.pid);
  if (j.id == 0 || j.id >= s->next_id) return fmt::format("id {} not below {}", j.id, s->next_id);
  if (j.curve.n_ladder < 1 || j.curve.n_ladder > JobLedger::kMaxLadder)
    return fmt::format("{} ladder points", j.curve.n_ladder);
  if (((j.waiting | j.admitted | j.objective) & ~1) != 0) return "a flag out of range";
  if (!terminated(j.config) || !terminated(j.run_dir) || !terminated(j.reason))
    return "an unterminated text";
  if (!finite_at_least_zero(j.predicted_step_s) || !finite_at_least_zero(j.measured_step_s) ||
      !std::isfinite(j.joined))
    return "a time that is not a finite number";
  try {
    check_curve(curve_of(j.curve));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

namespace job_ledger_impl {

std::string check_block(Shared* s, bool owner_died) {
  if (s->next_id == 0 || s->next_seq == 0) return "a zero counter";
  for (int g = 0; g < JobLedger::kMaxGpus; ++g) {
    const GpuSlot& gpu = s->gpus[g];
    if ((gpu.used & ~1) != 0 || (gpu.objective & ~1) != 0 || !terminated(gpu.device) ||
        gpu.recorded_jobs < 0 || gpu.recorded_jobs > JobLedger::kMaxJobs)
      return fmt::format("GPU entry {} is out of range", g);
  }
  for (int k = 0; k < JobLedger::kMaxJobs; ++k) {
    const JobSlot& j = s->jobs[k];
    if ((j.used & ~1) != 0) return fmt::format("job entry {} has a used flag of {}", k, j.used);
    if (!j.used) continue;
    const std::string problem = check_job_slot(s, j);
    if (!problem.empty()) return fmt::format("job entry {}: {}", k, problem);
  }
  for (const RecordSlot& r : s->history)
    if (!terminated(r.device) || !std::isfinite(r.t)) return "a damaged held record";
  if (owner_died) reap_locked(s, true);  // what the holder was changing is recomputed
  return "";
}

}  // namespace job_ledger_impl

JobGrant JobLedger::join(const JobRequest& request) {
  const ShareCurve curve = thinned(request.curve);
  check_curve(curve);
  const shm_names::ProcessId me = shm_names::self();
  Locked lock(s_);
  int g = -1;
  for (int i = 0; i < kMaxGpus && g < 0; ++i)
    if (s_->gpus[i].used && request.device == s_->gpus[i].device) g = i;
  for (int i = 0; i < kMaxGpus && g < 0; ++i) {
    if (s_->gpus[i].used) continue;
    GpuSlot& gpu = s_->gpus[i];
    gpu = GpuSlot{};
    copy_text(gpu.device, request.device);
    gpu.capacity = request.capacity;
    gpu.objective = static_cast<int32_t>(request.objective);
    gpu.used = 1;
    g = i;
  }
  if (g < 0) throw ConfigError(fmt::format("job ledger: more than {} GPUs on this node", kMaxGpus));
  for (JobSlot& j : s_->jobs) {
    if (j.used) continue;
    j = JobSlot{};
    j.gpu = g;
    j.pid = me.pid;
    j.start = me.start;
    j.rank = request.rank;
    j.id = s_->next_id++;
    copy_text(j.config, request.config);
    copy_text(j.run_dir, request.run_dir);
    j.capacity = request.capacity;
    j.objective = static_cast<int32_t>(request.objective);
    store(j.curve, curve);
    j.joined = now_s();
    j.used = 1;  // last: a joiner killed before this left nothing
    redivide(s_, g, who(j) + " arrived");
    return grant_of(s_, &j, j.id);
  }
  if (!jobs_on(s_, g).size()) s_->gpus[g] = GpuSlot{};
  throw ConfigError(fmt::format("job ledger: more than {} jobs on this node", kMaxJobs),
                    "wait for a job to end");
}

void JobLedger::leave(uint64_t id) {
  Locked lock(s_);
  JobSlot* j = find(s_, id);
  if (!j) return;
  j->used = 0;
  redivide(s_, j->gpu, who(*j) + " left");
}

JobGrant JobLedger::poll(uint64_t id) {
  Locked lock(s_);
  return grant_of(s_, find(s_, id), id);
}

JobGrant JobLedger::report(uint64_t id, uint64_t held, double measured_step_s) {
  Locked lock(s_);
  JobSlot* j = find(s_, id);
  if (!j) return grant_of(s_, j, id);
  if (held > j->granted) {
    throw Error(fmt::format("job ledger: job {} holds {} bytes, more than its grant of {}", id,
                            held, j->granted));
  }
  j->held = held;
  if (measured_step_s >= 0) j->measured_step_s = measured_step_s;
  record(s_, j->gpu, id);
  return grant_of(s_, j, id);
}

JobGrant JobLedger::confirm(uint64_t id, uint64_t held) {
  Locked lock(s_);
  JobSlot* j = find(s_, id);
  if (!j) return grant_of(s_, j, id);
  if (held > j->share || held > j->granted) {
    throw Error(fmt::format("job ledger: job {} confirms a share of {} bytes holding {}", id,
                            j->share, held));
  }
  j->held = held;
  const std::string why = who(*j) + " confirmed its smaller share";
  if (j->share < j->granted) set(j->granted, j->share, *j, why);
  record(s_, j->gpu, id);
  settle(s_, j->gpu, why);
  return grant_of(s_, j, id);
}

JobGrant JobLedger::update_curve(uint64_t id, const ShareCurve& curve_in, const std::string& why) {
  const ShareCurve curve = thinned(curve_in);
  check_curve(curve);
  Locked lock(s_);
  JobSlot* j = find(s_, id);
  if (!j) return grant_of(s_, j, id);
  store(j->curve, curve);
  redivide(s_, j->gpu,
           who(*j) + " re-registered its curve" + (why.empty() ? "" : " (" + why + ")"));
  return grant_of(s_, j, id);
}

JobGrant JobLedger::wait_change(uint64_t id, uint64_t generation, double timeout_s) {
  const double deadline = now_s() + timeout_s;
  for (;;) {
    const JobGrant g = poll(id);
    if (g.gone || g.generation != generation || now_s() >= deadline) return g;
    std::this_thread::sleep_for(std::chrono::duration<double>(
        std::max(0.0, std::min(options_.slice_s, deadline - now_s()))));
  }
}

JobGrant JobLedger::wait_admitted(uint64_t id, double timeout_s) {
  const double deadline = now_s() + timeout_s;
  for (;;) {
    const JobGrant g = poll(id);
    if (g.gone || !g.waiting || now_s() >= deadline) return g;
    std::this_thread::sleep_for(std::chrono::duration<double>(
        std::max(0.0, std::min(options_.slice_s, deadline - now_s()))));
  }
}

int JobLedger::reap() {
  Locked lock(s_);
  return lock.reaped();
}

std::vector<LedgerGpu> JobLedger::snapshot() {
  Locked lock(s_);
  const double t = now_s();
  std::vector<LedgerGpu> out;
  for (int g = 0; g < kMaxGpus; ++g) {
    const GpuSlot& gpu = s_->gpus[g];
    if (!gpu.used) continue;
    LedgerGpu lg;
    lg.device = gpu.device;
    lg.capacity = gpu.capacity;
    lg.objective = static_cast<ShareObjective>(gpu.objective);
    lg.generation = gpu.generation;
    lg.peak_held = gpu.peak_held;
    for (const JobSlot* j : jobs_on(s_, g)) {
      LedgerJob lj;
      lj.id = j->id;
      lj.pid = j->pid;
      lj.rank = j->rank;
      lj.config = j->config;
      lj.run_dir = j->run_dir;
      lj.curve = curve_of(j->curve);
      lj.share = j->share;
      lj.granted = j->granted;
      lj.held = j->held;
      lj.predicted_step_s = j->predicted_step_s;
      lj.measured_step_s = j->measured_step_s;
      lj.waiting = j->waiting != 0;
      lj.generation = j->generation;
      lj.age_s = t - j->joined;
      lj.reason = j->reason;
      lg.jobs.push_back(std::move(lj));
    }
    out.push_back(std::move(lg));
  }
  return out;
}

std::vector<HeldRecord> JobLedger::history(uint64_t after_seq) {
  Locked lock(s_);
  std::vector<HeldRecord> out;
  const uint64_t end = s_->next_seq;  // one past the newest
  const uint64_t kept = end > static_cast<uint64_t>(kHistory) ? end - kHistory : 1;
  for (uint64_t seq = std::max(after_seq + 1, kept); seq < end; ++seq) {
    const RecordSlot& r = s_->history[(seq - 1) % kHistory];
    if (r.seq != seq) continue;  // its writer died half-way
    HeldRecord h;
    h.seq = r.seq;
    h.t = r.t;
    h.device = r.device;
    h.jobs = r.jobs;
    h.held = r.held;
    h.granted = r.granted;
    h.capacity = r.capacity;
    h.job = r.job;
    h.job_held = r.job_held;
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace ferry
