// Shape schedules (trainer/plan/shape_schedule.h): data.scales weighted as often as the loader
// really draws each side, padded documents at their batches' lengths, the configured input alone
// without either, and --shapes text parsed (weights normalised, repeats merged) or refused with
// one error naming the option.
#include "trainer/plan/shape_schedule.h"

#include <map>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/temp_dir.h"
#include "tests/trainer/data/test_files.h"
#include "trainer/configured/dataset.h"
#include "trainer/data/loader.h"

namespace ferry {
namespace {

Config images(std::vector<int64_t> scales) {
  Config c = default_config();
  c.model.name = "resnet18_cifar";
  c.data.batch_size = 4;
  c.data.samples = 64;
  c.data.scales = std::move(scales);
  return c;
}

TEST(ShapeSchedule, ScalesAreWeightedAsOftenAsTheLoaderDrawsThem) {
  const Config c = images({24, 32, 32, 48});
  const ShapeSchedule s = shape_schedule(c);
  ASSERT_EQ(s.shapes.size(), 3u);
  EXPECT_EQ(s.shapes[0].input, Shape({4, 3, 24, 24}));
  EXPECT_EQ(s.shapes[1].size, 32);
  EXPECT_DOUBLE_EQ(s.shapes[0].weight, 0.25);
  EXPECT_DOUBLE_EQ(s.shapes[1].weight, 0.5);
  EXPECT_DOUBLE_EQ(s.shapes[2].weight, 0.25);
  EXPECT_EQ(s.largest().size, 48);
  // The loader's draws over 16 epochs of 16 batches match the weights.
  LoaderOptions o;
  o.batch_size = 4;
  o.scales = c.data.scales;
  DataLoader loader(open_configured_dataset(c), o);
  std::map<int64_t, double> drawn;
  const int64_t batches = 16 * loader.batches_per_epoch();
  for (int64_t i = 0; i < batches; ++i) drawn[loader.side(loader.position_after(i))] += 1;
  for (const ScheduledShape& shape : s.shapes) {
    EXPECT_NEAR(drawn[shape.size] / static_cast<double>(batches), shape.weight, 0.06)
        << "side " << shape.size;
  }
}

// Four documents of 3, 5, 9 and 2 positions (separator 9, shared between neighbours), in file
// order: batches of 2 rows pad to 5 -> 8 and 9 -> 12 (data.len_bucket 4); one global batch of
// 4 rows pads to 12.
TEST(ShapeSchedule, PaddedDocumentsTakeTheLengthsOfTheFirstEpochsGlobalBatches) {
  testing::TempDir dir;
  const std::vector<uint16_t> tokens = {9, 1, 2, 9, 1, 2, 3, 4, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 9};
  Config c = default_config();
  c.model.name = "gpt2";
  c.model.layers = 1;
  c.model.heads = 1;
  c.model.width = 8;
  c.model.vocab = 16;
  c.model.context = 16;
  c.data.source = DataSource::kTokens;
  c.data.path = dir.write("docs.bin", testing::llmc_file(tokens));
  c.data.documents = true;
  c.data.eot_token = 9;
  c.data.seq_len = 16;
  c.data.len_bucket = 4;
  c.data.shuffle = false;
  c.data.batch_size = 2;
  const ShapeSchedule one = shape_schedule(c);
  ASSERT_EQ(one.shapes.size(), 2u) << one.source;
  EXPECT_EQ(one.shapes[0].input, Shape({2, 8}));
  EXPECT_EQ(one.shapes[1].input, Shape({2, 12}));
  EXPECT_DOUBLE_EQ(one.shapes[0].weight, 0.5);
  EXPECT_DOUBLE_EQ(one.shapes[1].weight, 0.5);
  // Two ranks of 2 rows: one global batch of every document.
  const ShapeSchedule two = shape_schedule(c, 2);
  ASSERT_EQ(two.shapes.size(), 1u) << two.source;
  EXPECT_EQ(two.shapes[0].input, Shape({2, 12}));
  // Packed rows keep data.seq_len.
  c.data.pack = true;
  const ShapeSchedule packed = shape_schedule(c);
  ASSERT_EQ(packed.shapes.size(), 1u);
  EXPECT_EQ(packed.shapes[0].input, Shape({2, 16}));
}

TEST(ShapeSchedule, WithoutScalesTheConfiguredInputAlone) {
  const ShapeSchedule s = shape_schedule(images({}));
  ASSERT_EQ(s.shapes.size(), 1u);
  EXPECT_EQ(s.shapes[0].input, Shape({4, 3, 32, 32}));
  EXPECT_EQ(s.shapes[0].weight, 1.0);
}

TEST(ShapeSchedule, TextGivesSidesOrTokenLengthsWithNormalisedWeights) {
  const ShapeSchedule s = parse_shape_schedule(images({}), "24:1,48:2.5,24:0.5", "--shapes");
  ASSERT_EQ(s.shapes.size(), 2u);
  EXPECT_EQ(s.shapes[0].input, Shape({4, 3, 24, 24}));
  EXPECT_DOUBLE_EQ(s.shapes[0].weight, 1.5 / 4);
  EXPECT_DOUBLE_EQ(s.shapes[1].weight, 2.5 / 4);
  Config gpt = default_config();
  gpt.model.name = "gpt2";
  gpt.data.source = DataSource::kTokens;
  gpt.data.path = "unused.bin";
  gpt.data.batch_size = 16;
  const ShapeSchedule t = parse_shape_schedule(gpt, "256,1024", "--shapes");
  ASSERT_EQ(t.shapes.size(), 2u);
  EXPECT_EQ(t.shapes[1].input, Shape({16, 1024}));
  EXPECT_DOUBLE_EQ(t.shapes[0].weight, 0.5);
  // Longer than the rows the model reads.
  EXPECT_THROW(parse_shape_schedule(gpt, "2048", "--shapes"), ConfigError);
  for (const char* bad : {"", "0", "24:0", "24:-1", "24:x", "a", "24:1:2", "24,,32", "16385"}) {
    try {
      (void)parse_shape_schedule(images({}), bad, "--shapes");
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--shapes: ", 0), 0u) << e.what();
      EXPECT_NE(e.hint().find("SIZE[:WEIGHT]"), std::string::npos) << e.hint();
    }
  }
}

// Issue 27 item 6: each weight finite but their sum not (1e308 + 1e308) gave every shape weight 0
// and a simulated step of 0.0 s; now one error naming the flag. Inf and weights past a double
// are bad entries.
TEST(ShapeSchedule, WeightsWhoseSumIsNotFiniteAreRefused) {
  try {
    (void)parse_shape_schedule(images({}), "160:1e308,224:1e308", "--shapes");
    ADD_FAILURE() << "weights summing to infinity were accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--shapes: the weights in '160:1e308,224:1e308'", 0), 0u)
        << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
  for (const char* bad : {"24:inf", "24:nan", "24:1e309"})
    EXPECT_THROW((void)parse_shape_schedule(images({}), bad, "--shapes"), ConfigError) << bad;
  // Large but summable weights are relative, as small ones.
  const ShapeSchedule s = parse_shape_schedule(images({}), "24:1e307,32:3e307", "--shapes");
  ASSERT_EQ(s.shapes.size(), 2u);
  EXPECT_DOUBLE_EQ(s.shapes[0].weight, 0.25);
}

}  // namespace
}  // namespace ferry
