// memory.optimizer host's weight copies (Note [Host copies on the links] in
// trainer/optim/model_state_step.h): after an update, compute waits for each weight piece's copy
// up only before the first step of the next forward that reads one of its floats (worked out here
// from the program, apart from the code under test), not for every piece before the first layer;
// and training with the host optimizer keeps its losses bitwise the device optimizer's (under bf16
// too, where compute waits for every piece at the update).
#include <set>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"
#include "trainer/config/config.h"
#include "trainer/configured/dataset.h"
#include "trainer/data/loader.h"
#include "trainer/session/session.h"

namespace ferry {
namespace {

// LeNet-5 (about 62k parameters) with weight pieces of at most 0.02 MiB: several pieces, every
// layer's weights in a piece of their own or with a neighbour's.
Config lenet(const std::string& dir, const std::string& memory) {
  return parse_config_text(
      "run: {seed: 3, dir: " + dir +
      "}\nmodel: {name: lenet5, classes: 10, input: [3, 32, 32]}\n"
      "data: {source: synthetic, batch_size: 8, samples: 64, mean: [0.5, 0.5, 0.5], "
      "std: [0.265, 0.265, 0.265]}\n"
      "optim: {name: sgd, lr: 0.02, momentum: 0.9}\n"
      "comm: {bucket_mb: 0.02}\n"
      "device: {backend: cpu, memory: 256MiB, threads: 1}\n"
      "memory: {measure: false, " +
      memory + "}\n");
}

// Per step of the training program, its losses; `check` runs after each step's forward and
// backward are enqueued (before its update).
template <typename Check>
std::vector<float> train(Session& session, const Config& c, int steps, Check check) {
  const std::shared_ptr<const Dataset> data = open_configured_dataset(c);
  LoaderOptions lo;
  lo.batch_size = c.data.batch_size;
  lo.seed = c.run.seed;
  lo.allocator = &session.device().pinned();
  DataLoader loader(data, lo);
  std::vector<float> losses;
  for (int step = 1; step <= steps; ++step) {
    Batch batch = loader.next();
    session.forward_backward({batch.input(), batch.labels(), batch.size()},
                             static_cast<uint64_t>(step));
    check(step);
    session.reduce_gradients();
    session.update(static_cast<float>(c.optim.lr));
    losses.push_back(session.metrics().loss);
  }
  return losses;
}

// The first forward (or recompute) step of `program` that reads a float of [begin, end) of the
// parameter block, -1 for none.
int first_reader(const Program& program, const ParameterStore& store, int64_t begin, int64_t end) {
  const auto& steps = program.plan.tape.steps;
  for (size_t s = 0; s < steps.size(); ++s) {
    if (steps[s].phase != StepPhase::kForward && steps[s].phase != StepPhase::kRecompute) continue;
    for (int slot : program.lowered.bindings[program.plan.origin[s]].params) {
      const int32_t p = program.param_index[persistent_id(slot)];
      if (p < 0) continue;
      const auto& e = store.params()[static_cast<size_t>(p)];
      const auto b = static_cast<int64_t>(e.offset / sizeof(float));
      if (b < end && b + e.desc.shape.numel() > begin) return static_cast<int>(s);
    }
  }
  return -1;
}

TEST(HostWeightWaits, ComputeWaitsForEachPieceBeforeItsFirstReaderOnly) {
  const testing::TempDir dir("host_waits");
  const Config c = lenet(dir.str(), "optimizer: host");
  Session session(c, RankInfo{}, /*training=*/true);
  const Program& program = session.executor().program(c.data.batch_size, true);
  int checked = 0;
  train(session, c, 3, [&](int step) {
    // Made with the gradient buckets, at the first step.
    const ModelStateStep* state = session.model_state_step();
    ASSERT_NE(state, nullptr);
    const std::vector<int64_t>& bounds = state->weight_pieces();
    const std::vector<int>& waits = state->weight_waits();
    if (step == 1) {
      EXPECT_TRUE(waits.empty()) << "no update before the first step";
      return;
    }
    ASSERT_GE(bounds.size(), 4u) << "at least 3 pieces";
    ASSERT_EQ(waits.size() + 1, bounds.size());
    EXPECT_EQ(bounds.front(), 0);
    EXPECT_EQ(bounds.back(), session.store().param_floats());
    std::set<int> at;
    for (size_t k = 0; k < waits.size(); ++k) {
      const int reader = first_reader(program, session.store(), bounds[k], bounds[k + 1]);
      // A piece no forward reads is waited for with the rest before the first backward step.
      EXPECT_EQ(waits[k], reader) << "piece " << k << " [" << bounds[k] << ", " << bounds[k + 1]
                                  << ") in step " << step;
      at.insert(waits[k]);
    }
    // The first layer does not wait for the last layers' weights.
    EXPECT_GT(at.size(), 2u);
    EXPECT_GT(*at.rbegin(), 0);
    ++checked;
  });
  EXPECT_EQ(checked, 2);
}

// The waits move, the bits do not: the host optimizer's losses equal the device optimizer's.
TEST(HostWeightWaits, TheLossesEqualTheDeviceOptimizersBitwise) {
  const testing::TempDir a("host_waits_device"), b("host_waits_host");
  const Config device = lenet(a.str(), "optimizer: device");
  const Config host = lenet(b.str(), "optimizer: host, policy: vdnn-all, debug_poison: true");
  Session on_device(device, RankInfo{}, true);
  Session on_host(host, RankInfo{}, true);
  const std::vector<float> want = train(on_device, device, 5, [](int) {});
  const std::vector<float> got = train(on_host, host, 5, [](int) {});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1;
}

// Under bf16 the working copy is narrowed from the whole block before the next forward's first
// step: compute waits for every piece at the update, and the losses stay the device optimizer's.
TEST(HostWeightWaits, UnderBf16EveryPieceIsWaitedForAtTheUpdate) {
  const testing::TempDir a("host_waits_bf16_device"), b("host_waits_bf16_host");
  Config device = lenet(a.str(), "optimizer: device");
  Config host = lenet(b.str(), "optimizer: host");
  device.device.precision = Precision::kBf16;
  host.device.precision = Precision::kBf16;
  Session on_device(device, RankInfo{}, true);
  Session on_host(host, RankInfo{}, true);
  const std::vector<float> want = train(on_device, device, 4, [](int) {});
  int checked = 0;
  const std::vector<float> got = train(on_host, host, 4, [&](int step) {
    if (step == 1) return;
    const std::vector<int>& waits = on_host.model_state_step()->weight_waits();
    ASSERT_GT(waits.size(), 2u);
    for (int w : waits) EXPECT_EQ(w, -1) << "step " << step;
    ++checked;
  });
  EXPECT_EQ(checked, 3);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1;
}

}  // namespace
}  // namespace ferry
