// GradientBuckets without MPI: a fake communicator that halves each range on the comm stream
// (the mean with a rank contributing zeros) shows when buckets launch, in which order, that
// every gradient byte is reduced exactly once, that finish() orders the compute stream, and the
// counts of reductions, collectives and overlapped buckets.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "comm/buckets.h"
#include "comm/communicator.h"
#include "common/error.h"
#include "device/cpu/cpu_stream.h"
#include "device/device.h"

namespace ferry {
namespace {

struct Launch {
  uint64_t offset;  // bytes from the block
  int64_t count;
};

class HalvingCommunicator : public Communicator {
 public:
  HalvingCommunicator(Device& device, const float* block) : device_(device), block_(block) {}
  const RankInfo& ranks() const override { return ranks_; }
  std::string_view backend_name() const override { return "halving"; }

  CommWork all_reduce_mean(float* data, int64_t count, Stream& after) override {
    launches.push_back({static_cast<uint64_t>(data - block_) * sizeof(float), count});
    auto& comm = static_cast<cpu::CpuStream&>(device_.stream(StreamKind::kComm));
    auto produced = device_.create_event();
    after.record(*produced);
    comm.wait(*produced);
    auto span = std::make_shared<CommSpanRecord>();
    const int delay = delay_ms;
    comm.enqueue([data, count, span, delay] {
      span->start_ns = 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      for (int64_t i = 0; i < count; ++i) data[i] *= 0.5f;
      span->end_ns = 2;
    });
    std::shared_ptr<Event> done = device_.create_event();
    comm.record(*done);
    return CommWork(done, span);
  }
  // comm.dtype bf16: recorded apart, so a test sees which collective the buckets chose.
  CommWork all_reduce_mean_bf16(float* data, int64_t count, Stream& after) override {
    bf16_launches.push_back({static_cast<uint64_t>(data - block_) * sizeof(float), count});
    return {};
  }
  CommWork broadcast(void*, uint64_t, int, Stream&) override { return {}; }
  void broadcast_host(void*, uint64_t, int) override {}
  void barrier() override {}

  std::vector<Launch> launches, bf16_launches;
  int delay_ms = 0;

 private:
  Device& device_;
  const float* block_;
  RankInfo ranks_{0, 2, 0, 2, false};
};

class BucketsTest : public ::testing::Test {
 protected:
  BucketsTest()
      : device_(
            create_device({.backend = Backend::kCpu, .memory = 64 << 20, .cpu = {.threads = 1}})),
        block_(device_->memory(), kBlockBytes, "gradients"),
        comm_(*device_, grads()) {}

  float* grads() const { return static_cast<float*>(block_.data()); }
  cpu::CpuStream& compute() {
    return static_cast<cpu::CpuStream&>(device_->stream(StreamKind::kCompute));
  }
  // Backward writes a parameter's gradient on the compute stream: grads = value.
  void write(const GradSlice& s, float value) {
    float* g = grads() + s.offset / sizeof(float);
    const uint64_t n = s.bytes / sizeof(float);
    compute().enqueue([=] {
      for (uint64_t i = 0; i < n; ++i) g[i] = value;
    });
  }
  std::vector<float> read_after_compute() {
    std::vector<float> out(kBlockBytes / sizeof(float));
    float* g = grads();
    compute().enqueue([&out, g] { std::copy(g, g + out.size(), out.begin()); });
    compute().synchronize();
    return out;
  }

