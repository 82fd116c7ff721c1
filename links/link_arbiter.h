// A rank's link arbiter: the device's copy arbiter (device/copy_arbiter.h) that takes the node's
// link ledger and arbitrates copies with a scheduled deadline (Note [Two kinds of link arbiter]).
// Invariant: an arbiter built here speaks the protocol it was asked for.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/copy_arbiter.h"
#include "links/link_ledger.h"

// Note [Two kinds of link arbiter]
// The copies arbitrated are those that arrive with a scheduled deadline (device/copy_deadline.h).
// The CPU link emulator (paced) and the GPU link gatekeeper (gated) are the arbiter's two kinds;
// make_link_arbiter picks the one the device's protocol needs.

namespace ferry {

// A rank's copy path through the node's link ledger, as its link arbiter sees it.
struct LinkPathOptions {
  int rank = 0;           // for the ledger's records and error messages
  std::vector<int> path;  // the ledger's link ids this rank's copies cross (GPU side first)
  // The links of `path` whose tokens a chunk takes: those one chunk can fill (capacity at most
  // the path's bottleneck). A wider link (a root complex summing its ports) is shared by the
  // fluid model alone, so arbitration never leaves it idle. Empty: the whole path.
  std::vector<int> arbitrated;
  uint64_t chunk_bytes = 4ull << 20;  // topology.chunk_mb
};

class LinkArbiter : public CopyArbiter {
 public:
  // Attaches the node's ledger; copies before this are neither shared nor arbitrated.
  virtual void attach(std::shared_ptr<LinkLedger> ledger) = 0;
  virtual std::shared_ptr<LinkLedger> ledger() const = 0;
  // Whether the ledger's links are the emulated ones (stretched by topology.emulation_scale)
  // rather than the GPU's real links.
  virtual bool emulates_links() const = 0;
};

struct LinkArbiterOptions : LinkPathOptions {
  // The rank's link rate: the path's bottleneck as its copies see it, GB/s (emulated: already
  // divided by the emulation's scale).
  double link_gbps = 0;
  bool emulate = false;    // the rank's copies stand in for a described server's GPU (paced)
  bool arbitrate = false;  // topology scheduler: chunks wait for the ledger's grants
  // Where the rank's topology came from, for messages ("live machine", a file).
  std::string topology_source;
};

// The arbiter a device of protocol `how` needs: the link emulator for paced copies that emulate
// a described server's link (arbitrated or not), the link gatekeeper for gated copies under
// arbitration; null when there is nothing to arbitrate. Throws ConfigError when gated copies are
// to be arbitrated but the rank's path is unknown.
std::shared_ptr<LinkArbiter> make_link_arbiter(CopyArbitration how,
                                               const LinkArbiterOptions& options);

}  // namespace ferry
