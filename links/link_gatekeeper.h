// The topology scheduler on real GPUs: a gated LinkArbiter (Note [Gating a GPU copy stream]).
// Invariant: per direction, chunks are granted, opened and finished in enqueue order; a token
// taken is always freed; once failed or closed every gate is open, so no stream waits forever.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "device/copy_gate.h"
#include "links/link_arbiter.h"
#include "links/link_ledger.h"

namespace ferry {

// Note [Gating a GPU copy stream]
// The gatekeeper's CopyGate has two threads (one per direction) that hold each scheduled copy's
// chunks on the GPU's copy stream until the node's link ledger grants them (least deadline slack
// first, across every local rank), and hold the chunk's tokens until the GPU reports it moved. A
// token taken is freed on every path: finish, failure, shutdown.
// The host enqueues a whole step ahead, so it cannot wait for grants before it enqueues a copy.
// Instead the CUDA device enqueues, per chunk on the copy stream: write `arrived = seq`, wait
// until `gate >= seq`, the chunk's copy, write `done = seq` (stream memory operations on pinned,
// mapped host words, device/copy_gate.h). The gatekeeper, per direction and in enqueue order,
// waits until the stream reaches a chunk (its arrival starts the copy's deadline clock, as the
// CPU emulator's carry() does), asks the ledger for its tokens, opens its gate, waits for its
// done word and frees the tokens. Copies enqueued without a scheduled deadline (inputs,
// parameters) are not gated.
// Events that compute waits on are enqueued as before; they simply complete once the gated
// chunks before them have moved.

// Note [Polling the flags]
// The host learns of a chunk's arrival and completion by reading words the GPU writes, so the
// gatekeeper polls: a short busy loop catches the next chunk of a transfer (its arrival follows
// the previous chunk's done at once), then sleeps. An arrival may be far off (the stream waits
// for compute), so those naps grow to max_sleep_s (a few thousand wake-ups a second per
// direction, not tens of thousands); a chunk's done word is first awaited by sleeping through
// most of the chunk's time alone on the path, then with short naps, so a token is held only a
// few tens of us past the chunk's real end.

struct LinkGateOptions : LinkPathOptions {
  double link_gbps = 0;  // the path's bottleneck, for chunks' latest starts (0: 1000 GB/s)
  // Note [Polling the flags]
  double spin_s = 20e-6;        // a flag is re-read in a busy loop this long, then
  double sleep_s = 50e-6;       // with sleeps of this long between reads, doubling up to
  double max_sleep_s = 200e-6;  // this while a chunk has not arrived;
  double check_s = 1e-3;        // and the device is asked for failures this often
};

class LinkGatekeeper : public LinkArbiter, public CopyGate {
 public:
  explicit LinkGatekeeper(LinkGateOptions options);
  ~LinkGatekeeper() override;  // close()
  LinkGatekeeper(const LinkGatekeeper&) = delete;
  LinkGatekeeper& operator=(const LinkGatekeeper&) = delete;

  // Attaches the node's ledger; copies enqueued before this are not gated.
  void attach(std::shared_ptr<LinkLedger> ledger) override;
  std::shared_ptr<LinkLedger> ledger() const override;
  bool emulates_links() const override { return false; }
  CopyGate* gate() override { return this; }
  const LinkGateOptions& options() const { return options_; }

  // CopyGate. bind() starts the threads. enqueue() gates a copy whose deadline is scheduled when
  // a ledger is attached and the gatekeeper is running; it rethrows a failure of the threads,
  // whatever the copy.
  void bind(std::shared_ptr<GateSignals> signals) override;
  GateTicket enqueue(bool to_device, uint64_t bytes, const CopyDeadline& deadline) override;
  void close() override;

  // Rethrows the first failure of a gatekeeper thread, if any.
  void check() const;
  // Chunks whose tokens were granted and freed after their done word, both directions.
  uint64_t chunks_finished() const { return finished_.load(); }

 private:
  struct Copy {
    uint32_t first_seq = 0;
    uint32_t chunks = 0;
    uint64_t bytes = 0;
    uint64_t chunk_bytes = 0;
    double deadline_s = 0;
    CopyKind kind = CopyKind::kOther;  // what it carries, for the ledger's label
  };
  struct Lane {
    std::deque<Copy> queue;
    uint32_t next_seq = 1;
    std::thread worker;
  };
  struct Stopped {};  // thrown inside a thread when the gatekeeper closes

  void run(int dir);
  void serve(int dir, const Copy& copy, LinkLedger& ledger);
  // Returns once ready(); first sleeps `first_nap_s`; naps grow to max_sleep_s when `back_off`.
  template <typename Ready>
  void wait_for(int dir, Ready ready, double first_nap_s, bool back_off);
  void open_gate(int dir, uint32_t seq);
  void fail(std::exception_ptr error);
  void open_all_locked();  // mu_ held

  LinkGateOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Lane lanes_[2];
  std::shared_ptr<GateSignals> signals_;
  std::shared_ptr<LinkLedger> ledger_;
  std::atomic<bool> stopping_{false};  // closed or failed: gates open, nothing more is gated
  bool closed_ = false;
  std::exception_ptr error_;
  std::atomic<uint64_t> finished_{0};
};

}  // namespace ferry