  static constexpr uint64_t kBlockBytes = 1 << 16;
  std::unique_ptr<Device> device_;
  DeviceBuffer block_;
  HalvingCommunicator comm_;
};

std::vector<GradSlice> packed(size_t n, uint64_t bytes) {
  std::vector<GradSlice> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = {i * bytes, bytes};
  return s;
}

TEST_F(BucketsTest, OverlapLaunchesEachBucketWhenItsLastGradientIsMarked) {
  const auto params = packed(6, 400);  // buckets {5,4} {3,2} {1,0} at a 1000-byte cap
  GradientBuckets buckets(comm_, *device_, grads(), params, {1000, true, {}, {}});
  ASSERT_EQ(buckets.buckets().size(), 3u);
  std::vector<size_t> launched_after;
  for (size_t p : {5, 4, 3, 2, 1, 0}) {
    write(params[p], 1.0f);
    buckets.mark_ready(p);
    launched_after.push_back(buckets.launched());
  }
  EXPECT_EQ(launched_after, (std::vector<size_t>{0, 1, 1, 2, 2, 3}));
  ASSERT_EQ(comm_.launches.size(), 3u);
  EXPECT_EQ(comm_.launches[0].offset, 1600u);
  EXPECT_EQ(comm_.launches[0].count, 200);
  EXPECT_EQ(comm_.launches[2].offset, 0u);
  buckets.finish(compute());
  EXPECT_EQ(comm_.launches.size(), 3u);  // nothing left to launch
}

TEST_F(BucketsTest, BucketsLaunchInIndexOrderWhateverTheMarkOrder) {
  const auto params = packed(6, 400);
  GradientBuckets buckets(comm_, *device_, grads(), params, {1000, true, {}, {}});
  buckets.mark_ready(std::vector<size_t>{1, 0});  // bucket 2 complete, bucket 0 not
  EXPECT_EQ(buckets.launched(), 0u);
  buckets.mark_ready(std::vector<size_t>{5, 4});  // bucket 0: launches; bucket 1 still open
  EXPECT_EQ(buckets.launched(), 1u);
  buckets.mark_ready(std::vector<size_t>{3, 2});  // bucket 1, and bucket 2 behind it
  EXPECT_EQ(buckets.launched(), 3u);
  ASSERT_EQ(comm_.launches.size(), 3u);
  EXPECT_EQ(comm_.launches[0].offset, 1600u);
  EXPECT_EQ(comm_.launches[1].offset, 800u);
  EXPECT_EQ(comm_.launches[2].offset, 0u);
  buckets.finish(compute());
}

TEST_F(BucketsTest, OverlapOffLaunchesEverythingInFinish) {
  const auto params = packed(6, 400);
  GradientBuckets buckets(comm_, *device_, grads(), params, {1000, false, {}, {}});
  for (size_t p : {5, 4, 3, 2, 1, 0}) {
    write(params[p], 3.0f);
    buckets.mark_ready(p);
  }
  EXPECT_EQ(buckets.launched(), 0u);
  EXPECT_TRUE(comm_.launches.empty());
  buckets.finish(compute());
  EXPECT_EQ(buckets.launched(), 3u);
  const auto g = read_after_compute();
  for (size_t i = 0; i < 600; ++i) ASSERT_EQ(g[i], 1.5f) << i;
}

TEST_F(BucketsTest, FinishOrdersComputeAfterEveryBucketAndEachByteIsReducedOnce) {
  // Slices at 64-byte alignment with padded sizes: buckets {4} (larger than the cap), {3, 2}
  // (one merged range) and {1, 0}.
  std::vector<GradSlice> params{{0, 256}, {256, 64}, {320, 1024}, {1344, 64}, {1408, 2048}};
  comm_.delay_ms = 30;  // reductions finish well after backward was enqueued
  GradientBuckets buckets(comm_, *device_, grads(), params, {1100, true, {}, {}});
  for (size_t p = params.size(); p-- > 0;) {
    write(params[p], static_cast<float>(p + 1));
    buckets.mark_ready(p);
  }
  buckets.finish(compute());
  const auto g = read_after_compute();  // runs on compute after the buckets
  for (size_t p = 0; p < params.size(); ++p) {
    for (uint64_t i = 0; i < params[p].bytes / 4; ++i) {
      ASSERT_EQ(g[params[p].offset / 4 + i], 0.5f * static_cast<float>(p + 1)) << p << " " << i;
    }
  }
  uint64_t reduced = 0;
  for (const auto& l : comm_.launches) reduced += static_cast<uint64_t>(l.count) * 4;
  EXPECT_EQ(reduced, 256u + 64 + 1024 + 64 + 2048);
  const auto spans = buckets.spans();
  ASSERT_EQ(spans.size(), buckets.buckets().size());
  for (size_t b = 0; b < spans.size(); ++b) {
    EXPECT_EQ(spans[b].bucket, b);
    EXPECT_EQ(spans[b].bytes, buckets.buckets()[b].bytes);
    EXPECT_GT(spans[b].launch_ns, 0);
  }
}

TEST_F(BucketsTest, AGradientWrittenTwiceWaitsForItsSecondWrite) {
  const auto params = packed(2, 400);
  GradientBuckets buckets(comm_, *device_, grads(), params, {1 << 20, true, {}, {2, 1}});
  buckets.mark_ready(1);
  buckets.mark_ready(0);
  EXPECT_EQ(buckets.launched(), 0u);  // parameter 0 has one more write to come
  buckets.mark_ready(0);
  EXPECT_EQ(buckets.launched(), 1u);
  buckets.finish(compute());
}

TEST_F(BucketsTest, ResetStartsTheNextStep) {
  const auto params = packed(4, 400);
  GradientBuckets buckets(comm_, *device_, grads(), params, {800, true, {}, {}});
  for (int step = 0; step < 3; ++step) {
    buckets.reset();
    for (size_t p : {3, 2, 1, 0}) {
      write(params[p], 8.0f);
      buckets.mark_ready(p);
    }
    buckets.finish(compute());
    const auto g = read_after_compute();
    EXPECT_EQ(g[0], 4.0f);
    EXPECT_EQ(g[399], 4.0f);
  }
  EXPECT_EQ(comm_.launches.size(), 6u);
  // The counts a run reports (optim.accumulate: one reduction per update): every step's
  // finish(), every collective, and the buckets launched while "backward" ran (all of them).
  EXPECT_EQ(buckets.reductions(), 3u);
  EXPECT_EQ(buckets.collectives(), comm_.launches.size());
  EXPECT_EQ(buckets.overlapped_buckets(), 6u);
}

TEST_F(BucketsTest, MissingGradientsAreReducedInFinish) {
  const auto params = packed(4, 400);
  GradientBuckets buckets(comm_, *device_, grads(), params, {800, true, {}, {}});
  buckets.mark_ready(3);  // bucket 0 = {3, 2} never completes during "backward"
  EXPECT_EQ(buckets.launched(), 0u);
  buckets.finish(compute());
  EXPECT_EQ(buckets.launched(), 2u);
  EXPECT_EQ(buckets.overlapped_buckets(), 0u) << "both launched by finish()";
  EXPECT_EQ(buckets.reductions(), 1u);
  EXPECT_EQ(buckets.collectives(), 2u);
}

// comm.dtype bf16: every range goes to the bf16 all-reduce, none to the fp32 one, each byte once.
TEST_F(BucketsTest, ABf16WireSendsEveryRangeThroughTheBf16AllReduce) {
  const auto params = packed(6, 400);
  BucketOptions options{1000, true, {}, {}};
  options.wire_dtype = DType::kBF16;
  GradientBuckets buckets(comm_, *device_, grads(), params, options);
  for (size_t p = 6; p-- > 0;) buckets.mark_ready(p);
  buckets.finish(compute());
  compute().synchronize();
  EXPECT_TRUE(comm_.launches.empty());
  ASSERT_EQ(comm_.bf16_launches.size(), buckets.collectives());
  int64_t floats = 0;
  for (const Launch& l : comm_.bf16_launches) floats += l.count;
  EXPECT_EQ(floats, 6 * 400 / 4);
}

// memory.zero 1 and 2 reduce-scatter in fp32: a bf16 wire with them is refused, not ignored.
TEST_F(BucketsTest, ABf16WireWithAReduceScatterIsRefused) {
  BucketOptions options{1000, true, {}, {}};
  options.wire_dtype = DType::kBF16;
  options.reduce = [](float*, int64_t, int64_t, Stream&) { return CommWork(); };
  EXPECT_THROW(GradientBuckets(comm_, *device_, grads(), packed(2, 400), options),
               UnsupportedError);
}

TEST(BucketsLocal, OneRankLeavesGradientsAsTheyAreAndMeasuresNothing) {
  auto device =
      create_device({.backend = Backend::kCpu, .memory = 16 << 20, .cpu = {.threads = 1}});
  auto comm = create_communicator(CommBackendChoice::kAuto, *device, RankInfo{});
  DeviceBuffer block(device->memory(), 4096, "gradients");
  auto* g = static_cast<float*>(block.data());
  for (int i = 0; i < 1024; ++i) g[i] = static_cast<float>(i);
  GradientBuckets buckets(*comm, *device, g, packed(8, 512), {1024, true, {}, {}});
  for (size_t p = 8; p-- > 0;) buckets.mark_ready(p);
  EXPECT_EQ(buckets.launched(), 4u);
  buckets.finish(device->stream(StreamKind::kCompute));
  device->synchronize();
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(g[i], static_cast<float>(i));
  EXPECT_TRUE(buckets.spans().empty());
}

}  // namespace
}  // namespace ferry
