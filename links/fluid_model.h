// The link ledger's fluid model, pure: copies in flight as flows sharing links max-min fairly, in
// one plain fixed-size struct, no clock, no lock, no I/O (Note [What the fluid state holds]).
// Invariant: once advanced to a time, no link-direction carries more than its capacity.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "links/fair_rates.h"

// Note [What the fluid state holds]
// The node's copies in flight as flows (bytes remaining at their max-min fair share of the links
// they cross, fair_rates.h), the topology scheduler's chunk claims and per-link-direction tokens,
// and the bytes each link-direction carried over time. The link ledger keeps it in shared memory
// and drives it with the node's clock (link_ledger.h); tests drive it with theirs. Once advanced
// to a time, every live flow's rate is its fair share at that time, so no link-direction carries
// more than its capacity in any interval (Note [Fluid copies] in fluid_model.cc).

namespace ferry {

// A link-arbitration failure: a token holder that stays silent past the timeout, or a node with
// more copies or claims in flight than the model holds. Exit code 1.
class LinkArbiterError : public Error {
  using Error::Error;
};

// The sizes of a FluidState (the ledger's shared block holds one).
constexpr int kFluidMaxLinks = 64;
constexpr int kFluidMaxPath = 8;  // links one flow or claim crosses
constexpr int kFluidMaxFlows = 128;
constexpr int kFluidMaxClaims = 256;
constexpr int kFluidBins = 1024;    // the bytes-over-time record keeps this many bins per direction
constexpr int32_t kFluidKinds = 3;  // FluidFlow::kind and FluidClaim::kind are below this

// A copy, or a granted chunk, in flight. `dir`: 0 to host, 1 to device.
struct FluidFlow {
  int32_t used = 0;
  int32_t done = 0;  // its bytes are through (a held one still holds its tokens)
  int32_t rank = 0;
  int32_t pid = 0;
  int32_t dir = 0;
  int32_t n_links = 0;
  int32_t links[kFluidMaxPath] = {};
  int32_t held = 0;  // Note [Held chunks]
  int32_t kind = 0;  // what the copy carries, shown beside it: CopyKind (device/copy_deadline.h)
  uint64_t id = 0;
  double remaining = 0;  // bytes
  double rate = 0;       // bytes/s
};

// A chunk waiting for (or granted) one token per link-direction of `links`.
struct FluidClaim {
  int32_t used = 0;
  int32_t granted = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  int32_t dir = 0;
  int32_t n_links = 0;  // arbitrated links: one token each
  int32_t links[kFluidMaxPath] = {};
  int32_t n_path = 0;  // the links its flow crosses
  int32_t path[kFluidMaxPath] = {};
  int32_t held = 0;  // Note [Held chunks]
  int32_t kind = 0;  // as FluidFlow::kind; its flow takes it when granted
  uint64_t bytes = 0;
  uint64_t flow = 0;  // once granted
  uint64_t id = 0;    // also its arrival order
  double latest_start = 0;
  double heartbeat = 0;  // when its owner last showed it is alive (the ledger's)
};

// Who holds a link-direction: the granted chunk's flow (0: free).
struct LinkToken {
  uint64_t flow = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  double since = 0;
};

// Bytes per time bin, in a ring of kFluidBins bins; bins that leave the ring keep their peak.
struct ByteBins {
  double total = 0;
  double peak = 0;  // bytes in the fullest retired bin
  int64_t id[kFluidBins];
  double bytes[kFluidBins];
};

struct FluidLink {
  char name[96];
  LinkCapacity capacity;
};

// The whole model. Plain data: it may live in a zero-filled shared block, set up by init().
struct FluidState {
  int32_t n_links;
  double bin_s;      // measurement bin of the bytes-over-time record
  double t_last;     // the time the model was last advanced to
  uint64_t next_id;  // flows and claims share ids, so a claim's id is its arrival order
  FluidLink links[kFluidMaxLinks];
  FluidFlow flows[kFluidMaxFlows];
  FluidClaim claims[kFluidMaxClaims];
  LinkToken tokens[kFluidMaxLinks][2];
  ByteBins bins[kFluidMaxLinks][2];
};

// What the model measured on one link.
struct LinkUsage {
  std::string name;
  LinkCapacity capacity;         // emulated GB/s
  double bytes[2] = {0, 0};      // [to host, to device] carried since the model was set up
  double peak_gbps[2] = {0, 0};  // the highest rate over any measurement bin
  double bin_s = 0;              // the bin width the peak is measured over
};

// Operations on a FluidState that someone else owns (and locks). Times are seconds on the
// caller's clock; none of them reads a clock. A full table (flows or claims) throws
// LinkArbiterError.
class FluidModel {
 public:
  explicit FluidModel(FluidState& state) : s_(state) {}

  // Sets up a zero-filled `state` for `links` at time `t` (at most kFluidMaxLinks).
  static void init(FluidState& state, const std::vector<NamedLink>& links, double bin_s, double t);
  // What is wrong with a state read from outside (Note [A block is input] in
  // common/shm_block.h): a count, index, flag or number out of range; "" when nothing.
  static std::string check(const FluidState& state);

  FluidState& state() { return s_; }
  int link_count() const { return s_.n_links; }
  double now() const { return s_.t_last; }

  // Advances every flow to `t` (Note [Fluid copies]); at each finish, frees the finished chunks'
  // tokens and grants the waiting claims then. No-op when `t` is not later than now().
  void advance(double t);

  // A copy of `bytes` crossing `links` in direction `dir` from now() on, rates recomputed.
  // `kind`: what it carries (FluidFlow::kind).
  FluidFlow& begin_flow(int rank, int32_t pid, int dir, std::span<const int32_t> links,
                        uint64_t bytes, int32_t kind = 0);
  FluidFlow* find_flow(uint64_t id);
  // When `flow` finishes at today's rates (+infinity when it makes no progress).
  double finish_time(const FluidFlow& flow) const;
  // Ends a flow now, carried or not, and hands its tokens on (grants, rates).
  void end_flow(uint64_t id);

  // Queues a chunk claim at `t` (the model advanced to it) and grants what may start then, this
  // claim or another (rates recomputed); `granted_any` says whether anything was granted.
  // `kind`: what the chunk carries (FluidClaim::kind).
  FluidClaim& add_claim(double t, int rank, int32_t pid, int dir,
                        std::span<const int32_t> arbitrated, std::span<const int32_t> path,
                        uint64_t bytes, double latest_start, bool held, bool* granted_any,
                        int32_t kind = 0);
  FluidClaim* find_claim(uint64_t id);
  // Grants waiting claims at `t` (arbiter_policy::grant) and starts their flows then; true when
  // any was granted. Rates are not recomputed.
  bool grant_waiting(double t);
  // Frees the tokens of flows that are through (held ones excepted) or gone.
  void free_tokens();
  // Sets every live flow's rate to its max-min fair share.
  void recompute_rates();
  // Whether the chunk holding `token` cannot progress by itself: a flow of zero rate, or a held
  // chunk whose mover has not finished it.
  bool token_stalled(const LinkToken& token) const;

  // Per-link measurements so far.
  std::vector<LinkUsage> usage() const;

 private:
  // A new flow in a free slot; rates are not recomputed.
  FluidFlow& start_flow(int rank, int32_t pid, int dir, const int32_t* links, int n,
                        uint64_t bytes);
  void add_bytes(int link, int dir, double t0, double t1, double bytes);

  FluidState& s_;
};

}  // namespace ferry
