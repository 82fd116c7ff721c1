// The fluid model's operations (Note [Fluid copies]), on a state someone else owns and locks.
#include "links/fluid_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "links/arbiter_policy.h"

namespace ferry {

// Note [Fluid copies]
// Every copy in flight is a flow with bytes remaining and a rate (bytes/s), its max-min fair
// share of the links it crosses (fair_rates). The model keeps the time it was last
// advanced; whoever holds it advances every flow to now, event by event: up to the earliest
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
TransferDirection direction_of(int32_t dir) {
  return dir ? TransferDirection::kToDevice : TransferDirection::kToHost;
}
}  // namespace

void FluidModel::init(FluidState& s, const std::vector<NamedLink>& links, double bin_s, double t) {
  s.n_links = static_cast<int32_t>(links.size());
  s.bin_s = bin_s;
  s.t_last = t;
  s.next_id = 1;
  for (size_t l = 0; l < links.size(); ++l) {
    std::snprintf(s.links[l].name, sizeof(s.links[l].name), "%s", links[l].name.c_str());
    s.links[l].capacity = links[l].capacity;
    for (auto& b : s.bins[l]) std::fill(b.id, b.id + kFluidBins, int64_t{-1});
  }
}

namespace {

template <size_t N>
bool terminated(const char (&text)[N]) {
  return std::memchr(text, '\0', N) != nullptr;
}

bool finite_at_least_zero(double x) { return std::isfinite(x) && x >= 0; }

// Whether `n` indices at `links` are a path of at most kFluidMaxPath links of `n_links`.
bool path_in_range(int32_t n, const int32_t* links, int32_t n_links) {
  if (n < 0 || n > kFluidMaxPath) return false;
  return std::all_of(links, links + n, [&](int32_t l) { return l >= 0 && l < n_links; });
}

}  // namespace

std::string FluidModel::check(const FluidState& s) {
  if (s.n_links < 0 || s.n_links > kFluidMaxLinks) return fmt::format("{} links", s.n_links);
  if (!(s.bin_s >= 1e-6 && s.bin_s <= 60)) return fmt::format("a bin of {} s", s.bin_s);
  for (int l = 0; l < s.n_links; ++l) {
    const FluidLink& link = s.links[l];
    const LinkCapacity& c = link.capacity;
    if (!terminated(link.name) || !finite_at_least_zero(c.to_host_gbps) ||
        !finite_at_least_zero(c.to_device_gbps) || !(c.duplex_factor > 0 && c.duplex_factor <= 1))
      return fmt::format("link {} is out of range", l);
    for (int e = 0; e < 2; ++e) {
      const ByteBins& b = s.bins[l][e];
      if (!std::isfinite(s.tokens[l][e].since) || !finite_at_least_zero(b.total) ||
          !finite_at_least_zero(b.peak) ||
          !std::all_of(b.bytes, b.bytes + kFluidBins, finite_at_least_zero))
        return fmt::format("link {}'s record is out of range", l);
    }
  }
  for (int k = 0; k < kFluidMaxFlows; ++k) {
    const FluidFlow& f = s.flows[k];
    if ((f.used & ~1) != 0) return fmt::format("flow entry {} has a used flag of {}", k, f.used);
    if (f.used && (((f.done | f.held | f.dir) & ~1) != 0 || f.kind < 0 || f.kind >= kFluidKinds ||
                   !path_in_range(f.n_links, f.links, s.n_links) ||
                   !finite_at_least_zero(f.remaining) || !finite_at_least_zero(f.rate)))
      return fmt::format("flow entry {} is out of range", k);
  }
  for (int k = 0; k < kFluidMaxClaims; ++k) {
    const FluidClaim& c = s.claims[k];
    if ((c.used & ~1) != 0) return fmt::format("claim entry {} has a used flag of {}", k, c.used);
    if (c.used && (((c.granted | c.held | c.dir) & ~1) != 0 || c.kind < 0 ||
                   c.kind >= kFluidKinds || !path_in_range(c.n_links, c.links, s.n_links) ||
                   !path_in_range(c.n_path, c.path, s.n_links) || std::isnan(c.latest_start) ||
                   !std::isfinite(c.heartbeat)))
      return fmt::format("claim entry {} is out of range", k);
  }
  return "";
}

