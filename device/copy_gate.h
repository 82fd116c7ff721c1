// Gating of a device's host<->device copies by a host-side arbiter (Note [Gated copies in chunks]).
// Invariant: per direction, chunk numbers are consecutive in stream order and every flag only
// moves forward, so opening a gate to a later number opens every earlier chunk.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "device/copy_deadline.h"

// Note [Gated copies in chunks]
// The host-side arbiter is the topology scheduler on real GPUs. The device cuts a gated copy into
// chunks and, per chunk, has its stream mark the chunk's arrival, hold until the host opens the
// chunk's gate, move it, and mark it done, all through a few flag words that both the stream and
// the host see. Chunk sequence numbers are consecutive per direction, in stream order; a flag
// moves forward cyclically (seq_reached), so sequence numbers may wrap.

namespace ferry {

// One direction's flags, each the sequence number of the latest chunk it concerns (0: none).
struct GateWords {
  uint32_t arrived = 0;  // written by the stream: it has reached chunk `arrived`
  uint32_t gate = 0;     // written by the host: chunks up to `gate` may move
  uint32_t done = 0;     // written by the stream: chunk `done` has moved
  uint32_t pad = 0;
};

// The flags of one device: [0] to host (offloads), [1] to device (prefetches).
struct GateFlags {
  GateWords dir[2];
};

// Whether a flag at `value` has reached `seq`, in the cyclic order the device's wait uses
// ((int32_t)(value - seq) >= 0), so sequence numbers may wrap.
inline bool seq_reached(uint32_t value, uint32_t seq) {
  return static_cast<int32_t>(value - seq) >= 0;
}

// The host's view of a device's flags. `dir`: 0 to host, 1 to device.
class GateSignals {
 public:
  virtual ~GateSignals() = default;
  virtual uint32_t arrived(int dir) = 0;
  virtual uint32_t done(int dir) = 0;
  // Lets chunks up to `seq` of `dir` move (a release store: what the host wrote before is seen).
  virtual void open(int dir, uint32_t seq) = 0;
  // Throws when the device reports a failure (its copies will never signal); called now and then
  // while the host waits on a flag.
  virtual void check_device(int /*dir*/) {}
};

// Signals over GateFlags in memory the host reads and writes directly (pinned, mapped host
// memory on a GPU; plain memory for a stand-in stream in tests). The flags must outlive it.
class MappedGateSignals : public GateSignals {
 public:
  explicit MappedGateSignals(GateFlags* flags) : flags_(flags) {}
  uint32_t arrived(int dir) override {
    return std::atomic_ref<uint32_t>(flags_->dir[dir].arrived).load(std::memory_order_acquire);
  }
  uint32_t done(int dir) override {
    return std::atomic_ref<uint32_t>(flags_->dir[dir].done).load(std::memory_order_acquire);
  }
  void open(int dir, uint32_t seq) override {
    std::atomic_ref<uint32_t>(flags_->dir[dir].gate).store(seq, std::memory_order_release);
  }

 private:
  GateFlags* flags_;
};

// How the device enqueues one copy: `chunks` chunks of `chunk_bytes` (the last one shorter),
// numbered first_seq, first_seq + 1, ...; chunks == 0: one plain copy, not gated.
struct GateTicket {
  uint32_t first_seq = 0;
  uint32_t chunks = 0;
  uint64_t chunk_bytes = 0;
};

// The arbiter side, which the device calls.
class CopyGate {
 public:
  virtual ~CopyGate() = default;
  // Once, by the device before its first copy: the signals of its flags, valid until close().
  virtual void bind(std::shared_ptr<GateSignals> signals) = 0;
  // On the thread that enqueues a copy of `bytes` on the direction's copy stream, in stream
  // order: how to enqueue it (a copy not `deadline.scheduled` is never gated). Throws the
  // arbiter's failure, if it has failed (the job ends).
  virtual GateTicket enqueue(bool to_device, uint64_t bytes, const CopyDeadline& deadline) = 0;
  // By the device once its streams have drained, before the flags go: opens every gate and stops
  // reading the signals. Idempotent; never throws.
  virtual void close() = 0;
};

}  // namespace ferry
