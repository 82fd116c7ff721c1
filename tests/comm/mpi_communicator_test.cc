// The MPI backend under mpirun (-np 2 and -np 4): all-reduce means (exact, and bitwise equal
// across ranks), broadcast from every root (device and host memory), barrier, asynchronous
// ordering against the compute stream, and gradient buckets with overlap on and off giving the
// same bits.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/backends.h"
#include "comm/buckets.h"
#include "comm/communicator.h"
#include "device/bf16.h"
#include "device/cpu/cpu_stream.h"
#include "device/device.h"
#include "tests/comm/mpi_test_env.h"

namespace ferry {
namespace {

using mpitest::test_ranks;
using Clock = std::chrono::steady_clock;

// Whether `ok` holds on every rank (so that every rank takes the same branch afterwards).
bool on_all_ranks(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all != 0;
}

// Whether `bytes` at `data` are the same on every rank as on rank 0.
bool same_on_all_ranks(const void* data, size_t bytes) {
  std::vector<char> root(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  MPI_Bcast(root.data(), static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD);
  return on_all_ranks(std::memcmp(root.data(), data, bytes) == 0);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// A deterministic gradient value in [-1, 1) for (rank, step, element).
float grad_value(int rank, int step, uint64_t element) {
  uint64_t x = (static_cast<uint64_t>(rank) << 48) ^ (static_cast<uint64_t>(step) << 40) ^ element;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

class MpiCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test_ranks().under_mpi || test_ranks().size < 2) {
      GTEST_SKIP() << "needs mpirun with 2 or more ranks";
    }
    device_ = create_device({.backend = Backend::kCpu, .memory = 256 << 20, .cpu = {.threads = 1}});
    comm_ = create_communicator(CommBackendChoice::kAuto, *device_, test_ranks());
  }
  void TearDown() override {
    if (comm_) comm_->barrier();  // no rank frees memory a peer's collective may still read
    buffers_.clear();
    comm_.reset();
    device_.reset();
  }

  cpu::CpuStream& compute() {
    return static_cast<cpu::CpuStream&>(device_->stream(StreamKind::kCompute));
  }
  float* alloc_floats(int64_t n, const char* label) {
    buffers_.emplace_back(device_->memory(), static_cast<uint64_t>(n) * sizeof(float), label);
    return static_cast<float*>(buffers_.back().data());
  }

  int rank() const { return test_ranks().rank; }
  int size() const { return test_ranks().size; }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Communicator> comm_;
  std::vector<DeviceBuffer> buffers_;
};

TEST_F(MpiCommTest, RanksMatchTheLauncher) {
  const RankInfo& r = test_ranks();
  EXPECT_EQ(comm_->backend_name(), "mpi");
  if (const char* s = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(r.size, std::atoi(s));
  }
  if (const char* s = std::getenv("OMPI_COMM_WORLD_RANK")) {
    EXPECT_EQ(r.rank, std::atoi(s));
  }
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    EXPECT_EQ(r.local_rank, std::atoi(s));
  }
  EXPECT_EQ(r.local_size, r.size);  // one machine
  // Every rank number appears once.
  std::vector<int> all(static_cast<size_t>(r.size));
  MPI_Allgather(&r.rank, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::sort(all.begin(), all.end());
  for (int i = 0; i < r.size; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], i);
}

TEST_F(MpiCommTest, AllReduceMeanIsExactForRepresentableValues) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{(1 << 20) + 3}}) {
    float* data = alloc_floats(n, "data");
    for (int64_t i = 0; i < n; ++i) {
      data[i] = static_cast<float>(rank() + 1) * 0.5f + static_cast<float>(i % 17) * 0.25f;
    }
    comm_->all_reduce_mean(data, n, compute()).wait();
    const double rank_term = 0.5 * (size() + 1) / 2.0;  // mean of (r + 1) / 2 over ranks
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto expected = static_cast<float>(rank_term + 0.25 * static_cast<double>(i % 17));
      if (data[i] != expected) ++wrong;
    }
    EXPECT_EQ(wrong, 0) << "count " << n << ", data[0] = " << data[0];
  }
}

