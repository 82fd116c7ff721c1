// The node simulator: with one GPU on one link it agrees with the planner's own cost model
// (prefetch simulate()); the same input gives the same result; every byte a copy or an
// all-reduce hop moves is counted once on every link it crosses; links shared by more GPUs
// slow their copies; the arbiter's grants keep one chunk per arbitrated link and direction;
// under the topology scheduler all-reduce chunks and copies go by deadline (Note [All-reduce
// chunks on arbitrated links] in sim/node_sim.h), and no claim is starved; jobs sharing one
// GPU's compute share it while they compute.
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "device/cpu/cpu_kernels.h"
#include "prefetch/plan.h"
#include "sim/node_links.h"
#include "sim/node_sim.h"
#include "topology/load.h"
#include "trainer/exec/lower.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {
namespace {

MemoryPlan model_plan(const std::string& name, int64_t batch, MemoryPolicy policy,
                      double link_gbps) {
  static cpu::CpuKernels kernels(1);
  const Graph g = build_model(name, Shape{batch, 3, 32, 32}, 10);
  PlanOptions o;
  o.policy = policy;
  o.persistent = ParameterStore::plan_bytes(g, 1);
  o.cost.link_gbps = link_gbps;
  o.cost.compute_flops = 2e12;  // a slow GPU, so copies matter
  o.cost.memory_gbps = 100;
  return plan_memory(lower_graph(g, kernels, true).tape, o);
}

SimRank rank_of(const MemoryPlan& plan, const CostModel& cost, std::vector<int> path) {
  SimRank r;
  r.name = "GPU";
  for (const TapeStep& s : plan.tape.steps)
    r.step_seconds.push_back(cost.step_seconds(s, plan.tape));
  r.transfers = plan_transfers(plan);
  r.path = std::move(path);
  return r;
}

TEST(NodeSim, OneGpuOnOneLinkAgreesWithThePlannersCostModel) {
  for (MemoryPolicy policy : {MemoryPolicy::kVdnnAll, MemoryPolicy::kVdnnConv}) {
    for (double gbps : {0.5, 4.0, 50.0}) {
      const MemoryPlan plan = model_plan("vgg11_cifar", 64, policy, gbps);
      ASSERT_GT(plan.offload_bytes, 0u);
      CostModel cost;
      cost.link_gbps = gbps;
      cost.compute_flops = 2e12;
      cost.memory_gbps = 100;
      NodeSimInput in;
      in.links.push_back({"link", {gbps, gbps, 1.0}});
      in.ranks.push_back(rank_of(plan, cost, {0}));
      for (bool topology : {false, true}) {
        in.topology_scheduler = topology;
        const NodeSimResult r = simulate_node(in);
        EXPECT_NEAR(r.step_seconds, plan.prediction.step_seconds,
                    1e-9 * plan.prediction.step_seconds)
            << policy_name(policy) << " at " << gbps << " GB/s, topology " << topology;
        EXPECT_NEAR(r.stall_seconds, plan.prediction.stall_seconds,
                    1e-9 * plan.prediction.step_seconds + 1e-12);
        EXPECT_NEAR(r.ranks[0].compute_seconds, plan.prediction.compute_seconds,
                    1e-9 * plan.prediction.compute_seconds);
      }
    }
  }
}

// Note [One GPU's compute shared by jobs]: two jobs on one GPU share its compute while both
// compute; a job waiting for its prefetch hands its share to the other. By hand: job A computes
// 1 s, waits for a 3 s prefetch, computes 1 s; job B computes 2 s.
TEST(NodeSim, JobsSharingOneGpusComputeShareItWhileBothCompute) {
  NodeSimInput in;
  in.links.push_back({"link", {1.0, 1.0, 1.0}});
  SimRank a;
  a.name = "A";
  a.step_seconds = {1.0, 1.0};
  a.transfers = {SimTransfer{false, 3'000'000'000ull, -1, 1}};
  a.path = {0};
  a.marks = {0, 1};
  SimRank b;
  b.name = "B";
  b.step_seconds = {2.0};
  b.path = {0};
  in.ranks = {a, b};
  const NodeSimResult own = simulate_node(in);  // a GPU each
  EXPECT_DOUBLE_EQ(own.ranks[0].step_seconds, 4.0);
  EXPECT_DOUBLE_EQ(own.ranks[0].stall_seconds, 2.0);
  EXPECT_DOUBLE_EQ(own.ranks[1].step_seconds, 2.0);
  EXPECT_EQ(own.ranks[0].mark_seconds, (std::vector<double>{1.0, 4.0}));
  in.shared_compute = true;
  // 0-2 s both compute at half speed: A's first step ends at 2, B has 1 s left; 2-3 s A waits
  // for its prefetch and B runs alone, ending at 3; 3-4 s A's second step alone.
  const NodeSimResult shared = simulate_node(in);
  EXPECT_NEAR(shared.ranks[0].step_seconds, 4.0, 1e-12);
  EXPECT_NEAR(shared.ranks[0].stall_seconds, 1.0, 1e-12);
  EXPECT_NEAR(shared.ranks[1].step_seconds, 3.0, 1e-12);
  ASSERT_EQ(shared.ranks[0].mark_seconds.size(), 2u);
  EXPECT_NEAR(shared.ranks[0].mark_seconds[0], 2.0, 1e-12);
  EXPECT_NEAR(shared.ranks[0].mark_seconds[1], 4.0, 1e-12);
  EXPECT_DOUBLE_EQ(shared.ranks[0].compute_seconds, 2.0) << "work at the device's full speed";
  // Without copies, k jobs computing each run at 1/k: B's 2 s and a 1 s job end at 2 and 3.
  SimRank c;
  c.name = "C";
  c.step_seconds = {1.0};
  c.path = {0};
  in.ranks = {b, c};
  const NodeSimResult two = simulate_node(in);
  EXPECT_NEAR(two.ranks[0].step_seconds, 3.0, 1e-12);
  EXPECT_NEAR(two.ranks[1].step_seconds, 2.0, 1e-12);
}

// Eight GPUs of the DGX-1-like server (two per switch), each offloading everything.
NodeSimInput dgx1_input(bool topology, double gbps = 2.0) {
  const Topology topo =
      load_topology(std::string(FERRY_SOURCE_DIR) + "/configs/topologies/dgx1-like.yaml");
  const NodeLinks nl = node_links(topo, place_ranks(topo, 8), nullptr);
  const MemoryPlan plan = model_plan("vgg11_cifar", 64, MemoryPolicy::kVdnnAll, gbps);
  CostModel cost;
  cost.compute_flops = 2e12;
  cost.memory_gbps = 100;
  NodeSimInput in;
  in.links = nl.links;
  for (NamedLink& l : in.links)
    l.capacity = {gbps * l.capacity.to_host_gbps / 15.754,
                  gbps * l.capacity.to_device_gbps / 15.754, 0.8};
  for (size_t r = 0; r < nl.paths.size(); ++r) in.ranks.push_back(rank_of(plan, cost, nl.paths[r]));
  in.ring = nl.ring;
  in.buckets = {{40u << 20, static_cast<int>(plan.tape.steps.size()) / 2},
                {60u << 20, static_cast<int>(plan.tape.steps.size()) - 2}};
  in.topology_scheduler = topology;
  in.chunk_bytes = 1 << 20;
  in.trace = true;
  return in;
}

TEST(NodeSim, SameInputSameResult) {
  for (bool topology : {false, true}) {
    const NodeSimInput in = dgx1_input(topology);
    const NodeSimResult a = simulate_node(in), b = simulate_node(in);
    EXPECT_EQ(a.step_seconds, b.step_seconds);
    EXPECT_EQ(a.stall_seconds, b.stall_seconds);
    ASSERT_EQ(a.links.size(), b.links.size());
    for (size_t l = 0; l < a.links.size(); ++l) {
      EXPECT_EQ(a.links[l].to_host_bytes, b.links[l].to_host_bytes);
      EXPECT_EQ(a.links[l].busy_seconds, b.links[l].busy_seconds);
    }
    EXPECT_EQ(chrome_trace(in, a), chrome_trace(in, b));
  }
}

TEST(NodeSim, EveryByteIsCountedOnEveryLinkItCrosses) {
  for (bool topology : {false, true}) {
    const NodeSimInput in = dgx1_input(topology);
    const NodeSimResult r = simulate_node(in);
    const size_t n = in.ranks.size();
    std::vector<double> out(in.links.size(), 0), back(in.links.size(), 0);
    double bucket_bytes = 0;
    for (const SimBucket& b : in.buckets) bucket_bytes += static_cast<double>(b.bytes);
    const double hop = 2.0 * static_cast<double>(n - 1) / static_cast<double>(n) * bucket_bytes;
    for (size_t k = 0; k < n; ++k) {
      double up = 0, down = 0;
      for (const SimTransfer& t : in.ranks[k].transfers)
        (t.to_host ? up : down) += static_cast<double>(t.bytes);
      EXPECT_NEAR(r.ranks[k].copy_bytes, up + down, 1e-6 * (up + down));
      for (int l : in.ranks[k].path) {
        out[static_cast<size_t>(l)] += up;
        back[static_cast<size_t>(l)] += down;
      }
      for (int l : in.ring[k].up) out[static_cast<size_t>(l)] += hop;
      for (int l : in.ring[k].down) back[static_cast<size_t>(l)] += hop;
    }
    EXPECT_NEAR(r.allreduce_bytes, hop, 1e-6 * hop);
    for (size_t l = 0; l < in.links.size(); ++l) {
      EXPECT_NEAR(r.links[l].to_host_bytes, out[l], 1e-6 * out[l] + 1) << in.links[l].name;
      EXPECT_NEAR(r.links[l].to_device_bytes, back[l], 1e-6 * back[l] + 1) << in.links[l].name;
      // No link carries more than its capacity allows over the step.
      const double seconds = r.step_seconds;
      EXPECT_LE(r.links[l].to_host_bytes,
                in.links[l].capacity.to_host_gbps * 1e9 * seconds * 1.0001);
    }
  }
}

TEST(NodeSim, GpusUnderOneSwitchShareItsUplink) {
  // Eight GPUs alone would each take a full link; two per switch uplink must each get half of
  // it when they copy at once, so the job is slower than one GPU alone.
  NodeSimInput all = dgx1_input(false);
  all.ring.clear();
  all.buckets.clear();
  NodeSimInput one = all;
  one.ranks.resize(1);
  const NodeSimResult a = simulate_node(all), b = simulate_node(one);
  EXPECT_GT(a.step_seconds, 1.2 * b.step_seconds);
  EXPECT_GT(a.stall_seconds, b.stall_seconds);
}

TEST(NodeSim, ArbitratedLinksCarryOneChunkPerDirectionAtATime) {
  // Under the topology scheduler a switch uplink carries one chunk per direction at a time, so
  // the two GPUs under a switch never move in the same direction at once; under fifo they do.
  for (bool topology : {true, false}) {
    NodeSimInput in = dgx1_input(topology);
    // Copies alone: a hop between the two GPUs of a switch takes their own links, not the
    // switch's, and would run beside the other GPU's copy.
    in.ring.clear();
    in.buckets.clear();
    const NodeSimResult r = simulate_node(in);
    ASSERT_FALSE(r.samples.empty());
    // GPU uplink of each rank, keyed by the switch uplink above it.
    std::map<int, std::vector<int>> under;
    for (const SimRank& k : in.ranks) under[k.path[1]].push_back(k.path[0]);
    std::map<double, std::map<int, SimLinkSample>> at;
    for (const SimLinkSample& s : r.samples) {
      const LinkCapacity& c = in.links[static_cast<size_t>(s.link)].capacity;
      EXPECT_LE(s.to_host_gbps, c.to_host_gbps * (1 + 1e-9));
      EXPECT_LE(s.to_device_gbps, c.to_device_gbps * (1 + 1e-9));
      at[s.at][s.link] = s;
    }
    int together = 0;
    for (const auto& [t, links] : at) {
      for (const auto& [sw, gpus] : under) {
        ASSERT_EQ(gpus.size(), 2u);
        const SimLinkSample& a = links.at(gpus[0]);
        const SimLinkSample& b = links.at(gpus[1]);
        together += (a.to_host_gbps > 0 && b.to_host_gbps > 0) ||
                    (a.to_device_gbps > 0 && b.to_device_gbps > 0);
      }
    }
    if (topology) {
      EXPECT_EQ(together, 0);
    } else {
      EXPECT_GT(together, 0);
    }
  }
}

TEST(NodeSim, AnAllReduceHopTakesEachLinksOwnSideAsOneFlow) {
  // GPU0's link A (10 GB/s) and GPU1's link B (2 GB/s). Hop 0 goes up A and down B, so B's
  // to-device side holds it at 2 GB/s; GPU0's offload shares A's to-host side with it and gets
  // the other 8 GB/s. (Two flows, one per half, would split A 5/5 and leave 3 GB/s idle.)
  NodeSimInput in;
  in.links = {{"A", {10, 10, 1.0}}, {"B", {2, 2, 1.0}}};
  SimRank r0{"GPU0", {1e-6, 1e-6}, {}, {{true, 8'000'000'000ull, 0, 1}}, {0}};
  SimRank r1{"GPU1", {1e-6, 1e-6}, {}, {}, {1}};
  in.ranks = {r0, r1};
  in.buckets = {{2'000'000'000ull, 0}};  // 2 GB per hop (2 ranks: 2 (n-1) / n = 1)
  in.ring = {{{0}, {1}}, {{1}, {0}}};
  const NodeSimResult r = simulate_node(in);
  EXPECT_NEAR(r.step_seconds, 1.0, 1e-3);  // offload and hops all end at 1 s
  EXPECT_NEAR(r.links[0].to_host_bytes, 10e9, 1e3);
  EXPECT_NEAR(r.links[1].to_device_bytes, 2e9, 1e3);
}

// Two GPUs, each alone on its link (10 GB/s each way); hop 0 goes up GPU0's link and down
// GPU1's, hop 1 back. A bucket of `bucket` bytes is ready after step 0; the update is the last
// step.
NodeSimInput two_gpus(std::vector<double> steps0, std::vector<double> steps1, uint64_t bucket) {
  NodeSimInput in;
  in.links = {{"A", {10, 10, 1.0}}, {"B", {10, 10, 1.0}}};
  in.ranks = {SimRank{"GPU0", std::move(steps0), {}, {}, {0}},
              SimRank{"GPU1", std::move(steps1), {}, {}, {1}}};
  in.buckets = {{bucket, 0}};
  in.ring = {{{0}, {1}}, {{1}, {0}}};
  return in;
}

TEST(NodeSim, UnderTopologyAnAllReduceDueNowGoesBeforeAnOffloadNothingWaitsFor) {
  // GPU0 offloads 8 GB that nothing waits for while the 2 GB bucket (2 GB per hop for 2 ranks)
  // is needed at once by the update. Under fifo hop 0 shares A's to-host side with the offload
  // (5 GB/s, 0.4 s); under topology it takes A alone (10 GB/s, 0.2 s) and the offload waits.
  NodeSimInput in = two_gpus({1e-6, 1e-6}, {1e-6, 1e-6}, 2'000'000'000ull);
  in.ranks[0].transfers = {{true, 8'000'000'000ull, -1, -1}};
  const NodeSimResult fifo = simulate_node(in);
  in.topology_scheduler = true;
  const NodeSimResult topology = simulate_node(in);
  EXPECT_NEAR(fifo.step_seconds, 0.4, 1e-3);
  EXPECT_NEAR(topology.step_seconds, 0.2, 2e-3);  // after at most the offload's first chunk
  // The offload still moves every byte, after the all-reduce.
  EXPECT_NEAR(topology.ranks[0].copy_bytes, 8e9, 1);
  EXPECT_NEAR(topology.links[0].to_host_bytes, 10e9, 1);
}

TEST(NodeSim, UnderTopologyAPrefetchDueNowGoesBeforeAnAllReduceWithTimeToSpare) {
  // GPU1 prefetches 2 GB for step 1 while the 2 GB bucket, needed only by the update after a
  // 1 s step, goes down the same side of B. Under fifo they share it and GPU1 waits 0.4 s;
  // under topology the prefetch goes first (0.2 s) and the all-reduce hides under step 1.
  NodeSimInput in = two_gpus({1e-6, 1.0, 1e-6}, {1e-6, 1.0, 1e-6}, 2'000'000'000ull);
  in.ranks[1].transfers = {{false, 2'000'000'000ull, -1, 1}};
  const NodeSimResult fifo = simulate_node(in);
  in.topology_scheduler = true;
  const NodeSimResult topology = simulate_node(in);
  EXPECT_NEAR(fifo.ranks[1].stall_seconds, 0.4, 1e-3);
  EXPECT_NEAR(topology.ranks[1].stall_seconds, 0.2, 2e-3);
  EXPECT_NEAR(topology.step_seconds, 1.2, 3e-3);
  EXPECT_NEAR(topology.links[1].to_device_bytes, 4e9, 1);
}

TEST(NodeSim, UnderTopologyAnUrgentCopyIsNotStarvedByHopsAndCopiesTakingItsLinksInTurn) {
  // GPUs 0 and 1 under one switch S (Note [Claims that need several links at once] in
  // links/arbiter_policy.h). GPU0 streams a 4 GB prefetch for step 2 over S; when the bucket
  // becomes ready, GPU1 asks for a 1 GB prefetch for its next step, the most urgent claim. Its
  // claim must wait for S (GPU0's chunk), while hop 0 wants GPU1's link: unless the claim holds
  // that link, hop 0 takes it, then GPU0 takes S again, and GPU1 waits for all of GPU0's copy.
  NodeSimInput in;
  in.links = {{"G0", {10, 10, 1.0}}, {"G1", {10, 10, 1.0}}, {"S", {10, 10, 1.0}}};
  in.ranks = {
      SimRank{"GPU0", {1e-6, 1.0, 1.0, 1e-6}, {}, {{false, 4'000'000'000ull, -1, 2}}, {0, 2}},
      SimRank{"GPU1", {0.01, 1.0, 1.0, 1e-6}, {}, {{false, 1'000'000'000ull, 0, 1}}, {1, 2}}};
  in.buckets = {{4'000'000'000ull, 0}};
  in.ring = {{{0}, {1}}, {{1}, {0}}};
  in.topology_scheduler = true;
  const NodeSimResult r = simulate_node(in);
  // Its own 0.1 s, after at most one of GPU0's 4 MB chunks.
  EXPECT_NEAR(r.ranks[1].stall_seconds, 0.1, 2e-3);
  EXPECT_NEAR(r.links[2].to_device_bytes, 5e9, 1);
}

TEST(NodeLinks, TopologyDuplexFactorAppliesWhereNoProfileStatesOne) {
  const Topology topo =
      load_topology(std::string(FERRY_SOURCE_DIR) + "/configs/topologies/dgx1-like.yaml");
  const auto bindings = place_ranks(topo, 4);
  for (const NamedLink& l : node_links(topo, bindings, nullptr, {}, 0.8).links)
    EXPECT_DOUBLE_EQ(l.capacity.duplex_factor, 0.8) << l.name;
  HardwareProfile p;
  p.gpu_link = {12, 12, 1.0};
  p.nominal_gbps = 15.75;
  const NodeLinks unstated = node_links(topo, bindings, &p, {}, 0.8);
  p.duplex_given = true;
  p.gpu_link.duplex_factor = 0.9;
  const NodeLinks stated = node_links(topo, bindings, &p, {}, 0.8);
  for (size_t l = 0; l < unstated.links.size(); ++l) {
    const bool pcie = unstated.kinds[l] != "root-complex" && unstated.kinds[l] != "inter-socket";
    EXPECT_DOUBLE_EQ(unstated.links[l].capacity.duplex_factor, pcie ? 0.8 : 1.0)
        << unstated.links[l].name;
    EXPECT_DOUBLE_EQ(stated.links[l].capacity.duplex_factor, pcie ? 0.9 : 1.0)
        << stated.links[l].name;
  }
}

TEST(NodeSim, BadInputIsAnError) {
  NodeSimInput in = dgx1_input(false);
  in.ranks[0].path.push_back(999);
  EXPECT_THROW(simulate_node(in), std::invalid_argument);
  in = dgx1_input(false);
  in.links[in.ranks[0].path[0]].capacity.to_host_gbps = 0;
  EXPECT_THROW(simulate_node(in), std::invalid_argument);
  in = dgx1_input(false);
  in.ring.pop_back();
  EXPECT_THROW(simulate_node(in), std::invalid_argument);
}

}  // namespace
}  // namespace ferry
