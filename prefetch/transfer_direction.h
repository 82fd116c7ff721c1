// The direction of a host<->device copy, shared by the link scheduler, the link-share model and
// the arbiter policy. Kept alone so pure modules need not include the Stream interface.
#pragma once

namespace ferry {

enum class TransferDirection { kToHost, kToDevice };

}  // namespace ferry
