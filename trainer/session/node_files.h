// What each node of a job writes and prints for itself (its link ledger's report, its bindings
// table): the node's first local rank does, under the node's host name. Invariant: one writer
// per node, and a job on one node names its files as it always has.
#pragma once

#include <string>

#include "comm/ranks.h"

namespace ferry {

// Whether this rank speaks for its node: its first local rank.
bool speaks_for_node(const RankInfo& ranks);

// The file a node's link-ledger report goes to in the run directory: "links.json" for a job on
// one node, "links.<host>.json" for each node of a job over several.
std::string node_links_file(const RankInfo& ranks, const std::string& host);

// The heading of a node's bindings table in a job over several nodes, printed by the rank that
// speaks for it: "node HOST (first rank R)".
std::string node_heading(const RankInfo& ranks, const std::string& host);

}  // namespace ferry