TEST_F(MpiCommTest, AllReduceMeanOfRandomDataIsBitwiseEqualOnEveryRank) {
  for (int64_t n : {int64_t{1000}, int64_t{3 << 20} + 5}) {
    float* data = alloc_floats(n, "data");
    std::vector<double> expected(static_cast<size_t>(n), 0.0);
    for (int r = 0; r < size(); ++r) {
      std::mt19937 gen(static_cast<uint32_t>(1000 * r + 7));
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      for (int64_t i = 0; i < n; ++i) {
        const float v = dist(gen);
        expected[static_cast<size_t>(i)] += v;
        if (r == rank()) data[i] = v;
      }
    }
    comm_->all_reduce_mean(data, n, compute()).wait();
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::abs(data[i] - expected[static_cast<size_t>(i)] / size()));
    }
    EXPECT_LT(worst, 2e-6) << "count " << n;
    EXPECT_TRUE(same_on_all_ranks(data, static_cast<size_t>(n) * sizeof(float))) << "count " << n;
  }
}

TEST_F(MpiCommTest, TheNonblockingVariantGivesTheMeanBitwiseEqualOnEveryRank) {
  auto nonblocking =
      detail::make_mpi_communicator(*device_, test_ranks(), detail::MpiWait::kNonblocking);
  const int64_t n = (1 << 20) + 1;
  float* data = alloc_floats(n, "data");
  for (int64_t i = 0; i < n; ++i) data[i] = grad_value(rank(), 0, static_cast<uint64_t>(i));
  nonblocking->all_reduce_mean(data, n, compute()).wait();
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    double mean = 0;
    for (int r = 0; r < size(); ++r) mean += grad_value(r, 0, static_cast<uint64_t>(i));
    worst = std::max(worst, std::abs(data[i] - mean / size()));
  }
  EXPECT_LT(worst, 2e-6);
  EXPECT_TRUE(same_on_all_ranks(data, static_cast<size_t>(n) * sizeof(float)));
  auto* bytes = reinterpret_cast<unsigned char*>(data);
  for (int i = 0; i < 100; ++i) bytes[i] = static_cast<unsigned char>(rank() + i);
  nonblocking->broadcast(bytes, 100, size() - 1, compute()).wait();
  EXPECT_EQ(bytes[99], static_cast<unsigned char>(size() - 1 + 99));
  nonblocking->barrier();
}

// Note [A bf16 all-reduce]'s bound on n ranks' bf16 sum, relative to the sum of |b_i|.
double bf16_sum_bound(int ranks) { return std::pow(1.0 + 0x1p-8 + 0x1p-23, ranks - 1) - 1.0; }

// A gradient of varied magnitude (2^-12 .. 2^7) with every fp32 mantissa bit in use.
float varied_grad(int rank, uint64_t element) {
  return std::ldexp(grad_value(rank, 5, element), static_cast<int>(element % 20) - 12);
}

