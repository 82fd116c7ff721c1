// CIFAR-10 binary batches written by the test: CHW values, the folder rule, and truncated or
// malformed files as DataErrors.
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/trainer/data/test_files.h"
#include "trainer/data/dataset.h"

namespace ferry {
namespace {

using testing::error_of;
using testing::TempDir;
using testing::write_bytes;

constexpr size_t kRecord = 3073;

// Records with the given labels; pixel byte k of record r is (r * 7 + k) % 251 + label.
std::vector<uint8_t> cifar_records(const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> b;
  for (size_t r = 0; r < labels.size(); ++r) {
    b.push_back(labels[r]);
    for (size_t k = 0; k < 3072; ++k)
      b.push_back(static_cast<uint8_t>((r * 7 + k) % 251 + labels[r]));
  }
  return b;
}

std::vector<int32_t> all_labels(const Dataset& ds) {
  std::vector<float> pixels(3072);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < ds.size(); ++i) out.push_back(ds.get(i, pixels.data()));
  return out;
}

TEST(Cifar10Dataset, OneFileValuesInChwOrder) {
  TempDir dir;
  write_bytes(dir.file("data_batch_1.bin"), cifar_records({3, 9, 0}));
  auto ds = load_cifar10_dataset(dir.file("data_batch_1.bin"));
  EXPECT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->image_shape(), (Shape{3, 32, 32}));
  EXPECT_EQ(ds->classes(), 10);
  std::vector<float> pixels(3072);
  EXPECT_EQ(ds->get(1, pixels.data()), 9);
  // Channel G (plane 1), row 5, column 7: byte 1 + 1024 + 5 * 32 + 7 of the record.
  const size_t k = 1024 + 5 * 32 + 7;
  EXPECT_FLOAT_EQ(pixels[k], static_cast<float>((1 * 7 + k) % 251 + 9) / 255.0f);
  EXPECT_FLOAT_EQ(pixels[3071], static_cast<float>((7 + 3071) % 251 + 9) / 255.0f);
}

TEST(Cifar10Dataset, FolderTakesDataBatchesInNumericOrder) {
  TempDir dir;
  write_bytes(dir.file("data_batch_10.bin"), cifar_records({5}));
  write_bytes(dir.file("data_batch_2.bin"), cifar_records({2, 2}));
  write_bytes(dir.file("data_batch_1.bin"), cifar_records({1}));
  write_bytes(dir.file("test_batch.bin"), cifar_records({8, 8, 8}));  // ignored
  write_bytes(dir.file("batches.meta.txt"), {'a', '\n'});             // ignored
  auto ds = load_cifar10_dataset(dir.path().string());
  EXPECT_EQ(all_labels(*ds), (std::vector<int32_t>{1, 2, 2, 5}));
  EXPECT_NE(ds->describe().find("3 files"), std::string::npos) << ds->describe();
}

TEST(Cifar10Dataset, FolderWithOnlyTheTestBatch) {
  TempDir dir;
  write_bytes(dir.file("test_batch.bin"), cifar_records({8, 6}));
  EXPECT_EQ(all_labels(*load_cifar10_dataset(dir.path().string())), (std::vector<int32_t>{8, 6}));
}

TEST(Cifar10Dataset, ParentOfTheUnpackedArchive) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "cifar-10-batches-bin");
  write_bytes(dir.file("cifar-10-batches-bin/data_batch_1.bin"), cifar_records({4}));
  EXPECT_EQ(all_labels(*load_cifar10_dataset(dir.path().string())), (std::vector<int32_t>{4}));
}

TEST(Cifar10Dataset, EmptyFolderMissingAndEmptyFile) {
  TempDir dir;
  std::string e = error_of<DataError>([&] { load_cifar10_dataset(dir.path().string()); });
  EXPECT_NE(e.find("no data_batch_<n>.bin and no test_batch.bin"), std::string::npos) << e;
  e = error_of<DataError>([&] { load_cifar10_dataset(dir.file("missing.bin")); });
  EXPECT_NE(e.find("cannot open CIFAR-10 batch file"), std::string::npos) << e;
  write_bytes(dir.file("empty.bin"), {});
  e = error_of<DataError>([&] { load_cifar10_dataset(dir.file("empty.bin")); });
  EXPECT_NE(e.find("is empty"), std::string::npos) << e;
}

// Regression (fuzzing): a folder named like a batch file was read as a 2^63-byte file.
TEST(Cifar10Dataset, BatchFileThatIsAFolder) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "data_batch_1.bin");
  const std::string e = error_of<DataError>([&] { load_cifar10_dataset(dir.path().string()); });
  EXPECT_NE(e.find("data_batch_1.bin' is not a regular file"), std::string::npos) << e;
}

TEST(Cifar10Dataset, TruncatedFile) {
  TempDir dir;
  std::vector<uint8_t> b = cifar_records({1, 2});
  b.resize(2 * kRecord - 5);
  write_bytes(dir.file("data_batch_1.bin"), b);
  const std::string e = error_of<DataError>([&] { load_cifar10_dataset(dir.path().string()); });
  EXPECT_NE(e.find("6141 bytes, not a whole number of 3073-byte records"), std::string::npos) << e;
  EXPECT_NE(e.find("data_batch_1.bin"), std::string::npos) << e;
}

TEST(Cifar10Dataset, LabelAboveNine) {
  TempDir dir;
  std::vector<uint8_t> b = cifar_records({1, 2, 3});
  b[2 * kRecord] = 10;
  write_bytes(dir.file("data_batch_1.bin"), b);
  const std::string e =
      error_of<DataError>([&] { load_cifar10_dataset(dir.file("data_batch_1.bin")); });
  EXPECT_NE(e.find("record 2 has label 10"), std::string::npos) << e;
}

}  // namespace
}  // namespace ferry
