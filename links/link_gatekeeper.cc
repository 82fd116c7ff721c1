// The gatekeeper's two threads: per direction, in enqueue order, wait for a chunk's arrival,
// take its tokens from the ledger, open its gate, wait for its done word, free the tokens.
#include "links/link_gatekeeper.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>

#include "links/arbiter_policy.h"

namespace ferry {

namespace {

// At most this many chunks per copy (a tiny topology.chunk_mb grows the chunk instead), so the
// sequence numbers of the copies in flight stay far from wrapping onto each other.
constexpr uint64_t kMaxChunksPerCopy = uint64_t{1} << 20;
// Opening "every gate" sets a gate this far past the next sequence number: the device's cyclic
// comparison then passes for every chunk enqueued so far (nothing is gated afterwards).
constexpr uint32_t kOpenAll = uint32_t{1} << 30;

}  // namespace

LinkGatekeeper::LinkGatekeeper(LinkGateOptions options) : options_(std::move(options)) {
  if (options_.chunk_bytes == 0) options_.chunk_bytes = 1;
}

LinkGatekeeper::~LinkGatekeeper() { close(); }

void LinkGatekeeper::attach(std::shared_ptr<LinkLedger> ledger) {
  std::lock_guard lock(mu_);
  ledger_ = std::move(ledger);
}

std::shared_ptr<LinkLedger> LinkGatekeeper::ledger() const {
  std::lock_guard lock(mu_);
  return ledger_;
}

void LinkGatekeeper::check() const {
  std::lock_guard lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

void LinkGatekeeper::bind(std::shared_ptr<GateSignals> signals) {
  std::lock_guard lock(mu_);
  if (signals_ || stopping_) return;  // bound once; a closed gatekeeper stays closed
  signals_ = std::move(signals);
  for (int d = 0; d < 2; ++d) lanes_[d].worker = std::thread([this, d] { run(d); });
}

GateTicket LinkGatekeeper::enqueue(bool to_device, uint64_t bytes, const CopyDeadline& deadline) {
  std::lock_guard lock(mu_);
  if (error_) std::rethrow_exception(error_);
  Lane& lane = lanes_[to_device ? 1 : 0];
  if (!deadline.scheduled) return {};  // not a scheduled transfer: not gated
  if (!ledger_ || !signals_ || stopping_ || bytes == 0) return {};
  const uint64_t chunk = std::max(options_.chunk_bytes, (bytes - 1) / kMaxChunksPerCopy + 1);
  GateTicket t;
  t.first_seq = lane.next_seq;
  t.chunks = static_cast<uint32_t>((bytes + chunk - 1) / chunk);
  t.chunk_bytes = chunk;
  lane.next_seq += t.chunks;
  lane.queue.push_back(
      Copy{t.first_seq, t.chunks, bytes, chunk, deadline.deadline_s, deadline.kind});
  cv_.notify_all();
  return t;
}

void LinkGatekeeper::close() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    open_all_locked();
  }
  cv_.notify_all();
  for (Lane& lane : lanes_) {
    if (lane.worker.joinable()) lane.worker.join();
  }
  std::lock_guard lock(mu_);
  signals_.reset();
}

void LinkGatekeeper::open_all_locked() {
  if (!signals_) return;
  for (int d = 0; d < 2; ++d) signals_->open(d, lanes_[d].next_seq + kOpenAll);
}

void LinkGatekeeper::fail(std::exception_ptr error) {
  {
    std::lock_guard lock(mu_);
    if (!error_) error_ = std::move(error);
    stopping_ = true;
    open_all_locked();
  }
  cv_.notify_all();
}

void LinkGatekeeper::open_gate(int dir, uint32_t seq) {
  std::lock_guard lock(mu_);
  if (stopping_) throw Stopped{};  // every gate is open already; never move one back
  signals_->open(dir, seq);
}

template <typename Ready>
void LinkGatekeeper::wait_for(int dir, Ready ready, double first_nap_s, bool back_off) {
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  if (first_nap_s > 0 && !ready()) std::this_thread::sleep_for(seconds(first_nap_s));
  const auto start = Clock::now();
  const auto spin = seconds(options_.spin_s);
  const auto most = seconds(std::max(options_.max_sleep_s, options_.sleep_s));
  const auto check_every = seconds(options_.check_s);
  auto nap = seconds(options_.sleep_s);
  auto checked = start;
  for (;;) {
    if (ready()) return;
    if (stopping_) throw Stopped{};
    const auto now = Clock::now();
    if (now - start < spin) continue;
    if (now - checked >= check_every) {
      signals_->check_device(dir);
      checked = now;
    }
    std::this_thread::sleep_for(nap);
    if (back_off) nap = std::min(nap * 2, most);
  }
}

void LinkGatekeeper::run(int dir) {
  // Naps of tens of us want a timer slack below the default 50 us (Note [Polling the flags]).
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  Lane& lane = lanes_[dir];
  for (;;) {
    Copy copy;
    std::shared_ptr<LinkLedger> ledger;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !lane.queue.empty(); });
      if (stopping_) return;
      copy = lane.queue.front();
      ledger = ledger_;
    }
    try {
      serve(dir, copy, *ledger);
    } catch (const Stopped&) {
      return;
    } catch (...) {
      fail(std::current_exception());
      return;
    }
    std::lock_guard lock(mu_);
    lane.queue.pop_front();
  }
}

void LinkGatekeeper::serve(int dir, const Copy& copy, LinkLedger& ledger) {
  const TransferDirection direction =
      dir == 1 ? TransferDirection::kToDevice : TransferDirection::kToHost;
  const std::vector<int>& arbitrated =
      options_.arbitrated.empty() ? options_.path : options_.arbitrated;
  const double rate = options_.link_gbps > 0 ? options_.link_gbps * 1e9 : 1e12;
  double deadline = 0;
  uint64_t offset = 0;
  for (uint32_t i = 0; i < copy.chunks; ++i) {
    const uint32_t seq = copy.first_seq + i;
    const uint64_t length = std::min(copy.chunk_bytes, copy.bytes - offset);
    wait_for(
        dir, [&] { return seq_reached(signals_->arrived(dir), seq); }, 0, /*back_off=*/true);
    // The deadline counts from the copy's start: the moment the stream reaches it.
    if (i == 0) deadline = LinkLedger::now() + copy.deadline_s;
    const uint64_t flow = ledger.acquire(
        options_.rank, direction, arbitrated, options_.path, length,
        chunk_latest_start(deadline, copy.bytes - offset, rate), /*held=*/true, copy.kind);
    try {
      open_gate(dir, seq);
      // Note [Polling the flags]: most of the chunk's time alone on the path, then short naps.
      const double alone_s = static_cast<double>(length) / rate;
      wait_for(
          dir, [&] { return seq_reached(signals_->done(dir), seq); },
          0.8 * alone_s - options_.spin_s, /*back_off=*/false);
    } catch (...) {
      ledger.abandon(flow);
      throw;
    }
    ledger.finish(flow);
    ++finished_;
    offset += length;
  }
}

}  // namespace ferry
