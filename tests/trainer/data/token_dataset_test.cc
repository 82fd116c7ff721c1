// Token files and the token source: llm.c vs nanoGPT detection, every malformed-file error by
// its exact message, the vocabulary check naming the token's position, window contents, random
// windows independent of workers and ranks, the evaluation walk covering every full window
// exactly once, and scripts/prepare_tokens.py's byte mode read back.
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/trainer/data/test_files.h"
#include "trainer/data/dataset.h"
#include "trainer/data/loader.h"
#include "trainer/data/token_file.h"

namespace ferry {
namespace {

using testing::error_of;
using testing::TempDir;

using testing::llmc_file;
using testing::put_le32;
using testing::u16_tokens;

// Tokens 0, 1, ..., n - 1: a token's value is its position, so a row names its window.
std::vector<uint16_t> counting(int n) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
  return t;
}

std::string file_error(const std::string& path) {
  return error_of<DataError>([&] { TokenFile file(path); });
}

TEST(TokenFile, TellsLlmcFromNanoGptByTheMagic) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {7, 65535, 0, 300, 42};
  TokenFile llmc(dir.write("llmc.bin", llmc_file(tokens)));
  EXPECT_EQ(llmc.format(), TokenFormat::kLlmc);
  EXPECT_STREQ(llmc.format_name(), "llm.c");
  ASSERT_EQ(llmc.size(), 5);
  TokenFile nano(dir.write("train.bin", u16_tokens(tokens)));
  EXPECT_EQ(nano.format(), TokenFormat::kNanoGpt);
  ASSERT_EQ(nano.size(), 5);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(llmc.at(i), tokens[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(nano.at(i), tokens[static_cast<size_t>(i)]) << i;
  }
  std::vector<int32_t> out(3);
  llmc.read(1, 3, 65536, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{65535, 0, 300}));
  // A headerless file of exactly one header's size whose first int32 is not the magic.
  TokenFile header_sized(dir.write("h.bin", std::string(kLlmcHeaderBytes, '\1')));
  EXPECT_EQ(header_sized.format(), TokenFormat::kNanoGpt);
  EXPECT_EQ(header_sized.size(), kLlmcHeaderBytes / 2);
  EXPECT_EQ(header_sized.at(0), 0x0101);
}

TEST(TokenFile, MalformedFilesAreDataErrorsNamingFileAndProblem) {
  TempDir dir;
  const auto p = [&](const std::string& name, const std::string& bytes) {
    return dir.write(name, bytes);
  };
  std::string path = p("empty.bin", "");
  EXPECT_EQ(file_error(path), "token file '" + path + "': is empty");
  path = p("v2.bin", llmc_file(counting(4), -1, 2));
  EXPECT_EQ(file_error(path),
            "token file '" + path + "': llm.c token format version 2, expected 1");
  path = p("trunc.bin", llmc_file(counting(9), 10));
  EXPECT_EQ(file_error(path), "token file '" + path +
                                  "': llm.c header says 10 tokens but the file holds 9 "
                                  "(truncated)");
  path = p("long.bin", llmc_file(counting(9), 8));
  EXPECT_EQ(file_error(path), "token file '" + path +
                                  "': llm.c header says 8 tokens but the file holds 9 (bytes "
                                  "after the last token)");
  path = p("odd.bin", llmc_file(counting(4)) + "x");
  EXPECT_EQ(file_error(path), "token file '" + path +
                                  "': holds an odd number of token bytes (9 after the header); "
                                  "tokens are uint16");
  path = p("odd_nano.bin", std::string(7, 'a'));
  EXPECT_EQ(file_error(path), "token file '" + path +
                                  "': holds an odd number of bytes (7); a headerless (nanoGPT) "
                                  "token file is uint16 tokens");
  path = p("short.bin", llmc_file({}).substr(0, 100));
  EXPECT_EQ(file_error(path), "token file '" + path +
                                  "': llm.c header (magic 20240520) is cut short: the file is "
                                  "100 bytes, the header 1024");
  path = p("negative.bin", llmc_file({}, -1).replace(8, 4, std::string("\xff\xff\xff\xff", 4)));
  EXPECT_EQ(file_error(path),
            "token file '" + path + "': llm.c header gives a negative token count (-1)");
  path = p("none.bin", llmc_file({}));
  EXPECT_EQ(file_error(path), "token file '" + path + "': holds no tokens");
  path = p("gz.bin", std::string("\x1f\x8b\x08\x00", 4));
  EXPECT_EQ(file_error(path), "token file '" + path + "': is gzip-compressed; gunzip it first");
  path = p("tok.bin", llmc_file(counting(4), -1, 2, 20240328));
  EXPECT_EQ(file_error(path),
            "token file '" + path + "': is an llm.c tokenizer file (magic 20240328), not tokens");
  EXPECT_EQ(file_error(dir.str()),
            "token file '" + dir.str() + "': is not a regular file (a directory?)");
  const std::string missing = dir.file("missing.bin");
  EXPECT_EQ(file_error(missing),
            "cannot open token file '" + missing + "': No such file or directory");
}

