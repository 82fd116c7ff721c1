// The node simulator's event loop. Between two events (a step ends, a copy or chunk lands, a hop
// of a bucket's all-reduce ends) every flow moves at its max-min fair rate; each event then
// starts what became possible at that instant (steps whose waits are met, the next copy on a
// stream, the chunks the arbiter grants, the next bucket), and the rates are shared again.
#include "sim/node_sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "links/arbiter_policy.h"
#include "links/link_capacities.h"

namespace ferry {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

int dir_index(TransferDirection d) { return d == TransferDirection::kToHost ? 0 : 1; }

struct RankState {
  int next_step = 0;
  bool running = false;
  double step_end = 0;
  double work_left = 0;  // shared compute: seconds of the running step at the device's full speed
  size_t next_mark = 0;
  double waiting_since = -1;
  std::vector<double> prefix;  // prefix sums of step times
  std::vector<std::vector<size_t>> issued_after, waited_before;
  std::vector<bool> issued, done;
  std::vector<bool> held;                         // waits for its bucket to end
  std::vector<std::vector<size_t>> after_bucket;  // per bucket: the transfers its end issues
  std::vector<size_t> buckets_before;             // per step: buckets done before it starts
  std::vector<double> remaining;                  // bytes of each transfer still to move
  std::vector<double> first_byte;                 // when each transfer started moving
  std::deque<size_t> queue[2];  // issued, not done, per direction; head is the active one
  bool chunk_active[2] = {false, false};
  bool finished = false;
  double finish_time = 0;
  double max_rate[2] = {kInf, kInf};  // bottleneck of its path per direction, alone
  // Per direction: the links of the path whose tokens a chunk takes under the topology
  // scheduler, those one chunk can fill (capacity at most the path's bottleneck), as the
  // emulation's arbiter does. A wider link (a root complex) is shared by the fluid rule alone.
  std::vector<int> arbitrated[2];
};

// A flow in flight: a copy (or one chunk of it) of one rank, or one hop of a bucket.
struct Active {
  bool hop = false;
  int rank = -1;  // copy: owner; hop: index in the ring
  int dir = 0;
  size_t transfer = 0;
  double remaining = 0;  // bytes of this flow (the chunk, the whole copy, or the hop)
  double rate = 0;
};

// A hop as one flow, up its sender's links and down its receiver's: each link's own side.
Flow hop_flow(const SimHop& h) {
  Flow f{h.up, TransferDirection::kToHost, {}};
  f.links.insert(f.links.end(), h.down.begin(), h.down.end());
  f.link_directions.assign(h.up.size(), TransferDirection::kToHost);
  f.link_directions.resize(f.links.size(), TransferDirection::kToDevice);
  f.links.insert(f.links.end(), h.then_up.begin(), h.then_up.end());
  f.link_directions.resize(f.links.size(), TransferDirection::kToHost);
  f.links.insert(f.links.end(), h.then_down.begin(), h.then_down.end());
  f.link_directions.resize(f.links.size(), TransferDirection::kToDevice);
  return f;
}

// One position of the ring under the topology scheduler: the hops from one rank to the next,
// one per channel, claimed together (Note [All-reduce chunks on arbitrated links] in
// node_sim.h). `left`: each hop's bytes of the running bucket not yet granted.
struct RingPosition {
  std::vector<size_t> hops;  // indices into the ring
  Flow arbitrated;           // the link-directions its chunks take tokens on, every hop's
  double max_rate = kInf;    // GB/s: the narrowest of those links alone
  double left = 0;
  int chunks_active = 0;  // hops of its granted chunk still moving
  bool claimed = false;
  uint64_t claim_seq = 0;
};

}  // namespace

