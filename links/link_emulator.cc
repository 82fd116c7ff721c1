// Copies through the ledger: one fluid flow per copy (fifo) or per granted chunk (topology).
#include "links/link_emulator.h"

#include <chrono>
#include <deque>
#include <thread>

#include "links/arbiter_policy.h"

namespace ferry {

namespace {
// Enough chunks queued to ride out a copy thread's wait for a core (a few scheduler slices),
// few enough that 16 ranks' two directions stay within the ledger's claim slots.
constexpr size_t kChunksClaimedAhead = 6;
}  // namespace

LinkEmulator::LinkEmulator(LinkEmulationOptions options) : options_(std::move(options)) {
  if (options_.chunk_bytes == 0) options_.chunk_bytes = 1;
}

void LinkEmulator::attach(std::shared_ptr<LinkLedger> ledger) {
  std::lock_guard lock(mu_);
  ledger_ = std::move(ledger);
}

std::shared_ptr<LinkLedger> LinkEmulator::ledger() const {
  std::lock_guard lock(mu_);
  return ledger_;
}

uint64_t LinkEmulator::enqueue(bool to_device, uint64_t bytes, const CopyDeadline& deadline) {
  Ticket t;
  t.direction = to_device ? TransferDirection::kToDevice : TransferDirection::kToHost;
  t.bytes = bytes;
  t.deadline = deadline;
  std::lock_guard lock(mu_);
  const uint64_t id = next_ticket_++;
  tickets_[id] = t;
  return id;
}

void LinkEmulator::carry(uint64_t id, const std::function<void(uint64_t, uint64_t)>& move) {
  Ticket t;
  std::shared_ptr<LinkLedger> ledger;
  {
    std::lock_guard lock(mu_);
    auto it = tickets_.find(id);
    if (it == tickets_.end()) return;
    t = it->second;
    tickets_.erase(it);
    ledger = ledger_;
  }
  if (!ledger || options_.path.empty()) {
    const auto start = std::chrono::steady_clock::now();
    move(0, t.bytes);
    if (options_.link_gbps > 0) {
      std::this_thread::sleep_until(
          start +
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(
              static_cast<double>(t.bytes) / (options_.link_gbps * 1e9))));
    }
    return;
  }
  if (!options_.arbitrate || !t.deadline.scheduled) {
    const uint64_t flow =
        ledger->begin_flow(options_.rank, t.direction, options_.path, t.bytes, t.deadline.kind);
    move(0, t.bytes);
    ledger->wait_flow(flow);
    return;
  }
  // Chunks: each waits for its turn on every link-direction of the path (Note [Chunk
  // pipelining]). Its latest start is the deadline less the time the rest of the transfer needs
  // alone on the path. The deadline counts from the copy's start: the moment the stream reaches
  // it, which is when the plan issues it (the host enqueues a whole step ahead).
  const double deadline = LinkLedger::now() + t.deadline.deadline_s;
  const double rate = options_.link_gbps > 0 ? options_.link_gbps * 1e9 : 1e12;
  const std::vector<int>& tokens =
      options_.arbitrated.empty() ? options_.path : options_.arbitrated;
  auto claim_at = [&](uint64_t offset) {
    return ledger->claim(options_.rank, t.direction, tokens, options_.path,
                         std::min(options_.chunk_bytes, t.bytes - offset),
                         chunk_latest_start(deadline, t.bytes - offset, rate), /*held=*/false,
                         t.deadline.kind);
  };
  // Claims queued ahead, oldest first: the chunk at `claimed_to` is the next to claim.
  std::deque<uint64_t> ahead;
  uint64_t claimed_to = 0;
  auto top_up = [&] {
    while (claimed_to < t.bytes && ahead.size() < kChunksClaimedAhead) {
      ahead.push_back(claim_at(claimed_to));
      claimed_to += std::min(options_.chunk_bytes, t.bytes - claimed_to);
    }
  };
  for (uint64_t offset = 0; offset < t.bytes; offset += options_.chunk_bytes) {
    const uint64_t length = std::min(options_.chunk_bytes, t.bytes - offset);
    uint64_t flow = 0;
    try {
      top_up();
      flow = ledger->await_grant(ahead.front());
      ahead.pop_front();
      top_up();
      move(offset, length);
      ledger->wait_flow(flow);
    } catch (...) {
      // The queued claims go first: abandoning the current chunk frees its links, and the
      // ledger would grant one of this copy's own queued chunks at that moment.
      for (uint64_t c : ahead) ledger->withdraw(c);
      if (flow != 0) ledger->abandon(flow);
      throw;
    }
  }
}

// Note [Chunk pipelining]
// A copy keeps its next chunks (up to kChunksClaimedAhead) claimed in the ledger while the
// current one moves, so when the current chunk's bytes are through the ledger grants the next
// (or another rank's claim with less slack) at that exact moment on its own clock, whatever this
// thread is doing: the link never idles while this rank's thread waits for a core, as it would
// if each chunk were claimed only after the one before it was seen to end (on a loaded machine
// that wake-up can take longer than a chunk). Queuing several chunks of one copy changes no
// grant: a later chunk of the same copy always has more slack than the one before it (its
// latest start is later), so the arbiter sees each copy's earliest unclaimed chunk first, as in
// the simulator (node_sim.cc), which claims a copy's next chunk the moment the one before lands.

}  // namespace ferry
