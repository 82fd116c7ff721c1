// Producer/use/death analysis over the tape.
#include "prefetch/liveness.h"

#include <algorithm>

#include "common/error.h"

namespace ferry {

Liveness analyse_liveness(const Tape& tape) {
  Liveness live;
  live.tensors.resize(tape.tensors.size());
  for (int s = 0; s < static_cast<int>(tape.steps.size()); ++s) {
    const TapeStep& step = tape.steps[s];
    if (step.phase == StepPhase::kForward || step.phase == StepPhase::kLoad) live.forward_end = s;
    for (int t : step.reads) {
      TensorLiveness& tl = live.tensors[t];
      FERRY_ASSERT(tl.produced >= 0 && tl.produced <= s,
                   "tape reads " + tape.tensors[t].name + " before it is written");
      if (tl.uses.empty() || tl.uses.back() != s) tl.uses.push_back(s);
      tl.last_use = std::max(tl.last_use, s);
    }
    for (int t : step.writes) {
      TensorLiveness& tl = live.tensors[t];
      if (tl.produced < 0) tl.produced = s;
      tl.last_use = std::max(tl.last_use, s);
    }
  }
  for (TensorLiveness& tl : live.tensors) {
    for (int u : tl.uses) {
      if (u <= live.forward_end) {
        tl.last_forward_use = u;
      } else if (tl.first_backward_use < 0) {
        tl.first_backward_use = u;
      }
    }
    if (tl.last_forward_use < 0 && tl.produced >= 0 && tl.produced <= live.forward_end) {
      tl.last_forward_use = tl.produced;
    }
  }
  return live;
}

}  // namespace ferry
