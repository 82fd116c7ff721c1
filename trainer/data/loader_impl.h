// The loader's private state (Note [Partial global batch] and the slot cycle in loader.cc):
// batch buffers (slots) and the queue between the producer thread and the consumer. Invariant:
// every field of State is read and written under State::mu, except `stop` (atomic).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "trainer/data/loader.h"

namespace ferry {

namespace loader_detail {

struct Slot {
  void* block = nullptr;
  uint64_t block_bytes = 0;
  void* input = nullptr;        // (batch_size, sample_shape...) (Note [Sample layout])
  int32_t* labels = nullptr;    // (batch_size, labels_per_sample)
  int32_t* segments = nullptr;  // (batch_size, T): packed documents only
  bool float_input = true;      // images: input holds floats
  int64_t n = 0;
  Shape shape;  // of the input this fill wrote, (n, sample...)
  LoaderPosition position;
  int64_t labelled = 0;       // labelled positions of this rank's rows
  float loss_divisor = 0.0f;  // Batch::loss_divisor
  bool generated = true;      // false: dropped unread (Note [Batches too large to train])
};

// A ready entry: a filled slot, or the end of a finite pass, or the producer's error.
struct Item {
  Slot* slot = nullptr;
  std::exception_ptr error;
};

struct State {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Slot>> slots;
  std::deque<Slot*> free;
  // Released after an event (Batch::release_after): reusable once it has completed.
  std::deque<std::pair<Slot*, std::shared_ptr<Event>>> returning;
  std::deque<Item> ready;
  int ready_batches = 0;                          // items in `ready` that hold a slot
  bool filling = false;                           // the producer holds a slot
  std::set<std::vector<int64_t>> skipped_shapes;  // DataLoader::skip_shape
  std::atomic<bool> stop{false};
  PinnedAllocator* allocator = nullptr;

  ~State() {
    for (auto& [slot, done] : returning) {
      try {
        done->synchronize();  // no copy may still read a buffer freed here
      } catch (...) {
        // The failure was reported to whoever waited on the device's work.
      }
    }
    for (auto& slot : slots) {
      if (allocator != nullptr) {
        allocator->deallocate(slot->block, slot->block_bytes);
      } else {
        std::free(slot->block);
      }
    }
  }

  void give_back(Slot* slot) {
    {
      std::lock_guard<std::mutex> lock(mu);
      free.push_back(slot);
    }
    cv.notify_all();
  }

  void give_back_after(Slot* slot, std::shared_ptr<Event> done) {
    {
      std::lock_guard<std::mutex> lock(mu);
      returning.emplace_back(slot, std::move(done));
    }
    cv.notify_all();
  }

  // Under `mu`: a slot for the producer, a free one first, else the oldest returning one with
  // the event it must wait for (outside the lock) before writing it.
  std::pair<Slot*, std::shared_ptr<Event>> take_slot() {
    if (free.empty()) {
      auto r = std::move(returning.front());
      returning.pop_front();
      return r;
    }
    Slot* slot = free.front();
    free.pop_front();
    return {slot, nullptr};
  }
};

}  // namespace loader_detail

}  // namespace ferry
