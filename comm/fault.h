// Ending a job when one rank fails, so that no other rank waits forever in a collective.
// Invariant: under MPI, a rank that reports a failure through fail_job never returns to user
// code: the launcher kills every rank of the job (MPI_Abort).
#pragma once

#include <exception>
#include <functional>
#include <string>

#include "comm/ranks.h"

namespace ferry {

// Note [Ending a job on one rank's failure]
// A rank that throws stops taking part in collectives; every other rank then blocks in the next
// all-reduce forever. So `main` catches every exception and calls fail_job, which prints the
// rank's message to stderr (each line prefixed "rank R of N: " when there is more than one rank)
// and, under MPI, calls MPI_Abort(MPI_COMM_WORLD, code): mpirun kills every rank within a
// second or two and exits non-zero. Without MPI it returns `code` for main to return.
//
// Keep the objects that own streams (device, communicator, session) OUT of the try block's
// scope, e.g. `std::unique_ptr<Session> session;` declared before `try`: otherwise stack
// unwinding destroys them before the catch runs, and a destructor that drains the comm stream
// could wait on a collective that the other ranks will not join. With the objects alive,
// fail_job aborts first. Typical main:
//
//   RankInfo ranks;
//   std::unique_ptr<Session> session;
//   try {
//     ranks = init_ranks();
//     session = std::make_unique<Session>(config, ranks);
//     session->train();
//   } catch (const ConfigError& e) {
//     return fail_job(ranks, e, 2);
//   } catch (const std::exception& e) {
//     return fail_job(ranks, e, 1);
//   }
//   session.reset();   // communicators go before MPI_Finalize
//   finalize_ranks();
//   return 0;

// Prints "error: <message>" and "hint: <hint>" (when not empty) to stderr, prefixed with the
// rank when size > 1; runs the fault actions (ScopedFaultAction); then under MPI ends the job
// (abort_job(code), never returns), otherwise returns `code`. `code` should be non-zero (0 becomes
// 1 under MPI).
int fail_job(const RankInfo& ranks, const std::string& message, const std::string& hint, int code);

// The same for a caught exception: its what(), and its hint() when it is a ferry::Error.
int fail_job(const RankInfo& ranks, const std::exception& error, int code);

// An action fail_job runs before it ends the job, registered for the lifetime of this object:
// a communicator whose collectives could block the process's exit aborts them (NCCL:
// ncclCommAbort; Note [Ending a job when a collective cannot finish] in
// comm/async_error_watchdog.h). Actions run on fail_job's thread, at most once each, newest first;
// one that throws is reported and the rest still run.
class ScopedFaultAction {
 public:
  explicit ScopedFaultAction(std::function<void()> action);
  ~ScopedFaultAction();
  ScopedFaultAction(const ScopedFaultAction&) = delete;
  ScopedFaultAction& operator=(const ScopedFaultAction&) = delete;

 private:
  std::function<void()> action_;
};

// Runs (and unregisters) every registered fault action; fail_job calls it.
void run_fault_actions();

// "rank 1 of 4: " when size > 1, "" otherwise: a prefix for per-rank console lines.
std::string rank_prefix(const RankInfo& ranks);

}  // namespace ferry
