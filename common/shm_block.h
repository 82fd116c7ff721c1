// POSIX shared-memory blocks that several processes find by name: created zero-filled, set up
// by their creator, published under a well-known name at most once, and mapped by everyone else
// only through one checked open: no mapping of an unchecked block (Note [A block is input]).
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace ferry::shm_block {

// Note [A well-known block created once]
// Every job on the node must find a ledger by name, so its name is fixed (per user and layout
// version) and it is never unlinked while jobs run: an empty ledger costs one block in /dev/shm
// and is reused by the next job. Two jobs starting together must not both create it, and a job
// killed while creating it must not leave a half-initialised block under the name. So the
// creator builds the block under a private creator-stamped name ("<name>-new-<pid>.<start>-
// <token>", Note [Shared-memory names that outlive nothing] in common/shm_names.h), initialises
// it, and publishes it with link(2) onto the well-known name in /dev/shm, which fails if another
// job published first (then it attaches that one). A private block left by a creator that died
// is removed by the next creator.

// Note [A block is input]
// Any process of this user can write /dev/shm, so a block found at a ledger's name is input: a
// foreign file, a block of another layout, or one whose body was overwritten. open_checked()
// hands out a mapping only after it checked, in order: the size; the magic and version; the
// robust mutex, locked with a timeout (a random lock word names an owner that never existed and
// would be waited on for ever); and, under that mutex, every field the ledger later reads through
// (counts, indices, enums, string terminators, ladders: the layout's `check`). A block that
// fails is removed when no live process maps it (Note [Who maps a block]) and the caller creates
// a fresh one; while a process does map it, the open throws DataError: one line naming the block
// and what to do (exit code 2).
//
// Note [Who maps a block]
// Every process that maps a block holds a shared flock(2) on its descriptor for as long as the
// mapping lives (Mapping), and the kernel drops it when the process dies, even by kill -9. So
// "no live process uses this block" is an exclusive flock that succeeds; a checker that found the
// block bad drops its own shared lock first and retries a while, since another opener may be
// looking at the same bad block.

// A mapped block and the descriptor whose shared flock says it is in use (Note [Who maps a
// block]). Move-only; unmaps and closes (dropping the flock) when destroyed.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t bytes, int fd) : addr_(addr), bytes_(bytes), fd_(fd) {}
  ~Mapping() { reset(); }
  Mapping(Mapping&& other) noexcept { *this = std::move(other); }
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  void* get() const { return addr_; }
  explicit operator bool() const { return addr_ != nullptr; }
  void reset();

 private:
  void* addr_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
};

// What a ledger's block must look like: its size, a header of a uint64 magic then a uint32
// version at offset 0, a robust process-shared mutex, and a body its `check` accepts.
struct Layout {
  std::string what;  // "job ledger", for messages
  size_t bytes = 0;
  uint64_t magic = 0;
  uint32_t version = 0;
  size_t mutex_offset = 0;
  // With the mutex held: "" when the body is sound, else what is wrong (one phrase). When
  // `owner_died` (the mutex's last holder died), a sound block may also be repaired here.
  std::function<std::string(void* block, bool owner_died)> check;
};

// Seconds open_checked() waits for a block's mutex before it calls the block damaged.
constexpr double kMutexTimeout_s = 5;

// Throws LibraryError for a failed POSIX call on `name`, with errno's text.
[[noreturn]] void fail(const std::string& call, const std::string& name);

// A new zero-filled block of `bytes` under `name` (O_EXCL), mapped; LibraryError when it exists
// or cannot be made.
Mapping create(const std::string& name, size_t bytes);

// The block `name` mapped and checked against `layout` (Note [A block is input]); an empty
// Mapping when there is none, or when a bad block nobody maps was removed (the caller may create
// one). Throws DataError naming the block when it is bad and in use.
Mapping open_checked(const std::string& name, const Layout& layout);

// Builds a block of `bytes` under a private name, lets `init` set it up (it is zero-filled), and
// publishes it onto `name` (the note above): the mapping, or an empty one when another process
// published first (the private block is gone either way).
Mapping publish(const std::string& name, size_t bytes, const std::function<void(void*)>& init);

// Initialises a robust, process-shared mutex at `mu`.
void init_robust_mutex(pthread_mutex_t* mu);

// Locks the robust mutex `mu`, waiting at most `timeout_s` (< 0: for ever): 0, or the error
// number (ETIMEDOUT, EINVAL, ENOTRECOVERABLE, ...). A holder that died is taken over: the mutex
// is made consistent and `*owner_died` set.
int lock_robust(pthread_mutex_t* mu, double timeout_s, bool* owner_died);

}  // namespace ferry::shm_block
