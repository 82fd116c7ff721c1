// The CUDA device on a real GPU: memory within and beyond capacity, pinned memory, copies
// ordered by events across streams, the fill and scale kernels, each on one cudaMalloc and on a
// range mapped on use (memory.share), and what mapping on use holds of the GPU. Each test skips
// with "no CUDA device present" when there is no GPU; the out-of-memory message of a GPU short
// of memory is checked everywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "common/bytes.h"
#include "common/error.h"
#include "device/cuda/cuda_device.h"
#include "device/cuda/gpu_shortage.h"
#include "device/device.h"

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

DeviceOptions cuda_options(uint64_t memory, bool map_on_use = false) {
  DeviceOptions options;
  options.backend = Backend::kCuda;
  options.memory = memory;
  options.ordinal = 0;
  options.map_on_use = map_on_use;
  return options;
}

// Pinned host floats from the device's allocator, freed at scope end (before the device).
class PinnedFloats {
 public:
  PinnedFloats(PinnedAllocator& allocator, size_t n)
      : allocator_(allocator), n_(n), data_(static_cast<float*>(allocator.allocate(bytes()))) {}
  ~PinnedFloats() { allocator_.deallocate(data_, bytes()); }
  PinnedFloats(const PinnedFloats&) = delete;
  PinnedFloats& operator=(const PinnedFloats&) = delete;

  float* data() const { return data_; }
  float& operator[](size_t i) const { return data_[i]; }
  uint64_t bytes() const { return n_ * sizeof(float); }
  void fill(float value) const {
    for (size_t i = 0; i < n_; ++i) data_[i] = value;
  }
  // Elements in [begin, end) that differ from `value` (NaN matches NaN).
  size_t mismatches(size_t begin, size_t end, float value) const {
    size_t bad = 0;
    for (size_t i = begin; i < end; ++i) {
      const bool same = std::isnan(value) ? std::isnan(data_[i]) : data_[i] == value;
      if (!same) ++bad;
    }
    return bad;
  }

 private:
  PinnedAllocator& allocator_;
  size_t n_;
  float* data_;
};

TEST(GpuShortage, NamesTheAllocationTheBytesAndWhatTheDriverReports) {
  const OutOfMemoryError e = cuda::gpu_shortage(
      1, "activation arena", 3 * 1024 * kMiB, {true, 1024 * kMiB, 80 * 1024 * kMiB},
      "mapping 2.00 GiB of it failed; lower device.memory");
  EXPECT_EQ(e.where(), OutOfMemoryError::Where::kDevice);
  EXPECT_EQ(e.requested(), 3 * 1024 * kMiB);
  EXPECT_TRUE(contains(e.what(), "'activation arena' needs 3.00 GiB, 79.00 GiB of 80.00 GiB"))
      << e.what();
  EXPECT_EQ(e.hint(),
            "mapping 2.00 GiB of it failed; lower device.memory: cuda:1 has 1.00 GiB free of "
            "80.00 GiB (other processes may hold the rest)");
  const OutOfMemoryError unknown =
      cuda::gpu_shortage(0, "cuda:0 device block", kMiB, {}, "lower device.memory");
  EXPECT_TRUE(contains(unknown.hint(), "cuda:0 did not report its free memory")) << unknown.hint();
  EXPECT_EQ(exit_code_for(unknown), 2);
}

// Without a GPU (or a driver) a mapped range is an error, never a call through a missing entry
// point; with one, it reserves address space only.
TEST(MappedRange, ReservesAddressSpaceOnlyOrFailsCleanly) {
  if (cuda::device_count() == 0) {
    EXPECT_THROW(cuda::MappedRange(0, 64 * kMiB, 2 * kMiB), Error);
    return;
  }
  cuda::MappedRange range(0, 64 * kMiB + 1, 2 * kMiB);
  EXPECT_EQ(range.reserved(), 66 * kMiB);
  EXPECT_EQ(range.mapped(), 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(range.base()) % (2 * kMiB), 0u);
  range.back(2 * kMiB, 4 * kMiB, "piece", 4 * kMiB);
  EXPECT_EQ(range.mapped(), 4 * kMiB);
  range.unback(2 * kMiB, 4 * kMiB);
  EXPECT_EQ(range.mapped(), 0u);
}

