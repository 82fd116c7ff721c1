// `trainer simulate`'s command line parsed once into the simulator's options, for a config and for
// a mix alike (simulate.cc and simulate_mix.cc read only what this returns).
#pragma once

#include "trainer/cli/commands.h"
#include "trainer/simulate/simulation.h"

namespace ferry {

// The options `args` ask for. ConfigError (exit 2) for --planning other than aware|oblivious, and
// with --mix for a flag a mix does not take (--gpus, --nodes, --emulated, --shapes, --trace, a
// CONFIG or overrides). chunk_bytes 0 when --chunk-mb is not given (topology.chunk_mb).
SimulateOptions parse_simulate_options(const SimulateArgs& args);

}  // namespace ferry
