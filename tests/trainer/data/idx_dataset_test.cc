// MNIST IDX files written by the test: values, label-file derivation, and every malformed
// variant reported as a DataError naming the file and the problem.
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/trainer/data/test_files.h"
#include "trainer/data/dataset.h"

namespace ferry {
namespace {

using testing::append_be32;
using testing::error_of;
using testing::TempDir;
using testing::write_bytes;

// IDX images: n images of h x w, pixel (i, k) = (i * 37 + k * 11) % 256.
std::vector<uint8_t> idx_images(uint32_t n, uint32_t h, uint32_t w) {
  std::vector<uint8_t> b;
  append_be32(b, 0x00000803);
  append_be32(b, n);
  append_be32(b, h);
  append_be32(b, w);
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t k = 0; k < h * w; ++k) b.push_back(static_cast<uint8_t>((i * 37 + k * 11) % 256));
  }
  return b;
}

std::vector<uint8_t> idx_labels(const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> b;
  append_be32(b, 0x00000801);
  append_be32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    images_ = dir_.file("train-images-idx3-ubyte");
    labels_ = dir_.file("train-labels-idx1-ubyte");
    write_bytes(images_, idx_images(3, 2, 4));
    write_bytes(labels_, idx_labels({7, 0, 9}));
  }
  // The DataError message of loading the current files.
  std::string load_error(int64_t classes = 10) {
    return error_of<DataError>([&] { load_idx_dataset(images_, "", classes); });
  }

  TempDir dir_;
  std::string images_, labels_;
};

TEST_F(IdxTest, ReadsPixelsAndLabels) {
  auto ds = load_idx_dataset(images_);  // labels path derived
  EXPECT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->image_shape(), (Shape{1, 2, 4}));
  EXPECT_EQ(ds->classes(), 10);
  std::vector<float> pixels(8);
  EXPECT_EQ(ds->get(2, pixels.data()), 9);
  for (uint32_t k = 0; k < 8; ++k) {
    EXPECT_FLOAT_EQ(pixels[k], static_cast<float>((2 * 37 + k * 11) % 256) / 255.0f) << k;
  }
  EXPECT_EQ(ds->get(0, pixels.data()), 7);
  EXPECT_EQ(pixels[0], 0.0f);
  EXPECT_NE(ds->describe().find("train-labels-idx1-ubyte"), std::string::npos);
}

TEST_F(IdxTest, DerivesTestSetLabelsAndDotNames) {
  write_bytes(dir_.file("t10k-images.idx3-ubyte"), idx_images(2, 3, 3));
  write_bytes(dir_.file("t10k-labels.idx1-ubyte"), idx_labels({4, 5}));
  auto ds = load_idx_dataset(dir_.file("t10k-images.idx3-ubyte"));
  EXPECT_EQ(ds->size(), 2);
  std::vector<float> pixels(9);
  EXPECT_EQ(ds->get(1, pixels.data()), 5);
}

TEST_F(IdxTest, ExplicitLabelsAndDerivedClassCount) {
  write_bytes(dir_.file("other"), idx_labels({1, 20, 3}));
  auto ds = load_idx_dataset(images_, dir_.file("other"), /*classes=*/0);
  EXPECT_EQ(ds->classes(), 21);
  std::vector<float> pixels(8);
  EXPECT_EQ(ds->get(1, pixels.data()), 20);
}

TEST_F(IdxTest, MissingFiles) {
  std::filesystem::remove(labels_);
  std::string e = load_error();
  EXPECT_NE(e.find("cannot open IDX labels file"), std::string::npos) << e;
  EXPECT_NE(e.find("train-labels-idx1-ubyte"), std::string::npos) << e;
  e = error_of<DataError>([&] { load_idx_dataset(dir_.file("nope-images-idx3-ubyte")); });
  EXPECT_NE(e.find("cannot open IDX images file"), std::string::npos) << e;
  e = error_of<DataError>([&] { load_idx_dataset(dir_.file("mnist.bin")); });
  EXPECT_NE(e.find("does not contain 'images'"), std::string::npos) << e;
}