TEST(TokenDataset, TooFewTokensForOneWindow) {
  TempDir dir;
  const std::string path = dir.write("t.bin", llmc_file(counting(8)));
  TokenDatasetOptions o{path, 8, 256, true, 0};
  EXPECT_EQ(error_of<DataError>([&] { load_token_dataset(o); }),
            "token file '" + path +
                "': holds 8 tokens, fewer than the 9 of one window "
                "(data.seq_len 8 + 1)");
  o.seq_len = 7;  // exactly one window
  EXPECT_EQ(load_token_dataset(o)->size(), 1);
  o.seq_len = 0;
  EXPECT_THROW(load_token_dataset(o), ConfigError);
}

TEST(TokenDataset, TokenOutsideTheVocabularyNamesItsPosition) {
  TempDir dir;
  std::vector<uint16_t> tokens(100, 5);
  tokens[37] = 300;
  const std::string path = dir.write("t.bin", llmc_file(tokens));
  const auto ds = load_token_dataset({path, 10, 256, false, 0});
  std::vector<int32_t> in(10), labels(10);
  ds->read(0, 0, in.data(), labels.data());  // tokens [0, 11): all fine
  ds->read(2, 0, in.data(), labels.data());  // [20, 31)
  const std::string expected = "token file '" + path +
                               "': token 300 at position 37 is outside the vocabulary of 256 "
                               "(model.vocab)";
  EXPECT_EQ(error_of<DataError>([&] { ds->read(3, 0, in.data(), labels.data()); }), expected);
  // A bad token that only a window's last label holds (window 3 is tokens [30, 41)).
  tokens[37] = 5;
  tokens[40] = 256;
  const std::string path2 = dir.write("t2.bin", u16_tokens(tokens));
  const auto ds2 = load_token_dataset({path2, 10, 256, false, 0});
  EXPECT_EQ(error_of<DataError>([&] { ds2->read(3, 0, in.data(), labels.data()); }),
            "token file '" + path2 +
                "': token 256 at position 40 is outside the vocabulary of 256 (model.vocab)");
  // Through the loader: the error reaches next() as a DataError with the same message.
  LoaderOptions lo;
  lo.batch_size = 2;
  lo.shuffle = false;
  DataLoader loader(load_token_dataset({path, 10, 256, false, 0}), lo);
  EXPECT_EQ(error_of<DataError>([&] {
              for (int i = 0; i < 5; ++i) loader.next();
            }),
            expected);
}

