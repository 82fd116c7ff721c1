// Streams and events: the ordering primitives every backend provides, with CUDA's semantics.
// Work on one stream runs in enqueue order; an event captures the work enqueued on a stream
// before record(); another stream's wait() orders its later work after that captured work.
#pragma once

#include <string_view>

namespace ferry {

enum class StreamKind { kCompute, kDeviceToHost, kHostToDevice, kComm };

constexpr std::string_view stream_kind_name(StreamKind k) {
  switch (k) {
    case StreamKind::kCompute:
      return "compute";
    case StreamKind::kDeviceToHost:
      return "d2h";
    case StreamKind::kHostToDevice:
      return "h2d";
    case StreamKind::kComm:
      return "comm";
  }
  return "?";
}

class Event {
 public:
  virtual ~Event() = default;
  // True once all work captured by the last record() has run (true if never recorded).
  virtual bool ready() = 0;
  // Blocks the host until ready(). Rethrows a failure of the captured work.
  virtual void synchronize() = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual StreamKind kind() const = 0;
  // `event` completes when all work enqueued on this stream so far has run.
  virtual void record(Event& event) = 0;
  // Work enqueued on this stream after this call starts only after `event`'s last record
  // (as of this call) has completed. Does not block the host.
  virtual void wait(Event& event) = 0;
  // Blocks the host until all enqueued work has run. Rethrows a failure of that work.
  virtual void synchronize() = 0;
};

}  // namespace ferry
