// The topology scheduler's arbitration rule, pure: which waiting chunk claims may start now.
// Invariant: at most one chunk per link per direction is in flight (busy + granted), and among
// claims that conflict the one with the least deadline slack (then the lowest seq) goes first.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "prefetch/transfer_direction.h"

namespace ferry {

// A chunk that wants to cross `links` in `direction`. slack_s: seconds between the latest start
// that still meets its deadline and now (smaller = more urgent). seq: arrival order, tie-break.
// A chunk that turns around on its way (an all-reduce hop, up one GPU's path and down another's)
// gives one direction per link in `link_directions`; empty: `direction` on every link. `reserve`:
// when it cannot start, it keeps less urgent claims off its free link-directions (Note [Claims
// that need several links at once]).
struct ChunkClaim {
  int rank = 0;
  TransferDirection direction = TransferDirection::kToHost;
  std::vector<int> links;
  double slack_s = 0;
  uint64_t seq = 0;
  std::vector<TransferDirection> link_directions;
  bool reserve = false;
};

struct LinkDirection {
  int link = 0;
  TransferDirection direction = TransferDirection::kToHost;
  auto operator<=>(const LinkDirection&) const = default;
};

// The latest start of a transfer's next chunk: its deadline less the time the rest of the
// transfer (`remaining_bytes`, this chunk included) needs at `bytes_per_s`. slack_s is this less
// now, so chunks are served least laxity first (Note [Why least laxity]).
double chunk_latest_start(double deadline, uint64_t remaining_bytes, double bytes_per_s);

// Note [Why least laxity]
// On one shared link with chunks as the unit of preemption, serving the least laxity first
// meets every deadline whenever any order of whole transfers does (tests/links:
// arbiter_policy_schedule_test checks it against brute force). Each rank's chunks also cross its
// own GPU link, which no other rank uses, so a switch's GPUs form exactly that case; transfers
// whose arbitrated links overlap only partially are a multi-resource problem no greedy rule solves,
// and grant() stays work-conserving there. This rule is step 6 of Note [Life of an offloaded
// activation] (trainer/exec/executor.h).

// Note [Claims that need several links at once]
// An all-reduce hop's chunk needs the tokens of two GPUs' links (and a NIC's) at once, each copy
// those of its own GPU's link and its switch's uplink. Granting greedily, a claim blocked on one
// busy link sees less urgent claims take its other links, and when the first frees the others
// are taken: two GPUs' prefetches under one switch and the hop into one of them, taking turns,
// kept the most urgent claim of all, that GPU's prefetch, waiting until its compute had stalled
// 83 ms (a simulated VGG-16 step at batch 64 under 4 GiB on the DGX-1-like server). A claim that
// reserves holds its free link-directions against every less urgent claim while it waits, so it
// starts as soon as the chunks in its way end; those links may idle for up to a chunk's time,
// which is what work conservation gives up for it. The simulator's claims all reserve; the
// ledger's (copies on a tree, where a blocked claim's free links are wanted by no other claim
// that could start) do not need to.

// Indices of `waiting` that may start now, in grant order: in order of (slack_s, seq), a claim is
// granted when none of its link-directions is in `busy` or taken by an earlier grant (one chunk
// per link per direction at a time), or reserved by an earlier claim that could not start and
// reserves. A claim with no links is always granted. std::invalid_argument when a claim's
// link_directions is neither empty nor one per link.
std::vector<size_t> grant(const std::vector<ChunkClaim>& waiting,
                          const std::vector<LinkDirection>& busy);

}  // namespace ferry
