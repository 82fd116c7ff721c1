// The link schedulers the transfer engine asks around each copy: `topology` schedules every copy
// with its planned seconds, even one without a known time.
#include "prefetch/link_scheduler.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(DeadlineLinkScheduler, SchedulesEveryCopyWithItsPlannedSeconds) {
  DeadlineLinkScheduler topology;
  EXPECT_EQ(topology.name(), "topology");
  const CopyDeadline d =
      topology.deadline(TransferRequest{TransferDirection::kToDevice, "conv1", 4096, 7, 0.125});
  EXPECT_TRUE(d.scheduled);
  EXPECT_DOUBLE_EQ(d.deadline_s, 0.125);
  // A request without a known time is still scheduled: its chunks go as soon as they may.
  EXPECT_TRUE(topology.deadline(TransferRequest{}).scheduled);
}

}  // namespace
}  // namespace ferry
