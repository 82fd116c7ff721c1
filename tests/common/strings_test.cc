// Edit distance and nearest-candidate suggestions used in config errors.
#include "common/strings.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(EditDistance, CountsInsertionsDeletionsSubstitutions) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("optim.lr", "optim.l"), 1u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
}

TEST(Nearest, SuggestsCloseKeysOnly) {
  const std::vector<std::string> keys = {"optim.lr", "optim.momentum", "data.batch_size"};
  EXPECT_EQ(nearest("optim.lrr", keys), "optim.lr");
  EXPECT_EQ(nearest("data.batchsize", keys), "data.batch_size");
  EXPECT_EQ(nearest("model.lr", keys), "optim.lr");  // same leaf
  EXPECT_EQ(nearest("zzzzzzzzzzzz", keys), "");
}

TEST(Split, KeepsEmptyParts) {
  EXPECT_EQ(split("a.b..c", '.'), (std::vector<std::string>{"a", "b", "", "c"}));
  EXPECT_EQ(join({"x", "y"}, ", "), "x, y");
}

}  // namespace
}  // namespace ferry
