// CpuDevice: copies between device memory and pinned host memory ordered by events across the
// copy and compute streams, the emulated link bandwidth, copies paced by an arbiter, the
// device's memory capacity, and its memory held on use under memory.share.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <vector>

#include "device/cpu/cpu_device.h"

namespace ferry::cpu {
namespace {

DeviceOptions options(uint64_t memory, double gbps = 0) {
  DeviceOptions o;
  o.memory = memory;
  o.cpu.threads = 2;
  o.cpu.link_gbps = gbps;
  return o;
}

// Host -> device on the H2D stream, a kernel on the compute stream after it, device -> host on
// the D2H stream after that: the round trip sees the kernel's result.
TEST(CpuDevice, CopiesBetweenPinnedAndDeviceMemoryFollowEvents) {
  CpuDevice device(options(64ull << 20));
  constexpr int64_t n = 1 << 20;
  const uint64_t bytes = n * sizeof(float);
  auto* host_in = static_cast<float*>(device.pinned().allocate(bytes));
  auto* host_out = static_cast<float*>(device.pinned().allocate(bytes));
  std::iota(host_in, host_in + n, 0.0f);
  std::memset(host_out, 0, bytes);
  DeviceBuffer buf(device.memory(), bytes, "activation");

  Stream& h2d = device.stream(StreamKind::kHostToDevice);
  Stream& compute = device.stream(StreamKind::kCompute);
  Stream& d2h = device.stream(StreamKind::kDeviceToHost);
  auto uploaded = device.create_event(), computed = device.create_event();
  device.copy_async(buf.data(), host_in, bytes, h2d);
  h2d.record(*uploaded);
  compute.wait(*uploaded);
  device.kernels().launch(Scale{n, 2.0f, buf.as<float>()}, compute);
  compute.record(*computed);
  d2h.wait(*computed);
  device.copy_async(host_out, buf.data(), bytes, d2h);
  d2h.synchronize();
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(host_out[i], 2.0f * static_cast<float>(i)) << i;
  EXPECT_EQ(host_out[n - 1], 2.0f * static_cast<float>(n - 1));
  device.synchronize();
  device.pinned().deallocate(host_in, bytes);
  device.pinned().deallocate(host_out, bytes);
}

// With copy_gbps set a copy takes at least bytes / bandwidth (only a lower bound is asserted:
// a loaded machine may take longer).
TEST(CpuDevice, CopyBandwidthEmulationTakesBytesOverBandwidth) {
  const double gbps = 1.0;  // 1 GB/s
  CpuDevice device(options(64ull << 20, gbps));
  const uint64_t bytes = 20'000'000;  // 20 ms at 1 GB/s
  void* host = device.pinned().allocate(bytes);
  std::memset(host, 1, bytes);
  DeviceBuffer buf(device.memory(), bytes, "x");
  Stream& h2d = device.stream(StreamKind::kHostToDevice);
  const auto start = std::chrono::steady_clock::now();
  device.copy_async(buf.data(), host, bytes, h2d);
  h2d.synchronize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(seconds, 0.9 * static_cast<double>(bytes) / (gbps * 1e9));
  EXPECT_EQ(static_cast<unsigned char*>(buf.data())[bytes - 1], 1);
  device.pinned().deallocate(host, bytes);
}

// Note [Pinned pages on a NUMA node]: each pinned block is handed to the placement whole (page
// rounded) while none of its pages has been touched, so a binding set there decides its node.
TEST(CpuDevice, PinnedBlocksArePlacedBeforeTheirFirstTouch) {
  DeviceOptions o = options(8ull << 20);
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  struct Call {
    void* addr;
    uint64_t bytes;
    size_t resident_pages;
  };
  std::vector<Call> calls;
  o.place_host_memory = [&](void* addr, uint64_t bytes) {
    std::vector<unsigned char> in_core(bytes / page);
    size_t resident = SIZE_MAX;
    if (mincore(addr, bytes, in_core.data()) == 0) {
      resident = static_cast<size_t>(
          std::count_if(in_core.begin(), in_core.end(), [](unsigned char c) { return c & 1; }));
    }
    calls.push_back({addr, bytes, resident});
  };
  CpuDevice device(o);
  const uint64_t bytes = 3 * page + 10;
  void* block = device.pinned().allocate(bytes);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].addr, block);
  EXPECT_EQ(calls[0].bytes, 4 * page);
  EXPECT_EQ(calls[0].resident_pages, 0u) << "placed after its first touch";
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % page, 0u);
  std::memset(block, 7, bytes);  // usable
  device.pinned().deallocate(block, bytes);

  // A placement that fails fails the allocation (and leaks nothing).
  CpuDevice refusing([&] {
    DeviceOptions r = options(8ull << 20);
    r.place_host_memory = [](void*, uint64_t) { throw ConfigError("NUMA node 77 does not exist"); };
    return r;
  }());
  EXPECT_THROW(refusing.pinned().allocate(page), ConfigError);
}

