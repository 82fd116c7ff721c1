// The NCCL backend: NCCL_CHECK's message and the registry's refusal run everywhere; the
// collectives need a GPU and skip with "no CUDA device present" on a machine without one.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "comm/backends.h"
#include "comm/communicator.h"
#include "comm/nccl_check.h"
#include "common/error.h"
#include "device/cuda/cuda_stream.h"
#include "device/device.h"

namespace ferry {
namespace {

TEST(NcclCheck, ThrowsALibraryErrorWithTheCallAndNcclsMessage) {
  try {
    NCCL_CHECK(ncclInvalidArgument);
    FAIL() << "no LibraryError";
  } catch (const LibraryError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.library(), "NCCL");
    EXPECT_NE(what.find("ncclInvalidArgument"), std::string::npos) << what;
    EXPECT_NE(what.find(ncclGetErrorString(ncclInvalidArgument)), std::string::npos) << what;
  }
}

TEST(NcclRegistry, IsBuiltAndVersionHasAvg) {
  EXPECT_TRUE(nccl_built());
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_GE(version, NCCL_VERSION(2, 10, 0));  // ncclAvg
}

class NcclDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device present";
    device_ = create_device({.backend = Backend::kCuda, .memory = 64 << 20});
  }
  std::unique_ptr<Device> device_;
};

TEST_F(NcclDeviceTest, MpiWithACudaDeviceIsRefusedWithAHint) {
  try {
    create_communicator(CommBackendChoice::kMpi, *device_, RankInfo{});
    FAIL() << "no ConfigError (a config mistake: exit 2)";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.hint().find("nccl"), std::string::npos) << e.hint();
  }
  EXPECT_EQ(create_communicator(CommBackendChoice::kAuto, *device_, RankInfo{})->backend_name(),
            "local");
}

TEST_F(NcclDeviceTest, OneRankAllReduceAndBroadcastKeepTheData) {
  auto comm = detail::make_nccl_communicator(*device_, RankInfo{});
  EXPECT_EQ(comm->backend_name(), "nccl");
  const int n = 1 << 16;
  DeviceBuffer buffer(device_->memory(), n * sizeof(float), "data");
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[i] = 0.5f * static_cast<float>(i);
  Stream& compute = device_->stream(StreamKind::kCompute);
  const cudaStream_t compute_handle = cuda::as_cuda(compute).handle();
  // On the compute stream the collective is ordered after (never the legacy default stream).
  ASSERT_EQ(cudaMemcpyAsync(buffer.data(), host.data(), n * sizeof(float), cudaMemcpyHostToDevice,
                            compute_handle),
            cudaSuccess);
  CommWork work = comm->all_reduce_mean(static_cast<float*>(buffer.data()), n, compute);
  work.order_before(compute);
  compute.synchronize();
  EXPECT_TRUE(work.ready());
  ASSERT_TRUE(work.span().has_value());
  EXPECT_LE(work.span()->start_ns, work.span()->end_ns);
  comm->broadcast(buffer.data(), n * sizeof(float), 0, compute).wait();
  std::vector<float> back(n);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), buffer.data(), n * sizeof(float), cudaMemcpyDeviceToHost,
                            compute_handle),
            cudaSuccess);
  compute.synchronize();
  EXPECT_EQ(back, host);
  // Host memory on one rank: kept, after the collectives before it; a bad root is refused.
  char name[16] = "ledger-name";
  comm->broadcast_host(name, sizeof(name), 0);
  EXPECT_STREQ(name, "ledger-name");
  EXPECT_THROW(comm->broadcast_host(name, sizeof(name), 1), UnsupportedError);
  comm->barrier();
}

}  // namespace
}  // namespace ferry
