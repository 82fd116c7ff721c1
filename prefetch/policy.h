// The memory policies the planner knows (memory.policy).
#pragma once

#include <string_view>

namespace ferry {

enum class MemoryPolicy { kNone, kVdnnConv, kVdnnAll, kAuto };
std::string_view policy_name(MemoryPolicy p);

}  // namespace ferry
