// The one hook through which a host-side arbiter governs a device's host<->device copies, in one
// of two protocols (Note [One hook, two protocols]). Invariant: a device given an arbiter that
// does not speak its protocol refuses it at creation.
#pragma once

#include <string_view>

#include "device/copy_gate.h"
#include "device/copy_pacer.h"

namespace ferry {

// Note [One hook, two protocols]
// Every backend lets one arbiter (DeviceOptions::arbiter) decide when its copies may cross the
// links, but how the arbiter reaches a copy depends on who moves its bytes. A CPU device moves
// them itself on a copy thread, so the arbiter can pace that thread (kPaced: CopyPacer::carry
// runs the moves). A GPU's copy engine moves them on a stream the host enqueued a whole step
// ahead, so the arbiter can only hold the stream at flags it opens chunk by chunk (kGated:
// CopyGate). Either way the arbiter learns of a copy in its protocol's enqueue(), which hands it
// the CopyDeadline (device/copy_deadline.h) that Device::copy_async received with the copy, so a
// copy and its deadline never travel apart. The device says which protocol it speaks
// (backend_traits(backend).arbitration in device/backend_traits.h) and the arbiter is built for
// it, so the layers above never ask which backend they run on. The arbiter is the node's link
// arbitration (links/link_arbiter.h); it offers the protocols it implements.
enum class CopyArbitration {
  kPaced,  // the device's copy threads move bytes through the arbiter's carry() (cpu)
  kGated,  // the device's copy streams hold each chunk until the arbiter opens its gate (cuda)
};

inline std::string_view copy_arbitration_name(CopyArbitration how) {
  return how == CopyArbitration::kPaced ? "paced" : "gated";
}

class CopyArbiter {
 public:
  virtual ~CopyArbiter() = default;
  // The protocol objects this arbiter implements, null for one it does not; each lives as long
  // as the arbiter.
  virtual CopyPacer* pacer() { return nullptr; }
  virtual CopyGate* gate() { return nullptr; }
};

}  // namespace ferry
