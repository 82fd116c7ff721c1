// Model state per rank (Note [Model state per rank]): the formula on gpt2 at 4 and 8 ranks, with
// its figures printed; auto's choices as the budget shrinks; the refusals.
#include "trainer/plan/model_state.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "common/bytes.h"
#include "common/error.h"
#include "trainer/config/config.h"
#include "trainer/plan/planning.h"

namespace ferry {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// gpt2 (124M) with AdamW at sequence 1024, batch 4.
Config gpt2(const std::string& extra = "") {
  return parse_config_text(
      "model: {name: gpt2}\ndata: {source: tokens, path: none.bin, batch_size: 4}\n"
      "optim: {name: adamw}\nmemory: {measure: false}\n" +
      extra);
}

TEST(ModelState, Gpt2FormulaAtFourAndEightRanks) {
  OfflinePlanner planner(gpt2());
  ModelStateInputs in = planner.model_state_inputs();
  const uint64_t P = in.param_bytes;
  ASSERT_EQ(in.slots, 2);
  // 124,439,808 parameters, each tensor padded to 64 bytes, the block to 256.
  EXPECT_GE(P, uint64_t{124439808} * 4);
  EXPECT_LT(P, uint64_t{124439808} * 4 + 200 * 64 + 256);
  // The largest parameter is the (tied) token embedding, 50257 x 768.
  EXPECT_EQ(in.largest_param, (uint64_t{50257} * 768 * 4 + 63) / 64 * 64);
  std::printf("gpt2 AdamW fp32: parameter block %s (%llu bytes), bucket %s, largest parameter %s\n",
              format_bytes(P).c_str(), static_cast<unsigned long long>(P),
              format_bytes(in.bucket_bytes).c_str(), format_bytes(in.largest_param).c_str());
  for (int ranks : {4, 8}) {
    in.ranks = ranks;
    const uint64_t S = ((P / 4 + ranks - 1) / ranks + 63) / 64 * 64;  // floats per shard
    const uint64_t shard = S * 4, block = shard * ranks;
    ASSERT_GE(block, P);
    ASSERT_LT(block - P, static_cast<uint64_t>(ranks) * 256);
    // Two 25 MiB bucket slots and the tied token embedding's bucket (itself, > 25 MiB), held.
    ASSERT_EQ(in.held_params, std::vector<uint64_t>{in.largest_param});
    ASSERT_LT(in.largest_unheld, in.bucket_bytes);
    const uint64_t in_flight =
        2 * ((in.bucket_bytes + 255) / 256 * 256) + (in.largest_param + 255) / 256 * 256;
    std::printf("%d ranks (shard %llu floats):\n", ranks, static_cast<unsigned long long>(S));
    std::printf("  %-28s %12s %12s %12s %12s %12s\n", "", "weights", "gradients", "optimizer",
                "device", "host");
    for (const ModelStateChoice& c :
         model_state_candidates(ZeroStage::kAuto, OptimizerPlacement::kAuto)) {
      const ModelState s = model_state(in, c);
      std::printf("  %-28s %12s %12s %12s %12s %12s\n", describe(c).c_str(),
                  format_bytes(s.weights).c_str(), format_bytes(s.gradients).c_str(),
                  format_bytes(s.optimizer).c_str(), format_bytes(s.device_bytes()).c_str(),
                  format_bytes(s.host_bytes()).c_str());
      const bool host = c.optimizer == OptimizerPlacement::kHost;
      const uint64_t unit = c.zero == ZeroStage::k0 ? P : shard;
      EXPECT_EQ(s.weights, c.zero == ZeroStage::k0 ? P : block) << describe(c);
      EXPECT_EQ(s.gradients, c.zero == ZeroStage::k0   ? P
                             : c.zero == ZeroStage::k1 ? block
                                                       : shard + in_flight)
          << describe(c);
      EXPECT_EQ(s.optimizer, host ? 0 : 2 * unit) << describe(c);
      EXPECT_EQ(s.host_optimizer, host ? 2 * unit : 0) << describe(c);
      EXPECT_EQ(s.host_bytes(), host ? 4 * unit : 0) << describe(c);
    }
    // 16 bytes per parameter unsharded; zero 1 at N ranks 8 + 8/N; the host optimizer 8.
    const double per_param = static_cast<double>(P) / 4;
    EXPECT_NEAR(model_state(in, {}).device_bytes() / per_param, 16.0, 1e-9);
    EXPECT_NEAR(model_state(in, {ZeroStage::k1}).device_bytes() / per_param, 8.0 + 8.0 / ranks,
                0.01);
    EXPECT_NEAR(
        model_state(in, {ZeroStage::k1, OptimizerPlacement::kHost}).device_bytes() / per_param, 8.0,
        0.01);
  }
}

// Note [Sharded master weights]: under bf16, zero 1 and 2 keep 4/N bytes of fp32 masters per
// parameter beside the 2-byte working copy, plus F (the fp32 weights read whole: gpt2's token and
// position embeddings, norms and biases); the host optimizer keeps none on the device. The
// all-gather the step model charges moves the working copy and F, not the fp32 block.
TEST(ModelState, Bf16MastersAreShardedOrOnTheHostAtFourAndEightRanks) {
  OfflinePlanner planner(gpt2("device: {precision: bf16}\n"));
  ModelStateInputs in = planner.model_state_inputs();
  const uint64_t P = in.param_bytes;
  ASSERT_TRUE(in.bf16);
  // wte 50257 x 768 and wpe 1024 x 768, 12 layers of two norms (2 x 768 each) and four biases
  // (2304 + 768 + 3072 + 768), the final norm: each padded to 64 bytes, the block to 256.
  const uint64_t fp32 =
      uint64_t{50257} * 768 + 1024 * 768 + 12 * (4 * 768 + 2304 + 768 + 3072 + 768) + 2 * 768;
  EXPECT_GE(in.fp32_weight_bytes, fp32 * 4);
  EXPECT_LT(in.fp32_weight_bytes, fp32 * 4 + 100 * 64 + 256);
  for (int ranks : {4, 8}) {
    in.ranks = ranks;
    const uint64_t S = ((P / 4 + ranks - 1) / ranks + 63) / 64 * 64;
    const uint64_t shard = S * 4, block = shard * ranks;
    const ModelState zero0 = model_state(in, {});
    EXPECT_EQ(zero0.weights, P);
    EXPECT_EQ(zero0.working_weights, (P / 2 + 255) / 256 * 256);
    EXPECT_FALSE(zero0.masters_apart);
    for (ZeroStage z : {ZeroStage::k1, ZeroStage::k2}) {
      const ModelState d = model_state(in, {z});
      EXPECT_TRUE(d.masters_apart);
      EXPECT_EQ(d.weights, shard + in.fp32_weight_bytes);
      EXPECT_EQ(d.working_weights, (block / 2 + 255) / 256 * 256);
      EXPECT_EQ(d.persistent(0).working_weights, d.working_weights);
      const ModelState h = model_state(in, {z, OptimizerPlacement::kHost});
      EXPECT_EQ(h.weights, in.fp32_weight_bytes);
      // The host keeps the shard's masters and their bf16 rounding for the upload.
      EXPECT_EQ(h.host_weights, shard + shard / 2);
      // The step model's gather: the working copy and F instead of the whole fp32 block.
      const double fp32_gather = model_state_seconds(model_state(in, {z}), 2, 1, 0, 0);
      ModelStateInputs fp32_in = in;
      fp32_in.bf16 = false;
      const double fp32_run = model_state_seconds(model_state(fp32_in, {z}), 2, 1, 0, 0);
      EXPECT_NEAR(fp32_gather / fp32_run,
                  static_cast<double>(d.working_weights + in.fp32_weight_bytes) / block, 1e-9);
    }
    const double per_param = static_cast<double>(P) / 4;
    const double f = static_cast<double>(in.fp32_weight_bytes) / per_param;
    std::printf(
        "gpt2 bf16, %d ranks: weights + working copy per parameter: zero 0 %.3f, zero 1 %.3f "
        "(2 + 4/N = %.3f, plus F %.3f), zero 2 + host %.3f bytes\n",
        ranks, static_cast<double>(zero0.weights + zero0.working_weights) / per_param,
        static_cast<double>(model_state(in, {ZeroStage::k1}).weights +
                            model_state(in, {ZeroStage::k1}).working_weights) /
            per_param,
        2 + 4.0 / ranks, f,
        static_cast<double>(
            model_state(in, {ZeroStage::k2, OptimizerPlacement::kHost}).weights +
            model_state(in, {ZeroStage::k2, OptimizerPlacement::kHost}).working_weights) /
            per_param);
    EXPECT_NEAR(static_cast<double>(model_state(in, {ZeroStage::k1}).weights +
                                    model_state(in, {ZeroStage::k1}).working_weights) /
                    per_param,
                2 + 4.0 / ranks + f, 0.01);
  }
}

TEST(ModelState, OneRankShardsNothing) {
  ModelStateInputs in{1 << 20, 4096, 25 * kMiB, 2, 1, 256};
  for (const ModelStateChoice& c :
       model_state_candidates(ZeroStage::kAuto, OptimizerPlacement::kDevice)) {
    const ModelState s = model_state(in, c);
    EXPECT_EQ(s.weights, in.param_bytes);
    EXPECT_EQ(s.gradients, in.param_bytes);
    EXPECT_EQ(s.optimizer, 2 * in.param_bytes);
  }
  EXPECT_EQ(shard_floats(1000, 1), 1000u);
  EXPECT_EQ(shard_floats(1000, 3), 384u);  // ceil(1000 / 3) = 334, rounded up to 64 floats
}

TEST(ModelState, CandidatesInPreferenceOrder) {
  const auto all = model_state_candidates(ZeroStage::kAuto, OptimizerPlacement::kAuto);
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all[0], (ModelStateChoice{ZeroStage::k0, OptimizerPlacement::kDevice}));
  EXPECT_EQ(all[2], (ModelStateChoice{ZeroStage::k2, OptimizerPlacement::kDevice}));
  EXPECT_EQ(all[3], (ModelStateChoice{ZeroStage::k0, OptimizerPlacement::kHost}));
  EXPECT_EQ(model_state_candidates(ZeroStage::k1, OptimizerPlacement::kAuto).size(), 2u);
  EXPECT_EQ(model_state_candidates(ZeroStage::k2, OptimizerPlacement::kHost).size(), 1u);
}

