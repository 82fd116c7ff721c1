// The ledger's operations on its shared block (layout in link_ledger_impl.h; creation, names and
// attachment in link_ledger_block.cc). See Note [Fluid copies] for how copies progress.
#include "links/link_ledger.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "links/arbiter_policy.h"
#include "links/link_ledger_impl.h"

namespace ferry {

// Note [Fluid copies]
// Every copy in flight is a flow with bytes remaining and a rate (bytes/s), its max-min fair
// share of the links it crosses (fair_share_rates). The ledger keeps the time it was last
// advanced; whoever locks it advances every flow to now, event by event: up to the earliest
// finish, where the finished flows drop out and the rates are recomputed, then on to now.
// Bytes carried are added to each crossed link-direction's time bins as they are carried, so the
// record is exact and no bin sees more than the capacity (up to rounding). A copy's thread sleeps
// until its predicted finish or one slice, whichever is first, and looks again; it leaves when the
// ledger says its bytes are through.

// Note [Held chunks]
// On a real GPU the bytes move on the hardware, not in the model: a chunk acquired `held` keeps
// its tokens after its fluid flow is through (the flow stops taking a share then) until its mover
// calls finish() on the GPU's word that the copy is done, so two chunks never overlap on an
// arbitrated link-direction whatever the real rate. A held token counts as stalled for the token
// timeout: a GPU chunk that holds a link that long is an error.

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

int dir_index(TransferDirection d) { return d == TransferDirection::kToDevice ? 1 : 0; }
const char* dir_name(int d) { return d == 1 ? "to device" : "to host"; }

using namespace link_ledger_impl;
using Shared = LinkLedger::Shared;

void lock(Shared* s) {
  int rc = pthread_mutex_lock(&s->mu);
  if (rc == EOWNERDEAD) pthread_mutex_consistent(&s->mu);  // its holder died: the job is ending
}

class Locked {
 public:
  explicit Locked(Shared* s) : s_(s) { lock(s_); }
  ~Locked() { pthread_mutex_unlock(&s_->mu); }

 private:
  Shared* s_;
};

void wait_until(Shared* s, double t) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(std::floor(t));
  ts.tv_nsec = static_cast<long>((t - std::floor(t)) * 1e9);
  int rc = pthread_cond_timedwait(&s->cv, &s->mu, &ts);
  if (rc == EOWNERDEAD) pthread_mutex_consistent(&s->mu);
}

bool alive(int32_t pid) { return pid <= 0 || kill(pid, 0) == 0 || errno == EPERM; }

void add_bytes(Shared* s, int link, int dir, double t0, double t1, double bytes) {
  Bins& b = s->bins[link][dir];
  b.total += bytes;
  if (bytes <= 0) return;
  const double w = s->bin_s;
  if (t1 <= t0) t1 = t0;
  int64_t k0 = static_cast<int64_t>(std::floor(t0 / w));
  int64_t k1 = static_cast<int64_t>(std::floor(t1 / w));
  for (int64_t k = k0; k <= k1; ++k) {
    const double a = std::max(t0, static_cast<double>(k) * w);
    const double e = std::min(t1, static_cast<double>(k + 1) * w);
    const double share = t1 > t0 ? bytes * std::max(0.0, e - a) / (t1 - t0) : bytes;
    if (share <= 0) continue;
    const int slot = static_cast<int>(((k % kBins) + kBins) % kBins);
    if (b.id[slot] != k) {
      if (b.id[slot] >= 0) b.peak = std::max(b.peak, b.bytes[slot]);
      b.id[slot] = k;
      b.bytes[slot] = 0;
    }
    b.bytes[slot] += share;
  }
}

