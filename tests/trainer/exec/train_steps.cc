// See train_steps.h.
#include "tests/trainer/exec/train_steps.h"

#include <cstring>
#include <memory>

#include <gtest/gtest.h>

#include "trainer/configured/dataset.h"
#include "trainer/data/dataset.h"
#include "trainer/data/loader.h"
#include "trainer/session/session.h"

namespace ferry {

TrainRun train_steps(const Config& c, int steps) {
  Session session(c, RankInfo{}, /*training=*/true);
  Device& device = session.device();
  device.memory().reset_peak();
  const std::shared_ptr<const Dataset> data = open_configured_dataset(c);
  LoaderOptions lo;
  lo.batch_size = c.data.batch_size;
  lo.seed = c.run.seed;
  lo.allocator = &device.pinned();
  DataLoader loader(data, lo);
  TrainRun run;
  const Program& program = session.executor().program(c.data.batch_size, true);
  run.planned_peak = program.plan.peak_bytes();
  run.offload_bytes = program.plan.offload_bytes;
  run.recompute_flops = program.plan.recompute_flops;
  for (const TapeStep& s : program.plan.tape.steps) {
    if (s.phase == StepPhase::kRecompute && (s.op == "conv2d" || s.op == "linear"))
      ++run.conv_recomputes;
    if (s.phase == StepPhase::kRecompute && s.op == "attention") ++run.attention_recomputes;
  }
  for (int step = 1; step <= steps; ++step) {
    Batch batch = loader.next();
    session.executor().enqueue({batch.input(), batch.labels(), batch.size()}, true,
                               static_cast<uint64_t>(step));
    session.optimizer().step(device.kernels(), device.stream(StreamKind::kCompute), session.store(),
                             static_cast<float>(c.optim.lr));
    run.losses.push_back(session.executor().read_metrics().loss);
  }
  run.measured_peak = device.memory().stats().peak;
  run.working_refreshes = session.store().working_refreshes();
  return run;
}

uint64_t tight_budget(const Config& c, bool recompute) {
  Config probe = c;
  probe.memory.policy = MemoryPolicy::kVdnnAll;
  Session session(probe, RankInfo{}, true);
  const uint64_t all = session.executor().program(c.data.batch_size, true).plan.peak_bytes();
  if (!recompute) return all + (256 << 10);
  probe.memory.policy = MemoryPolicy::kNone;
  Session resident(probe, RankInfo{}, true);
  const uint64_t none = resident.executor().program(c.data.batch_size, true).plan.peak_bytes();
  return all + (none - all) / 2;
}

void expect_bitwise_equal(const std::vector<float>& a, const std::vector<float>& b,
                          const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0)
        << what << ": step " << i + 1 << " loss " << a[i] << " vs " << b[i];
  }
}

std::vector<PolicyVariant> offload_policy_variants() {
  return {
      {"vdnn-conv", MemoryPolicy::kVdnnConv, false, false},
      {"vdnn-all", MemoryPolicy::kVdnnAll, false, false},
      {"auto (tight budget)", MemoryPolicy::kAuto, true, false},
      {"auto (tight budget, recompute)", MemoryPolicy::kAuto, true, true},
  };
}

void expect_policies_train_alike(const Config& base, const TrainRun& reference,
                                 const std::vector<PolicyVariant>& variants) {
  for (const PolicyVariant& v : variants) {
    SCOPED_TRACE(v.name);
    Config c = base;
    c.memory.policy = v.policy;
    c.memory.debug_poison = true;
    c.memory.recompute = v.recompute;
    if (v.tight) {
      c.memory.budget = tight_budget(base, v.recompute);
      // The planner is told the link is this slow: hiding copies looks impossible, so auto
      // prefers recomputing (the copies themselves still run at full speed).
      if (v.recompute) c.memory.link_gbps = 0.001;
    }
    const TrainRun run = train_steps(c, static_cast<int>(reference.losses.size()));
    expect_bitwise_equal(run.losses, reference.losses, v.name);
    if (v.policy != MemoryPolicy::kNone) {
      EXPECT_GT(run.offload_bytes + static_cast<uint64_t>(run.recompute_flops), 0u)
          << "the plan moved nothing";
      EXPECT_LT(run.planned_peak, reference.planned_peak);
    }
    if (v.recompute) {
      EXPECT_GT(run.recompute_flops, 0) << "nothing was recomputed";
    }
    EXPECT_EQ(run.measured_peak, run.planned_peak);
    EXPECT_LE(run.measured_peak, c.memory.budget);
  }
}

std::string small_token_file() {
  std::string file(256 * sizeof(int32_t), '\0');
  const int32_t header[3] = {20240520, 1, 4096};
  std::memcpy(file.data(), header, sizeof(header));
  for (int i = 0; i < 4096; ++i) {
    const auto token = static_cast<uint16_t>((i * 7 + i / 13) % 64);
    file.append(reinterpret_cast<const char*>(&token), sizeof(token));
  }
  return file;
}

}  // namespace ferry
