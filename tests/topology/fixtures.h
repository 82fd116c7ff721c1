// Shared fixtures for the topology tests: where the real hwloc XML files and the synthetic
// descriptions are, and a per-binary cache so each file is loaded once.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "topology/model.h"

namespace ferry::testing {

// FERRY_SOURCE_DIR/../shared/topologies/real
std::string real_dir();
bool have_real_dir();
// FERRY_SOURCE_DIR/configs/topologies/NAME
std::string config_path(const std::string& name);

// The real XML file NAME, loaded once per test binary.
const Topology& real(const std::string& name);
// The synthetic description NAME, loaded once per test binary.
const Topology& synthetic(const std::string& name);

std::string read_text(const std::string& path);

}  // namespace ferry::testing

#define FERRY_REQUIRE_REAL_TOPOLOGIES()                                                         \
  do {                                                                                          \
    if (!::ferry::testing::have_real_dir()) {                                                   \
      GTEST_SKIP() << "real hwloc XML topologies not found at " << ::ferry::testing::real_dir() \
                   << " (the ../shared folder beside the repository)";                          \
    }                                                                                           \
  } while (0)