// comm.dtype bf16: the mean is the bf16 sum of the ranks' bf16 gradients within the stated
// bound (exactly bf16(b_0 + b_1) / 2 at 2 ranks), the same bits on every rank, a bf16 sum on the
// wire (mean times ranks is a bf16 value), and half fp32's bytes counted.
TEST_F(MpiCommTest, Bf16AllReduceIsTheBf16SumWithinItsBoundAndHalvesTheBytes) {
  auto nonblocking =
      detail::make_mpi_communicator(*device_, test_ranks(), detail::MpiWait::kNonblocking);
  for (Communicator* comm : {comm_.get(), nonblocking.get()}) {
    for (int64_t n : {int64_t{1}, int64_t{4099}, int64_t{(1 << 20) + 3}}) {
      float* data = alloc_floats(n, "data");
      float* fp32 = alloc_floats(n, "fp32");
      for (int64_t i = 0; i < n; ++i) {
        data[i] = fp32[i] = varied_grad(rank(), static_cast<uint64_t>(i));
      }
      const uint64_t before = comm->all_reduce_bytes();
      comm->all_reduce_mean_bf16(data, n, compute()).wait();
      EXPECT_EQ(comm->all_reduce_bytes() - before, static_cast<uint64_t>(n) * 2) << n;
      comm->all_reduce_mean(fp32, n, compute()).wait();
      EXPECT_EQ(comm->all_reduce_bytes() - before, static_cast<uint64_t>(n) * 6) << n;
      int64_t outside = 0, not_bf16 = 0, unlike_fp32 = 0;
      double worst = 0;
      for (int64_t i = 0; i < n; ++i) {
        double sum = 0, magnitude = 0;
        float pair = 0;  // 2 ranks: the one combine
        for (int r = 0; r < size(); ++r) {
          const float b = round_to_bf16(varied_grad(r, static_cast<uint64_t>(i)));
          sum += b;
          magnitude += std::abs(b);
          pair += b;
        }
        const double err = std::abs(static_cast<double>(data[i]) * size() - sum);
        // n = 3: the fp32 division rounds once more.
        const double bound = bf16_sum_bound(size()) * magnitude + 0x1p-23 * std::abs(sum);
        if (err > bound) ++outside;
        worst = std::max(worst, magnitude > 0 ? err / magnitude : 0.0);
        const float times_ranks = data[i] * static_cast<float>(size());
        if ((size() & (size() - 1)) == 0 && round_to_bf16(times_ranks) != times_ranks) ++not_bf16;
        if (size() == 2 && data[i] != round_to_bf16(pair) * 0.5f) ++not_bf16;
        if (data[i] != fp32[i]) ++unlike_fp32;
      }
      EXPECT_EQ(outside, 0) << "count " << n << ", worst relative error " << worst
                            << " against the bound " << bf16_sum_bound(size());
      EXPECT_EQ(not_bf16, 0) << n;
      if (n > 1) {
        EXPECT_GT(unlike_fp32, n / 2) << "the bf16 all-reduce rounded little: was it narrowed?";
      }
      EXPECT_TRUE(same_on_all_ranks(data, static_cast<size_t>(n) * sizeof(float))) << n;
    }
    comm->barrier();
  }
}

TEST_F(MpiCommTest, CollectivesRunInIssueOrder) {
  const int64_t n = 1 << 16;
  float* a = alloc_floats(n, "a");
  float* b = alloc_floats(n, "b");
  std::fill(a, a + n, static_cast<float>(2 * rank()));
  std::fill(b, b + n, static_cast<float>(4 * rank()));
  CommWork first = comm_->all_reduce_mean(a, n, compute());
  CommWork second = comm_->all_reduce_mean(b, n, compute());
  second.wait();
  EXPECT_TRUE(first.ready());  // the comm stream ran it before the second
  EXPECT_EQ(a[n - 1], static_cast<float>(size() - 1));
  EXPECT_EQ(b[0], static_cast<float>(2 * (size() - 1)));
  ASSERT_TRUE(first.span() && second.span());
  EXPECT_LE(first.span()->end_ns, second.span()->start_ns);
  EXPECT_LE(first.span()->start_ns, first.span()->end_ns);
}

TEST_F(MpiCommTest, BroadcastFromEveryRoot) {
  auto* bytes = reinterpret_cast<unsigned char*>(alloc_floats(1024, "bytes"));
  for (int root = 0; root < size(); ++root) {
    for (int i = 0; i < 1001; ++i) bytes[i] = static_cast<unsigned char>((rank() * 31 + i) & 0xff);
    bytes[1001] = 0xee;  // past the end: untouched
    comm_->broadcast(bytes, 1001, root, compute()).wait();
    int wrong = 0;
    for (int i = 0; i < 1001; ++i) wrong += bytes[i] != ((root * 31 + i) & 0xff);
    EXPECT_EQ(wrong, 0) << "root " << root;
    EXPECT_EQ(bytes[1001], 0xee);
  }
  // A large broadcast, as for the initial parameters.
  const int64_t n = 3 << 20;
  float* params = alloc_floats(n, "params");
  for (int64_t i = 0; i < n; ++i) params[i] = static_cast<float>(rank() == 0 ? i : -1);
  comm_->broadcast(params, static_cast<uint64_t>(n) * sizeof(float), 0, compute()).wait();
  EXPECT_EQ(params[0], 0.0f);
  EXPECT_EQ(params[n - 1], static_cast<float>(n - 1));
  EXPECT_THROW(comm_->broadcast(params, 4, size(), compute()), UnsupportedError);
}