void recompute_rates(Shared* s) {
  std::vector<LinkCapacity> c(static_cast<size_t>(s->n_links));
  for (int l = 0; l < s->n_links; ++l) c[static_cast<size_t>(l)] = s->links[l].capacity;
  std::vector<Flow> flows;
  std::vector<FlowSlot*> slots;
  for (FlowSlot& f : s->flows) {
    if (!f.used || f.done) continue;
    Flow flow;
    flow.direction = f.dir ? TransferDirection::kToDevice : TransferDirection::kToHost;
    flow.links.assign(f.links, f.links + f.n_links);
    flows.push_back(std::move(flow));
    slots.push_back(&f);
  }
  const std::vector<double> gbps = fair_share_rates(c, flows);
  for (size_t i = 0; i < slots.size(); ++i) slots[i]->rate = gbps[i] * 1e9;
}

// A new flow in a free slot (throws when every slot is taken). Rates are not recomputed.
FlowSlot& start_flow(Shared* s, int rank, int32_t pid, int dir, const int32_t* links, int n,
                     uint64_t bytes) {
  for (FlowSlot& f : s->flows) {
    if (f.used) continue;
    f = FlowSlot{};
    f.used = 1;
    f.rank = rank;
    f.pid = pid;
    f.dir = dir;
    f.n_links = n;
    std::copy(links, links + n, f.links);
    f.remaining = static_cast<double>(bytes);
    f.id = s->next_id++;
    if (bytes == 0) f.done = 1;
    return f;
  }
  throw LinkArbiterError(fmt::format("link ledger: more than {} copies in flight on this node",
                                     LinkLedger::kMaxFlows));
}

// Frees the tokens of flows that are through.
void free_tokens(Shared* s) {
  for (int l = 0; l < s->n_links; ++l) {
    for (Token& k : s->tokens[l]) {
      if (k.flow == 0) continue;
      bool live = false;
      for (const FlowSlot& f : s->flows)
        if (f.used && (!f.done || f.held) && f.id == k.flow) live = true;
      if (!live) k = Token{};
    }
  }
}

// Grants waiting claims at time `t` (arbiter_policy::grant) and starts their flows then.
bool grant_waiting(Shared* s, double t) {
  std::vector<LinkDirection> busy;
  for (int l = 0; l < s->n_links; ++l)
    for (int e = 0; e < 2; ++e)
      if (s->tokens[l][e].flow != 0)
        busy.push_back(
            LinkDirection{l, e == 1 ? TransferDirection::kToDevice : TransferDirection::kToHost});
  std::vector<ChunkClaim> waiting;
  std::vector<ClaimSlot*> slots;
  for (ClaimSlot& c : s->claims) {
    if (!c.used || c.granted) continue;
    ChunkClaim w;
    w.rank = c.rank;
    w.direction = c.dir ? TransferDirection::kToDevice : TransferDirection::kToHost;
    w.links.assign(c.links, c.links + c.n_links);
    w.slack_s = c.latest_start - t;
    w.seq = c.id;
    waiting.push_back(std::move(w));
    slots.push_back(&c);
  }
  bool any = false;
  for (size_t i : grant(waiting, busy)) {
    ClaimSlot& c = *slots[i];
    FlowSlot& f = start_flow(s, c.rank, c.pid, c.dir, c.path, c.n_path, c.bytes);
    f.held = c.held;
    c.granted = 1;
    c.flow = f.id;
    for (int j = 0; j < c.n_links; ++j)
      s->tokens[c.links[j]][c.dir] = Token{f.id, c.rank, c.pid, t};
    any = true;
  }
  return any;
}

