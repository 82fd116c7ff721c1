// Shared-link emulation for CPU ranks standing in for a described server's GPUs, as a paced
// LinkArbiter (Note [Paced copies through the link ledger]). Invariant: every byte goes through
// the caller's move() exactly once; tokens taken are released even when moving throws.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "device/copy_pacer.h"
#include "links/link_arbiter.h"
#include "links/link_ledger.h"
#include "prefetch/transfer_direction.h"

// Note [Paced copies through the link ledger]
// The arbiter's CopyPacer runs every copy of this rank through the node's link ledger, so its
// time follows its fair share of each link on its path given every concurrent copy on the node.
// With arbitration on (the `topology` scheduler), copies enqueued with a scheduled deadline move
// in chunks, each waiting for its turn on every link-direction of the path (least deadline slack
// first).

namespace ferry {

struct LinkEmulationOptions : LinkPathOptions {
  double link_gbps = 0;    // the path's emulated bottleneck: pacing before a ledger is attached
  bool arbitrate = false;  // topology scheduler: chunks wait for link-direction tokens
};

class LinkEmulator : public LinkArbiter, public CopyPacer {
 public:
  explicit LinkEmulator(LinkEmulationOptions options);

  // Attaches the node's ledger; copies carried before this run alone at link_gbps.
  void attach(std::shared_ptr<LinkLedger> ledger) override;
  std::shared_ptr<LinkLedger> ledger() const override;
  bool emulates_links() const override { return true; }
  CopyPacer* pacer() override { return this; }
  const LinkEmulationOptions& options() const { return options_; }

  // A copy whose `deadline` is scheduled (the link scheduler's offloads and prefetches) is
  // carried in arbitrated chunks when arbitration is on; any other (inputs, parameters) whole.
  uint64_t enqueue(bool to_device, uint64_t bytes, const CopyDeadline& deadline) override;
  void carry(uint64_t ticket, const std::function<void(uint64_t, uint64_t)>& move) override;

 private:
  struct Ticket {
    TransferDirection direction = TransferDirection::kToHost;
    uint64_t bytes = 0;
    CopyDeadline deadline;  // scheduled: arbitrated in chunks
  };
  LinkEmulationOptions options_;
  mutable std::mutex mu_;
  std::shared_ptr<LinkLedger> ledger_;
  std::map<uint64_t, Ticket> tickets_;
  uint64_t next_ticket_ = 1;
};

}  // namespace ferry