// Host memory (a std::vector, not the device block nor pinned memory): the root's bytes reach
// every rank, bytes past the end stay, and the call returns only once they are there.
TEST_F(MpiCommTest, HostBroadcastFromEveryRootFillsPlainHostMemory) {
  for (int root = 0; root < size(); ++root) {
    std::vector<char> name(129, static_cast<char>(0x5a + rank()));
    const std::string token = "ferry-ledger-" + std::to_string(root * 7 + 3);
    if (rank() == root) std::copy(token.begin(), token.end(), name.begin());
    if (rank() == root) name[token.size()] = '\0';
    comm_->broadcast_host(name.data(), 128, root);
    EXPECT_EQ(std::string(name.data()), token) << "root " << root;
    EXPECT_EQ(name[128], static_cast<char>(0x5a + rank())) << "past the end";
  }
  // Ordered after the device collectives issued before it on the comm stream.
  float* data = alloc_floats(1024, "mean");
  for (int i = 0; i < 1024; ++i) data[i] = static_cast<float>(rank() * 2);
  comm_->all_reduce_mean(data, 1024, compute());
  uint64_t word = rank() == 0 ? 0x0123456789abcdefULL : 0;
  comm_->broadcast_host(&word, sizeof(word), 0);
  EXPECT_EQ(word, 0x0123456789abcdefULL);
  EXPECT_EQ(data[1023], static_cast<float>(size() - 1));  // the mean of 0, 2, ..., 2(size-1)
  EXPECT_THROW(comm_->broadcast_host(&word, sizeof(word), size()), UnsupportedError);
  EXPECT_THROW(comm_->broadcast_host(&word, sizeof(word), -1), UnsupportedError);
}

TEST_F(MpiCommTest, BarrierWaitsForTheSlowestRank) {
  comm_->barrier();  // line the ranks up
  const bool slow = rank() == size() - 1;
  if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  comm_->barrier();
  const auto waited = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (!slow) {
    EXPECT_GE(waited, 200.0);
  }
  if (slow) {
    EXPECT_LT(waited, 200.0);
  }
}

// The collective starts after the producer's work on the compute stream, the host does not
// block, and the compute stream sees the result only once it is ordered after the work.
TEST_F(MpiCommTest, AllReduceIsOrderedAfterItsProducerAndBeforeItsConsumer) {
  const int64_t n = 4096;
  float* data = alloc_floats(n, "data");
  std::fill(data, data + n, 0.0f);
  std::vector<float> before(n, -1), after(n, -1);
  comm_->barrier();
  const float mine = static_cast<float>(rank() + 1);
  const int delay_ms = rank() == 0 ? 300 : 0;  // rank 0's gradient is late
  compute().enqueue([=] {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    std::fill(data, data + n, mine);
  });
  const auto t0 = Clock::now();
  CommWork work = comm_->all_reduce_mean(data, n, compute());
  const auto issue_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_LT(issue_ms, 100.0);  // issuing does not wait for the producer
  EXPECT_FALSE(work.ready());  // rank 0's producer is still sleeping
  compute().enqueue([&] { std::copy(data, data + n, before.begin()); });  // not ordered
  work.order_before(compute());
  compute().enqueue([&] { std::copy(data, data + n, after.begin()); });  // ordered
  compute().synchronize();
  EXPECT_TRUE(work.ready());
  const float mean = static_cast<float>(size() + 1) / 2.0f;
  EXPECT_EQ(after[0], mean);
  EXPECT_EQ(after[n - 1], mean);
  if (rank() != 0) {
    // Ran right after this rank's producer, while the collective waited for rank 0.
    EXPECT_EQ(before[0], mine);
    EXPECT_EQ(before[n - 1], mine);
  }
}

