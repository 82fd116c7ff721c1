// Documents of changing length (data.documents, data.pack; issue 18) through the trainer binary:
// a small GPT on generated documents under a budget the longest length cannot meet without moving
// or rebuilding activations, in poison mode. For every length the run saw, the measured device
// peak equals the planned one and is within the budget, and the losses are bitwise those of
// memory.policy none with unlimited memory. More padding changes nothing but the float order.
// Packed rows evaluate every document as padded rows do (each document alone). Under mpirun -np 2
// both ranks train every step at the length one rank draws. `trainer plan` prints a plan per
// length. Bad keys: one error line, exit 2.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "tests/trainer/integration/run_metrics.h"
#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

constexpr int kSeparator = 256;  // scripts/prepare_tokens.py's bytes separator; vocab 257

// An llm.c token file of `documents` documents, each led by the separator, of 3 to 200 bytes,
// 33 on average (most shorter than the longest row, a few cut at it).
std::string document_file(const std::string& path, int documents, uint32_t seed) {
  std::mt19937 rng(seed);
  std::exponential_distribution<double> length(1.0 / 30);
  std::vector<uint16_t> tokens;
  for (int d = 0; d < documents; ++d) {
    tokens.push_back(kSeparator);
    const int len = 3 + std::min(197, static_cast<int>(length(rng)));
    for (int i = 0; i < len; ++i) {
      tokens.push_back(static_cast<uint16_t>(std::uniform_int_distribution<int>(32, 126)(rng)));
    }
  }
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 256 * 4);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * 2));
  return path;
}

std::string data_dir() {
  static const std::string dir = [] {
    const std::string d = scratch("documents_data");
    document_file(d + "/train.bin", 400, 1);
    document_file(d + "/val.bin", 40, 2);
    return d;
  }();
  return dir;
}

std::string gpt_text() { return std::string(FERRY_SOURCE_DIR) + "/configs/gpt_text.yaml"; }

std::string documents(const std::string& dir, int steps, const std::string& more = "") {
  return trainer() + " train " + gpt_text() + " run.dir=" + dir +
         " run.steps=" + std::to_string(steps) + " run.log_every=1 data.path=" + data_dir() +
         "/train.bin data.val_path=" + data_dir() +
         "/val.bin data.documents=true data.len_bucket=32 model.layers=2 model.heads=2 "
         "model.width=32 model.vocab=257 model.context=128 data.batch_size=4 "
         "optim.warmup_steps=0 optim.schedule=constant checkpoint.every=0 memory.measure=false "
         "memory.debug_poison=true device.memory=1GiB device.threads=1 " +
         more;
}

// Per length, auto (with and without recompute) within a budget between the lengths' peaks
// trains bitwise like none with unlimited memory, in `precision` (device.precision).
void expect_per_length_plans_alike(const std::string& precision) {
  constexpr int kSteps = 12;
  const std::string more = " device.precision=" + precision;
  const std::string none_dir = scratch("documents_none_" + precision);
  NoneReference none;
  ASSERT_NO_FATAL_FAILURE(run_none_reference(
      documents(none_dir, kSteps, "memory.policy=none" + more), none_dir, kSteps, 1, none));
  ASSERT_GE(none.peaks.size(), 2u) << "the batches took several lengths:\n" << none.output;
  ASSERT_LT(none.peaks.begin()->second, none.peaks.rbegin()->second);
  // Below what the longest length needs with everything resident, above the shortest's: half
  // way, since in bf16 the longest length's lower bound (its LM head's fp32 staging, Note [bf16
  // products in fp32]) lies above a third of the way.
  const uint64_t budget = budget_between(none.peaks, 2);

  for (const std::string variant : {"auto", "auto_recompute"}) {
    SCOPED_TRACE(variant);
    const std::string dir = scratch("documents_" + variant + "_" + precision);
    BudgetedRun r;
    ASSERT_NO_FATAL_FAILURE(expect_bitwise_like_none(
        documents(dir, kSteps,
                  "memory.policy=auto memory.budget=" + std::to_string(budget) +
                      (variant == "auto" ? "" : " memory.link_gbps=0.001") + more),
        dir, none, budget, r));
    if (variant == "auto_recompute") {
      EXPECT_GT(r.given_up.rebuilt, 0);
    }
  }
}