// Advances every flow to `now` (Note [Fluid copies]); at each finish, frees the finished
// chunks' tokens and grants the waiting claims then.
void advance(Shared* s, double now) {
  while (s->t_last < now) {
    double dt_fin = kInf;
    bool any = false;
    for (const FlowSlot& f : s->flows) {
      if (!f.used || f.done) continue;
      any = true;
      if (f.rate > 0) dt_fin = std::min(dt_fin, f.remaining / f.rate);
    }
    if (!any) {
      s->t_last = now;
      return;
    }
    const double t0 = s->t_last;
    const bool finishes = dt_fin <= now - t0;
    const double dt = finishes ? dt_fin : now - t0;
    for (FlowSlot& f : s->flows) {
      if (!f.used || f.done) continue;
      const double carried = std::min(f.remaining, f.rate * dt);
      f.remaining -= carried;
      for (int i = 0; i < f.n_links; ++i) add_bytes(s, f.links[i], f.dir, t0, t0 + dt, carried);
    }
    s->t_last = t0 + dt;
    if (!finishes) return;
    for (FlowSlot& f : s->flows) {
      if (f.used && !f.done && f.remaining <= 0.5) {
        f.remaining = 0;
        f.done = 1;
      }
    }
    free_tokens(s);
    grant_waiting(s, s->t_last);
    recompute_rates(s);
  }
}

// Ends a flow now, carried or not, and hands its tokens on.
void end_flow(Shared* s, uint64_t flow) {
  for (FlowSlot& f : s->flows)
    if (f.used && f.id == flow) f.used = 0;
  free_tokens(s);
  grant_waiting(s, s->t_last);
  recompute_rates(s);
}

ClaimSlot* find_claim(Shared* s, uint64_t id) {
  for (ClaimSlot& c : s->claims)
    if (c.used && c.id == id) return &c;
  return nullptr;
}

// A copy's thread refreshes its process's other waiting claims while it waits for a flow: a
// claim queued ahead for the next chunk is not stale while the chunk before it moves.
void refresh_claims(Shared* s, int32_t pid, double t) {
  for (ClaimSlot& c : s->claims)
    if (c.used && !c.granted && c.pid == pid) c.heartbeat = t;
}

}  // namespace

double LinkLedger::now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int LinkLedger::link_count() const { return s_->n_links; }

uint64_t LinkLedger::begin_flow(int rank, TransferDirection direction,
                                const std::vector<int>& links, uint64_t bytes) {
  if (links.size() > static_cast<size_t>(kMaxPath)) {
    throw ConfigError(
        fmt::format("a path of {} links; the ledger takes at most {}", links.size(), kMaxPath));
  }
  Locked guard(s_);
  for (int l : links) {
    if (l < 0 || l >= s_->n_links)
      throw ConfigError(fmt::format("link {} is not in the ledger", l));
  }
  advance(s_, now());
  std::vector<int32_t> path(links.begin(), links.end());
  FlowSlot& f = start_flow(s_, rank, static_cast<int32_t>(getpid()), dir_index(direction),
                           path.data(), static_cast<int>(path.size()), bytes);
  recompute_rates(s_);
  pthread_cond_broadcast(&s_->cv);
  return f.id;
}