// ---- gradient buckets -------------------------------------------------------------------

struct FakeModel {
  std::vector<GradSlice> slices;  // padded to 64 bytes
  uint64_t block_bytes = 0;
};

FakeModel fake_model() {
  const std::vector<int64_t> floats{1000, 40000, 3, 70000, 17, 5, 65536, 100, 2500, 8, 30000, 1};
  FakeModel m;
  for (int64_t f : floats) {
    const uint64_t padded = (static_cast<uint64_t>(f) * 4 + 63) / 64 * 64;
    m.slices.push_back({m.block_bytes, padded});
    m.block_bytes += padded;
  }
  return m;
}

struct StepResult {
  std::vector<float> block;
  std::vector<BucketSpan> spans;
  size_t launched_before_finish = 0;
  int64_t last_write_ns = 0;
  int64_t finish_ns = 0;
  uint64_t wire_bytes_before = 0;  // the communicator's all_reduce_bytes() before finish()
  uint64_t wire_bytes = 0;         // all-reduce payload bytes of the step (overlap on: part)
};

// Two steps of a fake backward (3 ms per gradient) through GradientBuckets.
class BucketsMpiTest : public MpiCommTest {
 protected:
  std::vector<StepResult> run(bool overlap, const FakeModel& m, DType wire = DType::kF32) {
    float* block = alloc_floats(static_cast<int64_t>(m.block_bytes / 4), "gradients");
    std::fill(block, block + m.block_bytes / 4, 0.0f);
    BucketOptions options{128 << 10, overlap, {}, {}};
    options.wire_dtype = wire;
    GradientBuckets buckets(*comm_, *device_, block, m.slices, options);
    std::vector<StepResult> results;
    for (int step = 0; step < 2; ++step) {
      StepResult r;
      buckets.reset();
      comm_->barrier();
      std::atomic<int64_t> last_write{0};
      for (size_t p = m.slices.size(); p-- > 0;) {
        float* g = block + m.slices[p].offset / 4;
        const uint64_t n = m.slices[p].bytes / 4 - (p == 2 || p == 11 ? 1 : 0);  // leave padding
        const uint64_t first = m.slices[p].offset / 4;
        const int rk = rank();
        compute().enqueue([=, &last_write] {
          std::this_thread::sleep_for(std::chrono::milliseconds(3));
          for (uint64_t i = 0; i < n; ++i) g[i] = grad_value(rk, step, first + i);
          last_write = now_ns();
        });
        buckets.mark_ready(p);
      }
      r.launched_before_finish = buckets.launched();
      r.wire_bytes_before = comm_->all_reduce_bytes();
      r.finish_ns = now_ns();
      buckets.finish(compute());
      r.block.resize(m.block_bytes / 4);
      compute().enqueue([&r, block] { std::copy(block, block + r.block.size(), r.block.begin()); });
      compute().synchronize();
      r.spans = buckets.spans();
      r.wire_bytes = comm_->all_reduce_bytes() - r.wire_bytes_before;
      r.last_write_ns = last_write;
      results.push_back(std::move(r));
    }
    return results;
  }
};

