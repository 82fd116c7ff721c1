// Every per-node piece of a job over 2 nodes x 2 ranks, from the ranks Open MPI's environment
// gives each process, without mpirun: a local rank is placed on its own node's topology (node
// B is another server), takes its node's device key in the job ledger and its node's file
// names; and, with each node's own /dev/shm (a mount namespace, as each host has its own), each
// node's first local rank creates that node's link ledger and job ledger, its other rank joins
// them, and no rank of the other node is ever in them. The namespace part skips without root.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "jobs/job_ledger.h"
#include "links/link_ledger.h"
#include "topology/links.h"
#include "topology/load.h"
#include "trainer/config/config.h"
#include "trainer/session/node_files.h"
#include "trainer/session/rank_placement.h"
#include "trainer/share/lease.h"

namespace ferry {
namespace {

// What `mpirun -np 4 --host node-a:2,node-b:2` puts in the environment of world rank r (ranks
// filled node by node): comm/ranks' init_ranks() gets the same from MPI (MPI_Comm_split_type).
std::map<std::string, std::string> open_mpi_environment(int r) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
          {"OMPI_COMM_WORLD_SIZE", "4"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r % 2)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
          {"OMPI_COMM_WORLD_NODE_RANK", std::to_string(r / 2)}};
}

RankInfo ranks_from(const std::map<std::string, std::string>& env) {
  RankInfo r;
  r.rank = std::stoi(env.at("OMPI_COMM_WORLD_RANK"));
  r.size = std::stoi(env.at("OMPI_COMM_WORLD_SIZE"));
  r.local_rank = std::stoi(env.at("OMPI_COMM_WORLD_LOCAL_RANK"));
  r.local_size = std::stoi(env.at("OMPI_COMM_WORLD_LOCAL_SIZE"));
  r.under_mpi = true;
  return r;
}

struct Node {
  std::string host;
  std::string topology;  // its own server
  int first_rank = 0;
};
const Node kNodes[2] = {{"node-a", "dgx1-like", 0}, {"node-b", "workstation-4gpu", 2}};

std::string topology_file(const Node& n) {
  return std::string(FERRY_SOURCE_DIR) + "/configs/topologies/" + n.topology + ".yaml";
}

// CPU ranks standing in for the node's GPUs under the topology scheduler, as a training config.
Config node_config(const Node& n) {
  return parse_config_text(
      fmt::format("model: {{name: lenet5}}\ndevice: {{backend: cpu}}\n"
                  "topology: {{scheduler: topology, bind: false, file: {}}}\n",
                  topology_file(n)));
}

TEST(NodeKeyed, EachLocalRankIsPlacedAndNamedFromItsOwnNode) {
  std::map<int, std::string> ledger_of;  // rank -> its node's link ledger name
  for (const Node& node : kNodes) {
    const Config config = node_config(node);
    const Topology topology = load_topology(topology_file(node));
    const std::vector<RankBinding> node_bindings = place_ranks(topology, 2);
    const LinkMap map(topology);
    for (int local = 0; local < 2; ++local) {
      const int r = node.first_rank + local;
      SCOPED_TRACE(fmt::format("rank {} on {}", r, node.host));
      const RankInfo ranks = ranks_from(open_mpi_environment(r));
      ASSERT_EQ(ranks.local_rank, local);
      const RankPlacement p = place_this_rank(config, ranks);
      // Its node's local_rank-th GPU, that GPU's NUMA node and path on its node's server.
      ASSERT_TRUE(p.binding.gpu.has_value());
      EXPECT_EQ(*p.binding.gpu, *node_bindings[static_cast<size_t>(local)].gpu);
      EXPECT_EQ(p.binding.numa, node_bindings[static_cast<size_t>(local)].numa);
      EXPECT_EQ(p.link_ids, map.gpu_path(*p.binding.gpu, p.binding.numa));
      // The bindings table lists the node's two local ranks.
      EXPECT_NE(p.table.find("\n0 "), std::string::npos) << p.table;
      EXPECT_NE(p.table.find("\n1 "), std::string::npos) << p.table;
      EXPECT_EQ(p.table.find("\n2 "), std::string::npos) << p.table;
      // Its device in the node's job ledger, its node's files.
      EXPECT_EQ(share_device_key(config, ranks), fmt::format("cpu:{}", local));
      EXPECT_EQ(speaks_for_node(ranks), local == 0);
      EXPECT_EQ(node_links_file(ranks, node.host), "links." + node.host + ".json");
      if (speaks_for_node(ranks)) {
        EXPECT_EQ(node_heading(ranks, node.host),
                  fmt::format("node {} (first rank {})", node.host, node.first_rank));
      }
      ledger_of[r] = LinkLedger::node_name(node_ledger_links(config, p, true));
    }
  }
  EXPECT_EQ(ledger_of[0], ledger_of[1]);
  EXPECT_EQ(ledger_of[2], ledger_of[3]);
  EXPECT_NE(ledger_of[0], ledger_of[2]) << "each node names its ledger from its own links";
  // One node alone keeps the one-machine names.
  RankInfo alone;
  alone.local_size = alone.size = 2;
  EXPECT_EQ(node_links_file(alone, "node-a"), "links.json");
}

