// One entry point for every topology source, so callers (trainer, emulation, topo-probe) name a
// topology by a string and always get the same Topology type back.
#pragma once

#include <string>

#include "topology/model.h"

namespace ferry {

// "live" (or "") discovers this machine; a path ending in .xml loads hwloc XML; .yaml/.yml loads
// a synthetic description or a model dump. Throws ConfigError for any other spelling, and the
// loaders' DataError/ConfigError for bad files.
Topology load_topology(const std::string& spec);

}  // namespace ferry