TEST(Documents, PerLengthPlansTrainBitwiseLikeUnlimitedNoneWithinTheBudget) {
  expect_per_length_plans_alike("fp32");
}

// The same in bf16 mixed precision (bf16 activations, fused attention's fp32 log-sum-exp).
TEST(Documents, PerLengthPlansTrainBitwiseLikeUnlimitedNoneWithinTheBudgetInBf16) {
  expect_per_length_plans_alike("bf16");
}

// Padding adds nothing: the same batches padded to the longest document (data.len_bucket 1)
// and to 128 positions every time give the same losses and parameters within float (the mean is
// over real tokens, and padded positions carry no gradient). SGD, so a leak is not normalised
// away.
TEST(Documents, PaddingChangesNothingButTheFloatOrder) {
  const std::string sgd = " optim.name=sgd optim.lr=0.5 optim.weight_decay=0 checkpoint.every=6";
  std::map<int64_t, Logged> runs;
  std::map<int64_t, std::string> dirs;
  for (const int64_t bucket : {1, 128}) {
    dirs[bucket] = scratch("documents_bucket_" + std::to_string(bucket));
    const Exit e =
        run(documents(dirs[bucket], 6, "data.len_bucket=" + std::to_string(bucket) + sgd));
    ASSERT_EQ(e.code, 0) << e.output;
    runs[bucket] = read_metrics(dirs[bucket]);
  }
  ASSERT_EQ(runs[1].losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(runs[128].shapes[i][1], 128);
    EXPECT_LT(runs[1].shapes[i][1], 128) << "step " << i + 1 << " padded less";
    EXPECT_NEAR(runs[1].losses[i], runs[128].losses[i], 1e-5 * runs[128].losses[i])
        << "step " << i + 1;
  }
  expect_same_parameters(dirs[1] + "/checkpoints/step_6.safetensors",
                         dirs[128] + "/checkpoints/step_6.safetensors", 1e-5);
}

// The mean token loss of every document of val.bin, one per padded row and packed several to a
// row, with the same weights: packing changes nothing but the float order.
TEST(Documents, PackedRowsEvaluateEachDocumentAsAlone) {
  const std::string dir = scratch("documents_pack_eval");
  Exit e = run(documents(dir, 2, "checkpoint.every=2 data.pack=true"));
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string weights = dir + "/checkpoints/step_2.safetensors";
  std::map<std::string, nlohmann::json> evals;
  for (const std::string mode : {"padded", "packed", "windows"}) {
    const std::string eval_dir = scratch("documents_eval_" + mode);
    const std::string keys = mode == "padded"   ? "data.documents=true data.len_bucket=1"
                             : mode == "packed" ? "data.documents=true data.pack=true"
                                                : "data.documents=false";
    e = run(trainer() + " eval " + gpt_text() + " run.dir=" + eval_dir +
            " data.path=" + data_dir() + "/train.bin data.val_path=" + data_dir() +
            "/val.bin model.layers=2 model.heads=2 model.width=32 model.vocab=257 "
            "model.context=128 data.batch_size=4 memory.measure=false device.threads=1 "
            "model.init_from=" +
            weights + " " + keys);
    ASSERT_EQ(e.code, 0) << e.output;
    evals[mode] = read_json(eval_dir + "/eval.json");
  }
  const double padded = evals["padded"]["loss"].get<double>();
  const double packed = evals["packed"]["loss"].get<double>();
  EXPECT_EQ(evals["padded"]["tokens"], evals["packed"]["tokens"]);
  EXPECT_NEAR(packed, padded, 2e-6 * padded);
  EXPECT_NEAR(evals["packed"]["accuracy"].get<double>(), evals["padded"]["accuracy"].get<double>(),
              1e-4);
  // Windows cross document boundaries: another number (the check above can fail).
  EXPECT_GT(std::abs(evals["windows"]["loss"].get<double>() - padded), 1e-4);
  EXPECT_LT(evals["packed"]["samples"].get<int64_t>(), evals["padded"]["samples"].get<int64_t>());
}

