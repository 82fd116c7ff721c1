// The ledger's operations on its shared block (layout in link_ledger_impl.h; creation, names and
// attachment in link_ledger_block.cc): the fluid model (links/fluid_model.h, Note [Fluid copies])
// driven on the node's clock under the block's mutex, with the waiting, the liveness of other
// processes and the timeouts that the model leaves to its owner.
#include "links/link_ledger.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "links/fluid_model.h"
#include "links/link_ledger_impl.h"

namespace ferry {

namespace {

int dir_index(TransferDirection d) { return d == TransferDirection::kToDevice ? 1 : 0; }
const char* dir_name(int d) { return d == 1 ? "to device" : "to host"; }

using Shared = LinkLedger::Shared;

void lock(Shared* s) {
  int rc = pthread_mutex_lock(&s->mu);
  if (rc == EOWNERDEAD) pthread_mutex_consistent(&s->mu);  // its holder died: the job is ending
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

void wait_until(Shared* s, double t) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(std::floor(t));
  ts.tv_nsec = static_cast<long>((t - std::floor(t)) * 1e9);
  int rc = pthread_cond_timedwait(&s->cv, &s->mu, &ts);
  if (rc == EOWNERDEAD) pthread_mutex_consistent(&s->mu);
}

bool alive(int32_t pid) { return pid <= 0 || kill(pid, 0) == 0 || errno == EPERM; }

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

double LinkLedger::now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int LinkLedger::link_count() const { return s_->fluid.n_links; }

uint64_t LinkLedger::begin_flow(int rank, TransferDirection direction,
                                const std::vector<int>& links, uint64_t bytes) {
  if (links.size() > static_cast<size_t>(kMaxPath)) {
    throw ConfigError(
        fmt::format("a path of {} links; the ledger takes at most {}", links.size(), kMaxPath));
  }
  Locked guard(s_);
  check_links(guard.state(), links);
  guard.model().advance(now());
  const std::vector<int32_t> path(links.begin(), links.end());
  const FluidFlow& f =
      guard.model().begin_flow(rank, self_pid(), dir_index(direction), path, bytes);
  pthread_cond_broadcast(&s_->cv);
  return f.id;
}

void LinkLedger::wait_flow(uint64_t flow) {
  Locked guard(s_);
  FluidModel& model = guard.model();
  const double started = now();
  for (;;) {
    const double t = now();
    model.advance(t);
    FluidFlow* f = model.find_flow(flow);
    if (f == nullptr) return;
    refresh_claims(guard.state(), self_pid(), t);
    if (f->done) {
      f->used = 0;
      pthread_cond_broadcast(&s_->cv);
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
                           uint64_t bytes, double latest_start, bool held) {
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
  const FluidClaim& c = guard.model().add_claim(t, rank, self_pid(), dir_index(direction), tokens,
                                                links, bytes, latest_start, held, &granted);
  if (granted) pthread_cond_broadcast(&s_->cv);
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
      if (!alive(c.pid) || (!c.granted && t - c.heartbeat > options_.claim_stale_s)) c.used = 0;
    }
    for (FluidFlow& f : s.flows) {
      if (f.used && !alive(f.pid)) {
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
    if (changed) pthread_cond_broadcast(&s_->cv);
    if (mine->granted) {
      mine->used = 0;
      return mine->flow;
    }
    const int d = mine->dir;
    for (int i = 0; i < mine->n_links; ++i) {
      const int l = mine->links[i];
      const LinkToken& k = s.tokens[l][d];
      if (k.flow != 0 && model.token_stalled(k) && t - k.since > options_.token_timeout_s) {
        const LinkToken held = k;
        mine->used = 0;
        throw LinkArbiterError(
            fmt::format("link ledger: rank {} has held the {} token of {} for {:.0f} s", held.rank,
                        dir_name(d), s.links[l].name, t - held.since),
            "a rank is stuck in a copy; the job ends so that no rank waits forever");
      }
    }
    wait_until(s_, t + options_.slice_s);
  }
}

uint64_t LinkLedger::acquire(int rank, TransferDirection direction,
                             const std::vector<int>& arbitrated, const std::vector<int>& path,
                             uint64_t bytes, double latest_start, bool held) {
  return await_grant(claim(rank, direction, arbitrated, path, bytes, latest_start, held));
}

void LinkLedger::withdraw(uint64_t claim) {
  Locked guard(s_);
  guard.model().advance(now());
  FluidClaim* c = guard.model().find_claim(claim);
  if (c == nullptr) return;
  c->used = 0;
  if (c->granted) guard.model().end_flow(c->flow);
  pthread_cond_broadcast(&s_->cv);
}

void LinkLedger::abandon(uint64_t flow) {
  Locked guard(s_);
  guard.model().advance(now());
  guard.model().end_flow(flow);
  pthread_cond_broadcast(&s_->cv);
}

std::vector<LinkUsage> LinkLedger::usage() const {
  Locked guard(s_);
  guard.model().advance(now());
  return guard.model().usage();
}

}  // namespace ferry
