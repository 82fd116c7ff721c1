// The all-gather of updated parameters in pieces, ordered for the next forward: which pieces each
// forward step reads and the order to issue them in. Invariant: every piece is issued once per
// update, and a step that reads a float of a piece is ordered after that piece's gather.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ferry {

// Note [Parameters gathered for the next forward]
// After the update every rank holds only its shard of the new parameters; the all-gather brings
// the others back in pieces (comm.bucket_mb per shard: piece k is floats [k * P, k * P + P) of
// every rank's shard, so every rank sends the same count). Rather than ordering compute after
// the whole gather, each piece's completion is its own event: the pieces are issued in the order
// the next forward first reads them (the program of the last backward says which parameters each
// step reads; the parameter block is in forward order, so the first layers' pieces go first), and
// each forward step waits only for the pieces holding the parameters it reads, so the gather of
// the later layers runs while the first layers compute. Any step other than a forward or a
// recompute (the first backward step, in practice), and anything else that reads parameters
// (checkpoints), first waits for every piece still pending.

struct GatherPieces {
  int64_t shard = 0;  // S: floats per rank
  int64_t piece = 0;  // floats per piece per rank
  int ranks = 1;
  size_t count() const { return piece > 0 ? static_cast<size_t>((shard + piece - 1) / piece) : 0; }
};

// Per step, the pieces (sorted, unique) holding the floats [begin, end) of the block it reads.
std::vector<std::vector<size_t>> pieces_read(
    const GatherPieces& g, const std::vector<std::vector<std::pair<int64_t, int64_t>>>& reads);

// Per step, the pieces (sorted, unique) among the contiguous pieces [bounds[k], bounds[k + 1]) of
// the block that hold a float of [begin, end) it reads; floats outside [bounds.front(),
// bounds.back()) are in none. The host optimizer's weight copies (Note [Host copies on the links]
// in model_state_step.h) are such pieces, cut at parameter boundaries.
std::vector<std::vector<size_t>> pieces_read(
    const std::vector<int64_t>& bounds,
    const std::vector<std::vector<std::pair<int64_t, int64_t>>>& reads);

// The pieces in the order the steps first read them (pieces no step reads last, in index order).
std::vector<size_t> gather_order(size_t pieces, const std::vector<std::vector<size_t>>& read);

}  // namespace ferry
