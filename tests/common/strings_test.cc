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

// Regression (fuzzing): suggestions for huge names from untrusted files (a 4 MB config key, a
// checkpoint's tensor names) ran the quadratic edit distance in full, billions of steps.
TEST(Nearest, HugeWordsMatchByLastComponentOnly) {
  std::vector<std::string> keys;
  for (int i = 0; i < 200; ++i) keys.push_back("section.key_" + std::to_string(i));
  keys.push_back("optim.lr");
  const std::string huge(4 << 20, 'k');
  EXPECT_EQ(nearest(huge, keys), "");
  EXPECT_EQ(nearest(huge + ".lr", keys), "optim.lr");
  EXPECT_EQ(nearest("optim.lrr", {huge, "optim.lr"}), "optim.lr");
}

TEST(Split, KeepsEmptyParts) {
  EXPECT_EQ(split("a.b..c", '.'), (std::vector<std::string>{"a", "b", "", "c"}));
  EXPECT_EQ(join({"x", "y"}, ", "), "x, y");
}

TEST(Strings, PrintableWritesControlCharactersOut) {
  EXPECT_EQ(printable("runs/a b.yaml"), "runs/a b.yaml");
  EXPECT_EQ(printable("bad\nname\t\r"), "bad\\nname\\t\\r");
  EXPECT_EQ(printable(std::string("a\x01\x7f", 3)), "a\\x01\\x7f");
  EXPECT_EQ(printable("caf\xc3\xa9"), "caf\xc3\xa9") << "UTF-8 passes";
}

}  // namespace
}  // namespace ferry
