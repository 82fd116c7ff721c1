// Offload changes nothing: 10 training steps of resnet18_cifar and vgg11_cifar (and 6 of a small
// GPT) under
// vdnn-conv, vdnn-all and auto at a tight budget (with and without recomputation, convolutions
// recomputed included) give a loss trajectory bitwise equal to the one under none. Every run but
// the reference is in poison mode, where device space that the plan says is not resident holds NaN:
// had any kernel read a tensor the plan had moved away, the losses would differ. Each run's
// measured device high-water mark equals its planned peak and stays within its budget. Each holds
// in bf16 mixed precision too (device.precision bf16: bf16 activations, their gradients and what
// the planner moves or rebuilds), for the CNNs, the GPT and the Llama.
#include <cstring>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"
#include "tests/trainer/exec/train_steps.h"
#include "trainer/data/dataset.h"
#include "trainer/data/loader.h"
#include "trainer/model/zoo/zoo.h"
#include "trainer/session/session.h"

namespace ferry {
namespace {

Config small_config(const std::string& model, int64_t batch) {
  Config c = default_config();
  c.model.name = model;
  c.data.batch_size = batch;
  c.data.samples = 64;
  c.optim.lr = 0.01;
  c.device.memory = 1ull << 30;
  c.memory.budget = c.device.memory;
  // The FLOP model, not this machine's timings: what auto decides must not depend on the load.
  c.memory.measure = false;
  return c;
}

// Four steps of `base` under auto with recompute at a tight budget over a slow link (copies look
// slow, so rebuilding wins), in poison mode: the losses bitwise equal to none's, the measured
// peak the planned one, within budget and below none's. Returns the run (what it rebuilt).
TrainRun expect_recompute_alike(const Config& base, const std::string& what) {
  constexpr int kSteps = 4;
  const TrainRun reference = train_steps(base, kSteps);
  Config c = base;
  c.memory.policy = MemoryPolicy::kAuto;
  c.memory.debug_poison = true;
  c.memory.recompute = true;
  c.memory.budget = tight_budget(base, true);
  c.memory.link_gbps = 0.001;
  const TrainRun run = train_steps(c, kSteps);
  expect_bitwise_equal(run.losses, reference.losses, "auto (" + what + ")");
  EXPECT_EQ(run.measured_peak, run.planned_peak);
  EXPECT_LE(run.measured_peak, c.memory.budget);
  EXPECT_LT(run.planned_peak, reference.planned_peak);
  return run;
}

// A model of the zoo in a precision.
struct ModelPrecision {
  std::string model;
  Precision precision = Precision::kFp32;
};

Config small_config(const ModelPrecision& m, int64_t batch) {
  Config c = small_config(m.model, batch);
  c.device.precision = m.precision;
  return c;
}

class OffloadEquivalence : public ::testing::TestWithParam<ModelPrecision> {};

TEST_P(OffloadEquivalence, EveryPolicyGivesTheSameLosses) {
  const Config base = small_config(GetParam(), 2);
  const TrainRun reference = train_steps(base, 10);
  EXPECT_EQ(reference.measured_peak, reference.planned_peak);
  // bf16: the working copy was made once per update (Note [The bf16 working copy]).
  EXPECT_EQ(reference.working_refreshes, base.device.precision == Precision::kBf16 ? 10u : 0u);
  for (float l : reference.losses) ASSERT_TRUE(std::isfinite(l));

  expect_policies_train_alike(base, reference, offload_policy_variants());
}

// Recomputing convolutions (a conv output rebuilt from its kept or fetched input, then its
// ReLU in place over it) gives the forward's bits: at a tight budget where copies look slow,
// auto drops conv outputs, and the losses stay bitwise equal to none's in poison mode.
TEST_P(OffloadEquivalence, RecomputedConvolutionsGiveTheSameLosses) {
  const TrainRun run = expect_recompute_alike(small_config(GetParam(), 2), "conv recompute");
  EXPECT_GT(run.conv_recomputes, 0) << "no convolution was recomputed";
}

// fp32 runs keep their index names (Models/.../0), bf16 ones are named after the model
// (Bf16/.../resnet18_cifar).
std::string model_precision_name(const ::testing::TestParamInfo<ModelPrecision>& info) {
  return info.param.precision == Precision::kBf16 ? info.param.model : std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Models, OffloadEquivalence,
                         ::testing::Values(ModelPrecision{"resnet18_cifar"},
                                           ModelPrecision{"vgg11_cifar"}),
                         model_precision_name);
INSTANTIATE_TEST_SUITE_P(Bf16, OffloadEquivalence,
                         ::testing::Values(ModelPrecision{"resnet18_cifar", Precision::kBf16},
                                           ModelPrecision{"vgg11_cifar", Precision::kBf16}),
                         model_precision_name);

// A small GPT's config, reading a token file written into `dir`.
Config small_gpt(const testing::TempDir& dir, float dropout, AttentionKind attention,
                 int64_t heads = 2, int64_t width = 64, int64_t context = 64) {
  Config c = small_config("gpt2", 4);
  c.data.source = DataSource::kTokens;
  c.data.path = dir.write("train.bin", small_token_file());
  c.model.layers = 2;
  c.model.heads = heads;
  c.model.width = width;
  c.model.vocab = 64;
  c.model.context = context;
  c.model.dropout = dropout;
  c.model.attention = attention;
  c.optim.name = OptimizerKind::kAdamW;
  c.optim.lr = 1e-3;
  return c;
}

// A small GPT with dropout (its masks are aux state that only moves or stays; the fused core,
// the default, draws its mask again from the seed): every policy, auto with recompute (layer
// norms, GELU and linear outputs rebuilt, and the fused core) included, trains bitwise like none
// in poison mode.
void expect_gpt_policies_alike(AttentionKind attention, Precision precision = Precision::kFp32) {
  testing::TempDir dir;
  Config base = small_gpt(dir, 0.1f, attention);
  base.device.precision = precision;
  const TrainRun reference = train_steps(base, 6);
  EXPECT_EQ(reference.measured_peak, reference.planned_peak);
  EXPECT_EQ(reference.working_refreshes, precision == Precision::kBf16 ? 6u : 0u);
  for (float l : reference.losses) ASSERT_TRUE(std::isfinite(l));
  // vdnn-conv moves nothing in a model without convolutions.
  std::vector<PolicyVariant> variants = offload_policy_variants();
  std::erase_if(variants,
                [](const PolicyVariant& v) { return v.policy == MemoryPolicy::kVdnnConv; });
  expect_policies_train_alike(base, reference, variants);
}

TEST(OffloadEquivalenceGpt, EveryPolicyGivesTheSameLosses) {
  expect_gpt_policies_alike(AttentionKind::kFused);
}

TEST(OffloadEquivalenceGpt, EveryPolicyGivesTheSameLossesWithNaiveAttention) {
  expect_gpt_policies_alike(AttentionKind::kNaive);
}

TEST(OffloadEquivalenceGpt, EveryPolicyGivesTheSameLossesInBf16) {
  expect_gpt_policies_alike(AttentionKind::kFused, Precision::kBf16);
}

TEST(OffloadEquivalenceGpt, EveryPolicyGivesTheSameLossesInBf16WithNaiveAttention) {
  expect_gpt_policies_alike(AttentionKind::kNaive, Precision::kBf16);
}

// Without dropout the attention core runs again to rebuild its probabilities (Note [Attention's
// saved probabilities]): at a tight budget over a slow link auto rebuilds them, bitwise.
TEST(OffloadEquivalenceGpt, RecomputedAttentionProbabilitiesGiveTheSameLosses) {
  testing::TempDir dir;
  // Long rows and narrow heads: the probabilities are most of what a block saves.
  const Config base =
      small_gpt(dir, 0.0f, AttentionKind::kNaive, /*heads=*/4, /*width=*/32, /*context=*/128);
  const TrainRun run = expect_recompute_alike(base, "attention recompute");
  EXPECT_GT(run.attention_recomputes, 0) << "no attention probabilities were rebuilt";
}

// The same long rows with the fused core: it saves O(T) per head, so the tight budget sits far
// lower, and what auto rebuilds (the fused core's y and log-sum-exp among them, if it pays)
// still trains bitwise like none.
TEST(OffloadEquivalenceGpt, FusedAttentionUnderRecomputeGivesTheSameLosses) {
  testing::TempDir dir;
  const Config fused =
      small_gpt(dir, 0.0f, AttentionKind::kFused, /*heads=*/4, /*width=*/32, /*context=*/128);
  Config naive = fused;
  naive.model.attention = AttentionKind::kNaive;
  EXPECT_LT(train_steps(fused, 1).planned_peak, train_steps(naive, 1).planned_peak);
  expect_recompute_alike(fused, "fused attention recompute");
}

// A small Llama with grouped-query attention (RMSNorm, rope_qkv, SwiGLU, an untied head): every
// policy, auto with recompute (the new ops rebuilt from their kept inputs) included, trains
// bitwise like none in poison mode, in `precision`.
void expect_llama_policies_alike(Precision precision) {
  testing::TempDir dir;
  Config base =
      small_gpt(dir, 0.0f, AttentionKind::kFused, /*heads=*/4, /*width=*/32, /*context=*/128);
  base.model.name = "llama";
  base.model.kv_heads = 2;
  base.model.ffn = 48;
  base.model.tie_embeddings = TieEmbeddings::kFalse;
  base.device.precision = precision;
  const TrainRun reference = train_steps(base, 6);
  EXPECT_EQ(reference.measured_peak, reference.planned_peak);
  EXPECT_EQ(reference.working_refreshes, precision == Precision::kBf16 ? 6u : 0u);
  for (float l : reference.losses) ASSERT_TRUE(std::isfinite(l));
  if (precision == Precision::kBf16) {
    // bf16 storage, not fp32 under another name: the losses move off fp32's, the peak shrinks.
    Config fp32 = base;
    fp32.device.precision = Precision::kFp32;
    const TrainRun wide = train_steps(fp32, 6);
    EXPECT_NE(reference.losses, wide.losses);
    for (size_t i = 0; i < wide.losses.size(); ++i)
      EXPECT_NEAR(reference.losses[i], wide.losses[i], 0.02 * wide.losses[i]) << "step " << i + 1;
    EXPECT_LT(reference.planned_peak, wide.planned_peak);
  }
  std::vector<PolicyVariant> variants = offload_policy_variants();
  std::erase_if(variants,
                [](const PolicyVariant& v) { return v.policy == MemoryPolicy::kVdnnConv; });
  expect_policies_train_alike(base, reference, variants);
  expect_recompute_alike(base, "llama recompute");
}

TEST(OffloadEquivalenceLlama, EveryPolicyAndRecomputeGiveTheSameLosses) {
  expect_llama_policies_alike(Precision::kFp32);
}

TEST(OffloadEquivalenceLlama, EveryPolicyAndRecomputeGiveTheSameLossesInBf16) {
  expect_llama_policies_alike(Precision::kBf16);
}

}  // namespace
}  // namespace ferry
