// CpuStream / CpuEvent semantics (CUDA's): in-order execution, record/wait across streams
// including a wait that must block, an event re-recorded, errors that poison a stream while its
// events still complete.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/error.h"
#include "device/cpu/cpu_stream.h"
#include "device/host_waits.h"

namespace ferry::cpu {
namespace {

using namespace std::chrono_literals;

// Generous bound for "this has not happened yet" checks: long enough for a worker to run a task.
constexpr auto kSettle = 50ms;

TEST(CpuStream, RunsTasksInEnqueueOrder) {
  CpuStream s(StreamKind::kCompute);
  std::vector<int> order;  // only the worker touches it until synchronize()
  for (int i = 0; i < 200; ++i) s.enqueue([&order, i] { order.push_back(i); });
  s.synchronize();
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(s.kind(), StreamKind::kCompute);
}

TEST(HostWaits, CountOnlySynchronizeCallsThatBlock) {
  CpuStream s(StreamKind::kCompute);
  CpuEvent e;
  const uint64_t before = host_waits_on_this_thread();
  e.synchronize();  // never recorded: nothing to wait for
  s.synchronize();  // idle
  EXPECT_EQ(host_waits_on_this_thread(), before);
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  s.enqueue([gate] { gate.wait(); });
  s.record(e);
  std::thread opener([&go] {
    std::this_thread::sleep_for(kSettle);
    go.set_value();
  });
  e.synchronize();  // blocks until the gate opens
  EXPECT_EQ(host_waits_on_this_thread(), before + 1);
  s.enqueue([] { std::this_thread::sleep_for(kSettle); });
  s.synchronize();
  EXPECT_EQ(host_waits_on_this_thread(), before + 2);
  opener.join();
  uint64_t other_thread = 0;
  std::thread([&] {
    s.enqueue([] { std::this_thread::sleep_for(kSettle); });
    s.synchronize();
    other_thread = host_waits_on_this_thread();
  }).join();
  EXPECT_EQ(other_thread, 1u);
  EXPECT_EQ(host_waits_on_this_thread(), before + 2) << "counts are per thread";
}

TEST(CpuEvent, NeverRecordedIsReady) {
  CpuEvent e;
  EXPECT_TRUE(e.ready());
  e.synchronize();  // returns at once
}

// Stream b waits for an event recorded on a after a task that is held back: b's later work must
// not start until a's task has finished, while the host is not blocked by wait().
TEST(CpuEvent, WaitBlocksTheOtherStreamUntilEarlierWorkFinishes) {
  CpuStream a(StreamKind::kHostToDevice), b(StreamKind::kCompute);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<bool> a_done{false}, b_ran{false}, b_saw_a_done{false};
  a.enqueue([gate, &a_done] {
    gate.wait();
    std::this_thread::sleep_for(5ms);
    a_done = true;
  });
  CpuEvent e;
  a.record(e);
  EXPECT_FALSE(e.ready());
  b.wait(e);  // must not block the host
  b.enqueue([&] {
    b_saw_a_done = a_done.load();
    b_ran = true;
  });
  std::this_thread::sleep_for(kSettle);
  EXPECT_FALSE(b_ran) << "b ran past a wait on unfinished work";
  release.set_value();
  b.synchronize();
  EXPECT_TRUE(b_ran);
  EXPECT_TRUE(b_saw_a_done);
  EXPECT_TRUE(e.ready());
}

// A wait captures the records made before it: re-recording the event later does not extend an
// earlier wait, and the event is not ready until its last record completes.
TEST(CpuEvent, ReRecordedEventTracksItsLastRecord) {
  CpuStream a(StreamKind::kDeviceToHost), b(StreamKind::kCompute);
  std::promise<void> first, second;
  auto g1 = first.get_future().share(), g2 = second.get_future().share();
  CpuEvent e;
  a.enqueue([g1] { g1.wait(); });
  a.record(e);  // record 1
  b.wait(e);    // waits for record 1 only
  std::atomic<bool> b_ran{false};
  b.enqueue([&] { b_ran = true; });
  a.enqueue([g2] { g2.wait(); });
  a.record(e);        // record 2
  first.set_value();  // record 1 completes; a now blocks on the second gate
  b.synchronize();
  EXPECT_TRUE(b_ran) << "b waited for a record made after its wait";
  std::this_thread::sleep_for(kSettle);
  EXPECT_FALSE(e.ready()) << "event ready before its last record";
  second.set_value();
  e.synchronize();
  EXPECT_TRUE(e.ready());
}

TEST(CpuStream, SynchronizeRethrowsATaskFailureAndSkipsLaterTasks) {
  CpuStream s(StreamKind::kCompute);
  std::atomic<bool> later_ran{false};
  s.enqueue([] { throw DataError("bad batch 3", "check the dataset"); });
  s.enqueue([&] { later_ran = true; });
  try {
    s.synchronize();
    ADD_FAILURE() << "no exception";
  } catch (const DataError& e) {
    EXPECT_STREQ(e.what(), "bad batch 3");
  }
  EXPECT_FALSE(later_ran);
  EXPECT_THROW(s.synchronize(), DataError) << "a poisoned stream stays poisoned";
}

// Events on a poisoned stream still complete (no waiter hangs) and carry the error.
TEST(CpuStream, EventsStillCompleteOnAPoisonedStream) {
  CpuStream a(StreamKind::kCompute), b(StreamKind::kDeviceToHost);
  a.enqueue([] { throw std::runtime_error("kernel failed"); });
  CpuEvent e;
  a.record(e);
  b.wait(e);
  std::atomic<bool> b_ran{false};
  b.enqueue([&] { b_ran = true; });
  b.synchronize();  // would hang if the record were skipped
  EXPECT_TRUE(b_ran);
  EXPECT_TRUE(e.ready());
  EXPECT_THROW(e.synchronize(), std::runtime_error);
}

TEST(CpuStream, WaitOnACompletedEventAddsNoOrdering) {
  CpuStream a(StreamKind::kCompute), b(StreamKind::kComm);
  CpuEvent e;
  a.record(e);
  a.synchronize();
  ASSERT_TRUE(e.ready());
  b.wait(e);
  std::atomic<int> ran{0};
  b.enqueue([&] { ++ran; });
  b.synchronize();
  EXPECT_EQ(ran, 1);
}

}  // namespace
}  // namespace ferry::cpu