// Every test on both kinds of device memory: one cudaMalloc (false), and a range mapped on use
// as under memory.share (true; Note [Device memory of a shared GPU]).
class CudaDeviceTest : public ::testing::TestWithParam<bool> {
 protected:
  static constexpr uint64_t kCapacity = 256 * kMiB;

  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device present";
    device_ = create_device(cuda_options(kCapacity, GetParam()));
  }

  Stream& compute() { return device_->stream(StreamKind::kCompute); }
  Stream& h2d() { return device_->stream(StreamKind::kHostToDevice); }
  Stream& d2h() { return device_->stream(StreamKind::kDeviceToHost); }

  std::unique_ptr<Device> device_;
};

TEST_P(CudaDeviceTest, NameNamesTheGpuAndTheCapacity) {
  EXPECT_EQ(device_->backend(), Backend::kCuda);
  const std::string name = device_->name();
  EXPECT_EQ(name.rfind("cuda:0 (", 0), 0u) << name;
  EXPECT_TRUE(contains(name, format_bytes(kCapacity) + " device memory")) << name;
  EXPECT_EQ(contains(name, "device memory mapped on use in 2.00 MiB granules"), GetParam()) << name;
  for (StreamKind kind : {StreamKind::kCompute, StreamKind::kDeviceToHost,
                          StreamKind::kHostToDevice, StreamKind::kComm}) {
    EXPECT_EQ(device_->stream(kind).kind(), kind);
  }
}

TEST_P(CudaDeviceTest, AllocatesDeviceMemoryWithinCapacity) {
  DeviceHeap& heap = device_->memory();
  EXPECT_EQ(heap.capacity(), kCapacity);
  const uint64_t odd = 100 * kMiB + 3;
  const uint64_t odd_rounded = 100 * kMiB + DeviceHeap::kAlignment;
  {
    DeviceBuffer a(heap, 64 * kMiB, "a");
    DeviceBuffer b(heap, odd, "b");
    const auto pa = reinterpret_cast<uintptr_t>(a.data());
    const auto pb = reinterpret_cast<uintptr_t>(b.data());
    EXPECT_EQ(pa % DeviceHeap::kAlignment, 0u);
    EXPECT_EQ(pb % DeviceHeap::kAlignment, 0u);
    EXPECT_TRUE(pb >= pa + 64 * kMiB || pa >= pb + odd_rounded);
    EXPECT_EQ(heap.stats().in_use, 64 * kMiB + odd_rounded);

    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, b.data()), cudaSuccess);
    EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
    EXPECT_EQ(attributes.device, 0);
  }
  EXPECT_EQ(heap.stats().in_use, 0u);
  EXPECT_EQ(heap.stats().peak, 64 * kMiB + odd_rounded);
  EXPECT_EQ(heap.stats().oom_count, 0u);
}

TEST_P(CudaDeviceTest, AllocationBeyondCapacityIsOutOfMemoryNamingTheResident) {
  DeviceHeap& heap = device_->memory();
  DeviceBuffer resident(heap, 200 * kMiB, "conv1 activations");
  try {
    heap.allocate(100 * kMiB, "fc weights");
    FAIL() << "allocated beyond the capacity";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.where(), OutOfMemoryError::Where::kDevice);
    EXPECT_EQ(e.requested(), 100 * kMiB);
    ASSERT_EQ(e.resident().size(), 1u);
    EXPECT_EQ(e.resident()[0].label, "conv1 activations");
    EXPECT_TRUE(contains(e.what(), "fc weights")) << e.what();
  }
  EXPECT_EQ(heap.stats().oom_count, 1u);
  // Exactly the rest of the capacity still fits.
  DeviceBuffer rest(heap, kCapacity - 200 * kMiB, "rest");
  EXPECT_EQ(heap.stats().in_use, kCapacity);
}

