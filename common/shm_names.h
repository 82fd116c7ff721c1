// Names of node-shared POSIX shared-memory blocks that say who created them, so that the next job
// removes a block whose creator died (Note [Shared-memory names that outlive nothing]).
// Invariant: a block is removed only when the process named in it is gone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::shm_names {

// Note [Shared-memory names that outlive nothing]
// A node-shared block (the link ledger) is created under a name, attached by the other local
// ranks, then unlinked: from then on it lives as long as a rank maps it. A creator killed before
// the unlink left the name in /dev/shm for ever (issue 15, item 17): nothing knew whose it was.
// Now the name carries its creator's identity, "/<prefix>-<pid>.<start>-<token>", <start> being
// the process's start time (field 22 of /proc/<pid>/stat, clock ticks since boot), which tells a
// reused pid from the creator; the job's <token> (drawn by rank 0, broadcast) lets the job's other
// ranks on the node find the block. Creating a block first removes every block of the prefix whose
// creator is gone, so a crash leaves a block only until the next job starts. The identity is in
// the name, not in the block, so even a creator killed between shm_open and the first write is
// recognised. (Processes in other pid namespaces sharing /dev/shm would look dead: not supported.)
// A creator is gone when its pid names no process, a zombie, or a process of another start time
// (a reused pid); a block is removed only then.

// A process: its pid and start time.
struct ProcessId {
  int pid = 0;
  uint64_t start = 0;
};

// This process.
ProcessId self();
// Whether `id` is a running process (not a zombie) with that start time. A process this one may
// not inspect counts as alive.
bool alive(const ProcessId& id);

// A token unique to one job on this machine: "<pid>-<microseconds>-<random>".
std::string job_token();
// The name under which this process creates the job's block: "/<prefix>-<pid>.<start>-<token>".
std::string block_name(const std::string& prefix, const std::string& token);
// The name of the job's block of `prefix` in `dir` (any creator), or "" when there is none.
std::string find_block(const std::string& prefix, const std::string& token,
                       const std::string& dir = "/dev/shm");
// Removes (shm_unlink) every block "<prefix>-<pid>.<start>-..." in `dir` whose creator is not
// alive; names of other forms are left alone. Returns the names removed ("/..."). Best effort:
// a name that cannot be removed (another user's) is skipped.
std::vector<std::string> remove_stale_blocks(const std::string& prefix,
                                             const std::string& dir = "/dev/shm");

}  // namespace ferry::shm_names