void LinkLedger::wait_flow(uint64_t flow) {
  Locked guard(s_);
  const double started = now();
  for (;;) {
    const double t = now();
    advance(s_, t);
    FlowSlot* f = nullptr;
    for (FlowSlot& x : s_->flows)
      if (x.used && x.id == flow) f = &x;
    if (f == nullptr) return;
    refresh_claims(s_, static_cast<int32_t>(getpid()), t);
    if (f->done) {
      f->used = 0;
      pthread_cond_broadcast(&s_->cv);
      return;
    }
    if (f->rate <= 0 && t - started > options_.token_timeout_s) {
      f->used = 0;
      free_tokens(s_);
      recompute_rates(s_);
      throw LinkArbiterError(fmt::format(
          "link ledger: a copy of rank {} made no progress for {:.0f} s (a link of zero speed?)",
          f->rank, t - started));
    }
    const double finish = f->rate > 0 ? s_->t_last + f->remaining / f->rate : kInf;
    wait_until(s_, std::min(finish, t + options_.slice_s));
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
  for (const auto* v : {&arbitrated, &path})
    for (int l : *v)
      if (l < 0 || l >= s_->n_links)
        throw ConfigError(fmt::format("link {} is not in the ledger", l));
  const double t = now();
  advance(s_, t);
  for (ClaimSlot& c : s_->claims) {
    if (c.used) continue;
    c = ClaimSlot{};
    c.used = 1;
    c.rank = rank;
    c.pid = static_cast<int32_t>(getpid());
    c.dir = dir_index(direction);
    c.n_links = static_cast<int32_t>(arbitrated.size());
    std::copy(arbitrated.begin(), arbitrated.end(), c.links);
    c.n_path = static_cast<int32_t>(path.size());
    std::copy(path.begin(), path.end(), c.path);
    c.held = held ? 1 : 0;
    c.bytes = bytes;
    c.id = s_->next_id++;
    c.latest_start = latest_start;
    c.heartbeat = t;
    // A claim whose link-directions are free is granted now, before anyone waits on it.
    if (grant_waiting(s_, t)) {
      recompute_rates(s_);
      pthread_cond_broadcast(&s_->cv);
    }
    return c.id;
  }
  throw LinkArbiterError(
      fmt::format("link ledger: more than {} chunk claims waiting on this node", kMaxClaims));
}

uint64_t LinkLedger::await_grant(uint64_t claim) {
  Locked guard(s_);
  for (;;) {
    const double t = now();
    advance(s_, t);
    ClaimSlot* mine = find_claim(s_, claim);
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
    for (ClaimSlot& c : s_->claims) {
      if (!c.used || &c == mine) continue;
      if (!alive(c.pid) || (!c.granted && t - c.heartbeat > options_.claim_stale_s)) c.used = 0;
    }
    for (FlowSlot& f : s_->flows) {
      if (f.used && !alive(f.pid)) {
        f.used = 0;
        changed = true;
      }
    }
    if (changed) {
      free_tokens(s_);
      recompute_rates(s_);
    }
    if (!mine->granted && grant_waiting(s_, t)) {
      recompute_rates(s_);
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
      const Token& k = s_->tokens[l][d];
      // A granted chunk's flow progresses on the ledger's clock whatever its rank's threads do;
      // only one that carries nothing (a link of zero speed) can hold a token forever, or a held
      // chunk whose hardware never reports it done.
      const bool stalled =
          std::any_of(std::begin(s_->flows), std::end(s_->flows), [&](const FlowSlot& f) {
            return f.used && f.id == k.flow && ((!f.done && f.rate <= 0) || f.held);
          });
      if (k.flow != 0 && stalled && t - k.since > options_.token_timeout_s) {
        const Token held = k;
        mine->used = 0;
        throw LinkArbiterError(
            fmt::format("link ledger: rank {} has held the {} token of {} for {:.0f} s", held.rank,
                        dir_name(d), s_->links[l].name, t - held.since),
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
  advance(s_, now());
  ClaimSlot* c = find_claim(s_, claim);
  if (c == nullptr) return;
  c->used = 0;
  if (c->granted) end_flow(s_, c->flow);
  pthread_cond_broadcast(&s_->cv);
}

void LinkLedger::abandon(uint64_t flow) {
  Locked guard(s_);
  advance(s_, now());
  end_flow(s_, flow);
  pthread_cond_broadcast(&s_->cv);
}

std::vector<LinkUsage> LinkLedger::usage() const {
  Locked guard(s_);
  advance(s_, now());
  std::vector<LinkUsage> out;
  for (int l = 0; l < s_->n_links; ++l) {
    LinkUsage u;
    u.name = s_->links[l].name;
    u.capacity = s_->links[l].capacity;
    u.bin_s = s_->bin_s;
    for (int e = 0; e < 2; ++e) {
      const Bins& b = s_->bins[l][e];
      double peak = b.peak;
      for (int k = 0; k < kBins; ++k)
        if (b.id[k] >= 0) peak = std::max(peak, b.bytes[k]);
      u.bytes[e] = b.total;
      u.peak_gbps[e] = peak / s_->bin_s / 1e9;
    }
    out.push_back(std::move(u));
  }
  return out;
}

}  // namespace ferry