// A GPT whose parameters dominate its activations: a small context and a large vocabulary.
// `extra`: more memory.* fields (", host_limit: 1MiB").
Config small_gpt(const std::string& budget, const std::string& extra = "",
                 const std::string& zero = "auto") {
  return parse_config_text(
      "model: {name: gpt2, layers: 2, context: 32, vocab: 8192}\n"
      "data: {source: tokens, path: none.bin, batch_size: 2}\noptim: {name: adamw}\n"
      "device: {memory: 4GiB}\n"
      "memory: {measure: false, zero: " +
      zero + ", optimizer: auto, policy: auto, budget: " + budget + extra + "}\n");
}

// The chosen combination at `budget` for a 4-rank job.
ModelStateChoice chosen(const std::string& budget, const std::string& zero = "auto") {
  OfflinePlanner planner(small_gpt(budget, "", zero));
  planner.set_ranks(4);
  const ModelStateDecision d = planner.resolve_model_state(MemoryPolicy::kAuto, 2);
  EXPECT_EQ(planner.model_state().choice, d.choice().state.choice);
  return d.choice().state.choice;
}

TEST(ModelState, AutoShardsAndOffloadsOnlyWhatTheBudgetNeeds) {
  OfflinePlanner probe(small_gpt("1GiB"));
  probe.set_ranks(4);
  const ModelStateInputs in = probe.model_state_inputs();
  const ModelStateDecision d = probe.resolve_model_state(MemoryPolicy::kAuto, 2);
  // Everything fits a large budget: no sharding, no offload.
  EXPECT_EQ(d.choice().state.choice, (ModelStateChoice{}));
  ASSERT_EQ(d.options.size(), 6u);
  for (const auto& o : d.options) EXPECT_TRUE(o.fits) << describe(o.state.choice);
  const uint64_t arena = d.options[0].plan.arena_bytes;
  std::printf("small gpt: parameters %s, arena %s\n", format_bytes(in.param_bytes).c_str(),
              format_bytes(arena).c_str());
  // A budget just above zero 1's model state + the arena: zero 0 no longer fits.
  const auto fits = [&](ModelStateChoice c) {
    return model_state(in, c).device_bytes() + in.buffers + arena;
  };
  const auto mib = [](uint64_t b) { return std::to_string(b / kMiB + 1) + "MiB"; };
  ASSERT_LT(fits({ZeroStage::k1}), fits({}));
  EXPECT_EQ(chosen(mib(fits({ZeroStage::k1}))), (ModelStateChoice{ZeroStage::k1}));
  // Below zero 1 and zero 2 + device, above zero 1 + host: the optimizer goes to the host.
  const ModelStateChoice z1h{ZeroStage::k1, OptimizerPlacement::kHost};
  const ModelStateChoice z2d{ZeroStage::k2, OptimizerPlacement::kDevice};
  ASSERT_LT(fits(z1h) + kMiB, fits(z2d));
  EXPECT_EQ(chosen(mib(fits(z1h))).optimizer, OptimizerPlacement::kHost);
  // memory.zero fixed at 0: the host optimizer is auto's only way down.
  EXPECT_EQ(chosen(mib(fits({ZeroStage::k0, OptimizerPlacement::kHost})), "0").optimizer,
            OptimizerPlacement::kHost);
}

