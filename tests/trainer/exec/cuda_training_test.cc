// Training on the GPU (issue 9), modelled on offload_equivalence_test.cc: (1) resnet18_cifar
// trains 20 steps on CUDA with the loss trajectory of the CPU backend from the same initial
// weights, within 1e-3 relative (TF32 off); (2) on the GPU every offload policy (vdnn-conv,
// vdnn-all, auto with and without recomputation) gives losses bitwise equal to none's, in poison
// mode with deterministic kernels, and the measured device peak equals the planned one; (3) so
// does vdnn-all under the topology scheduler (gated copy streams). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "device/device.h"
#include "tests/support/gpu_test.h"
#include "tests/support/source_root.h"
#include "tests/trainer/exec/train_steps.h"
#include "trainer/config/config.h"
#include "trainer/data/dataset.h"
#include "trainer/data/loader.h"
#include "trainer/session/session.h"

namespace ferry {
namespace {

// `c` with the CUDA keys that make runs comparable: FP32 convolutions (device.tf32=false, for
// parity with the CPU) and, when `deterministic`, fixed cuDNN algorithms (bitwise repeats).
Config with_cuda_keys(Config c, bool deterministic) {
  c.device.tf32 = false;
  c.device.tf32_matmul = false;
  if (deterministic) c.device.deterministic = true;
  c.memory.measure = false;  // the FLOP model: the same plans run to run
  return c;
}

Config small_config(const std::string& model, int64_t batch, Backend backend) {
  Config c = default_config();
  c.model.name = model;
  c.data.batch_size = batch;
  c.data.samples = 160;
  c.optim.lr = 0.01;
  c.device.backend = backend;
  c.device.memory = 1ull << 30;
  c.memory.budget = c.device.memory;
  return c;
}

class CudaTraining : public testing::GpuTest {};

TEST_F(CudaTraining, Resnet18LossTrajectoryMatchesTheCpuBackend) {
  const int kSteps = 20;
  const TrainRun cpu = train_steps(small_config("resnet18_cifar", 8, Backend::kCpu), kSteps);
  const TrainRun gpu =
      train_steps(with_cuda_keys(small_config("resnet18_cifar", 8, Backend::kCuda), false), kSteps);
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    ASSERT_TRUE(std::isfinite(cpu.losses[i])) << "cpu step " << i + 1;
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-3 * std::fabs(cpu.losses[i])) << "step " << i + 1;
  }
  // The run learned something, so the comparison covers the optimizer too.
  EXPECT_LT(cpu.losses.back(), cpu.losses.front());
}

TEST_F(CudaTraining, EveryOffloadPolicyGivesTheSameLossesOnTheGpu) {
  const Config base =
      with_cuda_keys(small_config("resnet18_cifar", 4, Backend::kCuda), /*deterministic=*/true);
  const TrainRun reference = train_steps(base, 10);
  EXPECT_EQ(reference.measured_peak, reference.planned_peak);
  for (float l : reference.losses) ASSERT_TRUE(std::isfinite(l));

  std::vector<PolicyVariant> variants = offload_policy_variants();
  variants.insert(variants.begin(), {"none (poisoned)", MemoryPolicy::kNone, false, false});
  expect_policies_train_alike(base, reference, variants);
}

// The topology scheduler on the GPU: vdnn-all's offloads and prefetches cross the copy streams in
// gated chunks (1 MiB, so a transfer takes several), granted by the link gatekeeper through the
// node's ledger of the described server; the losses stay bitwise those of none.
TEST_F(CudaTraining, TheTopologySchedulerGatesCopiesWithoutChangingTheLosses) {
  const Config base =
      with_cuda_keys(small_config("resnet18_cifar", 4, Backend::kCuda), /*deterministic=*/true);
  const TrainRun reference = train_steps(base, 6);
  Config c = base;
  c.memory.policy = MemoryPolicy::kVdnnAll;
  c.memory.debug_poison = true;
  // Found from where the binary runs (the bundle's tree on the GPU machine), not the build's path.
  c.topology.file = test::source_file("configs/topologies/dgx1-like.yaml");
  c.topology.scheduler = LinkSchedulerKind::kTopology;
  c.topology.chunk_mb = 1;
  const TrainRun run = train_steps(c, 6);
  expect_bitwise_equal(run.losses, reference.losses, "vdnn-all under topology");
  EXPECT_GT(run.offload_bytes, 0u) << "the plan moved nothing";
  EXPECT_EQ(run.measured_peak, run.planned_peak);
}

}  // namespace
}  // namespace ferry
