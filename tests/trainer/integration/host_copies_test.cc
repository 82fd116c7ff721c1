// memory.optimizer host's copies (Note [Host copies on the links] in
// trainer/optim/model_state_step.h): a traced step shows the gradients going down and the weights
// going up on the "optimizer d2h" and "optimizer h2d" tracks, one copy down per bucket, every
// float of the rank's range each way; and on a described server under the topology scheduler,
// with no activation offloaded (memory.policy none), the node's link ledger holds the optimizer's
// claims while the job runs, labelled as the optimizer's d2h and h2d, `trainer jobs` shows them
// so (table and --json), and the links carried its bytes; and
// sharing the copy streams with offloads changes no bit.
#include <chrono>
#include <fstream>
#include <future>
#include <map>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "links/link_ledger.h"
#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

std::string quickstart() { return std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml"; }

// Spans of one trace track, and whether the trace names it.
struct Track {
  bool named = false;
  std::vector<nlohmann::json> spans;
};

std::map<std::string, Track> tracks(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  const nlohmann::json j = nlohmann::json::parse(in);
  std::map<int, std::string> names;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name")
      names[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
  }
  std::map<std::string, Track> out;
  for (const auto& [tid, name] : names) out[name].named = true;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const int tid = e["tid"].get<int>();
    out[names.count(tid) ? names[tid] : std::to_string(tid)].spans.push_back(e);
  }
  return out;
}

uint64_t bytes_of(const std::vector<nlohmann::json>& spans, const std::string& prefix) {
  uint64_t b = 0;
  for (const auto& s : spans)
    if (s["name"].get<std::string>().rfind(prefix, 0) == 0) b += s["args"]["bytes"].get<uint64_t>();
  return b;
}

size_t count_of(const std::vector<nlohmann::json>& spans, const std::string& prefix) {
  size_t n = 0;
  for (const auto& s : spans) n += s["name"].get<std::string>().rfind(prefix, 0) == 0;
  return n;
}

// The host weights' bytes of one rank (trainer plan --json): the floats each copy moves.
uint64_t host_weights_bytes(const std::string& dir) {
  const Exit e = run(trainer() + " plan " + quickstart() +
                     " --json memory.measure=false memory.optimizer=host run.dir=" + dir);
  EXPECT_EQ(e.code, 0) << e.output;
  const nlohmann::json j = nlohmann::json::parse(e.output.substr(e.output.find('{')));
  return j["policies"][0]["host_weights_bytes"].get<uint64_t>();
}

std::string traced(const std::string& dir, const std::string& extra) {
  return trainer() + " train " + quickstart() + " run.dir=" + dir +
         " run.steps=3 run.log_every=1 run.trace=true run.trace_steps=[2,3] memory.measure=false "
         "checkpoint.every=0 comm.bucket_mb=0.05 " +
         extra;
}

TEST(HostCopies, TheTraceHasTheOptimizerTracks) {
  // The device optimizer: no optimizer tracks.
  const std::string device = scratch("host_copies_device");
  Exit e = run(traced(device, ""));
  ASSERT_EQ(e.code, 0) << e.output;
  auto t = tracks(device + "/trace_rank0.json");
  EXPECT_FALSE(t.count("optimizer d2h")) << "named only where used";
  EXPECT_FALSE(t.count("optimizer h2d"));

  const std::string host = scratch("host_copies_host");
  e = run(traced(host, "memory.optimizer=host"));
  ASSERT_EQ(e.code, 0) << e.output;
  t = tracks(host + "/trace_rank0.json");
  ASSERT_TRUE(t["optimizer d2h"].named);
  ASSERT_TRUE(t["optimizer h2d"].named);
  const auto& down = t["optimizer d2h"].spans;
  const auto& up = t["optimizer h2d"].spans;
  // The weights' bytes: the host's first copy down of the weights is in step 1, not traced.
  const uint64_t weights = host_weights_bytes(host);
  ASSERT_GT(weights, 0u);
  // Two traced steps: every float of the rank's range down and up in each.
  EXPECT_EQ(bytes_of(down, "gradients"), 2 * weights);
  EXPECT_EQ(bytes_of(up, "weights"), 2 * weights);
  EXPECT_EQ(count_of(down, "weights"), 0u) << "the host keeps its weights after the first step";
  // One copy down per bucket as its reduction ends (0.05 MiB buckets of LeNet-5's 250 KB).
  EXPECT_GE(count_of(down, "gradients"), 2 * 4u);
  for (const auto& s : up) EXPECT_GE(s["args"]["deadline_s"].get<double>(), 0.0);
  // The activations' tracks stay theirs: policy none offloads nothing.
  EXPECT_TRUE(t["device-to-host"].spans.empty());
}

// The optimizer's copies share the copy streams with the activations' offloads and prefetches:
// under zero 2 with the host optimizer on 2 ranks, every policy (memory.debug_poison: space not
// resident is NaN) trains to the bits of `none`, with fifo and with the topology scheduler on a
// described server.
TEST(HostCopies, EveryPolicyUnderZeroTwoWithTheHostOptimizerEqualsNoneBitwise) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  const std::string topology =
      " topology.file=" + std::string(FERRY_SOURCE_DIR) +
      "/configs/topologies/dgx1-like.yaml topology.emulation_scale=50 topology.chunk_mb=0.0625"
      " topology.scheduler=topology";
  const auto train = [&](const std::string& dir, const std::string& extra) {
    const Exit e = run(mpirun(2) + trainer() + " train " + quickstart() + " run.dir=" + dir +
                       " run.steps=6 run.log_every=1 data.batch_size=8 memory.measure=false"
                       " memory.zero=2 memory.optimizer=host memory.debug_poison=true"
                       " comm.bucket_mb=0.05 checkpoint.every=6 checkpoint.dir=" +
                       dir + "/ckpt " + extra);
    EXPECT_EQ(e.code, 0) << extra << "\n" << e.output;
    return dir + "/ckpt/step_6.safetensors";
  };
  const std::string none = train(scratch("host_copies_none"), "memory.policy=none");
  int i = 0;
  for (const std::string extra :
       std::vector<std::string>{"memory.policy=vdnn-all", "memory.policy=vdnn-conv",
                                "memory.policy=vdnn-all" + topology}) {
    const std::string got = train(scratch("host_copies_policy_" + std::to_string(i++)), extra);
    expect_same_parameters(got, none, 0);
  }
}

