// Choosing a rank's link arbiter by the protocol its device speaks.
#include "links/link_arbiter.h"

#include "common/error.h"
#include "links/link_emulator.h"
#include "links/link_gatekeeper.h"

namespace ferry {

std::shared_ptr<LinkArbiter> make_link_arbiter(CopyArbitration how,
                                               const LinkArbiterOptions& options) {
  switch (how) {
    case CopyArbitration::kPaced: {
      if (!options.emulate) return nullptr;
      // The rank's copies cross its GPU's path, shared with the node's other ranks through the
      // ledger (attached once the communicator exists); link time is stretched by the scale.
      LinkEmulationOptions e;
      static_cast<LinkPathOptions&>(e) = options;
      e.link_gbps = options.link_gbps;
      e.arbitrate = options.arbitrate;
      return std::make_shared<LinkEmulator>(e);
    }
    case CopyArbitration::kGated: {
      if (!options.arbitrate) return nullptr;
      // A GPU rank's real copies cross its GPU's real path: chunks are held on the copy streams
      // until the node's ledger grants them, at the links' own capacities (Note [Gating a GPU
      // copy stream] in links/link_gatekeeper.h).
      if (options.path.empty() || options.link_gbps <= 0) {
        throw ConfigError(
            "topology.scheduler: topology needs this rank's GPU and its PCIe path to host "
            "memory, which the topology (" +
                options.topology_source + ") does not show",
            "set topology.file to the server's description, or use topology.scheduler=fifo");
      }
      LinkGateOptions g;
      static_cast<LinkPathOptions&>(g) = options;
      g.link_gbps = options.link_gbps;
      return std::make_shared<LinkGatekeeper>(g);
    }
  }
  return nullptr;
}

}  // namespace ferry
