// optim.accumulate (issue 30): 4 micro-batches of 8 equal one step of 32 for models without
// batch norm (LeNet-5 and a tiny GPT) within float reassociation, on one rank and on two; one
// gradient reduction per update (counted by the buckets); one metrics.jsonl line per update;
// a resumed run continues with the same losses; vdnn-all in poison mode is bitwise like none;
// 0 and -1 are refused with exit 2. The same with memory.zero 1 and 2 and the host optimizer on
// one rank and two; zero 2's staged gradients reduce-scatter every micro-batch into the shard (4
// reductions per update, Note [Reduce and update by shard]).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

// Tolerances, from the measured differences (printed by each test; 2026-11-28, 6 updates: loss
// 5.2e-8 LeNet-5 and 4.3e-8 GPT, parameters 1.3e-7 LeNet-5 and 2.6e-7 GPT, the same on 2 ranks):
// summing four partial gradients instead of one GEMM over 32 rows reassociates float sums, and
// SGD with momentum carries the difference over the updates. About 10x the measured.
constexpr double kLossRel = 5e-7;
constexpr double kParamRel = 2e-6;

// Every logged step's loss, in order.
std::vector<double> losses(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  }
  return out;
}

nlohmann::json summary(const std::string& dir) {
  std::ifstream in(dir + "/summary.json");
  return nlohmann::json::parse(in);
}

// max |a - b| / max |b| over each parameter tensor of two checkpoints, the largest of them.
double max_param_rel(const std::string& a, const std::string& b) {
  const auto pa = parameters(a), pb = parameters(b);
  EXPECT_EQ(pa.size(), pb.size());
  double worst = 0;
  for (const auto& [name, va] : pa) {
    const auto& vb = pb.at(name);
    double scale = 1e-12, err = 0;
    for (size_t i = 0; i < va.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(vb[i])));
      err = std::max(err, static_cast<double>(std::fabs(va[i] - vb[i])));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

double max_loss_rel(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(std::fabs(b[i]), 1e-12));
  }
  return worst;
}

constexpr int kSteps = 6;

std::string lenet_args(const std::string& dir) {
  return " train " + std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml run.dir=" + dir +
         " run.steps=" + std::to_string(kSteps) +
         " run.log_every=1 optim.schedule=cosine optim.warmup_steps=2 optim.lr=0.05 "
         "data.samples=512 memory.measure=false checkpoint.every=" +
         std::to_string(kSteps) + " checkpoint.dir=" + dir + "/ckpt";
}

// A tiny GPT (2 layers, width 64, context 32, no dropout) on a token file of its own. SGD: AdamW
// divides by sqrt(v), so near-zero gradients that differ in their last bits move parameters by
// up to 5e-4 relative (measured: 5.5e-4 after 6 updates, losses still within 5e-8), as in
// data_parallel_test.
std::string gpt_args(const std::string& dir) {
  static const std::string data = [] {
    const std::string d = scratch("accumulate_tokens");
    std::ofstream out(d + "/train.bin", std::ios::binary);  // nanoGPT's headerless uint16
    uint32_t x = 777;
    for (int i = 0; i < 20000; ++i) {
      x = x * 1664525u + 1013904223u;
      const uint16_t token = static_cast<uint16_t>((x >> 16) % 256);
      out.write(reinterpret_cast<const char*>(&token), sizeof(token));
    }
    return d;
  }();
  return " train " + std::string(FERRY_SOURCE_DIR) + "/configs/gpt_text.yaml run.dir=" + dir +
         " run.steps=" + std::to_string(kSteps) + " run.log_every=1 data.path=" + data +
         "/train.bin data.val_path= optim.name=sgd optim.momentum=0.9 optim.weight_decay=0.01 "
         "optim.schedule=cosine optim.warmup_steps=2 optim.lr=0.05 "
         "model.context=32 model.layers=2 model.width=64 model.heads=2 memory.measure=false "
         "checkpoint.every=" +
         std::to_string(kSteps) + " checkpoint.dir=" + dir + "/ckpt";
}

std::string ckpt(const std::string& dir) {
  return dir + "/ckpt/step_" + std::to_string(kSteps) + ".safetensors";
}

