// A deterministic fuzz driver for the dataset file readers (MNIST IDX images and labels,
// CIFAR-10 batches, llm.c (uint16 and uint32) and nanoGPT token files): mutated files (boundary
// integers in the IDX dimensions, truncation, bit flips, inserted and deleted bytes) must each load
// a consistent dataset or fail with a DataError, never crash or allocate from a header's claim. Run
// under ASan and UBSan by the fuzz_asan test.
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/fuzz_mutator.h"
#include "tests/trainer/data/test_files.h"
#include "trainer/data/dataset.h"

namespace ferry {
namespace {

using fuzz::Rng;
using fuzz::Tally;
using testing::TempDir;

std::string be32(uint32_t v) {
  std::string s(4, '\0');
  fuzz::put_integer(s, 0, 4, v, true);
  return s;
}

std::string idx_images(uint32_t n, uint32_t h, uint32_t w) {
  std::string b = be32(0x803) + be32(n) + be32(h) + be32(w);
  for (uint32_t i = 0; i < n * h * w; ++i) b += static_cast<char>(i * 37 + 11);
  return b;
}

std::string idx_labels(uint32_t n) {
  std::string b = be32(0x801) + be32(n);
  for (uint32_t i = 0; i < n; ++i) b += static_cast<char>(i * 7 % 10);
  return b;
}

std::string cifar_batch(int records) {
  std::string b;
  for (int r = 0; r < records; ++r) {
    b += static_cast<char>(r % 10);
    for (int i = 0; i < 3072; ++i) b += static_cast<char>(r * 13 + i);
  }
  return b;
}

// Removes the old file first: truncating one in place makes ext4 flush it to disk (its
// auto_da_alloc heuristic), which would make this test I/O-bound.
void write(const std::string& path, const std::string& bytes) {
  std::filesystem::remove(path);
  testing::write_bytes(path, std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

// Everything a consumer does with a dataset: describe it and read its first and last samples.
void exercise(const Dataset& ds, uint64_t file_bytes) {
  ASSERT_GT(ds.size(), 0);
  const Shape shape = ds.image_shape();
  ASSERT_EQ(shape.rank(), 3u);
  ASSERT_GT(shape.numel(), 0);
  // Every pixel came from the files: the shape cannot claim more than they hold.
  ASSERT_LE(static_cast<uint64_t>(shape.numel()), file_bytes);
  (void)ds.describe();
  std::vector<float> pixels(static_cast<size_t>(shape.numel()));
  for (int64_t i : {int64_t{0}, ds.size() / 2, ds.size() - 1}) {
    const int32_t label = ds.get(i, pixels.data());
    EXPECT_GE(label, 0);
    EXPECT_LT(label, ds.classes());
  }
}

TEST(DatasetFuzz, MutatedIdxFiles) {
  TempDir dir;
  const std::string images = dir.file("train-images-idx3-ubyte");
  const std::string labels = dir.file("train-labels-idx1-ubyte");
  const fuzz::IntegerFields images_fields{{0, 4, 8, 12}, 4, true};
  const fuzz::IntegerFields labels_fields{{0, 4}, 4, true};
  Tally tally;
  uint64_t seed_value = 10;
  for (const auto& [n, h, w] :
       {std::tuple{5u, 3u, 4u}, std::tuple{1u, 1u, 1u}, std::tuple{2u, 28u, 28u}}) {
    const std::string good_images = idx_images(n, h, w), good_labels = idx_labels(n);
    Rng rng(seed_value++);
    for (int i = 0; i < 400; ++i) {
      std::string im = good_images, lb = good_labels;
      const int which = static_cast<int>(rng.below(3));  // images, labels or both
      if (which != 1) im = fuzz::mutate_bytes(im, rng, images_fields);
      if (which != 0) lb = fuzz::mutate_bytes(lb, rng, labels_fields);
      if (rng.one_in(4)) im = fuzz::mutate_bytes(im, rng, images_fields);
      write(images, im);
      write(labels, lb);
      const int64_t classes = rng.one_in(3) ? 0 : 10;
      fuzz::run_case<DataError>(fmt::format("idx-{}", seed_value), i, im + lb, tally,
                                [&](const std::string&) {
                                  const auto ds = load_idx_dataset(images, "", classes);
                                  exercise(*ds, im.size() + lb.size());
                                });
    }
  }
  fuzz::expect_tally(tally, "idx fuzz", "loaded", "a DataError",
                     {.cases = 1200, .rejected_above = 600, .accepted_above = 20});
}

// IDX headers claiming 10^15 pixels (or any product that overflows) are refused from the file
// size, before anything is allocated for them.
TEST(DatasetFuzz, IdxHugeDimensionsAreRefused) {
  TempDir dir;
  const std::string images = dir.file("train-images-idx3-ubyte");
  const std::string labels = dir.file("train-labels-idx1-ubyte");
  write(labels, idx_labels(2));
  const std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> dims = {
      {1000000, 1000000, 1000}, {0xffffffff, 0xffffffff, 0xffffffff}, {2, 0x80000000, 2},
      {2, 0x10000, 0x10000},    {0x80000000, 0x80000000, 0x80000000}, {2, 1, 0xffffffff}};
  for (const auto& [n, h, w] : dims) {
    write(images, be32(0x803) + be32(n) + be32(h) + be32(w) + std::string(64, '\x01'));
    EXPECT_THROW(load_idx_dataset(images, labels, 10), DataError) << n << " " << h << " " << w;
  }
  write(images, idx_images(2, 2, 2));
  for (uint32_t count : {0u, 3u, 0x7fffffffu, 0xffffffffu}) {
    write(labels, be32(0x801) + be32(count) + "\x01\x02");
    EXPECT_THROW(load_idx_dataset(images, labels, 10), DataError) << count;
  }
  // Directories where files belong are refused by name, not read as huge files.
  write(labels, idx_labels(2));
  EXPECT_THROW(load_idx_dataset(dir.path().string(), labels, 10), DataError);
  EXPECT_THROW(load_idx_dataset(images, dir.path().string(), 10), DataError);
}

TEST(DatasetFuzz, MutatedCifar10Files) {
  TempDir dir;
  const std::string file = dir.file("data_batch_1.bin");
  const std::string good = cifar_batch(3);
  // Offsets of the label bytes (the only header-like fields).
  const fuzz::IntegerFields labels{{0, 3073, 6146}, 1, false};
  Tally tally;
  Rng rng(42);
  for (int i = 0; i < 300; ++i) {
    std::string bytes = fuzz::mutate_bytes(good, rng, labels);
    if (rng.one_in(3)) bytes = fuzz::mutate_bytes(bytes, rng, labels);
    write(file, bytes);
    // Half the cases load the folder (every data_batch_<n>.bin in it), half the file.
    const std::string path = i % 2 ? file : dir.path().string();
    fuzz::run_case<DataError>("cifar10", i, bytes, tally, [&](const std::string&) {
      const auto ds = load_cifar10_dataset(path);
      exercise(*ds, bytes.size());
    });
  }
  fuzz::expect_tally(tally, "cifar10 fuzz", "loaded", "a DataError",
                     {.cases = 300, .rejected_above = 100, .accepted_above = 20});
}

TEST(DatasetFuzz, Cifar10NastyFolders) {
  TempDir dir;
  // A folder whose batch "files" are folders, and numbers at the edge of the name rule.
  std::filesystem::create_directories(dir.path() / "data_batch_1.bin");
  EXPECT_THROW(load_cifar10_dataset(dir.path().string()), DataError);
  std::filesystem::remove_all(dir.path() / "data_batch_1.bin");
  write(dir.file("data_batch_999999999.bin"), cifar_batch(1));
  write(dir.file("data_batch_99999999999999999999.bin"), cifar_batch(1));  // ignored: too long
  write(dir.file("data_batch_-1.bin"), cifar_batch(1));                    // ignored: not digits
  const auto ds = load_cifar10_dataset(dir.path().string());
  EXPECT_EQ(ds->size(), 1);
  write(dir.file("data_batch_2.bin"), "");
  EXPECT_THROW(load_cifar10_dataset(dir.path().string()), DataError);
}

std::string le32(int32_t v) {
  std::string s(4, '\0');
  fuzz::put_integer(s, 0, 4, static_cast<uint32_t>(v), false);
  return s;
}

// llm.c's token format: 256 int32 (magic, version, count, zeros), then uint16 tokens.
std::string llmc_tokens(int n) {
  std::string b = le32(20240520) + le32(1) + le32(n) + std::string(253 * 4, '\0');
  for (int i = 0; i < n; ++i) {
    const int token = (i * 53 + 7) % 300;  // some above the 256 of a byte vocabulary
    b += static_cast<char>(token & 0xff);
    b += static_cast<char>(token >> 8);
  }
  return b;
}

// Everything a consumer does with a token source: read its first, middle and last windows in
// two epochs; each read gives tokens below the vocabulary, labels shifted by one, or a
// DataError (a token outside the vocabulary).
void exercise_tokens(const Dataset& ds, uint64_t file_bytes, int64_t vocab) {
  ASSERT_GT(ds.size(), 0);
  const int64_t t = ds.sample_shape()[0];
  ASSERT_EQ(ds.labels_per_sample(), t);
  // Every window came from the file: size() * T + 1 tokens of 2 bytes at most.
  ASSERT_LE(static_cast<uint64_t>(ds.size() * t + 1) * 2, file_bytes);
  (void)ds.describe();
  std::vector<int32_t> in(static_cast<size_t>(t)), labels(static_cast<size_t>(t));
  for (int64_t epoch : {0, 1}) {
    for (int64_t i : {int64_t{0}, ds.size() / 2, ds.size() - 1}) {
      try {
        ds.read(i, epoch, in.data(), labels.data());
      } catch (const DataError&) {
        continue;
      }
      for (int64_t k = 0; k < t; ++k) {
        EXPECT_GE(in[k], 0);
        EXPECT_LT(in[k], vocab);
        EXPECT_LT(labels[k], vocab);
        if (k + 1 < t) {
          EXPECT_EQ(labels[k], in[k + 1]);
        }
      }
    }
  }
}

TEST(DatasetFuzz, MutatedTokenFiles) {
  TempDir dir;
  const std::string file = dir.file("train.bin");
  const fuzz::IntegerFields header{{0, 4, 8}, 4, false};
  Tally tally;
  Rng rng(77);
  for (int i = 0; i < 600; ++i) {
    // Half llm.c files, half headerless (nanoGPT) ones; both mutated.
    const std::string good = llmc_tokens(3 + static_cast<int>(rng.below(40)));
    std::string bytes = i % 2 ? good : good.substr(1024);
    bytes = fuzz::mutate_bytes(bytes, rng, header);
    if (rng.one_in(3)) bytes = fuzz::mutate_bytes(bytes, rng, header);
    write(file, bytes);
    TokenDatasetOptions o;
    o.path = file;
    o.seq_len = 1 + static_cast<int64_t>(rng.below(8));
    o.vocab = rng.one_in(2) ? 256 : 65536;
    o.random = rng.one_in(2);
    o.seed = rng.below(1000);
    fuzz::run_case<DataError>("tokens", i, bytes, tally, [&](const std::string&) {
      const auto ds = load_token_dataset(o);
      exercise_tokens(*ds, bytes.size(), o.vocab);
    });
  }
  fuzz::expect_tally(tally, "token fuzz", "loaded", "a DataError",
                     {.cases = 600, .rejected_above = 100, .accepted_above = 100});
}

// llm.c's uint32 files (ids up to 70,000), mutated, through open_dataset (which scans every
// token against the vocabulary at open): a file that opens never fails a read afterwards, and
// every token it hands out is below the vocabulary.
TEST(DatasetFuzz, MutatedUint32TokenFilesScannedAtOpen) {
  TempDir dir;
  const std::string file = dir.file("train.bin");
  const fuzz::IntegerFields header{{0, 4, 8}, 4, false};
  Tally tally;
  Rng rng(78);
  for (int i = 0; i < 400; ++i) {
    std::vector<uint32_t> tokens(3 + rng.below(40));
    for (size_t k = 0; k < tokens.size(); ++k) tokens[k] = (k * 7919 + 11) % 70000;
    std::string bytes = fuzz::mutate_bytes(testing::llmc32_file(tokens), rng, header);
    if (rng.one_in(3)) bytes = fuzz::mutate_bytes(bytes, rng, header);
    write(file, bytes);
    DatasetSpec spec;
    spec.source = "tokens";
    spec.path = file;
    spec.seq_len = 1 + static_cast<int64_t>(rng.below(8));
    spec.classes = rng.one_in(2) ? 65536 : 70000;
    spec.augment = rng.one_in(2);
    spec.seed = rng.below(1000);
    fuzz::run_case<DataError>("uint32 tokens", i, bytes, tally, [&](const std::string&) {
      const auto ds = open_dataset(spec);
      ASSERT_GT(ds->size(), 0);
      const int64_t t = spec.seq_len;
      std::vector<int32_t> in(static_cast<size_t>(t)), labels(static_cast<size_t>(t));
      for (int64_t k = 0; k < ds->size(); ++k) {
        try {
          ds->read(k, 1, in.data(), labels.data());
        } catch (const DataError& e) {
          FAIL() << "a read failed after the scan passed: " << e.what();
        }
        for (int64_t j = 0; j < t; ++j) {
          ASSERT_GE(in[j], 0);
          ASSERT_LT(in[j], spec.classes);
          ASSERT_LT(labels[j], spec.classes);
        }
      }
    });
  }
  fuzz::expect_tally(tally, "uint32 token fuzz", "loaded", "a DataError",
                     {.cases = 400, .rejected_above = 100, .accepted_above = 50});
}

// Token counts that disagree with the file (up to INT32_MAX and negative) are refused from the
// file size, and nothing is read past the mapping.
TEST(DatasetFuzz, TokenCountsTheFileCannotHold) {
  TempDir dir;
  const std::string file = dir.file("t.bin");
  const std::string tokens = llmc_tokens(10).substr(1024);
  for (int32_t count : {11, 9, 0x7fffffff, -1, int32_t(0x80000000), 1 << 30}) {
    write(file, le32(20240520) + le32(1) + le32(count) + std::string(253 * 4, '\0') + tokens);
    EXPECT_THROW(load_token_dataset({file, 2, 65536, true, 0}), DataError) << count;
  }
  write(file, llmc_tokens(10));
  EXPECT_EQ(load_token_dataset({file, 2, 65536, true, 0})->size(), 4);
  EXPECT_THROW(load_token_dataset({dir.path().string(), 2, 65536, true, 0}), DataError);
}

}  // namespace
}  // namespace ferry
