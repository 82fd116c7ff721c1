// The link ledger's shared block layout (private to links/link_ledger*.cc): fixed-size plain
// data behind a robust process-shared mutex and a condition variable on CLOCK_MONOTONIC.
// Invariant: kVersion changes whenever the layout does, so a block of another build is refused.
#pragma once

#include <pthread.h>

#include <cstdint>

#include "links/link_ledger.h"

namespace ferry {
namespace link_ledger_impl {

constexpr const char* kNamePrefix = "ferry-links";
constexpr uint64_t kMagic = 0x6665727279'6c6e6bULL;  // "ferrylnk"
constexpr uint32_t kVersion = 2;                     // 2: held chunks, 256 claims
constexpr int kBins = 1024;

struct FlowSlot {
  int32_t used = 0;
  int32_t done = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  int32_t dir = 0;
  int32_t n_links = 0;
  int32_t links[LinkLedger::kMaxPath] = {};
  int32_t held = 0;  // Note [Held chunks]
  uint64_t id = 0;
  double remaining = 0;  // bytes
  double rate = 0;       // bytes/s
};

struct ClaimSlot {
  int32_t used = 0;
  int32_t granted = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  int32_t dir = 0;
  int32_t n_links = 0;  // arbitrated links: one token each
  int32_t links[LinkLedger::kMaxPath] = {};
  int32_t n_path = 0;  // the links its flow crosses
  int32_t path[LinkLedger::kMaxPath] = {};
  int32_t held = 0;  // Note [Held chunks]
  uint64_t bytes = 0;
  uint64_t flow = 0;  // once granted
  uint64_t id = 0;    // also its arrival order
  double latest_start = 0;
  double heartbeat = 0;
};

struct Token {
  uint64_t flow = 0;  // the granted chunk's flow; 0: free
  int32_t rank = 0;
  int32_t pid = 0;
  double since = 0;
};

struct Bins {
  double total = 0;
  double peak = 0;  // bytes in the fullest retired bin
  int64_t id[kBins];
  double bytes[kBins];
};

struct LinkSlot {
  char name[96];
  LinkCapacity capacity;
};

}  // namespace link_ledger_impl

struct LinkLedger::Shared {
  using LinkSlot = link_ledger_impl::LinkSlot;
  using FlowSlot = link_ledger_impl::FlowSlot;
  using ClaimSlot = link_ledger_impl::ClaimSlot;
  using Token = link_ledger_impl::Token;
  using Bins = link_ledger_impl::Bins;

  uint64_t magic;
  uint32_t version;
  int32_t n_links;
  double bin_s;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  double t_last;
  uint64_t next_id;
  LinkSlot links[kMaxLinks];
  FlowSlot flows[kMaxFlows];
  ClaimSlot claims[kMaxClaims];
  Token tokens[kMaxLinks][2];
  Bins bins[kMaxLinks][2];
};

}  // namespace ferry