TEST_P(CudaDeviceTest, DeviceMemoryBeyondTheGpuIsOutOfMemoryWithAHint) {
  if (GetParam()) GTEST_SKIP() << "mapping on use reserves address space only (tested below)";
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  try {
    create_device(cuda_options(prop.totalGlobalMem + 1024 * kMiB));
    FAIL() << "reserved more device memory than the GPU has";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.where(), OutOfMemoryError::Where::kDevice);
    EXPECT_TRUE(contains(e.hint(), "lower device.memory")) << e.hint();
    EXPECT_TRUE(contains(e.hint(), " free of ")) << e.hint();
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the failed cudaMalloc left no error behind
  // The failure left the existing device working.
  DeviceBuffer buffer(device_->memory(), 4 * kMiB, "after");
  device_->kernels().launch(Fill{static_cast<int64_t>(kMiB), 1.0f, buffer.as<float>()}, compute());
  EXPECT_NO_THROW(compute().synchronize());
}

TEST_P(CudaDeviceTest, PinnedMemoryIsPageLockedHostMemory) {
  PinnedAllocator& pinned = device_->pinned();
  const uint64_t bytes = 3 * kMiB + 5;
  auto* p = static_cast<unsigned char*>(pinned.allocate(bytes));
  ASSERT_NE(p, nullptr);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, p), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  std::memset(p, 0xab, bytes);
  EXPECT_EQ(p[bytes - 1], 0xab);
  pinned.deallocate(p, bytes);
}

TEST_P(CudaDeviceTest, CopyRoundTripThroughDeviceMemoryOrderedByEvents) {
  const size_t n = (4u << 20) + 7;  // 16 MiB and a few floats
  PinnedFloats src(device_->pinned(), n);
  PinnedFloats dst(device_->pinned(), n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.25f - 3.0f;
  dst.fill(std::numeric_limits<float>::quiet_NaN());
  DeviceBuffer buffer(device_->memory(), src.bytes(), "round trip");

  auto uploaded = device_->create_event();
  auto downloaded = device_->create_event();
  device_->copy_async(buffer.data(), src.data(), src.bytes(), h2d());
  h2d().record(*uploaded);
  d2h().wait(*uploaded);
  device_->copy_async(dst.data(), buffer.data(), dst.bytes(), d2h());
  d2h().record(*downloaded);
  downloaded->synchronize();

  EXPECT_TRUE(downloaded->ready());
  EXPECT_TRUE(uploaded->ready());
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), src.bytes()), 0);
  EXPECT_EQ(dst[n - 1], static_cast<float>(n - 1) * 0.25f - 3.0f);
}

TEST_P(CudaDeviceTest, WaitOrdersWorkAcrossThreeStreams) {
  // fill(1) on compute -> upload 3s on h2d -> scale(2) on compute -> download on d2h. Each
  // hand-over is only an event wait; any missing order leaves 1, 2 or 3 instead of 6.
  const size_t n = 16u << 20;  // 64 MiB: long enough that a race shows
  PinnedFloats src(device_->pinned(), n);
  PinnedFloats dst(device_->pinned(), n);
  src.fill(3.0f);
  dst.fill(std::numeric_limits<float>::quiet_NaN());
  DeviceBuffer buffer(device_->memory(), src.bytes(), "ordered");
  const auto count = static_cast<int64_t>(n);
  auto filled = device_->create_event();
  auto uploaded = device_->create_event();
  auto scaled = device_->create_event();
  auto done = device_->create_event();

  device_->kernels().launch(Fill{count, 1.0f, buffer.as<float>()}, compute());
  compute().record(*filled);
  h2d().wait(*filled);
  device_->copy_async(buffer.data(), src.data(), src.bytes(), h2d());
  h2d().record(*uploaded);
  compute().wait(*uploaded);
  device_->kernels().launch(Scale{count, 2.0f, buffer.as<float>()}, compute());
  compute().record(*scaled);
  d2h().wait(*scaled);
  device_->copy_async(dst.data(), buffer.data(), dst.bytes(), d2h());
  d2h().record(*done);
  done->synchronize();

  EXPECT_EQ(dst.mismatches(0, n, 6.0f), 0u);
}

