// `trainer train` and `trainer eval`.
#include "trainer/cli/commands.h"
#include "trainer/config/config.h"
#include "trainer/session/train.h"

namespace ferry {

int run_train(const TrainArgs& args, const RankInfo& ranks) {
  train(load_config(args.config, args.overrides), ranks);
  return 0;
}

int run_eval(const TrainArgs& args) {
  evaluate(load_config(args.config, args.overrides));
  return 0;
}

}  // namespace ferry
