// Per-node file names and headings from a rank's place in the job.
#include "trainer/session/node_files.h"

#include <fmt/format.h>

namespace ferry {

bool speaks_for_node(const RankInfo& ranks) { return ranks.local_rank == 0; }

std::string node_links_file(const RankInfo& ranks, const std::string& host) {
  return ranks.local_size < ranks.size ? fmt::format("links.{}.json", host) : "links.json";
}

std::string node_heading(const RankInfo& ranks, const std::string& host) {
  return fmt::format("node {} (first rank {})", host, ranks.rank);
}

}  // namespace ferry
