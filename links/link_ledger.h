// The node-shared link ledger: one POSIX shared-memory block per node, user and topology holding
// the node's fluid model (Note [What the link ledger holds]). Invariant: under the ledger's mutex
// the fluid state is advanced to `now` before it is read or changed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/shm_block.h"
#include "device/copy_deadline.h"
#include "links/fair_rates.h"
#include "links/fluid_model.h"

// Note [What the link ledger holds]
// Every local rank of every ferry job attaches the block (Note [One link ledger per node]). It
// holds the node's fluid model (links/fluid_model.h): the emulated links, the copies in flight on
// them with each link's bandwidth shared max-min fairly, the topology scheduler's
// per-link-direction tokens and waiting claims, and bytes per link per direction over time.
// Whoever touches the ledger advances it on the node's clock. The mutex is robust and
// process-shared; since the state is advanced to `now` under it before it is read or changed, no
// link-direction ever carries more than its capacity in any interval.

namespace ferry {

// A process attached to the node's ledger: which job and rank it is (shown by `trainer jobs`).
struct LedgerUser {
  std::string job;      // the job's token (shm_names::job_token(), drawn by its rank 0)
  int rank = 0;         // its rank in the job
  std::string run_dir;  // the job's run directory
};

// Who is on one link in a snapshot: a process's copy (flow), waiting or granted chunk (claim).
struct LinkUserEntry {
  int pid = 0;
  int rank = 0;     // in its job
  std::string job;  // "" when the process is not a registered user (old-style block)
  std::string run_dir;
  std::string kind;    // "flow" (bytes in flight), "claim" (waiting for tokens)
  std::string label;   // what the copy carries: copy_label()
  int dir = 0;         // 0 to host, 1 to device
  bool token = false;  // the flow holds this link-direction's token
  double bytes = 0;    // flow: bytes still to carry; claim: the chunk's bytes
};

// One link in a snapshot.
struct LedgerLink {
  LinkUsage usage;
  std::vector<LinkUserEntry> users;
};

// A ledger in a snapshot: its topology key, the processes attached and every link.
struct LedgerSnapshot {
  uint64_t key = 0;
  struct User {
    int pid = 0;
    int rank = 0;
    std::string job;
    std::string run_dir;
  };
  std::vector<User> users;
  std::vector<LedgerLink> links;
};

// What a copy in the ledger carries, by its CopyKind and direction (0 to host, 1 to device):
// "offload" and "prefetch" (an activation's), "optimizer d2h" and "optimizer h2d" (the host
// optimizer's gradients and weights: Note [Host copies on the links] in
// trainer/optim/model_state_step.h), "copy" (anything else: an input, a parameter).
const char* copy_label(CopyKind kind, int dir);

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
  static constexpr int kMaxUsers = 64;

  // Note [One link ledger per node]
  // Every ferry job of one user on the node shares one ledger per topology, so the `topology`
  // scheduler arbitrates a switch uplink between two jobs' GPUs as between one job's ranks, and
  // the emulated links carry every job's copies. Its name is well known: "<base>-<key>", base
  // "/ferry-links-v<layout>-u<uid>" (or $FERRY_LINK_LEDGER, a name "/x" with no other "/": tests
  // keep theirs apart), key topology_key() of the job's links (names and capacities, in the
  // topology file's order), so jobs naming the same topology file (and emulation scale) map each
  // physical link to the same slot, and a job of another topology gets a ledger of its own; the
  // block also holds its links and refuses a job whose links differ (ConfigError). It is created
  // once (Note [A well-known block created once] in common/shm_block.h) and never removed.
  // Each attached process registers as a user (pid, start time, job, rank); a process that
  // attaches when no live user is left starts the fluid state afresh, so a job alone on the node
  // sees exactly a new ledger. The copies, claims, tokens and user entries of a process that died
  // (any job's, kill -9 at any moment) are dropped by whoever next attaches, waits for a grant,
  // or waits for a copy (at least every reap interval); the robust mutex is taken over from a
  // holder that died.

  // The node's ledger name for `links`: "<base>-<topology_key(links) in hex>".
  static std::string node_name(const std::vector<NamedLink>& links);
  // The base of node_name(): $FERRY_LINK_LEDGER when set to a name, else
  // "/ferry-links-v<layout>-u<uid>".
  static std::string node_base();
  // A 64-bit identity (FNV-1a) of a link table: count, then each name and both capacities.
  static uint64_t topology_key(const std::vector<NamedLink>& links);
  // Attaches the node's ledger `name`, creating it when no job has, and registers this process
  // as `user`. A block at the name that is not a sound ledger of this build is replaced when no
  // process maps it (Note [A block is input] in common/shm_block.h). Throws ConfigError when the
  // ledger holds other links, DataError when a bad block is in use, LibraryError when shared
  // memory fails.
  static std::shared_ptr<LinkLedger> attach(const std::string& name,
                                            const std::vector<NamedLink>& links,
                                            const LedgerUser& user,
                                            const LedgerOptions& options = {});
  // Attaches an existing node ledger to read it (`trainer jobs`); nullptr when there is none.
  static std::shared_ptr<LinkLedger> open_existing(const std::string& name);
  // The names of this user's node ledgers in /dev/shm (every topology), sorted.
  static std::vector<std::string> node_ledgers();

  // A job's private block (tests, and tools that want a ledger of their own; jobs use attach()).
  // Creates the shared block `name` (from name_for()), which must not exist yet, with `links`,
  // after removing the blocks of this machine whose creators died (Note [Shared-memory names that
  // outlive nothing] in common/shm_names.h). Throws ConfigError on too many links, LibraryError
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
  // `kind`: what it carries (snapshot() labels it).
  uint64_t begin_flow(int rank, TransferDirection direction, const std::vector<int>& links,
                      uint64_t bytes, CopyKind kind = CopyKind::kOther);
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
  // `kind`: what the chunk carries (snapshot() labels the claim and its flow).
  uint64_t claim(int rank, TransferDirection direction, const std::vector<int>& arbitrated,
                 const std::vector<int>& path, uint64_t bytes, double latest_start,
                 bool held = false, CopyKind kind = CopyKind::kOther);
  // Blocks until `claim` is granted; returns its flow for wait_flow(). Throws LinkArbiterError
  // when a needed token's chunk has carried nothing for the timeout (a link of zero speed); the
  // claims and flows of processes that died are dropped.
  uint64_t await_grant(uint64_t claim);
  // claim() then await_grant().
  uint64_t acquire(int rank, TransferDirection direction, const std::vector<int>& arbitrated,
                   const std::vector<int>& path, uint64_t bytes, double latest_start,
                   bool held = false, CopyKind kind = CopyKind::kOther);
  // Cancels a claim; if it was granted already, its flow ends now and frees its tokens.
  void withdraw(uint64_t claim);
  // Ends a flow now, carried or not (its mover failed), freeing its tokens.
  void abandon(uint64_t flow);
  // Ends a held flow whose chunk the hardware reports moved, freeing its tokens.
  void finish(uint64_t flow) { abandon(flow); }

  // Per-link measurements so far.
  std::vector<LinkUsage> usage() const;
  // The users and every link's copies and claims now (the dead reaped first).
  LedgerSnapshot snapshot();

  struct Shared;  // the block's layout, private to link_ledger*.cc (link_ledger_impl.h)

 private:
  LinkLedger(shm_block::Mapping block, const LedgerOptions& options);
  shm_block::Mapping block_;  // holds the flock that says a process uses it
  Shared* s_;
  LedgerOptions options_;
  int user_ = -1;  // this process's slot in the block's users, once registered
};

}  // namespace ferry
