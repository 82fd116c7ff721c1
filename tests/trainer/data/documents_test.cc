// Documents of a token file (data.documents, data.pack): where the separator cuts the stream, the
// rows a document and a packed row make, the padded batch's length as a pure function of the
// position computed before the batch is read and the same on every rank, the loss divisor over
// the global batch, the packing's invariants, and the errors.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/trainer/data/test_files.h"
#include "trainer/data/documents.h"
#include "trainer/data/loader.h"
#include "trainer/data/token_file.h"

namespace ferry {
namespace {

using testing::error_of;
using testing::llmc_file;
using testing::TempDir;

constexpr uint16_t kEot = 9;

// A stream of documents of the given lengths (real tokens each), each led by the separator, as
// scripts/prepare_tokens.py writes them; token values count 10, 11, ... so a row names its place.
std::vector<uint16_t> led_by_separator(const std::vector<int>& lengths) {
  std::vector<uint16_t> out;
  uint16_t next = 10;
  for (int len : lengths) {
    out.push_back(kEot);
    for (int i = 0; i < len; ++i) out.push_back(next++);
  }
  return out;
}

TEST(Documents, TheSeparatorCutsTheStreamIntoWindows) {
  TempDir dir;
  //  position:  0  1  2  3  4  5  6  7  8  9 10 11 12
  const std::vector<uint16_t> t = {10, 11, 9, 12, 13, 14, 9, 9, 15, 9, 16, 17, 18};
  const TokenFile file(dir.write("t.bin", llmc_file(t)));
  const DocumentIndex index = index_documents(file, kEot, 100);
  // [0, 2]: a first document without a leading separator; [2, 6]; [6, 7] holds only separators
  // (no document); [7, 9]; [9, 12]: the last, without a trailing separator.
  EXPECT_EQ(index.start, (std::vector<int64_t>{0, 2, 7, 9}));
  EXPECT_EQ(index.length, (std::vector<int32_t>{2, 4, 2, 3}));
  EXPECT_EQ(index.tokens, 11);
  EXPECT_EQ(index.longest, 4);
  EXPECT_EQ(index.cut, 0);
  // Cut at seq_len 3: only the second is longer.
  const DocumentIndex cut = index_documents(file, kEot, 3);
  EXPECT_EQ(cut.length, (std::vector<int32_t>{2, 3, 2, 3}));
  EXPECT_EQ(cut.cut, 1);
  EXPECT_EQ(cut.longest, 4);
  // A file ending with its separator has no empty last document.
  const TokenFile ends(dir.write("e.bin", llmc_file({9, 10, 11, 9})));
  EXPECT_EQ(index_documents(ends, kEot, 8).start, (std::vector<int64_t>{0}));
  EXPECT_EQ(index_documents(ends, kEot, 8).length, (std::vector<int32_t>{3}));
  // No separator at all: a file tokenised without them (prepare_tokens.py --no-separator).
  EXPECT_NE(error_of<DataError>([&] {
              index_documents(ends, 500, 8);
            }).find("holds no end-of-text token 500 (data.eot_token)"),
            std::string::npos);
  const TokenFile only(dir.write("o.bin", llmc_file({9, 9, 9})));
  EXPECT_NE(error_of<DataError>([&] { index_documents(only, kEot, 8); }).find("holds no document"),
            std::string::npos);
}

TEST(Documents, APaddedRowHoldsItsDocumentThenSeparatorsWithoutLabels) {
  TempDir dir;
  const std::string path = dir.write("t.bin", llmc_file(led_by_separator({3, 1, 6})));
  const auto ds = load_document_dataset({path, 5, 100, kEot, false});
  ASSERT_EQ(ds->size(), 3);
  EXPECT_TRUE(ds->pads_per_batch());
  EXPECT_FALSE(ds->segmented());
  // A document of L tokens led by its separator has L + 1 positions (it predicts the next
  // separator), the last one L (no separator follows it).
  EXPECT_EQ(ds->labelled(0), 4);
  EXPECT_EQ(ds->labelled(1), 2);
  EXPECT_EQ(ds->labelled(2), 5);  // 6 cut at seq_len 5
  std::vector<int32_t> tokens(5, -7), labels(5, -7);
  ds->read_row(0, 0, 4, tokens.data(), labels.data(), nullptr);
  EXPECT_EQ(tokens, (std::vector<int32_t>{9, 10, 11, 12, -7}));
  EXPECT_EQ(labels, (std::vector<int32_t>{10, 11, 12, 9, -7}));
  ds->read_row(1, 3, 5, tokens.data(), labels.data(), nullptr);
  EXPECT_EQ(tokens, (std::vector<int32_t>{9, 13, 9, 9, 9}));
  EXPECT_EQ(labels, (std::vector<int32_t>{13, 9, -1, -1, -1}));
  ds->read_row(2, 0, 5, tokens.data(), labels.data(), nullptr);  // the first 5 of 6
  EXPECT_EQ(tokens, (std::vector<int32_t>{9, 14, 15, 16, 17}));
  EXPECT_EQ(labels, (std::vector<int32_t>{14, 15, 16, 17, 18}));
  EXPECT_NE(ds->describe().find("3 documents split at token 9"), std::string::npos)
      << ds->describe();
  // A token the vocabulary does not hold is named with its position when its row is read.
  const auto small = load_document_dataset({path, 5, 15, kEot, false});
  const std::string e =
      error_of<DataError>([&] { small->read_row(2, 0, 5, tokens.data(), labels.data(), nullptr); });
  EXPECT_NE(e.find("token 15 at position 8"), std::string::npos) << e;
}

TEST(Documents, APackedRowHoldsWholeDocumentsWithTheirSegmentStarts) {
  TempDir dir;
  // Documents of 4, 2, 7 and 2 positions into rows of 8: best fit decreasing puts the 7 alone
  // and the others together.
  const std::string path = dir.write("t.bin", llmc_file(led_by_separator({3, 1, 6, 2})));
  const auto ds = load_document_dataset({path, 8, 100, kEot, true});
  ASSERT_EQ(ds->size(), 2);
  EXPECT_TRUE(ds->segmented());
  EXPECT_FALSE(ds->pads_per_batch());
  std::vector<int32_t> tokens(8), labels(8), segments(8);
  std::set<int64_t> filled;
  for (int64_t r = 0; r < 2; ++r) {
    ds->read_row(r, 0, 8, tokens.data(), labels.data(), segments.data());
    filled.insert(ds->labelled(r));
    if (ds->labelled(r) == 8) {  // documents 0, 1 and 3, in file order
      EXPECT_EQ(tokens, (std::vector<int32_t>{9, 10, 11, 12, 9, 13, 9, 20}));
      EXPECT_EQ(labels, (std::vector<int32_t>{10, 11, 12, 9, 13, 9, 20, 21}));
      EXPECT_EQ(segments, (std::vector<int32_t>{0, 0, 0, 0, 4, 4, 6, 6}));
    } else {  // document 2, then a position of padding with a segment of its own
      EXPECT_EQ(ds->labelled(r), 7);
      EXPECT_EQ(tokens, (std::vector<int32_t>{9, 14, 15, 16, 17, 18, 19, 9}));
      EXPECT_EQ(labels, (std::vector<int32_t>{14, 15, 16, 17, 18, 19, 9, -1}));
      EXPECT_EQ(segments, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 7}));
    }
  }
  EXPECT_EQ(filled, (std::set<int64_t>{7, 8}));
  EXPECT_NE(ds->describe().find("packed into 2 rows, 93.8% filled"), std::string::npos)
      << ds->describe();
}

