// Copies through the ledger: one fluid flow per copy (fifo) or per granted chunk (topology).
#include "prefetch/link_emulator.h"

#include <chrono>
#include <thread>

#include "prefetch/arbiter_policy.h"

namespace ferry {

namespace {
int dir_index(TransferDirection d) { return d == TransferDirection::kToDevice ? 1 : 0; }
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

void LinkEmulator::announce(const TransferRequest& request) {
  std::lock_guard lock(mu_);
  announced_[dir_index(request.direction)] = request;
}

void LinkEmulator::withdraw(TransferDirection direction) {
  std::lock_guard lock(mu_);
  announced_[dir_index(direction)].reset();
}

uint64_t LinkEmulator::enqueue(bool to_device, uint64_t bytes) {
  Ticket t;
  t.direction = to_device ? TransferDirection::kToDevice : TransferDirection::kToHost;
  t.bytes = bytes;
  std::lock_guard lock(mu_);
  auto& a = announced_[dir_index(t.direction)];
  if (a && a->bytes == bytes) {
    t.scheduled = true;
    t.deadline_s = a->deadline_s;
    a.reset();
  }
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
    if (options_.solo_gbps > 0) {
      std::this_thread::sleep_until(
          start +
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(
              static_cast<double>(t.bytes) / (options_.solo_gbps * 1e9))));
    }
    return;
  }
  if (!options_.arbitrate || !t.scheduled) {
    const uint64_t flow = ledger->begin_flow(options_.rank, t.direction, options_.path, t.bytes);
    move(0, t.bytes);
    ledger->wait_flow(flow);
    return;
  }
  // Chunks: each waits for its turn on every link-direction of the path. Its latest start is
  // the deadline less the time the rest of the transfer needs alone on the path.
  // The deadline counts from the copy's start: the moment the stream reaches it, which is when
  // the plan issues it (the host enqueues a whole step ahead).
  const double deadline = LinkLedger::now() + t.deadline_s;
  const double rate = options_.solo_gbps > 0 ? options_.solo_gbps * 1e9 : 1e12;
  for (uint64_t offset = 0; offset < t.bytes; offset += options_.chunk_bytes) {
    const uint64_t length = std::min(options_.chunk_bytes, t.bytes - offset);
    const double latest_start = chunk_latest_start(deadline, t.bytes - offset, rate);
    const uint64_t flow =
        ledger->acquire(options_.rank, t.direction,
                        options_.arbitrated.empty() ? options_.path : options_.arbitrated,
                        options_.path, length, latest_start);
    try {
      move(offset, length);
    } catch (...) {
      ledger->abandon(flow);
      throw;
    }
    ledger->wait_flow(flow);
  }
}

}  // namespace ferry
