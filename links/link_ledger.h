// The node-shared link ledger: one POSIX shared-memory block per job and node that every local
// rank attaches, holding the node's fluid model (links/fluid_model.h: the emulated links, the
// copies in flight on them with each link's bandwidth shared max-min fairly, the topology
// scheduler's per-link-direction tokens and waiting claims, and bytes per link per direction over
// time), advanced on the node's clock by whoever touches the ledger. Invariant: under the
// ledger's (robust, process-shared) mutex the fluid state is advanced to `now` before it is read
// or changed, so no link-direction ever carries more than its capacity in any interval.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "links/fluid_model.h"
#include "links/link_share.h"

namespace ferry {

struct LedgerOptions {
  double bin_s = 0.01;           // measurement bin of the bytes-over-time record
  double slice_s = 0.002;        // a waiting copy or claim re-reads the ledger at least this often
  double claim_stale_s = 5;      // a waiting claim not refreshed this long is dropped
  double token_timeout_s = 120;  // a token whose chunk carries nothing this long is an error
};

class LinkLedger {
 public:
  static constexpr int kMaxLinks = kFluidMaxLinks;
  static constexpr int kMaxPath = kFluidMaxPath;
  static constexpr int kMaxFlows = kFluidMaxFlows;
  static constexpr int kMaxClaims = kFluidMaxClaims;

  // Creates the shared block `name` (from name_for()), which must not exist yet, with `links`,
  // after removing the blocks of this machine whose creators died (Note [Shared-memory names that
  // outlive nothing] in links/shm_names.h). Throws ConfigError on too many links, LibraryError
  // when shared memory fails.
  static std::shared_ptr<LinkLedger> create(const std::string& name,
                                            const std::vector<NamedLink>& links,
                                            const LedgerOptions& options = {});
  // Attaches an existing block created by create() (another rank's).
  static std::shared_ptr<LinkLedger> open(const std::string& name,
                                          const LedgerOptions& options = {});
  // Removes the name; attached ranks keep the block until they detach. Quiet if absent.
  static void unlink(const std::string& name);
  // The name under which this process creates the block of the job whose ranks share
  // `job_token` (shm_names::job_token(), drawn by one rank): "/ferry-links-<pid>.<start>-<token>".
  static std::string name_for(const std::string& job_token);
  // The job's block on this machine, created by another process of the job; "" when none.
  static std::string find(const std::string& job_token);
  // name_for() a fresh token: a name no other job on this machine uses.
  static std::string unique_name();

  ~LinkLedger();
  LinkLedger(const LinkLedger&) = delete;
  LinkLedger& operator=(const LinkLedger&) = delete;

  int link_count() const;
  // Seconds on the node-wide clock the ledger uses (CLOCK_MONOTONIC).
  static double now();

  // Registers a copy of `bytes` crossing `links` in `direction`; returns its id for wait_flow.
  uint64_t begin_flow(int rank, TransferDirection direction, const std::vector<int>& links,
                      uint64_t bytes);
  // Blocks until the flow has carried its bytes at its fair share, re-reading the ledger at
  // least every slice; then removes it.
  void wait_flow(uint64_t flow);

  // Topology scheduler: queues a chunk of `bytes` crossing `path` that must hold one token per
  // link-direction of `arbitrated` (a subset of `path`) while it moves, and returns its claim
  // without waiting. Claims are granted by arbiter_policy::grant over every waiting claim of the
  // node, by slack = latest_start - now. The chunk's flow starts the moment it is granted, by
  // whichever rank advanced the ledger then, and its tokens are freed the moment its bytes are
  // through, so a copy thread that wakes late (or a rank that hangs) never holds a link. A copy
  // claims its next chunk while the current one moves (Note [Chunk pipelining] in
  // link_emulator.cc), so the hand-off between its chunks costs no link time.
  // `held` (a real GPU's chunk, Note [Held chunks] in fluid_model.cc): the chunk keeps its tokens
  // after the fluid model has carried its bytes, until finish(); it is not waited on.
  uint64_t claim(int rank, TransferDirection direction, const std::vector<int>& arbitrated,
                 const std::vector<int>& path, uint64_t bytes, double latest_start,
                 bool held = false);
  // Blocks until `claim` is granted; returns its flow for wait_flow(). Throws LinkArbiterError
  // when a needed token's chunk has carried nothing for the timeout (a link of zero speed); the
  // claims and flows of processes that died are dropped.
  uint64_t await_grant(uint64_t claim);
  // claim() then await_grant().
  uint64_t acquire(int rank, TransferDirection direction, const std::vector<int>& arbitrated,
                   const std::vector<int>& path, uint64_t bytes, double latest_start,
                   bool held = false);
  // Cancels a claim; if it was granted already, its flow ends now and frees its tokens.
  void withdraw(uint64_t claim);
  // Ends a flow now, carried or not (its mover failed), freeing its tokens.
  void abandon(uint64_t flow);
  // Ends a held flow whose chunk the hardware reports moved, freeing its tokens.
  void finish(uint64_t flow) { abandon(flow); }

  // Per-link measurements so far.
  std::vector<LinkUsage> usage() const;

  struct Shared;  // the block's layout, private to link_ledger*.cc (link_ledger_impl.h)

 private:
  LinkLedger(Shared* shared, const LedgerOptions& options) : s_(shared), options_(options) {}
  Shared* s_;
  LedgerOptions options_;
};

}  // namespace ferry