// Regression (fuzzing): a directory opens as a stream whose size reads as 2^63 - 1, and the
// reader tried to allocate that (std::bad_alloc instead of a DataError).
TEST_F(IdxTest, DirectoryInsteadOfAFile) {
  std::string e = error_of<DataError>([&] { load_idx_dataset(dir_.path().string(), labels_); });
  EXPECT_NE(e.find("IDX images file"), std::string::npos) << e;
  EXPECT_NE(e.find("is not a regular file"), std::string::npos) << e;
  e = error_of<DataError>([&] { load_idx_dataset(images_, dir_.path().string()); });
  EXPECT_NE(e.find("IDX labels file"), std::string::npos) << e;
  EXPECT_NE(e.find("is not a regular file"), std::string::npos) << e;
}

TEST_F(IdxTest, ShortHeader) {
  std::vector<uint8_t> b = idx_images(3, 2, 4);
  b.resize(10);
  write_bytes(images_, b);
  const std::string e = load_error();
  EXPECT_NE(e.find("too short for the 16-byte header"), std::string::npos) << e;
  EXPECT_NE(e.find(images_), std::string::npos) << e;
}

TEST_F(IdxTest, WrongMagic) {
  write_bytes(images_, idx_labels(std::vector<uint8_t>(20, 1)));  // labels where images belong
  const std::string e = load_error();
  EXPECT_NE(e.find("magic number 0x00000801 (this is a labels file)"), std::string::npos) << e;
}

TEST_F(IdxTest, GzipCompressed) {
  write_bytes(images_, {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_NE(load_error().find("gzip"), std::string::npos);
}

TEST_F(IdxTest, TruncatedAndTrailingPixels) {
  std::vector<uint8_t> b = idx_images(3, 2, 4);
  b.pop_back();
  write_bytes(images_, b);
  std::string e = load_error();
  EXPECT_NE(e.find("holds 23 pixel bytes (truncated)"), std::string::npos) << e;
  b = idx_images(3, 2, 4);
  b.push_back(0);
  write_bytes(images_, b);
  e = load_error();
  EXPECT_NE(e.find("trailing bytes"), std::string::npos) << e;
}

TEST_F(IdxTest, HugeHeaderOnSmallFileIsNoAllocation) {
  std::vector<uint8_t> b;
  append_be32(b, 0x00000803);
  append_be32(b, 0xffffffffu);
  append_be32(b, 0xffffffffu);
  append_be32(b, 0xffffffffu);
  b.resize(64, 1);
  write_bytes(images_, b);
  const std::string e = load_error();
  EXPECT_NE(e.find("4294967295 images of 4294967295 x 4294967295"), std::string::npos) << e;
}

TEST_F(IdxTest, EmptyDimension) {
  write_bytes(images_, idx_images(0, 2, 4));
  EXPECT_NE(load_error().find("empty dimension"), std::string::npos);
}

TEST_F(IdxTest, LabelCountDisagrees) {
  write_bytes(labels_, idx_labels({1, 2}));
  std::string e = load_error();
  EXPECT_NE(e.find("has 2 labels but images file"), std::string::npos) << e;
  // A labels header claiming more labels than the file holds.
  std::vector<uint8_t> b = idx_labels({1, 2, 3});
  b.pop_back();
  write_bytes(labels_, b);
  e = load_error();
  EXPECT_NE(e.find("header says 3 labels but the file holds 2 (truncated)"), std::string::npos)
      << e;
}

TEST_F(IdxTest, LabelOutOfRange) {
  write_bytes(labels_, idx_labels({1, 10, 3}));
  const std::string e = load_error(10);
  EXPECT_NE(e.find("label 10 of sample 1 is not below the 10 classes"), std::string::npos) << e;
  EXPECT_NE(e.find(labels_), std::string::npos) << e;
}

}  // namespace
}  // namespace ferry
