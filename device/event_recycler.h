// Completion events reused instead of created per use (Note [Reusing completion events]).
// Invariant: an event is handed out again only after every holder of its previous use has let it
// go, so no stream can still be about to wait on that use.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "device/stream.h"

// Note [Reusing completion events]
// A collective's CommWork holds a shared_ptr whose deleter returns the event here, and the next
// collective records it again. A wait captures the record it sees when it is enqueued, so
// re-recording the event later is safe.

namespace ferry {

class EventRecycler : public std::enable_shared_from_this<EventRecycler> {
 public:
  using Factory = std::function<std::unique_ptr<Event>()>;
  // Make one with std::make_shared: the handed-out events keep the recycler alive.
  explicit EventRecycler(Factory make) : make_(std::move(make)) {}

  // A free event, or a new one from the factory when none is free.
  std::shared_ptr<Event> take();
  // Events the factory made so far (free or in use).
  size_t created() const;

 private:
  void give(Event* event);

  Factory make_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Event>> free_;
  size_t created_ = 0;
};

}  // namespace ferry