TEST_F(BucketsMpiTest, OverlapOnAndOffGiveTheSameMeanOnEveryRank) {
  const FakeModel m = fake_model();
  const auto on = run(true, m);
  const auto off = run(false, m);
  const size_t n_buckets = assign_buckets(m.slices, {}, 128 << 10).size();
  ASSERT_GE(n_buckets, 5u);
  for (int step = 0; step < 2; ++step) {
    const auto& a = on[static_cast<size_t>(step)];
    const auto& b = off[static_cast<size_t>(step)];
    EXPECT_EQ(std::memcmp(a.block.data(), b.block.data(), a.block.size() * 4), 0) << step;
    EXPECT_TRUE(same_on_all_ranks(a.block.data(), a.block.size() * 4)) << step;
    // The mean over ranks, element by element; padding stays zero.
    double worst = 0;
    for (size_t p = 0; p < m.slices.size(); ++p) {
      const uint64_t first = m.slices[p].offset / 4;
      const uint64_t written = m.slices[p].bytes / 4 - (p == 2 || p == 11 ? 1 : 0);
      for (uint64_t i = 0; i < m.slices[p].bytes / 4; ++i) {
        double mean = 0;
        if (i < written) {
          for (int r = 0; r < size(); ++r) mean += grad_value(r, step, first + i);
          mean /= size();
        }
        worst = std::max(worst, std::abs(a.block[first + i] - mean));
        if (i >= written) {
          EXPECT_EQ(a.block[first + i], 0.0f);
        }
      }
    }
    EXPECT_LT(worst, 2e-6) << step;
    // Overlap on: buckets launched during backward, and the first started before its end.
    EXPECT_EQ(a.launched_before_finish, n_buckets) << step;
    ASSERT_EQ(a.spans.size(), n_buckets);
    EXPECT_LT(a.spans[0].start_ns, a.last_write_ns) << step;
    // Overlap off: nothing launched before finish, nothing started before it.
    EXPECT_EQ(b.launched_before_finish, 0u) << step;
    ASSERT_EQ(b.spans.size(), n_buckets);
    for (const auto& s : b.spans) EXPECT_GE(s.start_ns, b.finish_ns) << step;
    uint64_t bytes = 0;
    for (const auto& s : a.spans) bytes += s.bytes;
    EXPECT_EQ(bytes, m.block_bytes);
  }
}

// comm.dtype bf16 through the buckets: overlap on and off give the same bits on every rank,
// within the bf16 bound of the mean, with half the fp32 bytes on the wire (spans and counted).
TEST_F(BucketsMpiTest, ABf16WireHalvesTheBytesAndGivesTheBf16MeanOnEveryRank) {
  const FakeModel m = fake_model();
  const auto on = run(true, m, DType::kBF16);
  const auto off = run(false, m, DType::kBF16);
  const auto fp32 = run(false, m);
  for (int step = 0; step < 2; ++step) {
    const auto& a = on[static_cast<size_t>(step)];
    const auto& b = off[static_cast<size_t>(step)];
    EXPECT_EQ(std::memcmp(a.block.data(), b.block.data(), a.block.size() * 4), 0) << step;
    EXPECT_TRUE(same_on_all_ranks(a.block.data(), a.block.size() * 4)) << step;
    int64_t outside = 0;
    for (size_t p = 0; p < m.slices.size(); ++p) {
      const uint64_t first = m.slices[p].offset / 4;
      for (uint64_t i = 0; i < m.slices[p].bytes / 4; ++i) {
        double sum = 0, magnitude = 0;
        if (i < m.slices[p].bytes / 4 - (p == 2 || p == 11 ? 1 : 0)) {
          for (int r = 0; r < size(); ++r) {
            const float v = round_to_bf16(grad_value(r, step, first + i));
            sum += v;
            magnitude += std::abs(v);
          }
        }
        const double err = std::abs(static_cast<double>(a.block[first + i]) * size() - sum);
        if (err > bf16_sum_bound(size()) * magnitude + 0x1p-23 * std::abs(sum)) ++outside;
      }
    }
    EXPECT_EQ(outside, 0) << step;
    EXPECT_NE(std::memcmp(a.block.data(), fp32[static_cast<size_t>(step)].block.data(),
                          a.block.size() * 4),
              0)
        << "a bf16 wire gave fp32's bits";
    // Half the bytes: every bucket's span, and what the communicator handed to MPI.
    uint64_t span_bytes = 0;
    for (const auto& s : b.spans) span_bytes += s.bytes;
    EXPECT_EQ(span_bytes, m.block_bytes / 2) << step;
    EXPECT_EQ(b.wire_bytes, m.block_bytes / 2) << step;
    EXPECT_EQ(fp32[static_cast<size_t>(step)].wire_bytes, m.block_bytes) << step;
  }
}

}  // namespace
}  // namespace ferry