TEST(TokenDataset, WindowsAreInputsAndTheirNextTokens) {
  TempDir dir;
  const std::string path = dir.write("t.bin", llmc_file(counting(1000)));
  const int64_t t = 16;
  const auto seq = load_token_dataset({path, t, 1000, false, 3});
  EXPECT_EQ(seq->size(), (1000 - 1) / t);  // 62
  EXPECT_EQ(seq->input_dtype(), DType::kI32);
  EXPECT_EQ(seq->sample_shape(), (Shape{t}));
  EXPECT_EQ(seq->labels_per_sample(), t);
  EXPECT_EQ(seq->classes(), 1000);
  std::vector<int32_t> in(t), labels(t);
  for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{61}}) {
    seq->read(k, 5, in.data(), labels.data());
    for (int64_t i = 0; i < t; ++i) {
      EXPECT_EQ(in[i], k * t + i) << k;
      EXPECT_EQ(labels[i], k * t + i + 1) << k;
    }
  }
  const auto rnd = load_token_dataset({path, t, 1000, true, 3});
  EXPECT_EQ(rnd->size(), 62);
  std::set<int32_t> starts;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (int64_t k = 0; k < rnd->size(); ++k) {
      rnd->read(k, epoch, in.data(), labels.data());
      const int64_t start = token_window_start(1000, t, true, 3, epoch, k);
      ASSERT_GE(start, 0);
      ASSERT_LE(start, 1000 - t - 1);
      EXPECT_EQ(in[0], start);
      for (int64_t i = 0; i < t; ++i) {
        EXPECT_EQ(in[i], start + i);
        EXPECT_EQ(labels[i], start + i + 1);
      }
      starts.insert(in[0]);
    }
  }
  // Random offsets, not multiples of T: most of the 186 draws are distinct.
  EXPECT_GT(starts.size(), 150u);
  // A pure function of (seed, epoch, index).
  EXPECT_EQ(token_window_start(1000, t, true, 3, 1, 7), token_window_start(1000, t, true, 3, 1, 7));
  EXPECT_NE(token_window_start(1000, t, true, 3, 0, 7), token_window_start(1000, t, true, 3, 1, 7));
  EXPECT_NE(token_window_start(1000, t, true, 3, 0, 7), token_window_start(1000, t, true, 4, 0, 7));
  // A file of exactly one window has one place for it.
  for (int64_t k = 0; k < 5; ++k) EXPECT_EQ(token_window_start(17, 16, true, 3, 2, k), 0);
}

// Every row of every batch of `loader`'s next `batches` calls: (first input token, labels ok).
std::vector<int32_t> row_starts(DataLoader& loader, int batches, int64_t t) {
  std::vector<int32_t> out;
  for (int b = 0; b < batches; ++b) {
    Batch batch = loader.next();
    if (!batch) break;
    EXPECT_EQ(batch.images(), nullptr);
    const auto* in = static_cast<const int32_t*>(batch.input());
    for (int64_t r = 0; r < batch.size(); ++r) {
      for (int64_t i = 0; i < t; ++i) {
        EXPECT_EQ(in[r * t + i], in[r * t] + i);
        EXPECT_EQ(batch.labels()[r * t + i], in[r * t] + i + 1);
      }
      out.push_back(in[r * t]);
    }
  }
  return out;
}

