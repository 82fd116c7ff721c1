// When a host<->device copy is due, handed to the device together with the copy so that its copy
// arbiter can order the copy's chunks on the links (Note [A copy's deadline]). Invariant: a copy
// without a schedule (an input, a parameter, a metric) is moved whole and never waits for a grant.
#pragma once

#include <cstdint>

// Note [A copy's deadline]
// The copy arbiter is device/copy_arbiter.h's. Note [Life of an offloaded activation] in
// trainer/exec/executor.h, steps 5-6, follows a deadline from the link scheduler to the links.

namespace ferry {

// What a copy carries, so the node's link ledger can label its claims and flows (`trainer jobs`);
// with the direction it names the copy: an activation's offload or prefetch, the host
// optimizer's gradients down or weights up. kOther: an input, a parameter, a metric.
enum class CopyKind : int32_t { kOther = 0, kActivation = 1, kOptimizer = 2 };

struct CopyDeadline {
  // The link scheduler arbitrates this copy (an offload or prefetch under the topology
  // scheduler): with an arbitrating arbiter its chunks wait for the node ledger's grants.
  bool scheduled = false;
  // Planned seconds from the copy's start (when its stream reaches it) to its deadline
  // (TransferRequest::deadline_s; 0: none known).
  double deadline_s = 0;
  // What the copy carries (set by the transfer engine from its request's purpose).
  CopyKind kind = CopyKind::kOther;
};

}  // namespace ferry