void FluidModel::add_bytes(int link, int dir, double t0, double t1, double bytes) {
  ByteBins& b = s_.bins[link][dir];
  b.total += bytes;
  if (bytes <= 0) return;
  const double w = s_.bin_s;
  if (t1 <= t0) t1 = t0;
  int64_t k0 = static_cast<int64_t>(std::floor(t0 / w));
  int64_t k1 = static_cast<int64_t>(std::floor(t1 / w));
  for (int64_t k = k0; k <= k1; ++k) {
    const double a = std::max(t0, static_cast<double>(k) * w);
    const double e = std::min(t1, static_cast<double>(k + 1) * w);
    const double share = t1 > t0 ? bytes * std::max(0.0, e - a) / (t1 - t0) : bytes;
    if (share <= 0) continue;
    const int slot = static_cast<int>(((k % kFluidBins) + kFluidBins) % kFluidBins);
    if (b.id[slot] != k) {
      if (b.id[slot] >= 0) b.peak = std::max(b.peak, b.bytes[slot]);
      b.id[slot] = k;
      b.bytes[slot] = 0;
    }
    b.bytes[slot] += share;
  }
}

void FluidModel::recompute_rates() {
  std::vector<LinkCapacity> c(static_cast<size_t>(s_.n_links));
  for (int l = 0; l < s_.n_links; ++l) c[static_cast<size_t>(l)] = s_.links[l].capacity;
  std::vector<Flow> flows;
  std::vector<FluidFlow*> slots;
  for (FluidFlow& f : s_.flows) {
    if (!f.used || f.done) continue;
    Flow flow;
    flow.direction = direction_of(f.dir);
    flow.links.assign(f.links, f.links + f.n_links);
    flows.push_back(std::move(flow));
    slots.push_back(&f);
  }
  const std::vector<double> gbps = fair_rates(c, flows);
  for (size_t i = 0; i < slots.size(); ++i) slots[i]->rate = gbps[i] * 1e9;
}

FluidFlow& FluidModel::start_flow(int rank, int32_t pid, int dir, const int32_t* links, int n,
                                  uint64_t bytes) {
  for (FluidFlow& f : s_.flows) {
    if (f.used) continue;
    f = FluidFlow{};
    f.used = 1;
    f.rank = rank;
    f.pid = pid;
    f.dir = dir;
    f.n_links = n;
    std::copy(links, links + n, f.links);
    f.remaining = static_cast<double>(bytes);
    f.id = s_.next_id++;
    if (bytes == 0) f.done = 1;
    return f;
  }
  throw LinkArbiterError(
      fmt::format("link ledger: more than {} copies in flight on this node", kFluidMaxFlows));
}

FluidFlow& FluidModel::begin_flow(int rank, int32_t pid, int dir, std::span<const int32_t> links,
                                  uint64_t bytes, int32_t kind) {
  FluidFlow& f = start_flow(rank, pid, dir, links.data(), static_cast<int>(links.size()), bytes);
  f.kind = kind;
  recompute_rates();
  return f;
}

FluidFlow* FluidModel::find_flow(uint64_t id) {
  for (FluidFlow& f : s_.flows)
    if (f.used && f.id == id) return &f;
  return nullptr;
}

double FluidModel::finish_time(const FluidFlow& f) const {
  return f.rate > 0 ? s_.t_last + f.remaining / f.rate : kInf;
}

void FluidModel::free_tokens() {
  for (int l = 0; l < s_.n_links; ++l) {
    for (LinkToken& k : s_.tokens[l]) {
      if (k.flow == 0) continue;
      bool live = false;
      for (const FluidFlow& f : s_.flows)
        if (f.used && (!f.done || f.held) && f.id == k.flow) live = true;
      if (!live) k = LinkToken{};
    }
  }
}

bool FluidModel::grant_waiting(double t) {
  std::vector<LinkDirection> busy;
  for (int l = 0; l < s_.n_links; ++l)
    for (int e = 0; e < 2; ++e)
      if (s_.tokens[l][e].flow != 0) busy.push_back(LinkDirection{l, direction_of(e)});
  std::vector<ChunkClaim> waiting;
  std::vector<FluidClaim*> slots;
  for (FluidClaim& c : s_.claims) {
    if (!c.used || c.granted) continue;
    ChunkClaim w;
    w.rank = c.rank;
    w.direction = direction_of(c.dir);
    w.links.assign(c.links, c.links + c.n_links);
    w.slack_s = c.latest_start - t;
    w.seq = c.id;
    waiting.push_back(std::move(w));
    slots.push_back(&c);
  }
  bool any = false;
  for (size_t i : grant(waiting, busy)) {
    FluidClaim& c = *slots[i];
    FluidFlow& f = start_flow(c.rank, c.pid, c.dir, c.path, c.n_path, c.bytes);
    f.held = c.held;
    f.kind = c.kind;
    c.granted = 1;
    c.flow = f.id;
    for (int j = 0; j < c.n_links; ++j)
      s_.tokens[c.links[j]][c.dir] = LinkToken{f.id, c.rank, c.pid, t};
    any = true;
  }
  return any;
}