TEST(TokenDataset, LoaderBatchesAreTheSameWhateverWorkersAndRanks) {
  TempDir dir;
  const std::string path = dir.write("t.bin", llmc_file(counting(5000)));
  const int64_t t = 8;
  const std::shared_ptr<const Dataset> ds = load_token_dataset({path, t, 5000, true, 11});
  LoaderOptions one;
  one.batch_size = 12;
  one.seed = 4;
  one.workers = 1;
  DataLoader single(ds, one);
  EXPECT_EQ(single.batch_shape(), (Shape{12, t}));
  const int batches = 60;  // past the end of the first epoch (624 windows / 12 = 52 batches)
  const std::vector<int32_t> reference = row_starts(single, batches, t);
  ASSERT_EQ(reference.size(), 12u * batches);
  LoaderOptions many = one;
  many.workers = 4;
  many.prefetch = 3;
  DataLoader threaded(ds, many);
  EXPECT_EQ(row_starts(threaded, batches, t), reference);
  // Three ranks of 4 rows: their slices, concatenated in rank order, are the global batch.
  std::vector<std::vector<int32_t>> per_rank;
  for (int r = 0; r < 3; ++r) {
    LoaderOptions o = one;
    o.batch_size = 4;
    o.world_size = 3;
    o.rank = r;
    o.workers = 1 + r;
    DataLoader loader(ds, o);
    per_rank.push_back(row_starts(loader, batches, t));
  }
  std::vector<int32_t> merged;
  for (int b = 0; b < batches; ++b) {
    for (int r = 0; r < 3; ++r) {
      merged.insert(merged.end(), per_rank[r].begin() + 4 * b, per_rank[r].begin() + 4 * b + 4);
    }
  }
  EXPECT_EQ(merged, reference);
  // Another seed draws other windows.
  const std::shared_ptr<const Dataset> other = load_token_dataset({path, t, 5000, true, 12});
  DataLoader reseeded(other, one);
  EXPECT_NE(row_starts(reseeded, 4, t),
            std::vector<int32_t>(reference.begin(), reference.begin() + 48));
}

TEST(TokenDataset, EvaluationWalkCoversEveryFullWindowOnce) {
  TempDir dir;
  const int64_t t = 10;
  for (int n : {11, 12, 101, 1000, 1009}) {
    const std::string path = dir.write("t" + std::to_string(n) + ".bin", u16_tokens(counting(n)));
    const std::shared_ptr<const Dataset> ds = load_token_dataset({path, t, 65536, false, 0});
    const int64_t windows = (n - 1) / t;
    ASSERT_EQ(ds->size(), windows);
    for (int64_t batch : {1, 3, 7, 16}) {
      for (int world : {1, 2, 3}) {
        std::map<int32_t, int> seen;
        int64_t rows = 0;
        for (int r = 0; r < world; ++r) {
          LoaderOptions o;
          o.batch_size = batch;
          o.world_size = world;
          o.rank = r;
          o.shuffle = false;
          o.drop_last = false;
          o.epochs = 1;
          DataLoader loader(ds, o);
          for (int32_t start : row_starts(loader, 1 << 20, t)) {
            ++seen[start];
            ++rows;
          }
        }
        ASSERT_EQ(rows, windows) << n << " tokens, batch " << batch << ", " << world << " ranks";
        for (int64_t k = 0; k < windows; ++k) {
          EXPECT_EQ(seen[static_cast<int32_t>(k * t)], 1) << n << " " << batch << " " << world;
        }
      }
    }
  }
}

TEST(TokenDataset, LoaderRefusesImageNormalisation) {
  TempDir dir;
  const std::string path = dir.write("t.bin", u16_tokens(counting(100)));
  LoaderOptions o;
  o.batch_size = 2;
  o.mean = {0.5f};
  o.stddev = {0.5f};
  EXPECT_THROW(DataLoader(load_token_dataset({path, 4, 256, true, 0}), o), ConfigError);
}

TEST(TokenDataset, OpenDatasetBuildsTheTokenSource) {
  TempDir dir;
  DatasetSpec spec;
  spec.source = "tokens";
  spec.path = dir.write("t.bin", llmc_file(counting(200)));
  spec.seq_len = 9;
  spec.classes = 256;
  spec.augment = false;
  const auto ds = open_dataset(spec);
  EXPECT_EQ(ds->size(), 22);
  EXPECT_EQ(ds->describe(),
            "tokens '" + spec.path + "' (llm.c, 200 tokens, 22 windows of 9, vocab 256)");
  spec.source = "token";
  EXPECT_EQ(error_of<ConfigError>([&] { open_dataset(spec); }),
            "unknown data source 'token' (did you mean 'tokens'?)");
}

