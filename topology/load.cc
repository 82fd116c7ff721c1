// Dispatch of a topology spec to the hwloc or YAML loader by its file extension.
#include "topology/load.h"

#include <fmt/format.h>

#include "common/error.h"
#include "topology/hwloc_topology.h"
#include "topology/synthetic.h"

namespace ferry {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Topology load_topology(const std::string& spec) {
  if (spec.empty() || spec == "live") return discover_live();
  if (ends_with(spec, ".xml")) return load_xml(spec);
  if (ends_with(spec, ".yaml") || ends_with(spec, ".yml")) return load_yaml(spec);
  throw ConfigError(fmt::format("topology '{}' is neither 'live', an .xml nor a .yaml file", spec),
                    "name an hwloc XML export (.xml), a description (.yaml), or 'live'");
}

}  // namespace ferry