TEST(ModelState, TooSmallEvenWithZeroTwoAndTheHostOptimizerNamesTheSmallestBudget) {
  OfflinePlanner planner(small_gpt("2MiB"));
  planner.set_ranks(4);
  std::string message;
  try {
    planner.resolve_model_state(MemoryPolicy::kAuto, 2);
    FAIL() << "2 MiB cannot hold the model";
  } catch (const BudgetError& e) {
    message = e.what();
    EXPECT_NE(message.find("even with memory.zero 2, memory.optimizer host"), std::string::npos)
        << message;
    EXPECT_NE(std::string(e.hint()).find("raise memory.budget to at least"), std::string::npos);
  }
  // The named budget works and 2 MiB less does not (it is within 1 MiB of the smallest).
  const size_t at = message.find("the smallest budget that fits is ");
  ASSERT_NE(at, std::string::npos);
  const std::string named = message.substr(at + 33);
  ASSERT_NE(named.find(" MiB"), std::string::npos) << named;
  const double mib = std::stod(named);
  const auto fits = [&](double m) {
    OfflinePlanner p(small_gpt(std::to_string(static_cast<uint64_t>(m * kMiB))));
    p.set_ranks(4);
    // The least model state on the device: zero 2 + host, or an option holding as little (at
    // comm.bucket_mb 25 this model's zero 2 keeps the whole gradient block: its two bucket slots
    // and the held embedding are more than the block, Note [Model state per rank]).
    const uint64_t least =
        model_state(p.model_state_inputs(), {ZeroStage::k2, OptimizerPlacement::kHost})
            .device_bytes();
    try {
      return p.resolve_model_state(MemoryPolicy::kAuto, 2).choice().state.device_bytes() == least;
    } catch (const ConfigError&) {
      return false;
    }
  };
  EXPECT_TRUE(fits(mib + 0.01)) << message;
  EXPECT_FALSE(fits(mib - 2)) << message;
  std::printf("%s\n", message.c_str());
}

TEST(ModelState, HostLimitTooSmallNamesBothNumbers) {
  // The device holds the weights and gradients but not the optimizer state; the host cannot.
  OfflinePlanner probe(small_gpt("1GiB"));
  probe.set_ranks(1);
  const ModelStateInputs in = probe.model_state_inputs();
  const ModelState host = model_state(in, {ZeroStage::k0, OptimizerPlacement::kHost});
  const uint64_t budget = host.device_bytes() + in.buffers + 64 * kMiB;
  ASSERT_LT(budget, model_state(in, {}).device_bytes() + in.buffers)
      << "the test needs a model whose optimizer state is larger than 64 MiB";
  OfflinePlanner planner(small_gpt(std::to_string(budget), ", host_limit: 1MiB"));
  try {
    planner.resolve_model_state(MemoryPolicy::kAuto, 2);
    FAIL() << "host_limit 1 MiB cannot hold the optimizer state";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("memory.host_limit 1.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find(format_bytes(host.host_bytes())), std::string::npos) << m;
    std::printf("%s (%s)\n", m.c_str(), e.hint().c_str());
  }
}

}  // namespace
}  // namespace ferry
