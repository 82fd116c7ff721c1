// EventRecycler: completion events reused across uses (event_recycler.h).
#include "device/event_recycler.h"

namespace ferry {

std::shared_ptr<Event> EventRecycler::take() {
  std::unique_ptr<Event> event;
  {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      event = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!event) {
    event = make_();
    std::lock_guard lock(mutex_);
    ++created_;
  }
  return std::shared_ptr<Event>(event.release(),
                                [self = shared_from_this()](Event* e) { self->give(e); });
}

size_t EventRecycler::created() const {
  std::lock_guard lock(mutex_);
  return created_;
}

void EventRecycler::give(Event* event) {
  std::unique_ptr<Event> owned(event);
  std::lock_guard lock(mutex_);
  free_.push_back(std::move(owned));
}

}  // namespace ferry