// One update of `accumulate` x 8 against one step of 8 x `accumulate` (per rank), `ranks` ranks.
// `reductions`: gradient reductions per update (4 when zero 2 stages its gradients); `overlap`:
// buckets are launched while backward runs (not zero 1's, which reduces after backward).
void expect_equal_to_one_large_batch(const std::string& name,
                                     const std::function<std::string(const std::string&)>& args,
                                     int ranks, const std::string& extra, int reductions = 1,
                                     bool overlap = true) {
  const std::string launcher = ranks > 1 ? mpirun(ranks) : "";
  const std::string big = scratch(name + "_b32");
  Exit e = run(launcher + trainer() + args(big) + " data.batch_size=32 " + extra);
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string acc = scratch(name + "_b8x4");
  e = run(launcher + trainer() + args(acc) + " data.batch_size=8 optim.accumulate=4 " + extra);
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string total = std::to_string(8 * 4 * ranks);
  EXPECT_NE(e.output.find("batch 8 per rank x 4 micro-batches x " + std::to_string(ranks) +
                          (ranks == 1 ? " rank = " : " ranks = ") + total + " per update"),
            std::string::npos)
      << e.output;
  const auto lb = losses(big), la = losses(acc);
  ASSERT_EQ(la.size(), static_cast<size_t>(kSteps)) << "one metrics.jsonl line per update";
  // On several ranks the logged loss is rank 0's own: its micro-batches are its slices of 4
  // consecutive global batches, not the first quarter of one global batch of 4 times the size
  // (the update's samples are the same), so only the parameters compare there.
  const double loss_rel = max_loss_rel(la, lb);
  const double param_rel = max_param_rel(ckpt(acc), ckpt(big));
  std::printf(
      "[%s, %d rank%s] accumulate 4 x 8 vs 1 x 32 over %d updates: max relative diff "
      "loss %.3g, parameters %.3g\n",
      name.c_str(), ranks, ranks == 1 ? "" : "s", kSteps, loss_rel, param_rel);
  if (ranks == 1) EXPECT_LE(loss_rel, kLossRel);
  EXPECT_LE(param_rel, kParamRel);
  // Not trivially equal: the micro-batch path ran (its own plan at batch 8).
  EXPECT_GT(param_rel, 0.0) << "bitwise equal: did the accumulated run take the large batch?";
  // One reduction per update, of the same collectives as the large batch's.
  const auto sa = summary(acc), sb = summary(big);
  EXPECT_EQ(sa["gradient_reductions"].get<int64_t>(), reductions * kSteps) << extra;
  EXPECT_EQ(sa["allreduce_calls"].get<int64_t>(), reductions * sb["allreduce_calls"].get<int64_t>())
      << extra;
  EXPECT_EQ(sa["effective_batch"].get<int64_t>(), 32 * ranks);
  // The accumulation block is planned: the measured peak is the planned one.
  EXPECT_EQ(sa["device_peak_bytes"].get<uint64_t>(), sa["planned_peak_bytes"].get<uint64_t>());
  if (ranks > 1 && overlap) {
    // Overlapped with the last micro-batch's backward: buckets launched before finish().
    EXPECT_GT(sa["overlapped_buckets"].get<int64_t>(), 0);
  }
}

TEST(Accumulate, FourOfEightEqualOneOf32OnLeNet) {
  expect_equal_to_one_large_batch("acc_lenet", lenet_args, 1, "device.threads=1");
}

TEST(Accumulate, FourOfEightEqualOneOf32OnATinyGpt) {
  expect_equal_to_one_large_batch("acc_gpt", gpt_args, 1, "device.threads=1");
}

TEST(Accumulate, TwoRanksFourOfEightEqualOneOf32) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  expect_equal_to_one_large_batch("acc_lenet_np2", lenet_args, 2, "comm.bucket_mb=0.01");
  expect_equal_to_one_large_batch("acc_gpt_np2", gpt_args, 2, "comm.bucket_mb=0.05");
}

TEST(Accumulate, ResumingMidRunContinuesWithTheSameLosses) {
  // 144 samples: 18 micro-batches an epoch, so update 5 straddles the epoch's end.
  const auto args = [](const std::string& dir, int steps, const std::string& resume) {
    return trainer() + " train " + std::string(FERRY_SOURCE_DIR) +
           "/configs/quickstart.yaml run.dir=" + dir + " run.steps=" + std::to_string(steps) +
           " run.log_every=1 data.samples=144 data.batch_size=8 optim.accumulate=4 "
           "memory.measure=false checkpoint.every=3 checkpoint.keep=0 checkpoint.dir=" +
           dir + "/ckpt" + (resume.empty() ? "" : " checkpoint.resume=" + resume);
  };
  const std::string straight = scratch("acc_resume_straight");
  Exit e = run(args(straight, 6, ""));
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string split = scratch("acc_resume_split");
  e = run(args(split, 3, ""));
  ASSERT_EQ(e.code, 0) << e.output;
  e = run(args(split, 6, "latest"));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("at step 3"), std::string::npos) << e.output;
  const auto a = losses(straight), b = losses(split);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u) << "the resumed run appends updates 4-6";
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i], a[i]) << "update " << i + 1;
  expect_same_parameters(split + "/ckpt/step_6.safetensors", straight + "/ckpt/step_6.safetensors",
                         0.0);
}