// scripts/prepare_tokens.py in byte mode: train.bin then val.bin hold the inputs' bytes, each
// file led by the separator 256 (data.documents' end-of-text token), or none with
// --no-separator.
TEST(PrepareTokens, ByteModeRoundTrip) {
  if (std::system("test -x /usr/bin/python3") != 0) GTEST_SKIP() << "needs /usr/bin/python3";
  TempDir dir;
  std::string text;
  for (int i = 0; i < 300; ++i) text += "line " + std::to_string(i) + " \xc3\xa9t\xc3\xa9\n";
  dir.write("in/a.txt", text.substr(0, 1000));
  dir.write("in/b.txt", text.substr(1000));
  for (const bool separator : {true, false}) {
    SCOPED_TRACE(separator ? "separator" : "--no-separator");
    const std::string out = dir.file(separator ? "out" : "out_plain");
    const std::string command = "/usr/bin/python3 " + std::string(FERRY_SOURCE_DIR) +
                                "/scripts/prepare_tokens.py --tokenizer bytes " +
                                (separator ? "" : "--no-separator ") + "--out '" + out + "' '" +
                                dir.file("in") + "/*.txt' > '" + dir.file("log") + "'";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    TokenFile train(out + "/train.bin"), val(out + "/val.bin");
    EXPECT_EQ(train.format(), TokenFormat::kLlmc);
    EXPECT_EQ(val.format(), TokenFormat::kLlmc);
    const int64_t n = static_cast<int64_t>(text.size()) + (separator ? 2 : 0);
    EXPECT_EQ(val.size(), (n + 5) / 10);  // round(10%)
    ASSERT_EQ(train.size() + val.size(), n);
    std::vector<int64_t> separators;
    std::string back;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t t = i < train.size() ? train.at(i) : val.at(i - train.size());
      if (t == 256) {
        separators.push_back(i);
      } else {
        back.push_back(static_cast<char>(t));
      }
    }
    EXPECT_EQ(back, text);
    EXPECT_EQ(separators, (separator ? std::vector<int64_t>{0, 1001} : std::vector<int64_t>{}));
    const int64_t vocab = separator ? 257 : 256;
    std::vector<int32_t> all(static_cast<size_t>(train.size()));
    train.read(0, train.size(), vocab, all.data());  // every token is below the vocabulary
    std::ifstream log(dir.file("log"));
    std::string first;
    std::getline(log, first);
    EXPECT_EQ(first, separator ? "tokenizer bytes (separator 256 before each file): set "
                                 "model.vocab=257 (or more)"
                               : "tokenizer bytes: set model.vocab=256 (or more)");
  }
}

// An --out that cannot be a folder is one error line and exit 2 (no Python traceback), before
// any input is read.
TEST(PrepareTokens, AnOutThatIsAFileIsOneErrorLine) {
  if (std::system("test -x /usr/bin/python3") != 0) GTEST_SKIP() << "needs /usr/bin/python3";
  TempDir dir;
  dir.write("in.txt", "some text to tokenise\n");
  dir.write("taken", "a file, not a folder\n");
  for (const std::string out : {dir.file("taken"), dir.file("taken") + "/below"}) {
    SCOPED_TRACE(out);
    const std::string command = "/usr/bin/python3 " + std::string(FERRY_SOURCE_DIR) +
                                "/scripts/prepare_tokens.py --tokenizer bytes --out '" + out +
                                "' '" + dir.file("in.txt") + "' > '" + dir.file("log") + "' 2>&1";
    const int status = std::system(command.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << command;
    EXPECT_EQ(WEXITSTATUS(status), 2) << command;
    std::ifstream log(dir.file("log"));
    std::vector<std::string> lines;
    for (std::string line; std::getline(log, line);) lines.push_back(line);
    ASSERT_EQ(lines.size(), 1u) << (lines.empty() ? "" : lines.back());
    EXPECT_EQ(lines[0].rfind("error: --out " + out, 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find("is a file, not a folder"), std::string::npos) << lines[0];
  }
}

}  // namespace
}  // namespace ferry
