// Without a launcher: rank discovery gives one rank and leaves MPI alone, the registry's
// choices and refusals, the local communicator, and fail_job's message and return.
#include <gtest/gtest.h>

#include <vector>

#include "comm/communicator.h"
#include "comm/fault.h"
#include "comm/ranks.h"
#include "common/error.h"
#include "device/device.h"

namespace ferry {
namespace {

std::unique_ptr<Device> cpu_device() {
  return create_device({.backend = Backend::kCpu, .memory = 16 << 20, .cpu = {.threads = 1}});
}

TEST(Ranks, WithoutALauncherThereIsOneRankAndNoMpi) {
  if (launched_by_mpi()) GTEST_SKIP() << "started by an MPI launcher";
  const RankInfo r = init_ranks();
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.size, 1);
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.local_size, 1);
  EXPECT_FALSE(r.under_mpi);
  EXPECT_TRUE(r.is_root());
  EXPECT_FALSE(mpi_active());  // MPI_Init was not called
  finalize_ranks();            // a no-op without MPI
  EXPECT_FALSE(mpi_active());
}

TEST(Registry, ParsesBackendNames) {
  EXPECT_EQ(parse_comm_backend("auto"), CommBackendChoice::kAuto);
  EXPECT_EQ(parse_comm_backend("mpi"), CommBackendChoice::kMpi);
  EXPECT_EQ(parse_comm_backend("nccl"), CommBackendChoice::kNccl);
  EXPECT_EQ(comm_backend_name(CommBackendChoice::kNccl), "nccl");
  try {
    parse_comm_backend("ncl");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'nccl'"), std::string::npos) << e.what();
  }
}

TEST(Registry, OneRankGetsTheLocalCommunicator) {
  auto device = cpu_device();
  for (auto choice : {CommBackendChoice::kAuto, CommBackendChoice::kMpi}) {
    auto comm = create_communicator(choice, *device, RankInfo{});
    EXPECT_EQ(comm->backend_name(), "local");
    EXPECT_EQ(comm->ranks().size, 1);
  }
}

TEST(Registry, NcclWithACpuDeviceIsRefusedWithAHint) {
  auto device = cpu_device();
  try {
    create_communicator(CommBackendChoice::kNccl, *device, RankInfo{});
    FAIL() << "no ConfigError (a config mistake: exit 2)";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nccl"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("mpi"), std::string::npos) << e.hint();
  }
}

TEST(Registry, SeveralRanksWithoutMpiAreRefused) {
  auto device = cpu_device();
  RankInfo two{0, 2, 0, 2, false};
  EXPECT_THROW(create_communicator(CommBackendChoice::kMpi, *device, two), UnsupportedError);
}

TEST(LocalCommunicator, CollectivesAreCompleteAndChangeNothing) {
  auto device = cpu_device();
  auto comm = create_communicator(CommBackendChoice::kAuto, *device, RankInfo{});
  DeviceBuffer buffer(device->memory(), 64 * sizeof(float), "data");
  auto* data = static_cast<float*>(buffer.data());
  for (int i = 0; i < 64; ++i) data[i] = 0.1f * static_cast<float>(i);
  Stream& compute = device->stream(StreamKind::kCompute);
  CommWork work = comm->all_reduce_mean(data, 64, compute);
  EXPECT_TRUE(work.ready());
  work.order_before(compute);
  work.wait();
  for (int i = 0; i < 64; ++i) ASSERT_EQ(data[i], 0.1f * static_cast<float>(i));
  EXPECT_FALSE(work.span().has_value());
  // comm.dtype bf16: one rank has no wire, so nothing is narrowed (0.1 is no bf16 value).
  EXPECT_TRUE(comm->all_reduce_mean_bf16(data, 64, compute).ready());
  for (int i = 0; i < 64; ++i) ASSERT_EQ(data[i], 0.1f * static_cast<float>(i));
  EXPECT_EQ(comm->all_reduce_bytes(), 0u);
  EXPECT_TRUE(comm->broadcast(data, 256, 0, compute).ready());
  EXPECT_THROW(comm->broadcast(data, 256, 1, compute), UnsupportedError);
  char name[16] = "ledger-name";
  comm->broadcast_host(name, sizeof(name), 0);
  EXPECT_STREQ(name, "ledger-name");
  EXPECT_THROW(comm->broadcast_host(name, sizeof(name), 1), UnsupportedError);
  comm->barrier();
}

TEST(FailJob, WithoutMpiPrintsTheMessageAndHintAndReturnsTheCode) {
  ::testing::internal::CaptureStderr();
  const int code = fail_job(RankInfo{}, "the loss became nan", "lower optim.lr", 3);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 3);
  EXPECT_EQ(err, "error: the loss became nan\nhint: lower optim.lr\n");
}

TEST(FailJob, PrefixesEveryLineWithTheRankWhenThereAreSeveral) {
  ::testing::internal::CaptureStderr();
  const RankInfo rank1{1, 4, 1, 4, false};
  const int code = fail_job(rank1, ConfigError("bad key\nsecond line", "fix it"), 2);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 2);
  EXPECT_EQ(err,
            "rank 1 of 4: error: bad key\nrank 1 of 4:   second line\nrank 1 of 4: hint: fix it\n");
  EXPECT_EQ(rank_prefix(RankInfo{}), "");
}

}  // namespace
}  // namespace ferry