TEST(Documents, TwoRanksTrainEveryStepAtTheLengthOneRankDraws) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  constexpr int kSteps = 8;
  const std::string sgd = " optim.name=sgd optim.lr=0.5 optim.weight_decay=0 checkpoint.every=8";
  const std::string one = scratch("documents_one_rank");
  Exit e = run(documents(one, kSteps, "data.batch_size=8" + sgd));
  ASSERT_EQ(e.code, 0) << e.output;
  const std::vector<int64_t> lengths = logged_lengths(one + "/rank0.log");
  ASSERT_EQ(lengths.size(), static_cast<size_t>(kSteps)) << e.output;
  const std::string two = scratch("documents_two_ranks");
  e = run(mpirun(2) + documents(two, kSteps, "data.batch_size=4" + sgd));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(logged_lengths(two + "/rank0.log"), lengths);
  EXPECT_EQ(logged_lengths(two + "/rank1.log"), lengths);
  EXPECT_GT(std::set<int64_t>(lengths.begin(), lengths.end()).size(), 1u) << "the length changed";
  // The gradient is that of the mean over the global batch's real tokens on both (Note [The
  // mean over real tokens]): the same parameters within float. SGD: AdamW's division by sqrt(v)
  // would hide a wrong weighting of the ranks.
  expect_same_parameters(two + "/checkpoints/step_8.safetensors",
                         one + "/checkpoints/step_8.safetensors", 1e-5);
  // Rank 0 logs the mean over its own tokens: near the one rank's at the start (ln 257 = 5.55).
  const Logged a = read_metrics(one), b = read_metrics(two);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_NEAR(a.losses.front(), b.losses.front(), 0.05 * a.losses.front());
}

TEST(Documents, PlanPrintsOnePlanPerLength) {
  const Exit e = run(trainer() + " plan " + gpt_text() + " data.path=" + data_dir() +
                     "/train.bin data.documents=true data.len_bucket=32 model.layers=2 "
                     "model.heads=2 model.width=32 model.vocab=257 model.context=128 "
                     "memory.policy=auto");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("per input shape (data.documents, data.len_bucket)"), std::string::npos)
      << e.output;
  for (const char* row :
       {"\n32     (16, 32)", "\n64     (16, 64)", "\n96     (16, 96)", "\n128    (16, 128)"}) {
    EXPECT_NE(e.output.find(row), std::string::npos) << row << "\n" << e.output;
  }
}

TEST(Documents, BadKeysAreOneErrorNamingTheKeyAndExit2) {
  const std::string dir = scratch("documents_bad");
  const std::string base = documents(dir, 2);
  expect_user_error(run(base + " data.len_bucket=0"), "data.len_bucket: must be >= 1, got 0");
  expect_user_error(run(base + " data.len_bucket=-5"), "data.len_bucket: must be >= 1");
  expect_user_error(run(base + " data.documents=false data.pack=true"),
                    "data.pack: needs data.documents true");
  expect_user_error(run(base + " data.source=synthetic model.name=resnet18_cifar"),
                    "data.documents: needs data.source tokens, got synthetic");
  expect_user_error(run(base + " data.eot_token=300"),
                    "data.eot_token: must be below model.vocab (257), got 300");
  // Ids past 65,535 are a uint32 token file's (Llama 3's end-of-text is 128001).
  expect_user_error(run(base + " data.eot_token=70000"),
                    "data.eot_token: must be below model.vocab (257), got 70000");
  expect_user_error(run(base + " data.eot_token=3000000000"),
                    "data.eot_token: must be in [-1, 2147483647], got 3000000000");
  // A separator the file never holds (a file tokenised without separators).
  expect_user_error(run(base + " data.eot_token=5"), "holds no end-of-text token 5");
}

}  // namespace
}  // namespace ferry::testing