// data.documents: an update's logged loss is the mean over the real tokens of all its
// micro-batches, so before the first update (same weights) it is the large batch's mean, though
// the micro-batches pad to lengths of their own. (Later updates differ slightly by design: each
// micro-batch divides by its own real tokens, docs/data_parallel.md.)
TEST(Accumulate, DocumentsLogTheMeanOverTheUpdatesRealTokens) {
  const std::string data = scratch("acc_documents_tokens");
  {
    std::ofstream out(data + "/train.bin", std::ios::binary);
    uint32_t x = 99;
    for (int doc = 0; doc < 300; ++doc) {
      x = x * 1664525u + 1013904223u;
      const int length = 3 + static_cast<int>((x >> 16) % 40);
      for (int i = 0; i <= length; ++i) {
        x = x * 1664525u + 1013904223u;
        const uint16_t token = i == length ? 256 : static_cast<uint16_t>((x >> 16) % 256);
        out.write(reinterpret_cast<const char*>(&token), sizeof(token));
      }
    }
  }
  const auto args = [&](const std::string& dir) {
    return gpt_args(dir) + " data.path=" + data +
           "/train.bin data.documents=true data.len_bucket=8 run.steps=2 checkpoint.every=0";
  };
  const std::string big = scratch("acc_documents_b32");
  Exit e = run(trainer() + args(big) + " data.batch_size=32");
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string acc = scratch("acc_documents_b8x4");
  e = run(trainer() + args(acc) + " data.batch_size=8 optim.accumulate=4");
  ASSERT_EQ(e.code, 0) << e.output;
  const auto lb = losses(big), la = losses(acc);
  ASSERT_EQ(la.size(), 2u);
  ASSERT_EQ(lb.size(), 2u);
  {
    std::ifstream in(acc + "/metrics.jsonl");
    std::string line;
    std::getline(in, line);
    EXPECT_TRUE(nlohmann::json::parse(line).contains("tokens_per_s"))
        << "a documents run: " << line;
  }
  std::printf("documents, first update: 4 x 8 %.9g, 1 x 32 %.9g\n", la[0], lb[0]);
  EXPECT_NEAR(la[0], lb[0], kLossRel * lb[0]);
  EXPECT_NEAR(la[1], lb[1], 1e-3 * lb[1]);
}

// The accumulation block is persistent, outside the arena the policies reuse: moving every
// activation (poisoned once released) trains bit for bit like keeping them.
TEST(Accumulate, VdnnAllInPoisonModeIsBitwiseLikeNone) {
  const std::string none = scratch("acc_policy_none");
  Exit e = run(trainer() + lenet_args(none) + " data.batch_size=8 optim.accumulate=4");
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string all = scratch("acc_policy_vdnn_all");
  e = run(trainer() + lenet_args(all) +
          " data.batch_size=8 optim.accumulate=4 memory.policy=vdnn-all memory.debug_poison=true");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(losses(all), losses(none));
  expect_same_parameters(ckpt(all), ckpt(none), 0.0);
}

TEST(Accumulate, ZeroOrNegativeIsRefusedWithExit2) {
  for (const char* n : {"0", "-1"}) {
    const std::string dir = scratch(std::string("acc_bad_") + (n[0] == '-' ? "neg" : "zero"));
    const Exit e = run(trainer() + lenet_args(dir) + " optim.accumulate=" + n);
    expect_user_error(e, "optim.accumulate");
  }
}

// Accumulating beside the host optimizer: the gradients sum in the device's accumulation block,
// the host updates once per update.
TEST(Accumulate, WithTheHostOptimizerEqualsOneOf32) {
  expect_equal_to_one_large_batch("acc_host", lenet_args, 1,
                                  "device.threads=1 memory.optimizer=host");
}

// One rank: memory.zero changes nothing, accumulation runs as zero 0's.
TEST(Accumulate, OneRankWithZeroOneAndTwoEqualsOneOf32) {
  for (const char* zero : {"1", "2"}) {
    expect_equal_to_one_large_batch(std::string("acc_gpt_zero") + zero, gpt_args, 1,
                                    std::string("device.threads=1 memory.zero=") + zero);
  }
}

// Two ranks, the tiny GPT (its zero 2 stages gradients at comm.bucket_mb 0.05: two buckets of
// its largest parameter and the tied embedding are less than the block) and LeNet-5 (whose zero 2
// keeps the block: its largest parameter makes two buckets larger than it).
TEST(Accumulate, TwoRanksWithZeroAndTheHostOptimizerEqualOneOf32) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  expect_equal_to_one_large_batch("acc_gpt_np2_zero1", gpt_args, 2,
                                  "comm.bucket_mb=0.05 memory.zero=1", 1, /*overlap=*/false);
  expect_equal_to_one_large_batch("acc_gpt_np2_zero2", gpt_args, 2,
                                  "comm.bucket_mb=0.05 memory.zero=2", 4);
  expect_equal_to_one_large_batch("acc_gpt_np2_zero2_host", gpt_args, 2,
                                  "comm.bucket_mb=0.05 memory.zero=2 memory.optimizer=host", 4);
  expect_equal_to_one_large_batch("acc_gpt_np2_host", gpt_args, 2,
                                  "comm.bucket_mb=0.05 memory.optimizer=host");
  expect_equal_to_one_large_batch("acc_lenet_np2_zero2", lenet_args, 2,
                                  "comm.bucket_mb=0.01 memory.zero=2");
}

}  // namespace
}  // namespace ferry::testing
