// What the tests that run under mpirun share: the RankInfo that main discovered.
#pragma once

#include "comm/ranks.h"

namespace ferry::mpitest {

const RankInfo& test_ranks();

}  // namespace ferry::mpitest