void FluidModel::advance(double now) {
  while (s_.t_last < now) {
    double dt_fin = kInf;
    bool any = false;
    for (const FluidFlow& f : s_.flows) {
      if (!f.used || f.done) continue;
      any = true;
      if (f.rate > 0) dt_fin = std::min(dt_fin, f.remaining / f.rate);
    }
    if (!any) {
      s_.t_last = now;
      return;
    }
    const double t0 = s_.t_last;
    const bool finishes = dt_fin <= now - t0;
    const double dt = finishes ? dt_fin : now - t0;
    for (FluidFlow& f : s_.flows) {
      if (!f.used || f.done) continue;
      const double carried = std::min(f.remaining, f.rate * dt);
      f.remaining -= carried;
      for (int i = 0; i < f.n_links; ++i) add_bytes(f.links[i], f.dir, t0, t0 + dt, carried);
    }
    s_.t_last = t0 + dt;
    if (!finishes) return;
    for (FluidFlow& f : s_.flows) {
      if (f.used && !f.done && f.remaining <= 0.5) {
        f.remaining = 0;
        f.done = 1;
      }
    }
    free_tokens();
    grant_waiting(s_.t_last);
    recompute_rates();
  }
}

void FluidModel::end_flow(uint64_t flow) {
  for (FluidFlow& f : s_.flows)
    if (f.used && f.id == flow) f.used = 0;
  free_tokens();
  grant_waiting(s_.t_last);
  recompute_rates();
}

FluidClaim& FluidModel::add_claim(double t, int rank, int32_t pid, int dir,
                                  std::span<const int32_t> arbitrated,
                                  std::span<const int32_t> path, uint64_t bytes,
                                  double latest_start, bool held, bool* granted_any, int32_t kind) {
  for (FluidClaim& c : s_.claims) {
    if (c.used) continue;
    c = FluidClaim{};
    c.used = 1;
    c.rank = rank;
    c.pid = pid;
    c.dir = dir;
    c.n_links = static_cast<int32_t>(arbitrated.size());
    std::copy(arbitrated.begin(), arbitrated.end(), c.links);
    c.n_path = static_cast<int32_t>(path.size());
    std::copy(path.begin(), path.end(), c.path);
    c.held = held ? 1 : 0;
    c.kind = kind;
    c.bytes = bytes;
    c.id = s_.next_id++;
    c.latest_start = latest_start;
    c.heartbeat = t;
    // A claim whose link-directions are free is granted now, before anyone waits on it.
    *granted_any = grant_waiting(t);
    if (*granted_any) recompute_rates();
    return c;
  }
  throw LinkArbiterError(
      fmt::format("link ledger: more than {} chunk claims waiting on this node", kFluidMaxClaims));
}

FluidClaim* FluidModel::find_claim(uint64_t id) {
  for (FluidClaim& c : s_.claims)
    if (c.used && c.id == id) return &c;
  return nullptr;
}

bool FluidModel::token_stalled(const LinkToken& k) const {
  // A granted chunk's flow progresses on the model's clock whatever its rank's threads do; only
  // one that carries nothing (a link of zero speed) can hold a token forever, or a held chunk
  // whose hardware never reports it done.
  return std::any_of(std::begin(s_.flows), std::end(s_.flows), [&](const FluidFlow& f) {
    return f.used && f.id == k.flow && ((!f.done && f.rate <= 0) || f.held);
  });
}

std::vector<LinkUsage> FluidModel::usage() const {
  std::vector<LinkUsage> out;
  for (int l = 0; l < s_.n_links; ++l) {
    LinkUsage u;
    u.name = s_.links[l].name;
    u.capacity = s_.links[l].capacity;
    u.bin_s = s_.bin_s;
    for (int e = 0; e < 2; ++e) {
      const ByteBins& b = s_.bins[l][e];
      double peak = b.peak;
      for (int k = 0; k < kFluidBins; ++k)
        if (b.id[k] >= 0) peak = std::max(peak, b.bytes[k]);
      u.bytes[e] = b.total;
      u.peak_gbps[e] = peak / s_.bin_s / 1e9;
    }
    out.push_back(std::move(u));
  }
  return out;
}

}  // namespace ferry
