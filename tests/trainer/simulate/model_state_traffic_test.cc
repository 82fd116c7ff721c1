// memory.zero and memory.optimizer in `trainer simulate` (Note [Model state on the node] in
// sim/node_sim.h): add_model_state_traffic leaves zero 0 on the device untouched, turns the
// all-reduce into reduce-scatters of the same buckets and all-gathers of the same total, and
// adds the host optimizer's copies (its shard each way) and update; through the CLI the volumes
// equal the formula (reduce-scatter + all-gather = all-reduce; 4 bytes per parameter of the
// rank's shard each way), the copies cross the links, topology is no slower than fifo, and zero
// 0 prints what it printed before; the device update streams its shard's bytes at the memory rate.
#include "trainer/simulate/model_state_traffic.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <numeric>

#include "tests/trainer/integration/run_util.h"

namespace ferry {
namespace {

// Two ranks of 5 steps (load, 2 forward, backward, update) with 3 gradient buckets, each GPU on
// a link of its own (10 GB/s each way), the ring's hops between them.
NodeSimInput node() {
  NodeSimInput in;
  in.links = {{"G0", {10, 10, 1.0}}, {"G1", {10, 10, 1.0}}};
  in.ring = {{{0}, {1}}, {{1}, {0}}};
  for (int r = 0; r < 2; ++r) {
    SimRank rank;
    rank.name = "GPU" + std::to_string(r);
    rank.path = {r};
    rank.step_seconds = {0.001, 0.1, 0.1, 0.2, 0.002};
    rank.transfers = {{true, 1000, 1, 3}};  // an activation offload
    in.ranks.push_back(rank);
  }
  in.buckets = {{3000, 3}, {5000, 3}, {1000, 3}};
  in.buckets[0].ready_after = 2;
  return in;
}

ModelState state(ZeroStage zero, OptimizerPlacement where, int ranks) {
  ModelStateInputs in;
  in.param_bytes = 9024;  // 2256 floats
  in.largest_param = 4096;
  in.bucket_bytes = 4096;
  in.slots = 2;
  in.ranks = ranks;
  return model_state(in, {zero, where});
}

ModelStateSteps steps() {
  ModelStateSteps s;
  s.first_forward = 1;
  s.bucket_bytes = 1024;
  s.slots = 2;
  s.host_update_gbps = 1;
  return s;
}

uint64_t sum(const std::vector<SimBucket>& buckets, SimCollective kind) {
  uint64_t n = 0;
  for (const SimBucket& b : buckets) n += b.collective == kind ? b.bytes : 0;
  return n;
}

TEST(ModelStateTraffic, ZeroZeroOnTheDeviceChangesNothing) {
  NodeSimInput in = node();
  const ModelStateTraffic t =
      add_model_state_traffic(in, state(ZeroStage::k0, OptimizerPlacement::kDevice, 2), 2, steps());
  EXPECT_FALSE(t.active());
  const NodeSimInput before = node();
  ASSERT_EQ(in.buckets.size(), before.buckets.size());
  for (size_t b = 0; b < in.buckets.size(); ++b) {
    EXPECT_EQ(in.buckets[b].bytes, before.buckets[b].bytes);
    EXPECT_EQ(in.buckets[b].ready_after, before.buckets[b].ready_after);
    EXPECT_EQ(in.buckets[b].collective, SimCollective::kAllReduce);
  }
  EXPECT_EQ(in.ranks[0].transfers.size(), 1u);
  EXPECT_EQ(in.ranks[0].step_seconds, before.ranks[0].step_seconds);
}

TEST(ModelStateTraffic, ShardingReduceScattersTheBucketsAndAllGathersTheirTotal) {
  for (ZeroStage zero : {ZeroStage::k1, ZeroStage::k2}) {
    NodeSimInput in = node();
    add_model_state_traffic(in, state(zero, OptimizerPlacement::kDevice, 2), 2, steps());
    // All-gathers first (2 ranks x 1024-byte pieces = 2048 per bucket), then the buckets.
    ASSERT_EQ(in.buckets.size(), 5u + 3u);  // 9000 = 4 x 2048 + 808
    for (size_t b = 0; b < 5; ++b) {
      EXPECT_EQ(in.buckets[b].collective, SimCollective::kAllGather);
      EXPECT_EQ(in.buckets[b].bytes, b < 4 ? 2048u : 808u);
      EXPECT_EQ(in.buckets[b].ready_after, -1);
      EXPECT_EQ(in.buckets[b].needed_before, 1);
    }
    EXPECT_EQ(sum(in.buckets, SimCollective::kReduceScatter), 9000u);
    EXPECT_EQ(sum(in.buckets, SimCollective::kAllGather), 9000u);
    // Zero 2 reduces as backward completes a bucket, zero 1 after backward (step 3).
    EXPECT_EQ(in.buckets[5].ready_after, zero == ZeroStage::k2 ? 2 : 3);
    EXPECT_EQ(in.buckets[5].needed_before, -1);
    EXPECT_EQ(in.ranks[0].transfers.size(), 1u) << "no host copies on the device optimizer";
  }
}

TEST(ModelStateTraffic, TheHostOptimizerMovesItsShardEachWayAndUpdatesOnTheHost) {
  NodeSimInput in = node();
  const ModelState s = state(ZeroStage::k2, OptimizerPlacement::kHost, 2);
  const ModelStateTraffic t = add_model_state_traffic(in, s, 2, steps());
  const uint64_t shard = s.shard_floats * 4;  // 1152 floats
  EXPECT_EQ(shard, 4608u);
  EXPECT_EQ(t.to_host_bytes, shard);
  EXPECT_EQ(t.to_device_bytes, shard);
  // (2 slots + 3) x 4608 bytes at 1 GB/s.
  EXPECT_DOUBLE_EQ(t.host_update_seconds, 7.0 * 4608 / 1e9);
  for (const SimRank& r : in.ranks) {
    EXPECT_DOUBLE_EQ(r.step_seconds.back(), t.host_update_seconds);
    ASSERT_EQ(r.transfer_after_bucket.size(), r.transfers.size());
    ASSERT_EQ(r.bucket_after_transfer.size(), in.buckets.size());
    uint64_t up = 0, down = 0;
    for (size_t i = 1; i < r.transfers.size(); ++i) {
      const SimTransfer& x = r.transfers[i];
      const int bucket = r.transfer_after_bucket[i];
      if (x.to_host) {
        down += x.bytes;
        ASSERT_GE(bucket, 5);  // a reduce-scatter's
        EXPECT_EQ(in.buckets[static_cast<size_t>(bucket)].collective,
                  SimCollective::kReduceScatter);
        EXPECT_EQ(x.wait_before, 4);  // the update
      } else {
        up += x.bytes;
        EXPECT_EQ(bucket, -1);
        EXPECT_EQ(x.wait_before, 1);
      }
    }
    EXPECT_EQ(down, shard);
    EXPECT_EQ(up, shard);
    EXPECT_EQ(r.transfer_after_bucket[0], -1) << "the activation offload keeps its step";
    // Each all-gather waits for an upload of its piece.
    for (size_t b = 0; b < 5; ++b) {
      const int i = r.bucket_after_transfer[b];
      ASSERT_GE(i, 1);
      EXPECT_FALSE(r.transfers[static_cast<size_t>(i)].to_host);
    }
    for (size_t b = 5; b < in.buckets.size(); ++b) EXPECT_EQ(r.bucket_after_transfer[b], -1);
  }
  // The trace names the model state's copies apart from the activations'.
  in.trace = true;
  int gradients = 0, parameters = 0, offloads = 0;
  for (const SimSpan& span : simulate_node(in).spans) {
    if (span.track != 1 && span.track != 2) continue;  // GPU0's copies
    gradients += span.name.rfind("gradients ", 0) == 0;
    parameters += span.name.rfind("parameters ", 0) == 0;
    offloads += span.name.rfind("offload ", 0) == 0;
  }
  EXPECT_EQ(gradients, 3);   // one per reduce-scatter
  EXPECT_EQ(parameters, 5);  // one per all-gather piece
  EXPECT_EQ(offloads, 1);
}

TEST(ModelStateTraffic, ZeroZeroWithTheHostOptimizerMovesTheWholeBlock) {
  NodeSimInput in = node();
  const ModelState s = state(ZeroStage::k0, OptimizerPlacement::kHost, 2);
  const ModelStateTraffic t = add_model_state_traffic(in, s, 2, steps());
  EXPECT_EQ(t.to_host_bytes, 9024u);
  EXPECT_EQ(t.to_device_bytes, 9024u);
  EXPECT_EQ(sum(in.buckets, SimCollective::kAllReduce), 9000u);
  uint64_t up = 0;
  for (const SimTransfer& x : in.ranks[1].transfers) up += x.to_host ? 0 : x.bytes;
  EXPECT_EQ(up, 9024u);
}

// Note [The device update's cost]: (2 slots + 3) fp32 values per parameter the rank updates (its
// shard under zero 1 and 2), plus a bf16 working copy of the whole block under bf16, streamed at
// the memory rate on top of the update step's launch cost.
TEST(ModelStateTraffic, TheDeviceUpdateStreamsItsShardsValuesAtTheMemoryRate) {
  const ModelState whole = state(ZeroStage::k0, OptimizerPlacement::kDevice, 2);  // 2256 floats
  EXPECT_EQ(device_update_bytes(whole, 2, false), 2256u * 28);  // AdamW: 4 read, 3 written
  EXPECT_EQ(device_update_bytes(whole, 1, false), 2256u * 20);  // SGD with momentum
  EXPECT_EQ(device_update_bytes(whole, 0, false), 2256u * 12);  // plain SGD
  EXPECT_EQ(device_update_bytes(whole, 2, true), 2256u * 28 + 2256u * 2);
  for (ZeroStage zero : {ZeroStage::k1, ZeroStage::k2}) {
    const ModelState sharded = state(zero, OptimizerPlacement::kDevice, 2);  // S = 1152 floats
    EXPECT_EQ(device_update_bytes(sharded, 2, false), 1152u * 28);
    EXPECT_EQ(device_update_bytes(sharded, 2, true), 1152u * 28 + 2u * 1152 * 2);
  }
  const ModelState one = state(ZeroStage::k2, OptimizerPlacement::kDevice, 1);  // nothing to shard
  EXPECT_EQ(device_update_bytes(one, 2, false), 2256u * 28);

  NodeSimInput in = node();
  EXPECT_DOUBLE_EQ(add_device_update(in.ranks, in.update_step, 63'168, 2), 63'168 / 2e9);
  for (const SimRank& r : in.ranks) {
    EXPECT_DOUBLE_EQ(r.step_seconds.back(), 0.002 + 63'168 / 2e9);
    EXPECT_DOUBLE_EQ(r.step_seconds[3], 0.2) << "only the update step";
  }
  in = node();
  add_device_update(in.ranks, 3, 1'000'000, 1);
  EXPECT_DOUBLE_EQ(in.ranks[1].step_seconds[3], 0.2 + 1e-3);
  EXPECT_DOUBLE_EQ(in.ranks[1].step_seconds[4], 0.002);
  EXPECT_EQ(add_device_update(in.ranks, 3, 0, 1), 0.0);
}

// Through the CLI, on 4 GPUs of the DGX-1-like server (v100-pcie3).
nlohmann::json simulate(const std::string& args) {
  const testing::Exit e =
      testing::run("cd " + std::string(FERRY_SOURCE_DIR) + " && " + testing::trainer() +
                   " simulate configs/simulate/gpt2-medium-dgx1.yaml --hardware v100-pcie3 "
                   "--gpus 4 " +
                   args);
  EXPECT_EQ(e.code, 0) << args << "\n" << e.output;
  if (e.code != 0 || args.find("--json") == std::string::npos) return {{"text", e.output}};
  return nlohmann::json::parse(e.output);
}

TEST(SimulateModelState, VolumesEqualTheFormula) {
  const std::string none = " --json memory.policy=none memory.budget=0 device.memory=1TiB ";
  const nlohmann::json z0 = simulate(none);
  ASSERT_TRUE(z0.contains("allreduce_bytes"));
  const double all_reduce = z0["allreduce_bytes"].get<double>();
  EXPECT_GT(all_reduce, 0);
  for (const char* zero : {"1", "2"}) {
    for (const char* where : {"device", "host"}) {
      const nlohmann::json j =
          simulate(none + "memory.zero=" + zero + " memory.optimizer=" + where);
      ASSERT_TRUE(j.contains("model_state")) << zero << " " << where;
      const nlohmann::json& m = j["model_state"];
      EXPECT_EQ(m["ranks"].get<int>(), 4);
      EXPECT_EQ(j["allreduce_bytes"].get<double>(), 0);
      // Reduce-scatter and all-gather: (R-1)/R of the block each, an all-reduce's 2(R-1)/R.
      EXPECT_NEAR(m["reduce_scatter_bytes"].get<double>(), all_reduce / 2, 1e-9 * all_reduce);
      EXPECT_NEAR(m["all_gather_bytes"].get<double>(), all_reduce / 2, 1e-9 * all_reduce);
      // The host optimizer: 4 bytes per parameter of the rank's shard each way.
      const uint64_t shard = m["weights_bytes"].get<uint64_t>() / 4;
      const bool host = std::string(where) == "host";
      EXPECT_EQ(m["to_host_bytes"].get<uint64_t>(), host ? shard : 0);
      EXPECT_EQ(m["to_device_bytes"].get<uint64_t>(), host ? shard : 0);
      // policy none moves no activations: every rank's copies are the model state's.
      for (const auto& r : j["ranks"])
        EXPECT_NEAR(r["copy_bytes"].get<double>(), host ? 2.0 * shard : 0.0, 1.0) << r["name"];
      if (host) {
        // (2 slots + 3) x shard at the profile's host.update_gbps (15); slots from the host
        // bytes (slots + 2 shards).
        const double slots = static_cast<double>(m["host_bytes"].get<uint64_t>()) / shard - 2;
        EXPECT_NEAR(m["host_update_s"].get<double>(), (2 * slots + 3) * shard / 15e9, 1e-12);
      }
    }
  }
  const nlohmann::json h0 = simulate(none + "memory.optimizer=host");
  ASSERT_TRUE(h0.contains("model_state"));
  EXPECT_EQ(h0["allreduce_bytes"].get<double>(), all_reduce);
  EXPECT_EQ(h0["model_state"]["to_host_bytes"].get<uint64_t>(),
            h0["model_state"]["weights_bytes"].get<uint64_t>());  // the whole block
}

// The device update through the CLI: the rank's shard's (2 slots + 3) values at the profile's
// memory rate (v100-pcie3: 750 GB/s), in the JSON and the text; bf16 (h100-pcie5, 3000 GB/s) adds
// the working copy; the host optimizer has none.
TEST(SimulateModelState, TheDeviceUpdateIsTheShardsBytesAtTheProfilesMemoryRate) {
  const std::string none =
      " --json memory.policy=none memory.budget=0 device.memory=1TiB optim.name=adamw ";
  const nlohmann::json z2 = simulate(none + "memory.zero=2");
  ASSERT_TRUE(z2.contains("device_update") && z2.contains("model_state")) << z2.dump();
  const nlohmann::json& m = z2["model_state"];
  const uint64_t shard = m["weights_bytes"].get<uint64_t>() / 4;  // 4 ranks
  const uint64_t slots = m["optimizer_bytes"].get<uint64_t>() / shard;
  EXPECT_EQ(slots, 2u) << "AdamW";
  // SGD with momentum (the default) keeps one slot: 5 values per parameter.
  const nlohmann::json sgd = simulate(
      " --json memory.policy=none memory.budget=0 device.memory=1TiB memory.zero=2 "
      "optim.momentum=0.9");
  EXPECT_EQ(sgd["device_update"]["bytes"].get<uint64_t>(), 5 * shard);
  const nlohmann::json& u = z2["device_update"];
  EXPECT_EQ(u["bytes"].get<uint64_t>(), (2 * slots + 3) * shard);
  EXPECT_EQ(u["memory_gbps"].get<double>(), 750);
  EXPECT_NEAR(u["s"].get<double>(), static_cast<double>((2 * slots + 3) * shard) / 750e9, 1e-15);
  // Zero 0 updates the whole block: four times the shard's bytes (up to the shards' padding).
  const nlohmann::json z0 = simulate(none);
  EXPECT_NEAR(z0["device_update"]["bytes"].get<double>(), 4.0 * u["bytes"].get<double>(),
              4.0 * 64 * 28);
  EXPECT_FALSE(simulate(none + "memory.zero=2 memory.optimizer=host").contains("device_update"));
  const std::string text = simulate("memory.zero=2")["text"];
  EXPECT_NE(text.find("optimizer update on the device: "), std::string::npos) << text;

  const testing::Exit bf16 = testing::run(
      "cd " + std::string(FERRY_SOURCE_DIR) + " && " + testing::trainer() +
      " simulate configs/simulate/gpt2-medium-dgx1.yaml --hardware h100-pcie5 --gpus 4" + none +
      "memory.zero=2 device.precision=bf16");
  ASSERT_EQ(bf16.code, 0) << bf16.output;
  const nlohmann::json b = nlohmann::json::parse(bf16.output);
  // The masters are sharded under bf16 (Note [Sharded master weights]): the shard's update and
  // its rounding into the working copy.
  const uint64_t bf16_shard = b["model_state"]["optimizer_bytes"].get<uint64_t>() / slots;
  EXPECT_EQ(b["device_update"]["bytes"].get<uint64_t>(),
            (2 * slots + 3) * bf16_shard + bf16_shard / 2)
      << "the shard's update and its bf16 rounding";
  EXPECT_EQ(b["device_update"]["memory_gbps"].get<double>(), 3000);
}

TEST(SimulateModelState, ZeroZeroOnTheDevicePrintsWhatItDidBefore) {
  const nlohmann::json plain = simulate("--json");
  const nlohmann::json stated = simulate("--json memory.zero=0 memory.optimizer=device");
  EXPECT_FALSE(plain.contains("model_state"));
  EXPECT_EQ(plain, stated);
  const std::string text = simulate("memory.zero=0")["text"];
  EXPECT_EQ(text.find("model state"), std::string::npos) << text;
  const std::string zero2 = simulate("memory.zero=2 memory.optimizer=host")["text"];
  EXPECT_NE(zero2.find("model state: zero 2 + host optimizer on 4 ranks"), std::string::npos)
      << zero2;
  EXPECT_NE(zero2.find("reduce-scatter"), std::string::npos) << zero2;
}

TEST(SimulateModelState, TopologyIsNoSlowerThanFifo) {
  for (const char* s : {"memory.zero=1", "memory.zero=2", "memory.zero=2 memory.optimizer=host",
                        "memory.optimizer=host"}) {
    const double fifo = simulate(std::string("--json --scheduler fifo ") + s)["step_s"];
    const double topology = simulate(std::string("--json --scheduler topology ") + s)["step_s"];
    EXPECT_LE(topology, fifo * (1 + 1e-9)) << s;
  }
}

}  // namespace
}  // namespace ferry
