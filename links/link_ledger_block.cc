// The link ledger's shared block: its names, creation with its robust process-shared mutex,
// attachment and removal (Note [Names of the link ledger's block]). Invariant: a block is opened
// only once the checked open passes it, and the well-known name only names an initialised block.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "common/shm_block.h"
#include "common/shm_names.h"
#include "links/fluid_model.h"
#include "links/link_ledger.h"
#include "links/link_ledger_impl.h"

// Note [Names of the link ledger's block]
// The node's well-known name: Note [One link ledger per node] in link_ledger.h; a job's private
// one: Note [Shared-memory names that outlive nothing] in common/shm_names.h. A block is opened
// only when its size, header and body pass the checked open (Note [A block is input] in
// common/shm_block.h), and the well-known name only ever names an initialised block.

namespace ferry {
namespace {

using namespace link_ledger_impl;
using Shared = LinkLedger::Shared;

std::string without_slash(const std::string& name) {
  return name.starts_with('/') ? name.substr(1) : name;
}

// Sets up a zero-filled block: its fluid state for `links` and mutex (the futex word starts at
// zero); the magic last.
void init_block(Shared* s, const std::vector<NamedLink>& links, uint64_t key,
                const LedgerOptions& options) {
  s->version = kVersion;
  s->key = key;
  FluidModel::init(s->fluid, links, options.bin_s, LinkLedger::now());
  shm_block::init_robust_mutex(&s->mu);
  std::atomic_thread_fence(std::memory_order_release);
  s->magic = kMagic;
}

// What is wrong with a block's users and fluid state, "" when nothing (Note [A block is input]
// in common/shm_block.h). A holder that died needs no repair: the next operation reaps it.
std::string check_block(const Shared* s) {
  for (int k = 0; k < LinkLedger::kMaxUsers; ++k) {
    const UserSlot& u = s->users[k];
    if ((u.used & ~1) != 0 || (u.used && u.pid <= 0) || !std::memchr(u.job, '\0', sizeof(u.job)) ||
        !std::memchr(u.run_dir, '\0', kText) || !std::isfinite(u.since))
      return fmt::format("user entry {} is out of range", k);
  }
  // On the node's clock (CLOCK_MONOTONIC since boot): a state from the future would never move.
  const double now = LinkLedger::now();
  if (!(s->fluid.t_last >= 0 && s->fluid.t_last <= now + 1) ||
      !(s->last_reap >= 0 && s->last_reap <= now + 1))
    return "its clock is not the node's";
  return FluidModel::check(s->fluid);
}

// What the checked open expects at a link ledger's name.
shm_block::Layout layout() {
  shm_block::Layout l;
  l.what = "link ledger";
  l.bytes = sizeof(Shared);
  l.magic = kMagic;
  l.version = kVersion;
  l.mutex_offset = offsetof(Shared, mu);
  l.check = [](void* block, bool) { return check_block(static_cast<const Shared*>(block)); };
  return l;
}

// Opens `name` if it exists and is sound: the mapped block, or empty (none, or a bad one that
// nobody mapped was removed).
shm_block::Mapping open_block(const std::string& name) {
  return shm_block::open_checked(name, layout());
}

// Publishes an initialised block onto `name` (Note [A well-known block created once] in
// common/shm_block.h); empty when another process published first.
shm_block::Mapping publish_block(const std::string& name, const std::vector<NamedLink>& links,
                                 uint64_t key, const LedgerOptions& options) {
  return shm_block::publish(name, sizeof(Shared), [&](void* block) {
    init_block(static_cast<Shared*>(block), links, key, options);
  });
}

bool is_shm_name(const char* env) {
  return env && env[0] == '/' && env[1] != '\0' && !std::strchr(env + 1, '/');
}

}  // namespace

std::string LinkLedger::node_base() {
  const char* env = std::getenv("FERRY_LINK_LEDGER");
  if (is_shm_name(env)) return env;
  return fmt::format("/ferry-links-v{}-u{}", kVersion, static_cast<unsigned>(getuid()));
}

uint64_t LinkLedger::topology_key(const std::vector<NamedLink>& links) {
  uint64_t h = 0xcbf29ce484222325ULL;
  const auto mix = [&h](const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  };
  const uint64_t n = links.size();
  mix(&n, sizeof(n));
  for (const NamedLink& l : links) {
    mix(l.name.data(), l.name.size() + 1);  // with its terminator: "ab","c" differs from "a","bc"
    mix(&l.capacity.to_host_gbps, sizeof(double));
    mix(&l.capacity.to_device_gbps, sizeof(double));
  }
  return h;
}

std::string LinkLedger::node_name(const std::vector<NamedLink>& links) {
  return fmt::format("{}-{:016x}", node_base(), topology_key(links));
}

std::shared_ptr<LinkLedger> LinkLedger::attach(const std::string& name,
                                               const std::vector<NamedLink>& links,
                                               const LedgerUser& user,
                                               const LedgerOptions& options) {
  if (links.size() > static_cast<size_t>(kMaxLinks)) {
    throw ConfigError(fmt::format("topology.file: {} links, the link ledger holds at most {}",
                                  links.size(), kMaxLinks));
  }
  for (int attempt = 0; attempt < 100; ++attempt) {
    shm_block::Mapping block = open_block(name);
    if (!block) block = publish_block(name, links, topology_key(links), options);
    if (!block) continue;  // another job published between our open and our link
    std::shared_ptr<LinkLedger> ledger(new LinkLedger(std::move(block), options));
    ledger->user_ = join(ledger->s_, name, links, user);
    return ledger;
  }
  throw LibraryError("posix", "attach " + name, "the link ledger keeps appearing and vanishing",
                     __FILE__, __LINE__);
}

std::shared_ptr<LinkLedger> LinkLedger::open_existing(const std::string& name) {
  shm_block::Mapping block = open_block(name);
  return block ? std::shared_ptr<LinkLedger>(new LinkLedger(std::move(block), LedgerOptions{}))
               : nullptr;
}

std::vector<std::string> LinkLedger::node_ledgers() {
  const std::string head = without_slash(node_base()) + "-";
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string n = entry.path().filename().string();
    // "<base>-<16 hex digits>": not the private "-new-..." blocks of a creator.
    if (!n.starts_with(head) || n.size() != head.size() + 16) continue;
    if (n.find_first_not_of("0123456789abcdef", head.size()) != std::string::npos) continue;
    out.push_back("/" + n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string LinkLedger::name_for(const std::string& job_token) {
  return shm_names::block_name(kNamePrefix, job_token);
}

std::string LinkLedger::find(const std::string& job_token) {
  return shm_names::find_block(kNamePrefix, job_token);
}

std::string LinkLedger::unique_name() { return name_for(shm_names::job_token()); }

std::shared_ptr<LinkLedger> LinkLedger::create(const std::string& name,
                                               const std::vector<NamedLink>& links,
                                               const LedgerOptions& options) {
  if (links.size() > static_cast<size_t>(kMaxLinks)) {
    throw ConfigError(fmt::format("topology.file: {} links, the link ledger holds at most {}",
                                  links.size(), kMaxLinks));
  }
  shm_names::remove_stale_blocks(kNamePrefix);
  shm_block::Mapping block = shm_block::create(name, sizeof(Shared));
  init_block(static_cast<Shared*>(block.get()), links, 0, options);  // zero-filled: set the rest
  return std::shared_ptr<LinkLedger>(new LinkLedger(std::move(block), options));
}

std::shared_ptr<LinkLedger> LinkLedger::open(const std::string& name,
                                             const LedgerOptions& options) {
  shm_block::Mapping block = open_block(name);
  if (!block) {
    errno = ENOENT;
    shm_block::fail("shm_open", name);
  }
  return std::shared_ptr<LinkLedger>(new LinkLedger(std::move(block), options));
}

void LinkLedger::unlink(const std::string& name) { shm_unlink(name.c_str()); }

LinkLedger::LinkLedger(shm_block::Mapping block, const LedgerOptions& options)
    : block_(std::move(block)), s_(static_cast<Shared*>(block_.get())), options_(options) {}

LinkLedger::~LinkLedger() {
  if (user_ >= 0) leave(s_, user_);
}

}  // namespace ferry