// ---- Nodes made of mount and UTS namespaces, ranks of processes ----

// Runs `body` in a forked child, which exits with its result (99 when it throws).
pid_t fork_child(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  int rc = 99;
  try {
    rc = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child %d: %s\n", getpid(), e.what());
  }
  std::fflush(stderr);
  _exit(rc);
}

int wait_child(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return 98;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// This process becomes a node: its own mounts with a fresh /dev/shm, and its host name.
int become_node(const std::string& host) {
  if (unshare(CLONE_NEWNS | CLONE_NEWUTS) != 0) return 10;
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 11;
  if (mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=64m") != 0) return 12;
  if (sethostname(host.data(), host.size()) != 0) return 13;
  return 0;
}

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    if (pipe(fds) == 0) r = fds[0], w = fds[1];
  }
};

bool signal_on(int fd) { return write(fd, "x", 1) == 1; }
bool wait_on(int fd) {
  char c;
  return read(fd, &c, 1) == 1;
}

// One rank: places itself, attaches its node's link ledger and joins its node's job ledger as
// the session does, says so on `ready`, waits for `go`, writes what it sees to `report` (one
// line), says so, and leaves when `go` comes again.
int run_rank(const Node& node, int local, const Pipe& ready, const Pipe& go, int report) {
  const RankInfo ranks = ranks_from(open_mpi_environment(node.first_rank + local));
  const Config config = node_config(node);
  const RankPlacement p = place_this_rank(config, ranks);
  const std::vector<NamedLink> links = node_ledger_links(config, p, true);
  const std::string name = LinkLedger::node_name(links);
  const auto ledger = LinkLedger::attach(name, links, LedgerUser{"job", ranks.rank, "/run"});
  const auto jobs = JobLedger::attach();
  JobRequest request;
  request.device = share_device_key(config, ranks);
  request.capacity = 1 << 30;
  request.rank = ranks.rank;
  request.curve = {1 << 20, 2 << 20, {{1 << 20, 2.0}, {2 << 20, 1.0}}};
  const JobGrant grant = jobs->join(request);
  if (!signal_on(ready.w) || !wait_on(go.r)) return 30;
  std::string line = fmt::format("{} {} ledger={} users=", host_name(), ranks.rank, name);
  for (const auto& u : ledger->snapshot().users) line += fmt::format("{},", u.rank);
  line += " jobs=";
  for (const LedgerGpu& gpu : jobs->snapshot())
    for (const LedgerJob& j : gpu.jobs) line += fmt::format("{}:{},", gpu.device, j.rank);
  line += fmt::format(" ledgers={}\n", LinkLedger::node_ledgers().size());
  if (write(report, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 31;
  if (!signal_on(ready.w) || !wait_on(go.r)) return 32;
  jobs->leave(grant.id);
  return 0;
}

// One node: its first local rank starts alone and creates the node's ledgers, then the other
// joins; both report while both are attached.
int run_node(const Node& node, int report) {
  if (const int rc = become_node(node.host)) return rc;
  if (!LinkLedger::node_ledgers().empty()) return 14;
  Pipe ready, go[2];
  pid_t rank[2];
  for (int local = 0; local < 2; ++local) {
    rank[local] = fork_child([&] { return run_rank(node, local, ready, go[local], report); });
    if (!wait_on(ready.r)) return 15;
    if (local == 0 && LinkLedger::node_ledgers().size() != 1) return 16;  // it made the ledger
    if (local == 0 && access(("/dev/shm" + JobLedger::default_name()).c_str(), F_OK) != 0)
      return 17;
  }
  for (int round = 0; round < 2; ++round) {
    for (const Pipe& g : go)
      if (!signal_on(g.w)) return 18;
    if (round == 0 && !(wait_on(ready.r) && wait_on(ready.r))) return 19;
  }
  for (pid_t pid : rank)
    if (const int rc = wait_child(pid)) return 40 + rc;
  return 0;
}

std::string namespaces_refused() {
  if (geteuid() != 0) return "not root: a mount namespace with its own /dev/shm needs it";
  const int rc = wait_child(fork_child([] { return become_node("ferry-probe"); }));
  return rc == 0 ? "" : fmt::format("unshare or mount refused here (step {})", rc);
}

TEST(NodeKeyed, EachNodesFirstRankCreatesItsLedgersWhichOnlyItsRanksShare) {
  if (const std::string why = namespaces_refused(); !why.empty()) GTEST_SKIP() << why;
  const std::set<std::string> before = [] {
    const auto l = LinkLedger::node_ledgers();
    return std::set<std::string>(l.begin(), l.end());
  }();
  Pipe report;
  pid_t node[2];
  for (int n = 0; n < 2; ++n)
    node[n] = fork_child([&, n] { return run_node(kNodes[n], report.w); });
  for (int n = 0; n < 2; ++n) EXPECT_EQ(wait_child(node[n]), 0) << kNodes[n].host;
  close(report.w);
  std::string text;
  char buffer[4096];
  for (ssize_t got; (got = read(report.r, buffer, sizeof(buffer))) > 0;)
    text.append(buffer, static_cast<size_t>(got));
  close(report.r);
  std::map<int, std::string> line;  // rank -> its report
  std::istringstream lines(text);
  for (std::string l; std::getline(lines, l);) {
    std::istringstream fields(l);
    std::string host;
    int rank = -1;
    fields >> host >> rank;
    line[rank] = l;
  }
  ASSERT_EQ(line.size(), 4u) << text;
  for (const Node& node : kNodes) {
    for (int local = 0; local < 2; ++local) {
      const int r = node.first_rank + local;
      const std::string& l = line[r];
      const int a = node.first_rank, b = node.first_rank + 1;
      EXPECT_EQ(l.rfind(node.host + " ", 0), 0u) << l;  // its node's host name
      // Its node's two ranks in the link ledger, and nobody else.
      EXPECT_NE(l.find(fmt::format(" users={},{}, ", a, b)), std::string::npos) << l;
      // Each of its node's two devices holds that node's own rank, and no other.
      EXPECT_NE(l.find(fmt::format(" jobs=cpu:0:{},cpu:1:{}, ", a, b)), std::string::npos) << l;
      EXPECT_NE(l.find(" ledgers=1"), std::string::npos) << l;
    }
    EXPECT_EQ(line[node.first_rank].substr(line[node.first_rank].find(" ledger=")),
              line[node.first_rank + 1].substr(line[node.first_rank + 1].find(" ledger=")));
  }
  // The nodes' ledgers lived in their own /dev/shm: this machine's has none more.
  const auto after = LinkLedger::node_ledgers();
  EXPECT_EQ(std::set<std::string>(after.begin(), after.end()), before);
}

}  // namespace
}  // namespace ferry
