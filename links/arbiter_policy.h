// The topology scheduler's arbitration rule, pure: which waiting chunk claims may start now.
// Invariant: at most one chunk per link per direction is in flight (busy + granted), and among
// claims that conflict the one with the least deadline slack (then the lowest seq) goes first.
// Note [Life of an offloaded activation] (trainer/exec/executor.h), step 6.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "prefetch/transfer_direction.h"

namespace ferry {

// A chunk that wants to cross `links` in `direction`. slack_s: seconds between the latest start
// that still meets its deadline and now (smaller = more urgent). seq: arrival order, tie-break.
struct ChunkClaim {
  int rank = 0;
  TransferDirection direction = TransferDirection::kToHost;
  std::vector<int> links;
  double slack_s = 0;
  uint64_t seq = 0;
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
// topology_schedule_test checks it against brute force). Each rank's chunks also cross its own
// GPU link, which no other rank uses, so a switch's GPUs form exactly that case; transfers whose
// arbitrated links overlap only partially are a multi-resource problem no greedy rule solves,
// and grant() stays work-conserving there.

// Indices of `waiting` that may start now, in grant order: in order of (slack_s, seq), a claim is
// granted when none of its link-directions is in `busy` or taken by an earlier grant (one chunk
// per link per direction at a time). A claim with no links is always granted.
std::vector<size_t> grant(const std::vector<ChunkClaim>& waiting,
                          const std::vector<LinkDirection>& busy);

}  // namespace ferry
