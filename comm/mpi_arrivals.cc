// The arrivals window: two int64 per rank, read by polled requests against a deadline, so a peer
// that cannot answer costs the deadline, never a hang (Note [The arrivals window]).
#include "comm/mpi_arrivals.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace ferry::detail {

// Note [The arrivals window]
// The arrivals window: two int64 per rank from MPI_Win_allocate, in a passive-target epoch
// (MPI_Win_lock_all) for the window's whole life, so reading a peer's slot needs no matching call
// on the peer. Reads are request-based (MPI_Rget) and polled against a deadline, so a peer that
// cannot answer costs the deadline, never a hang. Without a window, the same slots are asked for
// (Note [Arrivals without a window] in mpi_arrivals.h), polled against the same deadline.

namespace {
// Tags on the answering communicator: a question carries the tag its answer must come back on.
constexpr int kQuestion = 1;
constexpr int kFirstAnswer = 2;
}  // namespace

MpiArrivals::MpiArrivals(MPI_Comm comm) {
  MPI_Comm_size(comm, &size_);
  MPI_Comm_rank(comm, &rank_);
  if (!make_window(comm)) {
    slot_ = own_;
    start_answering(comm);
    if (asked_ == MPI_COMM_NULL) {
      slot_ = nullptr;
      return;
    }
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

bool MpiArrivals::make_window(MPI_Comm comm) {
  void* base = nullptr;
  // MPI_ERRORS_RETURN is set on `comm`: a failure comes back as a code.
  if (MPI_Win_allocate(2 * sizeof(int64_t), sizeof(int64_t), MPI_INFO_NULL, comm, &base,
                       &window_) != MPI_SUCCESS) {
    window_ = MPI_WIN_NULL;
    return false;
  }
  MPI_Win_set_errhandler(window_, MPI_ERRORS_RETURN);
  slot_ = static_cast<int64_t*>(base);
  std::atomic_ref<int64_t>(slot_[0]).store(0, std::memory_order_release);
  std::atomic_ref<int64_t>(slot_[1]).store(0, std::memory_order_release);
  if (MPI_Win_lock_all(MPI_MODE_NOCHECK, window_) != MPI_SUCCESS) {
    MPI_Win_free(&window_);
    window_ = MPI_WIN_NULL;
    slot_ = nullptr;
    return false;
  }
  return true;
}

// The answering thread: polls for a question from any rank and sends this rank's slot back on
// the tag the question names. It polls (MPI_Test, then sleeps) rather than block in MPI_Recv,
// which spins a core inside Open MPI.
void MpiArrivals::start_answering(MPI_Comm comm) {
  if (MPI_Comm_dup(comm, &asked_) != MPI_SUCCESS) {
    asked_ = MPI_COMM_NULL;
    return;
  }
  MPI_Comm_set_errhandler(asked_, MPI_ERRORS_RETURN);
  answering_ = std::thread([this] {
    int tag = 0;
    MPI_Request question = MPI_REQUEST_NULL;
    while (!stop_.load(std::memory_order_relaxed)) {
      if (question == MPI_REQUEST_NULL &&
          MPI_Irecv(&tag, 1, MPI_INT, MPI_ANY_SOURCE, kQuestion, asked_, &question) != MPI_SUCCESS)
        return;
      int asked = 0;
      MPI_Status status;
      if (MPI_Test(&question, &asked, &status) != MPI_SUCCESS) return;
      if (!asked) {
        std::this_thread::sleep_for(std::chrono::duration<double>(kAnswerPollSeconds));
        continue;
      }
      question = MPI_REQUEST_NULL;
      int64_t answer[2] = {std::atomic_ref<int64_t>(slot_[0]).load(std::memory_order_acquire),
                           std::atomic_ref<int64_t>(slot_[1]).load(std::memory_order_acquire)};
      // 16 bytes go eagerly: this returns without the asker's help.
      MPI_Send(answer, 2, MPI_INT64_T, status.MPI_SOURCE, tag, asked_);
    }
    if (question != MPI_REQUEST_NULL) {
      MPI_Cancel(&question);
      MPI_Wait(&question, MPI_STATUS_IGNORE);
    }
  });
}

MpiArrivals::~MpiArrivals() {
  stop_ = true;
  if (heart_.joinable()) heart_.join();
  if (answering_.joinable()) answering_.join();
  if (asked_ != MPI_COMM_NULL) MPI_Comm_free(&asked_);
  if (window_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(window_);
  MPI_Win_free(&window_);
}

void MpiArrivals::post(int64_t sequence) {
  if (slot_ != nullptr)
    std::atomic_ref<int64_t>(slot_[0]).store(sequence, std::memory_order_release);
}

std::vector<std::optional<MpiArrivals::Slot>> MpiArrivals::read_all(double deadline_s) {
  std::vector<std::optional<Slot>> out(static_cast<size_t>(size_));
  if (asked_ != MPI_COMM_NULL) return ask_all(deadline_s);
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

std::vector<std::optional<MpiArrivals::Slot>> MpiArrivals::ask_all(double deadline_s) {
  std::vector<std::optional<Slot>> out(static_cast<size_t>(size_));
  int tag_ub = 32767;  // the least MPI_TAG_UB the standard allows
  int* attr = nullptr;
  int has = 0;
  if (MPI_Comm_get_attr(asked_, MPI_TAG_UB, &attr, &has) == MPI_SUCCESS && has) tag_ub = *attr;
  // A round of its own: a late answer to an earlier round never passes for one of this round.
  const int tag = kFirstAnswer + round_++ % (tag_ub - kFirstAnswer);
  // Freed only when every request completed, as in read_all.
  auto values = std::make_unique<int64_t[]>(2 * static_cast<size_t>(size_));
  auto tags = std::make_unique<int[]>(static_cast<size_t>(size_));
  std::vector<MPI_Request> answers(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  std::vector<MPI_Request> questions(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  for (int r = 0; r < size_; ++r) {
    const auto i = static_cast<size_t>(r);
    if (r == rank_) {
      out[i] = Slot{std::atomic_ref<int64_t>(slot_[0]).load(std::memory_order_acquire),
                    std::atomic_ref<int64_t>(slot_[1]).load(std::memory_order_acquire)};
      continue;
    }
    tags[i] = tag;
    if (MPI_Irecv(&values[2 * i], 2, MPI_INT64_T, r, tag, asked_, &answers[i]) != MPI_SUCCESS) {
      answers[i] = MPI_REQUEST_NULL;
      continue;
    }
    // A question that cannot be sent leaves its answer pending until the deadline.
    if (MPI_Isend(&tags[i], 1, MPI_INT, r, kQuestion, asked_, &questions[i]) != MPI_SUCCESS)
      questions[i] = MPI_REQUEST_NULL;
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  int pending = 0;
  do {
    pending = 0;
    for (int r = 0; r < size_; ++r) {
      const auto i = static_cast<size_t>(r);
      if (answers[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      if (MPI_Test(&answers[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        answers[i] = MPI_REQUEST_NULL;
      } else if (flag) {  // MPI_Test set the request to MPI_REQUEST_NULL
        out[i] = Slot{values[2 * i], values[2 * i + 1]};
      } else {
        ++pending;
      }
    }
    if (pending == 0 || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (true);
  int sent = 1;
  for (MPI_Request& q : questions)
    if (q != MPI_REQUEST_NULL && MPI_Test(&q, &sent, MPI_STATUS_IGNORE) == MPI_SUCCESS && !sent)
      pending += 1;
  // A question or answer still pending may use these buffers later: leave their few bytes
  // behind (the job is about to end) rather than free memory MPI still holds.
  if (pending > 0) {
    (void)values.release();
    (void)tags.release();
  }
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += fmt::format("{}{}", i ? ", " : "", ranks[i]);
  return text;
}

}  // namespace ferry::detail
