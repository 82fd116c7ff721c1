// The arrivals window: two int64 per rank from MPI_Win_allocate, in a passive-target epoch
// (MPI_Win_lock_all) for the window's whole life, so reading a peer's slot needs no matching call
// on the peer. Reads are request-based (MPI_Rget) and polled against a deadline, so a peer that
// cannot answer costs the deadline, never a hang.
#include "comm/mpi_arrivals.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace ferry::detail {

MpiArrivals::MpiArrivals(MPI_Comm comm) {
  MPI_Comm_size(comm, &size_);
  void* base = nullptr;
  // MPI_ERRORS_RETURN is set on `comm`: a failure comes back as a code.
  if (MPI_Win_allocate(2 * sizeof(int64_t), sizeof(int64_t), MPI_INFO_NULL, comm, &base,
                       &window_) != MPI_SUCCESS) {
    window_ = MPI_WIN_NULL;
    return;
  }
  MPI_Win_set_errhandler(window_, MPI_ERRORS_RETURN);
  slot_ = static_cast<int64_t*>(base);
  std::atomic_ref<int64_t>(slot_[0]).store(0, std::memory_order_release);
  std::atomic_ref<int64_t>(slot_[1]).store(0, std::memory_order_release);
  if (MPI_Win_lock_all(MPI_MODE_NOCHECK, window_) != MPI_SUCCESS) {
    MPI_Win_free(&window_);
    window_ = MPI_WIN_NULL;
    slot_ = nullptr;
    return;
  }
  // The heartbeat: every thread of a stopped (SIGSTOP) process stands still, this one too.
  heart_ = std::thread([this] {
    std::atomic_ref<int64_t> beats(slot_[1]);
    while (!stop_.load(std::memory_order_relaxed)) {
      beats.fetch_add(1, std::memory_order_release);
      std::this_thread::sleep_for(std::chrono::duration<double>(kBeatSeconds));
    }
  });
}

MpiArrivals::~MpiArrivals() {
  if (window_ == MPI_WIN_NULL) return;
  stop_ = true;
  heart_.join();
  MPI_Win_unlock_all(window_);
  MPI_Win_free(&window_);
}

void MpiArrivals::post(int64_t sequence) {
  if (slot_ != nullptr)
    std::atomic_ref<int64_t>(slot_[0]).store(sequence, std::memory_order_release);
}

std::vector<std::optional<MpiArrivals::Slot>> MpiArrivals::read_all(double deadline_s) const {
  std::vector<std::optional<Slot>> out(static_cast<size_t>(size_));
  if (window_ == MPI_WIN_NULL) return out;
  // Freed only when every read completed: see below.
  auto values = std::make_unique<int64_t[]>(2 * static_cast<size_t>(size_));
  std::vector<MPI_Request> requests(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  for (int r = 0; r < size_; ++r) {
    const auto i = static_cast<size_t>(r);
    if (MPI_Rget(&values[2 * i], 2, MPI_INT64_T, r, 0, 2, MPI_INT64_T, window_, &requests[i]) !=
        MPI_SUCCESS)
      requests[i] = MPI_REQUEST_NULL;
  }
  std::vector<bool> done(static_cast<size_t>(size_), false);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  int pending = size_;
  while (pending > 0) {
    pending = 0;
    for (int r = 0; r < size_; ++r) {
      const auto i = static_cast<size_t>(r);
      if (done[i] || requests[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      if (MPI_Test(&requests[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        requests[i] = MPI_REQUEST_NULL;
        continue;
      }
      if (flag) {
        done[i] = true;
        out[i] = Slot{values[2 * i], values[2 * i + 1]};
      } else {
        ++pending;
      }
    }
    if (pending == 0 || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // A read still pending may write into `values` later: leave its few bytes behind (the job is
  // about to end) rather than free memory MPI still holds.
  if (pending > 0) (void)values.release();
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += fmt::format("{}{}", i ? ", " : "", ranks[i]);
  return text;
}

}  // namespace ferry::detail
