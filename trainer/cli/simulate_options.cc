// Parsing `trainer simulate`'s flags into SimulateOptions, once for both scenarios.
#include "trainer/cli/simulate_options.h"

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {

namespace {

// A mix runs every job on one GPU of the topology, one input shape each.
void check_mix_flags(const SimulateArgs& args) {
  const auto only_one = [](const char* flag) {
    return ConfigError(fmt::format("{}: not with --mix", flag),
                       "a mix runs every job on one GPU of the topology, one input shape each; "
                       "give the job's settings in its config or the mix file's set: list");
  };
  if (!args.config.empty() || !args.overrides.empty())
    throw ConfigError("--mix: give a CONFIG or --mix FILE, not both",
                      "put each job's config and overrides in the mix file");
  if (args.gpus > 0) throw only_one("--gpus");
  if (args.nodes > 1) throw only_one("--nodes");
  if (!args.emulated.empty()) throw only_one("--emulated");
  if (!args.shapes.empty()) throw only_one("--shapes");
  if (!args.trace.empty()) throw only_one("--trace");
}

}  // namespace

SimulateOptions parse_simulate_options(const SimulateArgs& args) {
  if (!args.mix.empty()) check_mix_flags(args);
  SimulateOptions o;
  o.topology_file = args.topology;
  o.hardware = args.hardware;
  o.scheduler = args.scheduler;
  // The command line checked --chunk-mb's range; 0 = not given.
  if (args.chunk_mb > 0) o.chunk_bytes = static_cast<uint64_t>(args.chunk_mb * 1048576.0);
  if (!args.planning.empty()) {
    if (args.planning != "aware" && args.planning != "oblivious")
      throw ConfigError(
          fmt::format("--planning: must be aware or oblivious, got '{}'", args.planning),
          "aware plans against each GPU's share of its links");
    o.contention_aware = args.planning == "aware";
  }
  o.gpus = args.gpus;
  o.nodes = args.nodes;
  o.trace = !args.trace.empty();
  o.emulated_run = args.emulated;
  o.shapes = args.shapes;
  return o;
}

}  // namespace ferry
