// llm.c's uint32 token files (ids of 65,536 and above) and the whole-file vocabulary scan: a
// round trip through the same loader as the uint16 formats, every malformed uint32 file by its
// exact message, and a token >= vocab refused when the file opens, at its first position.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/trainer/data/test_files.h"
#include "trainer/data/dataset.h"
#include "trainer/data/documents.h"
#include "trainer/data/token_file.h"

namespace ferry {
namespace {

using testing::error_of;
using testing::llmc32_file;
using testing::llmc_file;
using testing::TempDir;
using testing::u16_tokens;

std::string file_error(const std::string& path) {
  return error_of<DataError>([&] { TokenFile file(path); });
}

TEST(TokenFile, Uint32FileRoundTripsIdsAbove65535) {
  TempDir dir;
  // Llama 3's and Qwen's sizes of vocabulary, the uint16 edge, and a window of counting ids.
  std::vector<uint32_t> tokens = {0, 65535, 65536, 128000, 128255, 151642, 7, 2147483647u};
  for (uint32_t i = 0; i < 1000; ++i) tokens.push_back(70000 + i);
  const std::string path = dir.write("llama3.bin", llmc32_file(tokens));
  TokenFile file(path);
  EXPECT_EQ(file.format(), TokenFormat::kLlmc32);
  EXPECT_STREQ(file.format_name(), "llm.c uint32");
  EXPECT_EQ(file.token_bytes(), 4);
  ASSERT_EQ(file.size(), static_cast<int64_t>(tokens.size()));
  for (int64_t i = 0; i < file.size(); ++i) EXPECT_EQ(file.at(i), tokens[i]) << i;
  std::vector<int32_t> out(7);
  file.read(0, 7, 151936, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{0, 65535, 65536, 128000, 128255, 151642, 7}));
  EXPECT_EQ(file.positions_of(128000), (std::vector<int64_t>{3}));
  EXPECT_EQ(file.positions_of(70999), (std::vector<int64_t>{1007}));
  EXPECT_TRUE(file.positions_of(5).empty());
  // The uint16 formats read as before, two bytes a token, and hold no id above 65535.
  TokenFile narrow(dir.write("gpt2.bin", llmc_file({50256, 3})));
  EXPECT_EQ(narrow.token_bytes(), 2);
  EXPECT_TRUE(narrow.positions_of(65536 + 50256).empty());
  EXPECT_EQ(narrow.positions_of(50256), (std::vector<int64_t>{0}));
}

TEST(TokenFile, MalformedUint32FilesNameTheProblem) {
  TempDir dir;
  const auto p = [&](const std::string& name, const std::string& bytes) {
    return dir.write(name, bytes);
  };
  const std::vector<uint32_t> four = {1, 2, 3, 70000};
  std::string path = p("v1.bin", llmc32_file(four, -1, 1));
  EXPECT_EQ(file_error(path),
            "token file '" + path + "': llm.c uint32 token format version 1, expected 7");
  path = p("trunc.bin", llmc32_file(four, 5));
  EXPECT_EQ(file_error(path), "token file '" + path +
                                  "': llm.c uint32 header says 5 tokens but the file holds 4 "
                                  "(truncated)");
  path = p("long.bin", llmc32_file(four, 3));
  EXPECT_EQ(file_error(path), "token file '" + path +
                                  "': llm.c uint32 header says 3 tokens but the file holds 4 "
                                  "(bytes after the last token)");
  path = p("ragged.bin", llmc32_file(four) + "xy");
  EXPECT_EQ(file_error(path), "token file '" + path +
                                  "': holds 18 token bytes after the header, not a multiple of "
                                  "4; tokens are uint32");
  path = p("short.bin", llmc32_file({}).substr(0, 12));
  EXPECT_EQ(file_error(path), "token file '" + path +
                                  "': llm.c uint32 header (magic 20240801) is cut short: the "
                                  "file is 12 bytes, the header 1024");
  path = p("negative.bin", llmc32_file({}).replace(8, 4, std::string("\xfe\xff\xff\xff", 4)));
  EXPECT_EQ(file_error(path),
            "token file '" + path + "': llm.c uint32 header gives a negative token count (-2)");
  path = p("none.bin", llmc32_file({}));
  EXPECT_EQ(file_error(path), "token file '" + path + "': holds no tokens");
}

TEST(TokenFile, ReadRefusesAUint32TokenAtOrAboveTheVocabulary) {
  TempDir dir;
  const std::string path = dir.write("t.bin", llmc32_file({5, 128000, 128256, 9}));
  TokenFile file(path);
  std::vector<int32_t> out(4);
  file.read(0, 2, 128256, out.data());
  EXPECT_EQ(error_of<DataError>([&] { file.read(0, 4, 128256, out.data()); }),
            "token file '" + path +
                "': token 128256 at position 2 is outside the vocabulary of 128256 "
                "(model.vocab)");
}

// The scan's blocks are 16384 tokens: bad tokens in the first block, at a block's last and next
// block's first position, only in a later block, and in the last partial block.
TEST(TokenFile, CheckVocabNamesTheFirstBadPositionAndTheLargestToken) {
  TempDir dir;
  const int64_t n = 3 * 16384 + 100;
  for (const int64_t first : {int64_t{0}, int64_t{16383}, int64_t{16384}, int64_t{40000}, n - 1}) {
    SCOPED_TRACE(first);
    std::vector<uint16_t> narrow(static_cast<size_t>(n), 17);
    std::vector<uint32_t> wide(static_cast<size_t>(n), 70000);
    narrow[first] = 300;
    wide[first] = 200000;
    if (first + 1 < n) {  // a later, larger bad token: the first one is named, the largest too
      narrow.back() = 301;
      wide.back() = 200001;
    }
    const std::string a = dir.write("a.bin", llmc_file(narrow));
    const std::string b = dir.write("b.bin", u16_tokens(narrow));
    const std::string c = dir.write("c.bin", llmc32_file(wide));
    const std::string bigger = first + 1 < n ? "1" : "0";
    for (const std::string& path : {a, b}) {
      TokenFile file(path);
      EXPECT_EQ(file.scan(256).first_outside, first);
      EXPECT_EQ(error_of<DataError>([&] { file.check_vocab(256); }),
                "token file '" + path + "': token 300 at position " + std::to_string(first) +
                    " is outside the vocabulary of 256 (model.vocab); the file's largest token "
                    "is 30" +
                    bigger);
      file.check_vocab(302);
      file.check_vocab(65536);  // no uint16 can be outside: no pass
    }
    TokenFile file(c);
    EXPECT_EQ(error_of<DataError>([&] { file.check_vocab(128256); }),
              "token file '" + c + "': token 200000 at position " + std::to_string(first) +
                  " is outside the vocabulary of 128256 (model.vocab); the file's largest token "
                  "is 20000" +
                  bigger);
    EXPECT_EQ(file.scan(200002).first_outside, -1);
    EXPECT_EQ(file.scan(200002).largest, first + 1 < n ? 200001u : 200000u);
    file.check_vocab(200002);
  }
  // A token no int32 holds is outside any vocabulary.
  const std::string huge = dir.write("huge.bin", llmc32_file({1, 3000000000u}));
  EXPECT_THROW(TokenFile(huge).check_vocab(int64_t{1} << 40), DataError);
}

// open_dataset (what train and eval call) refuses the file before any window or row is read;
// load_token_dataset alone still checks each token as it is read.
TEST(TokenFile, OpenDatasetRefusesABadTokenBeforeTraining) {
  TempDir dir;
  std::vector<uint32_t> tokens(500, 65536);
  for (size_t i = 0; i < tokens.size(); i += 50) tokens[i] = 100000;  // the separator
  tokens[321] = 150000;
  DatasetSpec spec;
  spec.source = "tokens";
  spec.augment = false;  // consecutive windows: window 0 starts at token 0
  spec.path = dir.write("t.bin", llmc32_file(tokens));
  spec.seq_len = 16;
  spec.classes = 131072;
  spec.eot = 100000;
  const std::string expected = "token file '" + spec.path +
                               "': token 150000 at position 321 is outside the vocabulary of "
                               "131072 (model.vocab); the file's largest token is 150000";
  for (const bool documents : {false, true}) {
    SCOPED_TRACE(documents);
    spec.documents = documents;
    spec.classes = 131072;
    EXPECT_EQ(error_of<DataError>([&] { open_dataset(spec); }), expected);
    spec.classes = 150001;
    const auto ds = open_dataset(spec);
    EXPECT_EQ(ds->size(), documents ? 10 : 31);
    std::vector<int32_t> in(16), labels(16);
    ds->read_row(0, 0, 16, in.data(), labels.data(), nullptr);
    EXPECT_EQ(in[0], 100000);
    EXPECT_EQ(in[1], 65536);
  }
  EXPECT_NE(open_dataset(spec)->describe().find("(llm.c uint32, 500 tokens"), std::string::npos)
      << open_dataset(spec)->describe();
  // The lazy loader: opening succeeds, the bad window does not.
  const auto lazy = load_token_dataset({spec.path, 16, 131072, false, 0});
  std::vector<int32_t> in(16), labels(16);
  lazy->read(0, 0, in.data(), labels.data());
  EXPECT_THROW(lazy->read(20, 0, in.data(), labels.data()), DataError);
}

// Documents of a uint32 file split at an end-of-text id above 65535 (Llama 3's 128001).
TEST(TokenFile, DocumentsOfAUint32FileSplitAtAWideSeparator) {
  TempDir dir;
  const uint32_t eot = 128001;
  const std::vector<uint32_t> tokens = {eot, 70000, 70001, eot, 90000, eot, 1, 2, 3};
  const std::string path = dir.write("t.bin", llmc32_file(tokens));
  TokenFile file(path);
  const DocumentIndex index = index_documents(file, eot, 8);
  EXPECT_EQ(index.start, (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(index.length, (std::vector<int32_t>{3, 2, 3}));
  const auto ds = load_document_dataset({path, 8, 128256, eot, false});
  std::vector<int32_t> in(8), labels(8);
  ds->read_row(0, 0, 3, in.data(), labels.data(), nullptr);
  EXPECT_EQ(std::vector<int32_t>(in.begin(), in.begin() + 3),
            (std::vector<int32_t>{128001, 70000, 70001}));
  EXPECT_EQ(std::vector<int32_t>(labels.begin(), labels.begin() + 3),
            (std::vector<int32_t>{70000, 70001, 128001}));
}

}  // namespace
}  // namespace ferry
