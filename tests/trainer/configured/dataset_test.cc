// open_configured_dataset for the token source: training reads data.path in random windows
// (consecutive with data.shuffle false), evaluation reads data.val_path (else data.path) in
// consecutive windows; the vocabulary is model.vocab, the window data.seq_len or model.context.
#include "trainer/configured/dataset.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/temp_dir.h"

namespace ferry {
namespace {

// A headerless (nanoGPT) file of tokens first, first + 1, ...
std::string counting(int first, int n) {
  std::string out;
  for (int i = first; i < first + n; ++i) {
    out.push_back(static_cast<char>(i & 0xff));
    out.push_back(static_cast<char>(i >> 8));
  }
  return out;
}

int32_t first_token(const Dataset& ds, int64_t index) {
  std::vector<int32_t> in(static_cast<size_t>(ds.sample_shape()[0])), labels(in.size());
  ds.read(index, 0, in.data(), labels.data());
  return in[0];
}

TEST(DataSetup, TokenSourceReadsTrainAndValidationFiles) {
  testing::TempDir dir;
  const std::string train = dir.write("train.bin", counting(0, 1000));
  const std::string val = dir.write("val.bin", counting(5000, 101));
  Config c = parse_config_text(
      "model:\n  name: gpt2\n  vocab: 8192\n  context: 64\ndata:\n  source: tokens\n  path: " +
      train + "\n  seq_len: 10\n");
  const auto training = open_configured_dataset(c);
  EXPECT_EQ(training->size(), 99);
  EXPECT_EQ(training->sample_shape(), (Shape{10}));
  EXPECT_EQ(training->classes(), 8192);
  // Random windows: not all at multiples of 10.
  bool off_grid = false;
  for (int64_t k = 0; k < 20; ++k) off_grid = off_grid || first_token(*training, k) % 10 != 0;
  EXPECT_TRUE(off_grid);
  // No val_path: evaluation walks data.path in order.
  EXPECT_EQ(first_token(*open_configured_dataset(c, true), 3), 30);
  c.data.val_path = val;
  const auto eval = open_configured_dataset(c, true);
  EXPECT_EQ(eval->size(), 10);
  EXPECT_EQ(first_token(*eval, 3), 5030);
  c.data.shuffle = false;
  EXPECT_EQ(first_token(*open_configured_dataset(c), 7), 70);
  c.data.seq_len = 0;  // model.context
  EXPECT_EQ(open_configured_dataset(c)->sample_shape(), (Shape{64}));
  c.data.seq_len = 65;
  EXPECT_THROW(open_configured_dataset(c), ConfigError);
  c.data.seq_len = 10;
  c.model.name = "resnet18_cifar";  // an image model cannot read tokens
  EXPECT_THROW(open_configured_dataset(c), ConfigError);
}

}  // namespace
}  // namespace ferry
