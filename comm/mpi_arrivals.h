// Which ranks have arrived at a collective, and which are still running, readable without their
// help: each rank posts the sequence number of the collective it enters, and a thread of its own
// beats a counter, into its slot of an MPI one-sided window; a rank whose collective has timed out
// reads every slot. Private to comm/ (the watchdog's side channel, Note [The collective watchdog]
// in comm/collective_watchdog.h). Invariant: a rank's slot only grows, and only that rank writes
// it.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ferry::detail {

class MpiArrivals {
 public:
  // How often a rank's heartbeat counter advances.
  static constexpr double kBeatSeconds = 0.05;

  // Collective over `comm`. When the MPI library cannot make the window, available() is false and
  // read_all() knows nothing.
  explicit MpiArrivals(MPI_Comm comm);
  // Collective (MPI_Win_free): every rank destroys its MpiArrivals, as its communicator.
  ~MpiArrivals();
  MpiArrivals(const MpiArrivals&) = delete;
  MpiArrivals& operator=(const MpiArrivals&) = delete;

  bool available() const { return window_ != MPI_WIN_NULL; }

  // This rank enters collective `sequence` (1, 2, ...). A store to local memory: no message.
  void post(int64_t sequence);

  // What a rank's slot holds.
  struct Slot {
    int64_t sequence = 0;  // the last collective it entered
    int64_t beats = 0;     // its heartbeat counter: stands still while the process is stopped
  };
  // Every rank's slot; nullopt for a rank whose slot could not be read within `deadline_s` (a
  // stopped process on an MPI transport that needs the target to take part), and for every rank
  // when !available().
  std::vector<std::optional<Slot>> read_all(double deadline_s) const;

 private:
  int size_ = 0;
  int64_t* slot_ = nullptr;  // this rank's slot in the window: {sequence, beats}
  MPI_Win window_ = MPI_WIN_NULL;
  std::atomic<bool> stop_{false};
  std::thread heart_;
};

// "rank 1" / "ranks 1, 3": the ranks in `ranks`, for messages.
std::string rank_list(const std::vector<int>& ranks);

}  // namespace ferry::detail