TEST_P(CudaDeviceTest, NeverRecordedEventIsReadyAndWaitingOnItIsANoOp) {
  auto event = device_->create_event();
  EXPECT_TRUE(event->ready());
  EXPECT_NO_THROW(event->synchronize());
  compute().wait(*event);
  EXPECT_NO_THROW(compute().synchronize());
}

TEST_P(CudaDeviceTest, DeviceSynchronizeWaitsForEveryStream) {
  const size_t n = 16u << 20;
  PinnedFloats src(device_->pinned(), n);
  std::vector<float> back(n, 0.0f);
  src.fill(5.0f);
  DeviceBuffer buffer(device_->memory(), src.bytes(), "synchronize");
  device_->copy_async(buffer.data(), src.data(), src.bytes(), h2d());
  device_->synchronize();
  // A plain cudaMemcpy on the legacy default stream does not wait for our non-blocking streams,
  // so this sees the whole upload only if synchronize() waited for it.
  // ferry-lint: legacy-stream-ok (this test is about exactly that)
  ASSERT_EQ(cudaMemcpy(back.data(), buffer.data(), src.bytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  size_t bad = 0;
  for (float v : back) bad += v != 5.0f;
  EXPECT_EQ(bad, 0u);
}

TEST_P(CudaDeviceTest, FillAndScaleKernelsCoverExactlyTheirRange) {
  Kernels& kernels = device_->kernels();
  // More than one grid of 4096 x 256 threads, and not a multiple of the block size.
  const int64_t n = 3'000'017;
  const int64_t guard = 64;
  const size_t total = static_cast<size_t>(n + guard);
  DeviceBuffer buffer(device_->memory(), total * sizeof(float), "fill");
  PinnedFloats host(device_->pinned(), total);
  float* y = buffer.as<float>();

  kernels.launch(Fill{n + guard, 7.0f, y}, compute());
  kernels.launch(Fill{n, std::numeric_limits<float>::quiet_NaN(), y}, compute());
  kernels.launch(Fill{0, 1.0f, nullptr}, compute());  // nothing to do
  device_->copy_async(host.data(), y, host.bytes(), compute());
  compute().synchronize();
  EXPECT_EQ(host.mismatches(0, n, std::numeric_limits<float>::quiet_NaN()), 0u);
  EXPECT_EQ(host.mismatches(n, total, 7.0f), 0u);

  kernels.launch(Fill{n, 1.5f, y}, compute());
  kernels.launch(Scale{n, -2.0f, y}, compute());
  device_->copy_async(host.data(), y, host.bytes(), compute());
  compute().synchronize();
  EXPECT_EQ(host.mismatches(0, n, -3.0f), 0u);
  EXPECT_EQ(host.mismatches(n, total, 7.0f), 0u);
}

TEST_P(CudaDeviceTest, TimingEventsMeasureElapsedTime) {
  auto& cuda = dynamic_cast<cuda::CudaDevice&>(*device_);
  auto start = cuda.create_timing_event();
  auto end = cuda.create_timing_event();
  DeviceBuffer buffer(device_->memory(), 64 * kMiB, "timed");
  compute().record(*start);
  device_->kernels().launch(Fill{static_cast<int64_t>(16 * kMiB), 0.0f, buffer.as<float>()},
                            compute());
  compute().record(*end);
  end->synchronize();
  const double ms = device_->elapsed_ms(*start, *end);
  EXPECT_GE(ms, 0.0);
  EXPECT_LT(ms, 10'000.0);
}

INSTANTIATE_TEST_SUITE_P(DeviceMemory, CudaDeviceTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "MappedOnUse" : "OneBlock";
                         });

// The GPU's free bytes, as the driver reports them.
uint64_t gpu_free() {
  size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return free_bytes;
}

class MappedOnUseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device present";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaGetDeviceProperties(&prop_, 0), cudaSuccess);
  }
  cudaDeviceProp prop_{};
};

