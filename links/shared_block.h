// POSIX shared-memory blocks that several processes find by name: created zero-filled, set up
// by their creator, published under a well-known name at most once (Note [A well-known block
// created once]), and mapped by everyone else. Used by the link ledger and the job ledger.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <functional>
#include <string>

namespace ferry::shared_block {

// Note [A well-known block created once]
// Every job on the node must find a ledger by name, so its name is fixed (per user and layout
// version) and it is never unlinked while jobs run: an empty ledger costs one block in /dev/shm
// and is reused by the next job. Two jobs starting together must not both create it, and a job
// killed while creating it must not leave a half-initialised block under the name. So the
// creator builds the block under a private creator-stamped name ("<name>-new-<pid>.<start>-
// <token>", Note [Shared-memory names that outlive nothing] in links/shm_names.h), initialises
// it, and publishes it with link(2) onto the well-known name in /dev/shm, which fails if another
// job published first (then it attaches that one). A private block left by a creator that died
// is removed by the next creator.

// Throws LibraryError for a failed POSIX call on `name`, with errno's text.
[[noreturn]] void fail(const std::string& call, const std::string& name);

// A new zero-filled block of `bytes` under `name` (O_EXCL), mapped; LibraryError when it exists
// or cannot be made.
void* create(const std::string& name, size_t bytes);

// The block `name` mapped, or nullptr when there is none (ENOENT). LibraryError naming `what`
// ("a link ledger") when its size is not `bytes` (another build's layout).
void* open(const std::string& name, size_t bytes, const std::string& what);

// Builds a block of `bytes` under a private name, lets `init` set it up (it is zero-filled), and
// publishes it onto `name` (the note above): the mapping, or nullptr when another process
// published first (the private block is gone either way).
void* publish(const std::string& name, size_t bytes, const std::function<void(void*)>& init);

// Initialises a robust, process-shared mutex at `mu`.
void init_robust_mutex(pthread_mutex_t* mu);

}  // namespace ferry::shared_block
