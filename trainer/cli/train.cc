// `trainer train` and `trainer eval`.
#include <cstdio>

#include "common/file_write.h"
#include "trainer/cli/commands.h"
#include "trainer/config/config.h"
#include "trainer/session/train.h"

namespace ferry {

int run_train(const TrainArgs& args, const RankInfo& ranks) {
  train(load_config(args.config, args.overrides), ranks);
  return 0;
}

int run_config(const TrainArgs& args, bool reference) {
  if (reference) {
    std::printf("%s", config_reference_markdown().c_str());
    check_stdout();
    return 0;
  }
  if (args.config.empty()) throw ConfigError("trainer config needs a CONFIG file (or --reference)");
  std::printf("%s", to_yaml(load_config(args.config, args.overrides)).c_str());
  check_stdout();
  return 0;
}

int run_eval(const TrainArgs& args) {
  evaluate(load_config(args.config, args.overrides));
  return 0;
}

}  // namespace ferry