TEST(CpuDevice, MemoryHasTheConfiguredCapacity) {
  CpuDevice device(options(8ull << 20));
  EXPECT_EQ(device.memory().capacity(), 8ull << 20);
  EXPECT_EQ(device.backend(), Backend::kCpu);
  EXPECT_EQ(device.threads(), 2);
  EXPECT_NE(device.name().find("2 threads"), std::string::npos) << device.name();
  DeviceBuffer a(device.memory(), 6ull << 20, "big");
  EXPECT_THROW(DeviceBuffer(device.memory(), 4ull << 20, "too much"), OutOfMemoryError);
}

// Resident pages of [p, p + bytes) (p page-aligned), by mincore.
size_t resident_pages(void* p, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((bytes + page - 1) / page);
  EXPECT_EQ(mincore(p, bytes, in.data()), 0);
  return static_cast<size_t>(
      std::count_if(in.begin(), in.end(), [](unsigned char c) { return (c & 1) != 0; }));
}

// memory.share (Note [Backing a heap on use]): the emulated device holds whole 2 MiB granules
// under its live allocations and gives a granule's pages back to the OS once none touches it.
TEST(CpuDevice, MappingOnUseGivesTheGranulesOfReleasedMemoryBack) {
  constexpr uint64_t kG = uint64_t{2} << 20;
  DeviceOptions o = options(16 * kG + 1024);
  o.map_on_use = true;
  CpuDevice device(o);
  DeviceHeap& heap = device.memory();
  EXPECT_EQ(heap.granule(), kG);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(heap.base()) % kG, 0u);
  EXPECT_NE(device.name().find("held on use in 2.00 MiB granules"), std::string::npos)
      << device.name();
  DeviceBuffer persistent(heap, kG + 4096, "persistent");  // granule 0 whole, granule 1 an edge
  DeviceBuffer arena(heap, 3 * kG, "arena");               // granule 1 shared, 2-3, 4 an edge
  EXPECT_EQ(heap.stats().held, 5 * kG);
  std::memset(persistent.data(), 1, persistent.bytes());
  std::memset(arena.data(), 1, arena.bytes());
  auto* granule2 = static_cast<std::byte*>(heap.base()) + 2 * kG;
  EXPECT_EQ(resident_pages(granule2, kG), kG / static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
  arena.reset();
  EXPECT_EQ(heap.stats().held, 2 * kG);
  EXPECT_EQ(resident_pages(granule2, 3 * kG), 0u) << "the arena's own granules went back";
  EXPECT_GT(resident_pages(heap.base(), 2 * kG), 0u) << "the persistent block's stayed";
  // The whole capacity still fits, and the range reaches a granule past it.
  persistent.reset();
  DeviceBuffer all(heap, 16 * kG + 1024, "all");
  EXPECT_EQ(heap.stats().held, 17 * kG);
  std::memset(all.data(), 2, all.bytes());
}

// Note [One hook, two protocols]: a pacing arbiter carries every copy through its moves; one
// that only gates is refused when the device is made, not at the first copy.
class CountingPacer : public CopyArbiter, public CopyPacer {
 public:
  CopyPacer* pacer() override { return this; }
  uint64_t enqueue(bool to_device, uint64_t bytes, const CopyDeadline&) override {
    (to_device ? to_device_ : to_host_) += bytes;
    return next_++;
  }
  void carry(uint64_t, const std::function<void(uint64_t, uint64_t)>& move) override {
    ++carried_;
    move(0, 3);
    move(3, last_ - 3);
  }
  uint64_t to_device_ = 0, to_host_ = 0, next_ = 1, last_ = 0;
  int carried_ = 0;
};

class GateOnly : public CopyArbiter, public CopyGate {
 public:
  CopyGate* gate() override { return this; }
  void bind(std::shared_ptr<GateSignals>) override {}
  GateTicket enqueue(bool, uint64_t, const CopyDeadline&) override { return {}; }
  void close() override {}
};

TEST(CpuDevice, CopiesGoThroughAPacingArbiterAndAGatingOneIsRefused) {
  auto pacer = std::make_shared<CountingPacer>();
  DeviceOptions o = options(8ull << 20);
  o.arbiter = pacer;
  CpuDevice device(o);
  const uint64_t bytes = 4096;
  pacer->last_ = bytes;
  auto* host = static_cast<unsigned char*>(device.pinned().allocate(bytes));
  for (uint64_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>(i * 7);
  DeviceBuffer buf(device.memory(), bytes, "paced");
  Stream& h2d = device.stream(StreamKind::kHostToDevice);
  device.copy_async(buf.data(), host, bytes, h2d);
  h2d.synchronize();
  EXPECT_EQ(pacer->to_device_, bytes);
  EXPECT_EQ(pacer->to_host_, 0u);
  EXPECT_EQ(pacer->carried_, 1);
  EXPECT_EQ(std::memcmp(buf.data(), host, bytes), 0);
  device.pinned().deallocate(host, bytes);

  DeviceOptions g = options(8ull << 20);
  g.arbiter = std::make_shared<GateOnly>();
  EXPECT_THROW(CpuDevice{g}, UnsupportedError);
}

}  // namespace
}  // namespace ferry::cpu