// A private link ledger base, its blocks removed however the test ends (as shared_links_test).
struct PrivateLinks {
  std::string base = "/ferrytest-hostcopy-" + std::to_string(::getpid());
  ~PrivateLinks() {
    setenv("FERRY_LINK_LEDGER", base.c_str(), 1);
    for (const std::string& n : LinkLedger::node_ledgers()) LinkLedger::unlink(n);
  }
};

TEST(HostCopies, TheLinkLedgerHoldsTheOptimizersClaimsDuringAStep) {
  const PrivateLinks links;
  const std::string saved = getenv("FERRY_LINK_LEDGER") ? getenv("FERRY_LINK_LEDGER") : "";
  const std::string dir = scratch("host_copies_ledger");
  const std::string command =
      "timeout 180 env FERRY_LINK_LEDGER=" + links.base + " " + trainer() + " train " +
      quickstart() + " run.dir=" + dir +
      " run.steps=30 run.log_every=10 checkpoint.every=0 memory.measure=false memory.policy=none"
      " memory.optimizer=host topology.file=" +
      std::string(FERRY_SOURCE_DIR) +
      "/configs/topologies/dgx1-like.yaml topology.emulation_scale=3000 topology.chunk_mb=0.0625"
      " topology.scheduler=topology";
  std::future<Exit> job = std::async(std::launch::async, [&] { return run(command); });
  setenv("FERRY_LINK_LEDGER", links.base.c_str(), 1);
  std::map<std::string, int> seen;    // "claim"/"flow with token" -> snapshots
  std::map<std::string, int> labels;  // their labels -> snapshots
  Exit table, json;
  bool printed = false, printed_json = false;
  while (job.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) {
    const std::vector<std::string> names = LinkLedger::node_ledgers();
    if (names.empty()) continue;
    const std::shared_ptr<LinkLedger> ledger = LinkLedger::open_existing(names[0]);
    if (!ledger) continue;
    bool any = false;
    for (const LedgerLink& l : ledger->snapshot().links) {
      for (const LinkUserEntry& u : l.users) {
        if (u.kind == "claim") ++seen["claim"], any = true;
        if (u.kind == "flow" && u.token) ++seen["token"], any = true;
        if (u.kind == "claim" || u.token) ++labels[u.label];
      }
    }
    // `trainer jobs` labels the claims as the optimizer's, in its table and its JSON.
    if (any && !printed) {
      table = run(trainer() + " jobs");
      printed = table.output.find("claim optimizer ") != std::string::npos ||
                table.output.find("flow  optimizer ") != std::string::npos;
    }
    if (any && !printed_json) {
      json = run(trainer() + " jobs --json");
      const size_t brace = json.output.find('{');
      const nlohmann::json j = brace == std::string::npos
                                   ? nlohmann::json()
                                   : nlohmann::json::parse(json.output.substr(brace), nullptr,
                                                           /*allow_exceptions=*/false);
      if (json.code == 0 && j.is_object() && j.contains("link_ledgers")) {
        for (const auto& l : j["link_ledgers"])
          for (const auto& link : l["links"])
            for (const auto& u : link["users"])
              printed_json |= u["label"].get<std::string>().rfind("optimizer ", 0) == 0;
      }
    }
  }
  const Exit e = job.get();
  ASSERT_EQ(e.code, 0) << e.output;
  // memory.policy none: the only scheduled copies are the optimizer's.
  EXPECT_GT(seen["claim"] + seen["token"], 0) << "the optimizer's copies claim link tokens";
  // ... and the ledger labels every claim and token as the optimizer's, never an activation's.
  EXPECT_GT(labels["optimizer d2h"] + labels["optimizer h2d"], 0);
  for (const auto& [label, n] : labels)
    EXPECT_TRUE(label == "optimizer d2h" || label == "optimizer h2d") << label << " x" << n;
  EXPECT_TRUE(printed) << table.output;
  EXPECT_TRUE(printed_json) << json.output;
  // The ledger's record: the emulated links carried at least every step's weights each way.
  const std::vector<std::string> names = LinkLedger::node_ledgers();
  ASSERT_EQ(names.size(), 1u);
  const std::shared_ptr<LinkLedger> ledger = LinkLedger::open_existing(names[0]);
  ASSERT_TRUE(ledger);
  const auto weights = static_cast<double>(host_weights_bytes(dir));
  double most[2] = {0, 0};
  for (const LinkUsage& u : ledger->usage())
    for (int d = 0; d < 2; ++d) most[d] = std::max(most[d], u.bytes[d]);
  EXPECT_GE(most[0], 29 * weights) << "gradients down";
  EXPECT_GE(most[1], 29 * weights) << "weights up";
  setenv("FERRY_LINK_LEDGER", saved.c_str(), 1);
}

}  // namespace
}  // namespace ferry::testing
