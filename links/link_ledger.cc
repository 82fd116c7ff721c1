// The link ledger's operations on its shared block: the fluid model (Note [Fluid copies]) driven
// on the node's clock under the block's mutex (Note [What the ledger adds to the fluid model]).
// Invariant: the fluid state is advanced to `now` under the mutex before it is read or changed.
#include "links/link_ledger.h"

#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "common/shm_names.h"
#include "links/fluid_model.h"
#include "links/link_ledger_impl.h"

// Note [What the ledger adds to the fluid model]
// The block's layout is in link_ledger_impl.h; its creation, names and attachment in
// link_ledger_block.cc. Around the fluid model (links/fluid_model.h) this file adds what the
// model leaves to its owner: the waiting, the liveness of other processes (of any job: Note [One
// link ledger per node] in link_ledger.h), the users and the timeouts.

namespace ferry {

namespace {

int dir_index(TransferDirection d) { return d == TransferDirection::kToDevice ? 1 : 0; }
const char* dir_name(int d) { return d == 1 ? "to device" : "to host"; }

using Shared = LinkLedger::Shared;

void lock(Shared* s) {
  // A holder that died (any job's) left the state as its last complete update or mid-update of
  // plain numbers; its flows and claims are reaped as a dead process's.
  int rc = pthread_mutex_lock(&s->mu);
  if (rc == EOWNERDEAD) pthread_mutex_consistent(&s->mu);
}

// The block locked, and its fluid model.
class Locked {
 public:
  explicit Locked(Shared* s) : s_(s), model_(s->fluid) { lock(s_); }
  ~Locked() { pthread_mutex_unlock(&s_->mu); }
  FluidModel& model() { return model_; }
  FluidState& state() { return s_->fluid; }