NodeSimResult simulate_node(const NodeSimInput& in) {
  const size_t n_links = in.links.size();
  const size_t n_ranks = in.ranks.size();
  check_indices(in);
  const auto capacity = [&](int l, int dir) {
    const LinkCapacity& c = in.links[static_cast<size_t>(l)].capacity;
    return dir == 0 ? c.to_host_gbps : c.to_device_gbps;
  };
  const auto check_positive = [&](const std::vector<int>& path, int dir) {
    for (int l : path)
      if (!(capacity(l, dir) > 0))
        throw std::invalid_argument(fmt::format("link '{}' has no capacity {}",
                                                in.links[static_cast<size_t>(l)].name,
                                                dir == 0 ? "to host" : "to device"));
  };

  std::vector<LinkCapacity> caps(n_links);
  for (size_t l = 0; l < n_links; ++l) caps[l] = in.links[l].capacity;

  const size_t job_ranks = in.job_ranks > 0 ? static_cast<size_t>(in.job_ranks) : n_ranks;
  const bool reduce = job_ranks > 1 && !in.ring.empty();
  const size_t n_buckets = in.buckets.size();

  NodeSimResult res;
  res.ranks.resize(n_ranks);
  res.links.resize(n_links);
  std::vector<RankState> st(n_ranks);
  for (size_t r = 0; r < n_ranks; ++r) {
    const SimRank& rank = in.ranks[r];
    RankState& s = st[r];
    const size_t steps = rank.step_seconds.size();
    s.prefix.assign(steps + 1, 0.0);
    for (size_t i = 0; i < steps; ++i) s.prefix[i + 1] = s.prefix[i] + rank.step_seconds[i];
    s.issued_after.resize(steps + 1);
    s.waited_before.resize(steps + 1);
    const size_t nt = rank.transfers.size();
    s.issued.assign(nt, false);
    s.done.assign(nt, false);
    s.remaining.resize(nt);
    s.first_byte.assign(nt, -1);
    s.held.assign(nt, false);
    s.after_bucket.resize(n_buckets);
    for (size_t i = 0; i < nt; ++i) {
      const SimTransfer& t = rank.transfers[i];
      const int bucket = rank.transfer_after_bucket.empty() ? -1 : rank.transfer_after_bucket[i];
      if (reduce && bucket >= 0) {  // Note [Model state on the node]: its bucket issues it
        s.held[i] = true;
        s.after_bucket[static_cast<size_t>(bucket)].push_back(i);
      } else {
        const int after = std::clamp(t.issue_after, -1, static_cast<int>(steps) - 1);
        s.issued_after[static_cast<size_t>(after + 1)].push_back(i);
      }
      if (t.wait_before >= 0 && static_cast<size_t>(t.wait_before) < steps)
        s.waited_before[static_cast<size_t>(t.wait_before)].push_back(i);
      s.remaining[i] = static_cast<double>(t.bytes);
    }
    for (int d = 0; d < 2; ++d) {
      if (nt > 0 && !rank.path.empty()) check_positive(rank.path, d);
      for (int l : rank.path) s.max_rate[d] = std::min(s.max_rate[d], capacity(l, d));
      s.arbitrated[d] = arbitrated_links(
          caps, rank.path, d == 0 ? TransferDirection::kToHost : TransferDirection::kToDevice);
    }
    res.ranks[r].compute_seconds = s.prefix[steps];
  }
  if (reduce) {
    if (in.ring.size() % n_ranks != 0)
      throw std::invalid_argument(
          fmt::format("ring has {} hops for {} ranks", in.ring.size(), n_ranks));
    for (const SimHop& h : in.ring) {
      check_positive(h.up, 0);
      check_positive(h.down, 1);
      check_positive(h.then_up, 0);
      check_positive(h.then_down, 1);
    }
  }
  // A ring all-reduce of R ranks sends 2(R-1)/R of a bucket over every hop, split evenly over
  // the channels.
  const double ring_ranks = static_cast<double>(job_ranks);
  const double channels = reduce ? static_cast<double>(in.ring.size() / n_ranks) : 1.0;
  const double hop_share = reduce ? 2.0 * (ring_ranks - 1) / ring_ranks / channels : 0.0;
  // A reduce-scatter or an all-gather sends (R-1)/R (Note [Model state on the node]).
  const double half_share = reduce ? (ring_ranks - 1) / ring_ranks / channels : 0.0;
  const auto share = [&](const SimBucket& b) {
    return b.collective == SimCollective::kAllReduce ? hop_share : half_share;
  };
  std::vector<RingPosition> positions(reduce ? n_ranks : 0);
  for (size_t h = 0; reduce && h < in.ring.size(); ++h) {
    RingPosition& p = positions[h % n_ranks];
    p.hops.push_back(h);
    const Flow a = arbitrated_flow(caps, hop_flow(in.ring[h]));
    for (size_t i = 0; i < a.links.size(); ++i) {
      bool have = false;
      for (size_t k = 0; k < p.arbitrated.links.size(); ++k)
        have = have || (p.arbitrated.links[k] == a.links[i] &&
                        p.arbitrated.link_directions[k] == a.link_directions[i]);
      if (have) continue;
      p.arbitrated.links.push_back(a.links[i]);
      p.arbitrated.link_directions.push_back(a.link_directions[i]);
      p.max_rate = std::min(p.max_rate, capacity(a.links[i], dir_index(a.link_directions[i])));
    }
  }
  // Hop bytes of the buckets after each: the rest of the all-reduce behind bucket b.
  std::vector<double> hop_bytes_after(in.buckets.size() + 1, 0.0);
  for (size_t b = in.buckets.size(); b-- > 0;)
    hop_bytes_after[b] =
        hop_bytes_after[b + 1] + share(in.buckets[b]) * static_cast<double>(in.buckets[b].bytes);
  size_t next_bucket = 0;
  bool bucket_running = false;
  const auto buckets_done = [&] { return !reduce || next_bucket == in.buckets.size(); };

  std::vector<Active> active;
  double now = 0;
  uint64_t seq = 0;
  std::vector<uint64_t> claim_seq;  // per rank and direction: when its head first claimed
  claim_seq.assign(n_ranks * 2, 0);
  std::vector<bool> claimed(n_ranks * 2, false);

  const auto issue = [&](size_t r, size_t i) {
    RankState& s = st[r];
    if (s.issued[i]) return;
    s.issued[i] = true;
    const int d = in.ranks[r].transfers[i].to_host ? 0 : 1;
    if (s.remaining[i] <= 0) {
      s.done[i] = true;
      return;
    }
    s.queue[d].push_back(i);
  };
  for (size_t r = 0; r < n_ranks; ++r)
    for (size_t i : st[r].issued_after[0]) issue(r, i);

  const auto update_step = [&](size_t r) {
    const int steps = static_cast<int>(in.ranks[r].step_seconds.size());
    return in.update_step >= 0 && in.update_step < steps ? in.update_step : steps - 1;
  };
  const auto need_step = [&](size_t r, const SimBucket& b) {
    return b.needed_before >= 0 ? b.needed_before : update_step(r);
  };
  for (size_t r = 0; r < n_ranks; ++r) {
    st[r].buckets_before.assign(in.ranks[r].step_seconds.size(), 0);
    for (size_t b = 0; b < n_buckets; ++b) {
      const int w = need_step(r, in.buckets[b]);
      if (w >= 0 && static_cast<size_t>(w) < st[r].buckets_before.size())
        st[r].buckets_before[static_cast<size_t>(w)] = b + 1;
    }
  }
  // A bucket has ended on every rank: the copies waiting for it go (Note [Model state on the
  // node]).
  const auto end_bucket = [&] {
    for (size_t r = 0; r < n_ranks; ++r) {
      for (size_t i : st[r].after_bucket[next_bucket]) {
        st[r].held[i] = false;
        issue(r, i);
      }
    }
    bucket_running = false;
    ++next_bucket;
  };
  // When rank r's compute will start step w at the earliest (now if it has passed it; +inf when
  // w is no step: nothing waits).
  const auto reach_step = [&](size_t r, int w) {
    const RankState& s = st[r];
    const int steps = static_cast<int>(in.ranks[r].step_seconds.size());
    if (w < 0 || w >= steps) return kInf;
    const int from = s.next_step + (s.running ? 1 : 0);  // the next step to start
    const double base = s.running ? s.step_end : now;
    if (w <= from) return w < from ? now : base;
    return base + s.prefix[static_cast<size_t>(w)] - s.prefix[static_cast<size_t>(from)];
  };
  const auto span = [&](int track, double b, double e, std::string name, bool stall) {
    if (in.trace && e > b) res.spans.push_back({track, b, e, std::move(name), stall});
  };

  for (int guard = 0;; ++guard) {
    // 1. Everything that can happen at `now`, until nothing changes.
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n_ranks; ++r) {
        RankState& s = st[r];
        const SimRank& rank = in.ranks[r];
        const int steps = static_cast<int>(rank.step_seconds.size());
        if (s.running && s.step_end <= now) {
          s.running = false;
          if (s.next_mark < rank.marks.size() && rank.marks[s.next_mark] == s.next_step) {
            res.ranks[r].mark_seconds.push_back(now);
            ++s.next_mark;
          }
          for (size_t i : s.issued_after[static_cast<size_t>(s.next_step) + 1]) issue(r, i);
          ++s.next_step;
          changed = true;
        }
        if (s.running || s.finished) continue;
        if (s.next_step >= steps) {
          s.finished = true;
          s.finish_time = now;
          changed = true;
          continue;
        }
        bool ready = true;
        for (size_t i : s.waited_before[static_cast<size_t>(s.next_step)]) {
          if (!s.issued[i] && !s.held[i]) {
            issue(r, i);  // issued and waited for at the same point
            changed = true;
          }
          ready = ready && s.done[i];
        }
        if (reduce)
          ready = ready && next_bucket >= s.buckets_before[static_cast<size_t>(s.next_step)];
        if (!ready) {
          if (s.waiting_since < 0) s.waiting_since = now;
          continue;
        }
        if (s.waiting_since >= 0) {
          res.ranks[r].stall_seconds += now - s.waiting_since;
          span(static_cast<int>(3 * r), s.waiting_since, now, "stall", true);
          s.waiting_since = -1;
        }
        const double t = rank.step_seconds[static_cast<size_t>(s.next_step)];
        span(static_cast<int>(3 * r), now, now + t,
             static_cast<size_t>(s.next_step) < rank.step_names.size()
                 ? rank.step_names[static_cast<size_t>(s.next_step)]
                 : fmt::format("step {}", s.next_step),
             false);
        s.running = true;
        s.step_end = now + t;
        s.work_left = t;
        changed = true;
      }
    }
    // 2. Copies: fifo starts each stream's head whole; topology asks the arbiter for chunks.
    std::vector<ChunkClaim> claims;
    std::vector<std::pair<size_t, int>> claim_of;
    for (size_t r = 0; r < n_ranks; ++r) {
      RankState& s = st[r];
      for (int d = 0; d < 2; ++d) {
        if (s.chunk_active[d] || s.queue[d].empty()) continue;
        const size_t i = s.queue[d].front();
        if (!in.topology_scheduler) {
          active.push_back({false, static_cast<int>(r), d, i, s.remaining[i], 0});
          s.chunk_active[d] = true;
          if (s.first_byte[i] < 0) s.first_byte[i] = now;
          continue;
        }
        const size_t key = r * 2 + static_cast<size_t>(d);
        if (!claimed[key]) {
          claimed[key] = true;
          claim_seq[key] = seq++;
        }
        // Slack: when compute will reach the step that waits, less the time the rest of the
        // copy needs alone on its path.
        const double reach = reach_step(r, in.ranks[r].transfers[i].wait_before);
        ChunkClaim c;
        c.rank = static_cast<int>(r);
        c.direction = d == 0 ? TransferDirection::kToHost : TransferDirection::kToDevice;
        c.links = s.arbitrated[d];
        // Least laxity first, as the emulation's arbiter (Note [Why least laxity]).
        c.slack_s = reach == kInf ? 1e30
                                  : chunk_latest_start(reach, static_cast<uint64_t>(s.remaining[i]),
                                                       s.max_rate[d] * 1e9) -
                                        now;
        c.seq = claim_seq[key];
        c.reserve = true;  // Note [Claims that need several links at once]
        claims.push_back(std::move(c));
        claim_of.emplace_back(r, d);
      }
    }
    // 3. The next bucket, once every rank has produced it and the previous one is reduced.
    if (reduce && !bucket_running && next_bucket < in.buckets.size()) {
      const SimBucket& b = in.buckets[next_bucket];
      bool ready = true;
      for (size_t r = 0; r < n_ranks; ++r) {
        ready = ready && st[r].next_step > b.ready_after;
        const auto& waits = in.ranks[r].bucket_after_transfer;
        const int t = waits.empty() ? -1 : waits[next_bucket];
        ready = ready && (t < 0 || st[r].done[static_cast<size_t>(t)]);
      }
      if (ready) {
        const double bytes = share(b) * static_cast<double>(b.bytes);
        for (size_t h = 0; h < in.ring.size(); ++h) {
          if (in.topology_scheduler)
            positions[h % n_ranks].left = bytes;  // claimed in chunks below
          else
            active.push_back({true, static_cast<int>(h), 0, 0, bytes, 0});
        }
        bucket_running = true;
        (b.collective == SimCollective::kAllReduce       ? res.allreduce_bytes
         : b.collective == SimCollective::kReduceScatter ? res.reduce_scatter_bytes
                                                         : res.all_gather_bytes) +=
            bytes * channels;
        if (bytes <= 0) {
          active.erase(
              std::remove_if(active.begin(), active.end(), [](const Active& a) { return a.hop; }),
              active.end());
          end_bucket();
          continue;
        }
      }
    }

    // Under the topology scheduler each ring position of the running bucket claims its next
    // chunk beside the copies' claims, its deadline the update step that needs every bucket:
    // its latest start leaves the rest of its hops' bytes, this bucket's and the later
    // buckets', time to cross its narrowest link alone (Note [All-reduce chunks on arbitrated
    // links]).
    if (in.topology_scheduler && bucket_running) {
      // Each run of buckets one step waits for (the update; the first forward for all-gathers)
      // has that step's start as its deadline: (deadline, the run's last bucket).
      std::vector<std::pair<double, size_t>> due;
      for (size_t b = next_bucket; b < n_buckets; ++b) {
        if (b + 1 < n_buckets && in.buckets[b + 1].needed_before == in.buckets[b].needed_before)
          continue;
        double deadline = kInf;
        for (size_t r = 0; r < n_ranks; ++r)
          deadline = std::min(deadline, reach_step(r, need_step(r, in.buckets[b])));
        due.emplace_back(deadline, b);
      }
      for (size_t q = 0; q < positions.size(); ++q) {
        RingPosition& p = positions[q];
        if (p.chunks_active > 0 || p.left <= 0) continue;
        if (!p.claimed) {
          p.claimed = true;
          p.claim_seq = seq++;
        }
        ChunkClaim c;
        c.rank = static_cast<int>(q);
        c.links = p.arbitrated.links;
        c.link_directions = p.arbitrated.link_directions;
        double latest = kInf;
        for (const auto& [deadline, last] : due) {
          if (deadline == kInf || p.max_rate == kInf) continue;
          const double rest =
              (p.left + (hop_bytes_after[next_bucket + 1] - hop_bytes_after[last + 1])) *
              static_cast<double>(p.hops.size());
          latest = std::min(
              latest, chunk_latest_start(deadline, static_cast<uint64_t>(rest), p.max_rate * 1e9));
        }
        c.slack_s = latest == kInf ? 1e30 : latest - now;
        c.seq = p.claim_seq;
        c.reserve = true;  // Note [Claims that need several links at once]
        claims.push_back(std::move(c));
        claim_of.emplace_back(q, -1);
      }
    }
    // The arbiter grants the copies' and the ring positions' chunks together.
    if (!claims.empty()) {
      std::vector<LinkDirection> busy;
      for (const Active& a : active) {
        if (a.hop) {
          if (!in.topology_scheduler) continue;
          const Flow& f = positions[static_cast<size_t>(a.rank) % n_ranks].arbitrated;
          for (size_t i = 0; i < f.links.size(); ++i)
            busy.push_back({f.links[i], link_direction(f, i)});
          continue;
        }
        for (int l : st[static_cast<size_t>(a.rank)].arbitrated[a.dir])
          busy.push_back(
              {l, a.dir == 0 ? TransferDirection::kToHost : TransferDirection::kToDevice});
      }
      for (size_t g : grant(claims, busy)) {
        const auto [r, d] = claim_of[g];
        if (d < 0) {  // a ring position's chunk, split over its hops; without tokens, whole
          RingPosition& p = positions[r];
          const double chunk = p.arbitrated.links.empty()
                                   ? p.left
                                   : std::min(p.left, static_cast<double>(in.chunk_bytes) /
                                                          static_cast<double>(p.hops.size()));
          for (size_t h : p.hops) active.push_back({true, static_cast<int>(h), 0, 0, chunk, 0});
          p.left -= chunk;
          p.chunks_active = static_cast<int>(p.hops.size());
          p.claimed = false;
          continue;
        }
        RankState& s = st[r];
        const size_t i = s.queue[d].front();
        const double chunk = std::min(s.remaining[i], static_cast<double>(in.chunk_bytes));
        active.push_back({false, static_cast<int>(r), d, i, chunk, 0});
        s.chunk_active[d] = true;
        claimed[r * 2 + static_cast<size_t>(d)] = false;
        if (s.first_byte[i] < 0) s.first_byte[i] = now;
      }
    }

    // 4. Rates: copies and each hop (up one path, down the other) share the links max-min
    // fairly.
    std::vector<Flow> flows;
    std::vector<std::pair<size_t, size_t>> flow_span(active.size());  // into `flows`
    for (size_t a = 0; a < active.size(); ++a) {
      const Active& x = active[a];
      flow_span[a].first = flows.size();
      if (!x.hop) {
        flows.push_back({in.ranks[static_cast<size_t>(x.rank)].path,
                         x.dir == 0 ? TransferDirection::kToHost : TransferDirection::kToDevice});
      } else {
        Flow f = hop_flow(in.ring[static_cast<size_t>(x.rank)]);
        if (!f.links.empty()) flows.push_back(std::move(f));
      }
      flow_span[a].second = flows.size();
    }
    const std::vector<double> rates = fair_rates(caps, flows);
    double next = kInf;
    for (size_t a = 0; a < active.size(); ++a) {
      double r = kInf;
      for (size_t f = flow_span[a].first; f < flow_span[a].second; ++f) r = std::min(r, rates[f]);
      active[a].rate = r;  // GB/s
      const double t = r == kInf ? now : now + active[a].remaining / (r * 1e9);
      next = std::min(next, t);
    }
    // Note [One GPU's compute shared by jobs]: the running steps share the device.
    double computing = 0;
    for (const RankState& s : st) computing += s.running ? 1 : 0;
    if (in.shared_compute)
      for (RankState& s : st)
        if (s.running) s.step_end = now + s.work_left * computing;
    for (size_t r = 0; r < n_ranks; ++r)
      if (st[r].running) next = std::min(next, st[r].step_end);
    if (in.trace) {
      std::vector<double> use(n_links * 2, 0.0);
      for (size_t a = 0; a < active.size(); ++a) {
        for (size_t f = flow_span[a].first; f < flow_span[a].second; ++f)
          for (size_t i = 0; i < flows[f].links.size(); ++i)
            use[static_cast<size_t>(flows[f].links[i]) * 2 +
                static_cast<size_t>(dir_index(link_direction(flows[f], i)))] +=
                active[a].rate == kInf ? 0 : active[a].rate;
      }
      for (size_t l = 0; l < n_links; ++l)
        res.samples.push_back({static_cast<int>(l), now, use[l * 2], use[l * 2 + 1]});
    }
    if (next == kInf) {
      bool all = buckets_done();
      for (const RankState& s : st) all = all && s.finished;
      if (all) break;
      throw std::logic_error("node simulation deadlocked: compute waits for a copy never issued");
    }
    if (guard > 50'000'000) throw std::logic_error("node simulation does not end");

    // 5. Advance to `next`: move bytes, account them on the links, end what lands.
    const double dt = next - now;
    std::vector<bool> link_busy(n_links, false);
    for (size_t a = 0; a < active.size(); ++a) {
      Active& x = active[a];
      const double rate = x.rate;
      const double t_end = rate == kInf ? now : now + x.remaining / (rate * 1e9);
      const double moved = t_end <= next ? x.remaining : rate * 1e9 * dt;
      x.remaining = t_end <= next ? 0 : std::max(0.0, x.remaining - moved);
      for (size_t f = flow_span[a].first; f < flow_span[a].second; ++f) {
        for (size_t i = 0; i < flows[f].links.size(); ++i) {
          const int l = flows[f].links[i];
          SimLinkStats& ls = res.links[static_cast<size_t>(l)];
          (link_direction(flows[f], i) == TransferDirection::kToHost ? ls.to_host_bytes
                                                                     : ls.to_device_bytes) += moved;
          link_busy[static_cast<size_t>(l)] = true;
        }
      }
      if (!x.hop) {
        RankState& s = st[static_cast<size_t>(x.rank)];
        s.remaining[x.transfer] -= moved;
        res.ranks[static_cast<size_t>(x.rank)].copy_bytes += moved;
      }
    }
    for (size_t l = 0; l < n_links; ++l)
      if (link_busy[l]) res.links[l].busy_seconds += dt;
    if (in.shared_compute)
      for (RankState& s : st)
        if (s.running) s.work_left = s.step_end <= next ? 0 : s.work_left - dt / computing;
    now = next;
    bool hops_left = false;
    for (const Active& x : active) hops_left = hops_left || (x.hop && x.remaining > 0);
    for (const RingPosition& p : positions) hops_left = hops_left || p.left > 0;
    std::vector<Active> keep;
    for (Active& x : active) {
      if (x.remaining > 0) {
        keep.push_back(x);
        continue;
      }
      if (x.hop) {
        if (in.topology_scheduler) --positions[static_cast<size_t>(x.rank) % n_ranks].chunks_active;
        continue;
      }
      RankState& s = st[static_cast<size_t>(x.rank)];
      s.chunk_active[x.dir] = false;
      if (in.topology_scheduler && s.remaining[x.transfer] > 0.5)
        continue;  // more chunks of this copy to claim
      s.remaining[x.transfer] = 0;
      s.done[x.transfer] = true;
      s.queue[x.dir].pop_front();
      const SimRank& owner = in.ranks[static_cast<size_t>(x.rank)];
      const SimTransfer& t = owner.transfers[x.transfer];
      static constexpr const char* kNames[2][2] = {{"prefetch", "offload"},
                                                   {"parameters", "gradients"}};
      const bool state = x.transfer >= owner.model_state_transfers;
      span(3 * x.rank + 1 + x.dir, s.first_byte[x.transfer], now,
           fmt::format("{} {}", kNames[state][t.to_host], t.bytes), false);
    }
    active = std::move(keep);
    if (bucket_running && !hops_left) end_bucket();
  }

  double stall = 0;
  for (size_t r = 0; r < n_ranks; ++r) {
    res.ranks[r].step_seconds = st[r].finish_time;
    res.step_seconds = std::max(res.step_seconds, st[r].finish_time);
    stall += res.ranks[r].stall_seconds;
  }
  res.stall_seconds = n_ranks ? stall / static_cast<double>(n_ranks) : 0;
  return res;
}

}  // namespace ferry
