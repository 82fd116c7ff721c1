// The kernels each step of a lowered tape launches, found by running its ops against kernels
// that record instead of launching: what a device profile times per step.
// Invariant: the recorded launches of a step are exactly those the executor makes for it, with
// every operand address replaced by a placeholder (null where the executor passes null).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "device/device.h"
#include "device/kernels.h"
#include "trainer/exec/lower.h"
#include "trainer/model/graph.h"

namespace ferry {

// Per step of `lowered.tape`: the kernel launches it makes, in order. `kernels` answers
// supports() and workspace_bytes() while ops are recorded. The update step records `update`
// (the optimizer's launch, which the executor leaves to the optimizer); the load step records
// none (it is a host-to-device copy).
std::vector<std::vector<KernelArgs>> step_kernels(const Graph& graph, const Lowered& lowered,
                                                  Kernels& kernels,
                                                  const std::optional<KernelArgs>& update);

// The name of the first kernel a bf16 step of `lowered` (StepBinding::dtype) launches that
// `kernels` does not run in bf16 storage (Note [Storage dtype of a kernel] in
// device/kernels.h; a copy moves bytes in any dtype), or empty when they all run.
std::string missing_bf16_kernel(const Graph& graph, const Lowered& lowered, Kernels& kernels);

// Throws ConfigError, one line naming the kernel, `model` and `backend`, when missing_bf16_kernel
// finds one: what `trainer train` says before step 1 and `trainer plan` and `trainer simulate`
// say for a GPU backend (exit 2 from the CLI).
void check_bf16_kernels(const Graph& graph, const Lowered& lowered, Kernels& kernels,
                        std::string_view model, Backend backend);

}  // namespace ferry
