// Which ranks have arrived at a collective and are still running, readable without their help
// (Note [Reading arrivals]). Invariant: a rank's slot only grows, and only that rank writes it.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ferry::detail {

// Note [Reading arrivals]
// Which ranks have arrived at a collective, and which are still running, readable without their
// help: each rank posts the sequence number of the collective it enters, and a thread of its own
// beats a counter, into its slot of an MPI one-sided window; a rank whose collective has timed out
// reads every slot (or asks each rank's answering thread, where MPI has no window: Note [Arrivals
// without a window]). Private to comm/ (the watchdog's side channel, Note [The collective
// watchdog] in comm/collective_watchdog.h). Invariant: a rank's slot only grows, and only that
// rank writes it.

// Note [Arrivals without a window]
// Open MPI 4.1 makes one-sided windows over shared memory (osc sm), UCX (osc ucx) and RDMA
// transports. Between hosts joined by TCP alone (btl tcp, no UCX: the namespace hosts of
// scripts/multihost.sh, an Ethernet cluster) none is left that allows MPI_THREAD_MULTIPLE (osc
// pt2pt refuses it), MPI_Win_allocate fails, and the watchdog could end a stalled job without
// naming the rank that stopped it, as it does on one node. So each rank then answers instead: a
// thread of its own receives "your slot?" on a duplicate of the communicator and sends its slot
// back, and read_all asks every rank and waits for the answers until its deadline. A stopped
// process cannot answer, so it is named as a rank that did not answer (stopped or hung); a
// running rank that never entered the collective answers with the one it is at.

class MpiArrivals {
 public:
  // How often a rank's heartbeat counter advances.
  static constexpr double kBeatSeconds = 0.05;
  // How often a rank's answering thread looks for a question (Note [Arrivals without a window]).
  static constexpr double kAnswerPollSeconds = 0.02;

  // Collective over `comm`: the window, or when the MPI library cannot make one, the answering
  // thread on a duplicate of `comm`. available() is false (read_all() knows nothing) when neither
  // can be made.
  explicit MpiArrivals(MPI_Comm comm);
  // Collective (MPI_Win_free, MPI_Comm_free): every rank destroys its MpiArrivals, as its
  // communicator.
  ~MpiArrivals();
  MpiArrivals(const MpiArrivals&) = delete;
  MpiArrivals& operator=(const MpiArrivals&) = delete;

  bool available() const { return window_ != MPI_WIN_NULL || asked_ != MPI_COMM_NULL; }
  // The slots are read through a one-sided window (else by asking each rank).
  bool one_sided() const { return window_ != MPI_WIN_NULL; }

  // This rank enters collective `sequence` (1, 2, ...). A store to local memory: no message.
  void post(int64_t sequence);

  // What a rank's slot holds.
  struct Slot {
    int64_t sequence = 0;  // the last collective it entered
    int64_t beats = 0;     // its heartbeat counter: stands still while the process is stopped
  };
  // Every rank's slot; nullopt for a rank whose slot could not be read within `deadline_s` (a
  // stopped process on an MPI transport that needs the target to take part, or that must
  // answer), and for every rank when !available().
  std::vector<std::optional<Slot>> read_all(double deadline_s);

 private:
  bool make_window(MPI_Comm comm);
  void start_answering(MPI_Comm comm);
  std::vector<std::optional<Slot>> ask_all(double deadline_s);

  int size_ = 0;
  int rank_ = 0;
  int64_t own_[2] = {0, 0};  // this rank's slot when there is no window
  int64_t* slot_ = nullptr;  // this rank's slot: {sequence, beats}, in the window or own_
  MPI_Win window_ = MPI_WIN_NULL;
  MPI_Comm asked_ = MPI_COMM_NULL;  // the answering thread's communicator (no window)
  int round_ = 0;                   // read_all calls so far: each round answers on its own tag
  std::atomic<bool> stop_{false};
  std::thread heart_;
  std::thread answering_;
};

// "rank 1" / "ranks 1, 3": the ranks in `ranks`, for messages.
std::string rank_list(const std::vector<int>& ranks);

}  // namespace ferry::detail
