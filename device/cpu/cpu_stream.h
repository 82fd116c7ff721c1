// CPU streams and events. Each stream is one worker thread running its tasks in order; an
// event is a counter of records and completions, so a wait captures exactly the records made
// before it (CUDA's semantics). A failed task poisons its stream: later tasks are skipped,
// events still complete (no waiter hangs) and carry the error to whoever synchronizes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "device/stream.h"

namespace ferry::cpu {

class CpuEvent : public Event {
 public:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t recorded = 0;   // records issued
    uint64_t completed = 0;  // highest record that has completed
    std::exception_ptr error;
    std::chrono::steady_clock::time_point completed_at;  // of the last completion
  };

  CpuEvent() : state_(std::make_shared<State>()) {}
  bool ready() override;
  void synchronize() override;
  const std::shared_ptr<State>& state() const { return state_; }

 private:
  std::shared_ptr<State> state_;
};

class CpuStream : public Stream {
 public:
  // `thread_init` runs first on the worker thread (thread count, affinity, name).
  CpuStream(StreamKind kind, std::function<void()> thread_init = {});
  ~CpuStream() override;

  StreamKind kind() const override { return kind_; }
  void record(Event& event) override;
  void wait(Event& event) override;
  void synchronize() override;

  // Runs `task` on the worker after everything enqueued before it. A task that throws poisons
  // the stream (see above).
  void enqueue(std::function<void()> task);
  // Whether this call runs on this stream's worker thread.
  bool on_worker() const { return std::this_thread::get_id() == worker_.get_id(); }

 private:
  struct Task {
    std::function<void()> run;
    bool always = false;  // bookkeeping that runs even on a poisoned stream
  };
  void push(Task task);
  void loop(std::function<void()> thread_init);

  StreamKind kind_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  uint64_t enqueued_ = 0;
  uint64_t finished_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace ferry::cpu