// Two devices each of three quarters of the GPU: one cudaMalloc each could not hold both.
TEST_F(MappedOnUseTest, DevicesTogetherLargerThanTheGpuHoldOnlyWhatTheirHeapsHold) {
  const uint64_t each = prop_.totalGlobalMem / 4 * 3 / kMiB * kMiB;
  auto first = create_device(cuda_options(each, true));
  auto second = create_device(cuda_options(each, true));
  const uint64_t before = gpu_free();
  DeviceHeap& heap = first->memory();
  {
    DeviceBuffer a(heap, 64 * kMiB + 3, "a");  // granules 0..32
    EXPECT_EQ(heap.stats().held, 66 * kMiB);
    DeviceBuffer b(second->memory(), 10 * kMiB, "b");
    EXPECT_EQ(second->memory().stats().held, 10 * kMiB);
    const uint64_t lost = before - gpu_free();
    EXPECT_GE(lost, 76 * kMiB);
    EXPECT_LE(lost, 76 * kMiB + 16 * kMiB) << "more than the granules mapped";
    // The memory is the device's: a kernel fills it, a copy reads it back.
    const int64_t n = static_cast<int64_t>(16 * kMiB);
    first->kernels().launch(Fill{n, 2.5f, a.as<float>()}, first->stream(StreamKind::kCompute));
    std::vector<float> back(16);
    first->stream(StreamKind::kCompute).synchronize();
    // ferry-lint: legacy-stream-ok (the device is idle; a plain read-back)
    ASSERT_EQ(cudaMemcpy(back.data(), a.as<float>() + n - 16, 64, cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (float v : back) EXPECT_EQ(v, 2.5f);
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, a.data()), cudaSuccess);
    EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  }
  EXPECT_EQ(heap.stats().held, 0u);
  EXPECT_GE(gpu_free() + 8 * kMiB, before) << "the granules went back to the GPU";
}

TEST_F(MappedOnUseTest, AnAllocationTheGpuCannotMapIsOutOfMemoryAndLeavesTheHeapAsItWas) {
  const uint64_t capacity = prop_.totalGlobalMem + 1024 * kMiB;
  auto device = create_device(cuda_options(capacity, true));
  DeviceHeap& heap = device->memory();
  DeviceBuffer kept(heap, 8 * kMiB, "kept");
  const MemoryStats stats = heap.stats();
  const uint64_t before = gpu_free();
  try {
    heap.allocate(prop_.totalGlobalMem, "activation arena");
    FAIL() << "mapped more than the GPU has";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.where(), OutOfMemoryError::Where::kDevice);
    EXPECT_EQ(e.requested(), prop_.totalGlobalMem);
    EXPECT_TRUE(contains(e.what(), "activation arena")) << e.what();
    EXPECT_TRUE(contains(e.hint(), "lower device.memory")) << e.hint();
    EXPECT_TRUE(contains(e.hint(), " free of ")) << e.hint();
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(heap.stats().in_use, stats.in_use);
  EXPECT_EQ(heap.stats().held, stats.held);
  EXPECT_GE(gpu_free() + 8 * kMiB, before) << "a failed mapping left memory behind";
  DeviceBuffer after(heap, 4 * kMiB, "after");
  device->kernels().launch(Fill{static_cast<int64_t>(kMiB), 1.0f, after.as<float>()},
                           device->stream(StreamKind::kCompute));
  EXPECT_NO_THROW(device->stream(StreamKind::kCompute).synchronize());
}

}  // namespace
}  // namespace ferry