 private:
  Shared* s_;
  FluidModel model_;
};

// Note [Waiting without a shared condition variable]
// The block outlives every job (Note [One link ledger per node] in link_ledger.h), and a process
// killed inside pthread_cond_wait or pthread_cond_broadcast of a process-shared condition
// variable leaves its internal lock or counters behind, so that every later broadcast on the
// node hangs. So waiters sleep on a futex instead: a sequence word that every change bumps
// before waking all. A waiter reads it under the mutex, unlocks, and sleeps only while the word
// is unchanged (the kernel checks), so no wake-up is lost, and a process that dies anywhere
// leaves nothing to undo.

// Wakes every waiter: the state changed.
void wake_all(Shared* s) {
  __atomic_fetch_add(&s->wake_seq, 1, __ATOMIC_SEQ_CST);
  syscall(SYS_futex, &s->wake_seq, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// With the mutex held: releases it until a wake_all() or CLOCK_MONOTONIC time `t`, then takes
// it again.
void wait_until(Shared* s, double t) {
  const uint32_t seen = __atomic_load_n(&s->wake_seq, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&s->mu);
  timespec ts;
  ts.tv_sec = static_cast<time_t>(std::floor(t));
  ts.tv_nsec = static_cast<long>((t - std::floor(t)) * 1e9);
  // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline.
  syscall(SYS_futex, &s->wake_seq, FUTEX_WAIT_BITSET, seen, &ts, nullptr, FUTEX_BITSET_MATCH_ANY);
  lock(s);
}

bool alive(int32_t pid) { return pid <= 0 || kill(pid, 0) == 0 || errno == EPERM; }

bool has_user(const Shared* s, int32_t pid) {
  for (const link_ledger_impl::UserSlot& u : s->users)
    if (u.used && u.pid == pid) return true;
  return false;
}

// Whether the process that owns a flow or claim is gone. On the node's ledger every process
// with copies registered as a user (with its start time), so a pid reused by a stranger counts
// as gone too; a job's private block (key 0) has no users.
bool gone(const Shared* s, int32_t pid) {
  return !alive(pid) || (s->key != 0 && pid > 0 && !has_user(s, pid));
}

// Whether `pid` is a user of another job than the user in `slot` (-1: this process registered
// none, as on a job's private block).
bool another_job(const Shared* s, int slot, int32_t pid) {
  if (slot < 0) return false;
  const link_ledger_impl::UserSlot& me = s->users[slot];
  for (const link_ledger_impl::UserSlot& u : s->users)
    if (u.used && u.pid == pid) return std::strncmp(u.job, me.job, sizeof(u.job)) != 0;
  return false;
}

// Drops the user entries, flows and claims of processes that died, hands their tokens on and
// wakes the waiters; true when a flow or claim was dropped.
bool reap_dead(Shared* s, FluidModel& model, double t) {
  for (link_ledger_impl::UserSlot& u : s->users)
    if (u.used && !shm_names::alive({u.pid, u.start})) u.used = 0;
  bool changed = false;
  for (FluidFlow& f : s->fluid.flows) {
    if (f.used && gone(s, f.pid)) {
      f.used = 0;
      changed = true;
    }
  }
  for (FluidClaim& c : s->fluid.claims) {
    if (c.used && gone(s, c.pid)) {
      c.used = 0;
      changed = true;
    }
  }
  if (changed) {
    model.free_tokens();
    model.grant_waiting(t);
    model.recompute_rates();
    wake_all(s);
  }
  s->last_reap = t;
  return changed;
}

// A copy's thread refreshes its process's other waiting claims while it waits for a flow: a
// claim queued ahead for the next chunk is not stale while the chunk before it moves.
void refresh_claims(FluidState& s, int32_t pid, double t) {
  for (FluidClaim& c : s.claims)
    if (c.used && !c.granted && c.pid == pid) c.heartbeat = t;
}

void check_links(const FluidState& s, const std::vector<int>& links) {
  for (int l : links)
    if (l < 0 || l >= s.n_links) throw ConfigError(fmt::format("link {} is not in the ledger", l));
}

int32_t self_pid() { return static_cast<int32_t>(getpid()); }

}  // namespace

// The block stores a CopyKind in FluidFlow::kind and FluidClaim::kind; its check admits below this.
static_assert(static_cast<int32_t>(CopyKind::kOptimizer) + 1 == kFluidKinds);

const char* copy_label(CopyKind kind, int dir) {
  switch (kind) {
    case CopyKind::kActivation:
      return dir == 1 ? "prefetch" : "offload";
    case CopyKind::kOptimizer:
      return dir == 1 ? "optimizer h2d" : "optimizer d2h";
    case CopyKind::kOther:
      break;
  }
  return "copy";
}

double LinkLedger::now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int LinkLedger::link_count() const { return s_->fluid.n_links; }

uint64_t LinkLedger::begin_flow(int rank, TransferDirection direction,
                                const std::vector<int>& links, uint64_t bytes, CopyKind kind) {
  if (links.size() > static_cast<size_t>(kMaxPath)) {
    throw ConfigError(
        fmt::format("a path of {} links; the ledger takes at most {}", links.size(), kMaxPath));
  }
  Locked guard(s_);
  check_links(guard.state(), links);
  guard.model().advance(now());
  const std::vector<int32_t> path(links.begin(), links.end());
  const FluidFlow& f = guard.model().begin_flow(rank, self_pid(), dir_index(direction), path, bytes,
                                                static_cast<int32_t>(kind));
  wake_all(s_);
  return f.id;
}

void LinkLedger::wait_flow(uint64_t flow) {
  Locked guard(s_);
  FluidModel& model = guard.model();
  const double started = now();
  for (;;) {
    const double t = now();
    model.advance(t);
    if (t - s_->last_reap > link_ledger_impl::kReapInterval_s) reap_dead(s_, model, t);
    FluidFlow* f = model.find_flow(flow);
    if (f == nullptr) return;
    refresh_claims(guard.state(), self_pid(), t);
    if (f->done) {
      f->used = 0;
      wake_all(s_);
      return;
    }
    if (f->rate <= 0 && t - started > options_.token_timeout_s) {
      f->used = 0;
      model.free_tokens();
      model.recompute_rates();
      throw LinkArbiterError(fmt::format(
          "link ledger: a copy of rank {} made no progress for {:.0f} s (a link of zero speed?)",
          f->rank, t - started));
    }
    wait_until(s_, std::min(model.finish_time(*f), t + options_.slice_s));
  }
}

uint64_t LinkLedger::claim(int rank, TransferDirection direction,
                           const std::vector<int>& arbitrated, const std::vector<int>& path,
                           uint64_t bytes, double latest_start, bool held, CopyKind kind) {
  if (path.size() > static_cast<size_t>(kMaxPath) ||
      arbitrated.size() > static_cast<size_t>(kMaxPath)) {
    throw ConfigError(
        fmt::format("a path of {} links; the ledger takes at most {}", path.size(), kMaxPath));
  }
  Locked guard(s_);
  check_links(guard.state(), arbitrated);
  check_links(guard.state(), path);
  const double t = now();
  guard.model().advance(t);
  const std::vector<int32_t> tokens(arbitrated.begin(), arbitrated.end());
  const std::vector<int32_t> links(path.begin(), path.end());
  bool granted = false;
  const FluidClaim& c =
      guard.model().add_claim(t, rank, self_pid(), dir_index(direction), tokens, links, bytes,
                              latest_start, held, &granted, static_cast<int32_t>(kind));
  if (granted) wake_all(s_);
  return c.id;
}

uint64_t LinkLedger::await_grant(uint64_t claim) {
  Locked guard(s_);
  FluidModel& model = guard.model();
  FluidState& s = guard.state();
  for (;;) {
    const double t = now();
    model.advance(t);
    FluidClaim* mine = model.find_claim(claim);
    if (mine == nullptr) {
      throw LinkArbiterError(fmt::format(
          "link ledger: chunk claim {} was dropped (its owner did not wait for it in {:.0f} s)",
          claim, options_.claim_stale_s));
    }
    mine->heartbeat = t;
    // Liveness: drop the claims, flows and tokens of processes that died, and waiting claims
    // nobody refreshes; a live holder that keeps a token we need past the timeout is an error
    // (the job-ending fault path takes it from there).
    bool changed = false;
    for (FluidClaim& c : s.claims) {
      if (!c.used || &c == mine) continue;
      if (gone(s_, c.pid) || (!c.granted && t - c.heartbeat > options_.claim_stale_s)) c.used = 0;
    }
    for (FluidFlow& f : s.flows) {
      if (f.used && gone(s_, f.pid)) {
        f.used = 0;
        changed = true;
      }
    }
    if (changed) {
      model.free_tokens();
      model.recompute_rates();
    }
    if (!mine->granted && model.grant_waiting(t)) {
      model.recompute_rates();
      changed = true;
    }
    if (changed) wake_all(s_);
    if (mine->granted) {
      mine->used = 0;
      return mine->flow;
    }
    const int d = mine->dir;
    bool took_back = false;
    for (int i = 0; i < mine->n_links && !took_back; ++i) {
      const int l = mine->links[i];
      const LinkToken& k = s.tokens[l][d];
      if (k.flow != 0 && model.token_stalled(k) && t - k.since > options_.token_timeout_s) {
        if (another_job(s_, user_, k.pid)) {
          // Another job's stuck chunk is that job's failure, not this one's: its token is taken
          // back (its own ranks time it out), and this claim may go on.
          model.end_flow(k.flow);
          wake_all(s_);
          took_back = true;
          continue;
        }
        const LinkToken held = k;
        mine->used = 0;
        throw LinkArbiterError(
            fmt::format("link ledger: rank {} has held the {} token of {} for {:.0f} s", held.rank,
                        dir_name(d), s.links[l].name, t - held.since),
            "a rank is stuck in a copy; the job ends so that no rank waits forever");
      }
    }
    if (took_back) continue;
    wait_until(s_, t + options_.slice_s);
  }
}

uint64_t LinkLedger::acquire(int rank, TransferDirection direction,
                             const std::vector<int>& arbitrated, const std::vector<int>& path,
                             uint64_t bytes, double latest_start, bool held, CopyKind kind) {
  return await_grant(claim(rank, direction, arbitrated, path, bytes, latest_start, held, kind));
}

void LinkLedger::withdraw(uint64_t claim) {
  Locked guard(s_);
  guard.model().advance(now());
  FluidClaim* c = guard.model().find_claim(claim);
  if (c == nullptr) return;
  c->used = 0;
  if (c->granted) guard.model().end_flow(c->flow);
  wake_all(s_);
}

void LinkLedger::abandon(uint64_t flow) {
  Locked guard(s_);
  guard.model().advance(now());
  guard.model().end_flow(flow);
  wake_all(s_);
}

LedgerSnapshot LinkLedger::snapshot() {
  Locked guard(s_);
  const double t = now();
  guard.model().advance(t);
  reap_dead(s_, guard.model(), t);
  const FluidState& st = guard.state();
  LedgerSnapshot out;
  out.key = s_->key;
  const auto user_of = [&](int32_t pid) -> const link_ledger_impl::UserSlot* {
    for (const link_ledger_impl::UserSlot& u : s_->users)
      if (u.used && u.pid == pid) return &u;
    return nullptr;
  };
  for (const link_ledger_impl::UserSlot& u : s_->users)
    if (u.used) out.users.push_back({u.pid, u.rank, u.job, u.run_dir});
  const std::vector<LinkUsage> usage = guard.model().usage();
  for (int l = 0; l < st.n_links; ++l) {
    LedgerLink link;
    link.usage = usage[static_cast<size_t>(l)];
    const auto add = [&](int32_t pid, int32_t rank, const char* kind, int32_t label, int32_t dir,
                         bool token, double bytes) {
      LinkUserEntry e;
      e.pid = pid;
      e.rank = rank;
      if (const link_ledger_impl::UserSlot* u = user_of(pid)) {
        e.job = u->job;
        e.run_dir = u->run_dir;
      }
      e.kind = kind;
      e.label = copy_label(static_cast<CopyKind>(label), dir);
      e.dir = dir;
      e.token = token;
      e.bytes = bytes;
      link.users.push_back(std::move(e));
    };
    for (const FluidFlow& f : st.flows) {
      if (!f.used || (f.done && !f.held)) continue;
      if (std::find(f.links, f.links + f.n_links, l) == f.links + f.n_links) continue;
      add(f.pid, f.rank, "flow", f.kind, f.dir, st.tokens[l][f.dir].flow == f.id, f.remaining);
    }
    for (const FluidClaim& c : st.claims) {
      if (!c.used || c.granted) continue;
      if (std::find(c.path, c.path + c.n_path, l) == c.path + c.n_path) continue;
      add(c.pid, c.rank, "claim", c.kind, c.dir, false, static_cast<double>(c.bytes));
    }
    out.links.push_back(std::move(link));
  }
  return out;
}

std::vector<LinkUsage> LinkLedger::usage() const {
  Locked guard(s_);
  guard.model().advance(now());
  return guard.model().usage();
}

namespace link_ledger_impl {

int join(Shared* s, const std::string& name, const std::vector<NamedLink>& links,
         const LedgerUser& user) {
  Locked guard(s);
  FluidState& st = guard.state();
  // The block's links are the ones its name promises: refuse a job whose are not (a hash
  // collision, or a ledger name forced by $FERRY_LINK_LEDGER), before anything changes.
  const auto differs = [&]() -> std::string {
    if (s->key != LinkLedger::topology_key(links)) return "its topology key";
    if (st.n_links != static_cast<int32_t>(links.size()))
      return fmt::format("{} links against this job's {}", st.n_links, links.size());
    for (size_t l = 0; l < links.size(); ++l) {
      const FluidLink& b = st.links[l];
      if (links[l].name != b.name || links[l].capacity.to_host_gbps != b.capacity.to_host_gbps ||
          links[l].capacity.to_device_gbps != b.capacity.to_device_gbps) {
        return fmt::format(
            "link {} is '{}' ({:.6g}/{:.6g} GB/s) against this job's '{}' "
            "({:.6g}/{:.6g} GB/s)",
            l, b.name, b.capacity.to_host_gbps, b.capacity.to_device_gbps, links[l].name,
            links[l].capacity.to_host_gbps, links[l].capacity.to_device_gbps);
      }
    }
    return "";
  }();
  if (!differs.empty()) {
    throw ConfigError(
        fmt::format("topology.file: the node's link ledger {} describes another server ({}); "
                    "jobs that share links must name the same topology and emulation scale",
                    name, differs),
        "unset FERRY_LINK_LEDGER, or give jobs of different topologies different ledgers");
  }
  const double t = LinkLedger::now();
  guard.model().advance(t);
  reap_dead(s, guard.model(), t);
  const bool alone = std::none_of(std::begin(s->users), std::end(s->users),
                                  [](const UserSlot& u) { return u.used != 0; });
  if (alone) {
    // No live job uses it: start afresh, as a job's own new ledger would (usage from now on).
    const double bin_s = st.bin_s;
    std::memset(static_cast<void*>(&st), 0, sizeof(FluidState));
    FluidModel::init(st, links, bin_s, t);
  }
  const shm_names::ProcessId me = shm_names::self();
  for (int i = 0; i < LinkLedger::kMaxUsers; ++i) {
    UserSlot& u = s->users[i];
    if (u.used) continue;
    u = UserSlot{};
    u.used = 1;
    u.pid = me.pid;
    u.start = me.start;
    u.rank = user.rank;
    u.since = t;
    std::snprintf(u.job, sizeof(u.job), "%s", user.job.c_str());
    std::snprintf(u.run_dir, sizeof(u.run_dir), "%s", user.run_dir.c_str());
    return i;
  }
  throw LinkArbiterError(fmt::format("link ledger {}: more than {} processes attached on this node",
                                     name, LinkLedger::kMaxUsers));
}

void leave(Shared* s, int slot) {
  Locked guard(s);
  UserSlot& u = s->users[slot];
  if (u.used && u.pid == static_cast<int32_t>(getpid())) u.used = 0;
}

}  // namespace link_ledger_impl
}  // namespace ferry
