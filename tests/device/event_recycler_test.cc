// EventRecycler (issue 16: every NCCL collective created a new CUDA event): an event comes back
// for reuse only once every holder of its last use has let it go, and the factory runs only when
// none is free. Fake events; the NCCL communicator's use of it runs only on a GPU.
#include "device/event_recycler.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <vector>

namespace ferry {
namespace {

class FakeEvent : public Event {
 public:
  bool ready() override { return true; }
  void synchronize() override {}
};

std::shared_ptr<EventRecycler> recycler() {
  return std::make_shared<EventRecycler>([] { return std::make_unique<FakeEvent>(); });
}

TEST(EventRecycler, ADroppedEventIsReusedInsteadOfCreatingOne) {
  auto pool = recycler();
  Event* first = nullptr;
  {
    std::shared_ptr<Event> e = pool->take();
    first = e.get();
  }
  for (int i = 0; i < 100; ++i) {
    std::shared_ptr<Event> e = pool->take();  // one collective at a time, its handle dropped
    EXPECT_EQ(e.get(), first);
  }
  EXPECT_EQ(pool->created(), 1u);
}

TEST(EventRecycler, AnEventStillHeldIsNeverHandedOutAgain) {
  auto pool = recycler();
  std::vector<std::shared_ptr<Event>> in_flight;
  std::set<Event*> seen;
  for (int i = 0; i < 5; ++i) {
    in_flight.push_back(pool->take());
    EXPECT_TRUE(seen.insert(in_flight.back().get()).second) << "handed out twice";
  }
  EXPECT_EQ(pool->created(), 5u);
  // A copy of the handle (CommWork is copyable) keeps the event in use.
  std::shared_ptr<Event> copy = in_flight[2];
  in_flight[2].reset();
  for (int i = 0; i < 3; ++i) {
    std::shared_ptr<Event> e = pool->take();
    EXPECT_NE(e.get(), copy.get());
    in_flight.push_back(e);
  }
  EXPECT_EQ(pool->created(), 8u);
}

TEST(EventRecycler, EventsMayOutliveTheRecyclersOwner) {
  std::shared_ptr<Event> kept;
  {
    auto pool = recycler();
    kept = pool->take();
  }  // the communicator that owned the pool is gone; the handle still is valid
  EXPECT_TRUE(kept->ready());
  kept.reset();  // returns it to the pool, which then goes
}

}  // namespace
}  // namespace ferry
