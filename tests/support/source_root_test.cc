// source_root (issue 16, defect 2): a test binary moved to another root (the GPU bundle unpacks
// build/tests/NAME into the tree on the GPU machine) finds the tree's files from where it runs,
// not through the build machine's path.
#include "tests/support/source_root.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "tests/support/temp_dir.h"

namespace ferry::test {
namespace {

namespace fs = std::filesystem;

// A scratch tree: ROOT/configs/{quickstart.yaml,topologies/dgx1-like.yaml} and ROOT/build/tests/,
// removed after.
class ScratchTree : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(root_ / "configs" / "topologies");
    fs::create_directories(root_ / "build" / "tests");
    std::ofstream(root_ / "configs" / "topologies" / "dgx1-like.yaml") << "gpus: 8\n";
    std::ofstream(root_ / "configs" / "quickstart.yaml") << "run: {}\n";  // the default marker
  }
  const ferry::testing::TempDir dir_;
  const fs::path root_ = dir_.path();
};

const fs::path kMarker = fs::path("configs") / "topologies" / "dgx1-like.yaml";

TEST_F(ScratchTree, ABinaryUnderBuildTestsFindsTheTreeAboveIt) {
  const auto found = find_tree_root({root_ / "build" / "tests"}, kMarker);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(fs::weakly_canonical(*found), fs::weakly_canonical(root_));
}

TEST_F(ScratchTree, TheNearestTreeWinsAndLaterStartsAreFallbacks) {
  // A tree inside the tree (a bundle unpacked under another checkout): the nearer one.
  const fs::path inner = root_ / "build" / "inner";
  fs::create_directories(inner / "configs" / "topologies");
  std::ofstream(inner / kMarker) << "gpus: 4\n";
  fs::create_directories(inner / "build" / "tests");
  EXPECT_EQ(fs::weakly_canonical(*find_tree_root({inner / "build" / "tests"}, kMarker)),
            fs::weakly_canonical(inner));
  // A start with no tree above it falls through to the next start.
  EXPECT_EQ(fs::weakly_canonical(*find_tree_root({"/proc/self", root_ / "build"}, kMarker)),
            fs::weakly_canonical(root_));
}

TEST_F(ScratchTree, NoTreeIsNullopt) {
  EXPECT_FALSE(find_tree_root({root_ / "build"}, "no/such/marker.yaml").has_value());
  EXPECT_FALSE(find_tree_root({}, kMarker).has_value());
}

TEST_F(ScratchTree, TheEnvironmentNamesTheTree) {
  ASSERT_EQ(::setenv("FERRY_SOURCE_ROOT", root_.c_str(), 1), 0);
  EXPECT_EQ(source_root(kMarker), root_);
  EXPECT_EQ(source_file(kMarker), (root_ / kMarker).string());
  ASSERT_EQ(::setenv("FERRY_SOURCE_ROOT", (root_ / "build").c_str(), 1), 0);
  EXPECT_THROW(source_root(kMarker), std::runtime_error);  // names a tree without the file
  ASSERT_EQ(::unsetenv("FERRY_SOURCE_ROOT"), 0);
}

// This binary, in build/tests of the checkout, finds that checkout's files at run time.
TEST(SourceRoot, ThisTestFindsItsOwnTreesFiles) {
  ::unsetenv("FERRY_SOURCE_ROOT");
  EXPECT_TRUE(fs::exists(source_file(kMarker)));
  EXPECT_THROW(source_file("configs/no-such-file.yaml"), std::runtime_error);
}

}  // namespace
}  // namespace ferry::test