TEST(Documents, PackingHoldsEveryDocumentOnceWithinTheRows) {
  std::mt19937 rng(5);
  std::vector<int32_t> lengths(5000);
  for (auto& l : lengths) l = static_cast<int32_t>(std::uniform_int_distribution<int>(1, 256)(rng));
  const PackedRows p = pack_documents(lengths, 256);
  std::vector<int> seen(lengths.size(), 0);
  int64_t total = 0;
  for (int64_t r = 0; r < p.rows(); ++r) {
    int64_t used = 0;
    for (int64_t k = p.first[r]; k < p.first[r + 1]; ++k) {
      ++seen[static_cast<size_t>(p.docs[k])];
      used += lengths[static_cast<size_t>(p.docs[k])];
      if (k > p.first[r]) EXPECT_LT(p.docs[k - 1], p.docs[k]) << "file order within a row";
    }
    EXPECT_LE(used, 256);
    EXPECT_EQ(used, p.tokens[r]);
    total += used;
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  // Best fit decreasing leaves little room: here within 2% of the ideal row count.
  const double ideal = static_cast<double>(total) / 256.0;
  EXPECT_LT(static_cast<double>(p.rows()), ideal * 1.02 + 1) << p.rows() << " rows";
  // A pure function of the lengths.
  const PackedRows again = pack_documents(lengths, 256);
  EXPECT_EQ(again.docs, p.docs);
  EXPECT_EQ(again.first, p.first);
}

TEST(Documents, BatchLengthsRoundUpToTheBucketWithinSeqLen) {
  EXPECT_EQ(batch_length(1, 64, 256), 64);
  EXPECT_EQ(batch_length(64, 64, 256), 64);
  EXPECT_EQ(batch_length(65, 64, 256), 128);
  EXPECT_EQ(batch_length(250, 64, 256), 256);
  EXPECT_EQ(batch_length(90, 64, 100), 100);  // capped at seq_len, not 128
  EXPECT_EQ(batch_length(7, 1, 100), 7);
  EXPECT_EQ(length_buckets(64, 256), (std::vector<int64_t>{64, 128, 192, 256}));
  EXPECT_EQ(length_buckets(64, 100), (std::vector<int64_t>{64, 100}));
  EXPECT_EQ(length_buckets(300, 100), (std::vector<int64_t>{100}));
  // The largest data.len_bucket rounds every batch up to seq_len, without overflowing.
  EXPECT_EQ(batch_length(1, INT64_MAX, 128), 128);
  EXPECT_EQ(batch_length(10, INT64_MAX, 128), 128);
  EXPECT_EQ(batch_length(127, INT64_MAX - 1, 128), 128);
  EXPECT_EQ(length_buckets(INT64_MAX, 128), (std::vector<int64_t>{128}));
}

// 96 documents of mostly a few tokens, some of over 32, for the loader tests.
std::string varied_file(TempDir& dir) {
  std::vector<int> lengths;
  std::mt19937 rng(11);
  std::exponential_distribution<double> length(1.0 / 6);
  for (int i = 0; i < 96; ++i) lengths.push_back(1 + std::min(60, static_cast<int>(length(rng))));
  return dir.write("varied.bin", llmc_file(led_by_separator(lengths)));
}

LoaderOptions options(int world, int rank, int64_t batch) {
  LoaderOptions o;
  o.batch_size = batch;
  o.world_size = world;
  o.rank = rank;
  o.seed = 3;
  o.len_bucket = 8;
  return o;
}

// The batch length is known before the batch is read (ShapePlans plans it ahead), equals what
// the loader then fills, and is the same on every rank: the longest document of the whole global
// batch. The loss divisor is the global batch's real tokens over the ranks.
TEST(DocumentLoader, LengthsArePureFunctionsOfThePositionAndTheSameOnEveryRank) {
  TempDir dir;
  auto ds = std::shared_ptr<const Dataset>(
      load_document_dataset({varied_file(dir), 32, 5000, kEot, false}));
  DataLoader one(ds, options(1, 0, 8));
  DataLoader r0(ds, options(2, 0, 4)), r1(ds, options(2, 1, 4));
  std::set<int64_t> lengths;
  for (int step = 0; step < 30; ++step) {  // past the end of an epoch (12 batches)
    const LoaderPosition p = one.position();
    const Shape ahead = one.input_shape(p);
    ASSERT_EQ(r0.input_shape(p)[1], ahead[1]);
    ASSERT_EQ(r1.input_shape(p)[1], ahead[1]);
    Batch b = one.next(), b0 = r0.next(), b1 = r1.next();
    ASSERT_EQ(b.shape(), ahead) << "step " << step;
    ASSERT_EQ(b0.shape(), (Shape{4, ahead[1]}));
    ASSERT_EQ(b1.shape(), (Shape{4, ahead[1]}));
    lengths.insert(ahead[1]);
    // The longest document rounded up to 8, at most 32.
    int64_t longest = 0, real = 0;
    for (int64_t index : one.indices(p)) {
      longest = std::max(longest, ds->labelled(index));
      real += ds->labelled(index);
    }
    ASSERT_EQ(ahead[1], batch_length(longest, 8, 32));
    ASSERT_EQ(b.labelled(), real);
    ASSERT_EQ(b0.labelled() + b1.labelled(), real);
    ASSERT_EQ(b.loss_divisor(), static_cast<float>(real));
    ASSERT_EQ(b0.loss_divisor(), static_cast<float>(real) / 2);
    ASSERT_EQ(b1.loss_divisor(), b0.loss_divisor());
    // Two ranks' rows are the one rank's rows, and every label past a document is -1.
    const int64_t t = ahead[1];
    for (int64_t i = 0; i < 8 * t; ++i) {
      const int32_t* half = i < 4 * t ? b0.labels() : b1.labels();
      ASSERT_EQ(b.labels()[i], half[i % (4 * t)]);
      const int32_t* in = static_cast<const int32_t*>(i < 4 * t ? b0.input() : b1.input());
      ASSERT_EQ(static_cast<const int32_t*>(b.input())[i], in[i % (4 * t)]);
    }
    int64_t labelled = 0;
    for (int64_t i = 0; i < 8 * t; ++i) labelled += b.labels()[i] >= 0 ? 1 : 0;
    ASSERT_EQ(labelled, real);
    EXPECT_EQ(b.segments(), nullptr);
  }
  EXPECT_GT(lengths.size(), 1u) << "the length changed from batch to batch";
  const std::vector<Shape> shapes = one.input_shapes();
  EXPECT_EQ(shapes, (std::vector<Shape>{{8, 8}, {8, 16}, {8, 24}, {8, 32}}));
  for (int64_t len : lengths) EXPECT_TRUE(len % 8 == 0 && len <= 32);
}

TEST(DocumentLoader, PackedBatchesCarrySegmentStarts) {
  TempDir dir;
  auto ds = std::shared_ptr<const Dataset>(
      load_document_dataset({varied_file(dir), 64, 5000, kEot, true}));
  DataLoader loader(ds, options(1, 0, 4));
  for (int step = 0; step < 5; ++step) {
    const Shape ahead = loader.input_shape(loader.position());
    Batch b = loader.next();
    ASSERT_EQ(b.shape(), (Shape{4, 64}));
    ASSERT_EQ(ahead, b.shape());
    ASSERT_NE(b.segments(), nullptr);
    int64_t labelled = 0;
    for (int64_t r = 0; r < 4; ++r) {
      const int32_t* seg = b.segments() + r * 64;
      for (int64_t i = 0; i < 64; ++i) {
        ASSERT_TRUE(seg[i] >= 0 && seg[i] <= i);
        ASSERT_TRUE(i == 0 || seg[i] == seg[i - 1] || seg[i] == i) << "contiguous documents";
        labelled += b.labels()[r * 64 + i] >= 0 ? 1 : 0;
      }
    }
    EXPECT_EQ(b.labelled(), labelled);
    EXPECT_EQ(b.loss_divisor(), static_cast<float>(labelled));
  }
}

TEST(DocumentLoader, BadOptionsAreConfigErrors) {
  TempDir dir;
  const std::string path = varied_file(dir);
  auto ds = std::shared_ptr<const Dataset>(load_document_dataset({path, 32, 1000, kEot, false}));
  LoaderOptions o = options(1, 0, 4);
  o.len_bucket = 0;
  EXPECT_EQ(error_of<ConfigError>([&] { DataLoader loader(ds, o); }),
            "data.len_bucket: must be >= 1, got 0");
  EXPECT_EQ(error_of<ConfigError>([&] {
              load_document_dataset({path, 32, 1000, 1000, false});
            }),
            "data.eot_token: must be below model.vocab (1000), got 1000");
}

// The index is one pass over the mapped file: tens of millions of tokens take well under a
// second. Printed, never asserted (a benchmark).
TEST(Documents, IndexOfTwentyMillionTokens) {
  TempDir dir;
  std::vector<uint16_t> tokens(20'000'000);
  std::mt19937 rng(1);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng() % 50000);
  for (size_t i = 0; i < tokens.size(); i += 1 + rng() % 4000) tokens[i] = 50256;
  const std::string path = dir.write("big.bin", llmc_file(tokens));
  const auto start = std::chrono::steady_clock::now();
  const auto ds = load_document_dataset({path, 1024, 50257, 50256, true});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("documents of 20M tokens indexed and packed in %.3f s: %s\n", s,
              ds->describe().c_str());
  EXPECT_GT(ds->size(), 0);
}

}  // namespace
}  // namespace ferry
