// The imagefolder source: torchvision's folder layout and order, clear errors for empty
// classes and unreadable files (or a logged skip with skip_bad), results that do not depend on
// the number of loader workers, and resnet18 training on a generated folder, bitwise
// reproducible for a seed.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/trainer/data/image_files.h"
#include "tests/trainer/data/test_files.h"
#include "trainer/config/config.h"
#include "trainer/data/dataset.h"
#include "trainer/data/loader.h"
#include "trainer/session/train.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using testing::encode_jpeg;
using testing::encode_png;
using testing::error_of;
using testing::jpeg_claiming;
using testing::pattern;
using testing::TempDir;
using testing::write_bytes;

// Writes a small folder: classes "bird", "cat", "dog" (created out of order), mixed formats,
// sizes and case of extensions, a nested subfolder and a file that is not an image.
void write_folder(const fs::path& root) {
  for (const char* c : {"dog", "bird", "cat"}) fs::create_directories(root / c);
  fs::create_directories(root / "cat" / "more");
  write_bytes((root / "bird" / "b1.jpg").string(),
              encode_jpeg(pattern(90, 70, 3, 1), 90, 70, TJPF_RGB));
  write_bytes((root / "bird" / "b0.PNG").string(),
              encode_png(pattern(50, 80, 3, 2), 50, 80, 8, PNG_COLOR_TYPE_RGB));
  write_bytes((root / "cat" / "c0.jpeg").string(),
              encode_jpeg(pattern(40, 40, 1, 3), 40, 40, TJPF_GRAY));
  write_bytes((root / "cat" / "more" / "c1.jpg").string(),
              encode_jpeg(pattern(120, 30, 4, 4), 120, 30, TJPF_CMYK));
  write_bytes((root / "cat" / "notes.txt").string(), {'h', 'i'});
  write_bytes((root / "dog" / "d0.png").string(),
              encode_png(pattern(33, 66, 4, 5), 33, 66, 8, PNG_COLOR_TYPE_RGBA));
  write_bytes((root / "dog" / "d1.jpg").string(),
              encode_jpeg(pattern(200, 150, 3, 6), 200, 150, TJPF_RGB));
}

ImageFolderOptions options(const fs::path& root, bool augment) {
  ImageFolderOptions o;
  o.path = root.string();
  o.crop_height = o.crop_width = 24;
  o.resize = 28;
  o.augment = augment;
  o.seed = 5;
  return o;
}

TEST(ImageFolder, FollowsTorchvisionLayoutAndOrder) {
  TempDir dir;
  write_folder(dir.path());
  const auto ds = load_imagefolder_dataset(options(dir.path(), false));
  EXPECT_EQ(ds->size(), 6);
  EXPECT_EQ(ds->classes(), 3);
  EXPECT_EQ(ds->image_shape(), (Shape{3, 24, 24}));
  std::vector<float> px(3 * 24 * 24);
  // bird: b0.PNG, b1.jpg; cat: c0.jpeg, more/c1.jpg; dog: d0.png, d1.jpg.
  const std::vector<int32_t> labels = {0, 0, 1, 1, 2, 2};
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(ds->get(i, px.data()), labels[static_cast<size_t>(i)]) << i;
    for (float v : px) ASSERT_TRUE(v >= 0.0f && v <= 1.0f);
  }
  EXPECT_NE(ds->describe().find("6 images, 3 classes"), std::string::npos) << ds->describe();
}

TEST(ImageFolder, EmptyClassesAndMissingFoldersAreErrorsBeforeTraining) {
  TempDir dir;
  write_folder(dir.path());
  fs::create_directories(dir.path() / "empty");
  std::string e = error_of<DataError>([&] { load_imagefolder_dataset(options(dir.path(), true)); });
  EXPECT_NE(e.find("class folder '" + (dir.path() / "empty").string() + "'"), std::string::npos)
      << e;
  EXPECT_NE(e.find("holds no .jpg, .jpeg or .png file"), std::string::npos) << e;
  TempDir bare;
  e = error_of<DataError>([&] { load_imagefolder_dataset(options(bare.path(), true)); });
  EXPECT_NE(e.find("holds no class subfolders"), std::string::npos) << e;
  e = error_of<DataError>([&] { load_imagefolder_dataset(options(bare.path() / "nope", true)); });
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
}

TEST(ImageFolder, ATruncatedJpegIsAClearErrorOrASkipWithSkipBad) {
  TempDir dir;
  write_folder(dir.path());
  const auto good = encode_jpeg(pattern(64, 64, 3, 9), 64, 64, TJPF_RGB);
  const std::string bad = (dir.path() / "cat" / "c00_truncated.jpg").string();
  write_bytes(bad, std::vector<uint8_t>(good.begin(), good.begin() + good.size() / 2));
  std::vector<float> px(3 * 24 * 24);
  {
    const auto ds = load_imagefolder_dataset(options(dir.path(), true));
    ASSERT_EQ(ds->size(), 7);
    // cat: c0.jpeg, c00_truncated.jpg, more/c1.jpg -> index 3 is the truncated file.
    const std::string e = error_of<DataError>([&] { ds->get(3, px.data()); });
    EXPECT_NE(e.find("cannot decode image '" + bad + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  }
  ImageFolderOptions o = options(dir.path(), true);
  o.skip_bad = true;
  const auto ds = load_imagefolder_dataset(o);
  std::vector<float> next(px.size());
  EXPECT_EQ(ds->sample(3, 0, px.data()), 1);  // replaced by the next readable file, c1 (cat)
  EXPECT_EQ(ds->sample(4, 0, next.data()), 1);
  EXPECT_EQ(px, next);
  EXPECT_EQ(ds->skipped(), 1);
  const auto warnings = ds->take_warnings();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("skipping unreadable image '" + bad + "'"), std::string::npos)
      << warnings[0];
  ds->sample(3, 1, px.data());
  EXPECT_TRUE(ds->take_warnings().empty()) << "each bad file is reported once";
  EXPECT_EQ(ds->skipped(), 1);
}

// Issue 15's repro: 25 good 48x40 JPEGs per class and one whose header claims 1 x 65535 pixels,
// read by one loader thread. Only the bad file is skipped (it used to poison the thread's
// decoder, so every later good file failed too); evaluation counts and scores only readable
// images, exactly as over the folder without the bad file.
TEST(ImageFolder, OneBadJpegSkipsOnlyItselfAndEvalScoresOnlyReadableImages) {
  TempDir dir;
  for (const char* c : {"cat", "dog"}) {
    fs::create_directories(dir.path() / "train" / c);
    fs::create_directories(dir.path() / "clean" / c);
    for (int i = 0; i < 25; ++i) {
      const auto jpeg =
          encode_jpeg(pattern(48, 40, 3, i + (c[0] == 'd' ? 50 : 0)), 48, 40, TJPF_RGB);
      for (const char* set : {"train", "clean"}) {
        write_bytes((dir.path() / set / c / fmt::format("{:02d}.jpg", i + 1)).string(), jpeg);
      }
    }
  }
  write_bytes((dir.path() / "train" / "cat" / "00_bad.jpg").string(), jpeg_claiming(1, 65535));
  ImageFolderOptions o = options(dir.path() / "train", false);
  o.skip_bad = true;
  std::shared_ptr<const Dataset> ds = load_imagefolder_dataset(o);
  ASSERT_EQ(ds->size(), 51);
  LoaderOptions lo;
  lo.batch_size = 8;
  lo.shuffle = false;
  lo.drop_last = false;
  lo.epochs = 1;
  lo.workers = 1;
  {
    DataLoader loader(ds, lo);
    while (Batch b = loader.next()) {
    }
  }
  EXPECT_EQ(ds->skipped(), 1);
  EXPECT_TRUE(ds->unreadable(0));
  EXPECT_FALSE(ds->unreadable(1));

  const std::string run_dir = (dir.path() / "run").string();
  const std::string yaml = "run: {steps: 2, dir: " + run_dir +
                           "}\n"
                           "model: {name: mlp, classes: 2, input: [3, 16, 16]}\n"
                           "data: {source: imagefolder, path: " +
                           (dir.path() / "clean").string() +
                           ", batch_size: 8, resize: 18, workers: 1}\n"
                           "checkpoint: {every: 2}\n"
                           "device: {memory: 256MiB, threads: 1}\n"
                           "topology: {bind: false}\n";
  train(parse_config_text(yaml), RankInfo{});
  const EvalResult clean = evaluate(parse_config_text(yaml));
  const EvalResult skipping = evaluate(parse_config_text(
      yaml, {"data.path=" + (dir.path() / "train").string(), "data.skip_bad=true"}));
  EXPECT_EQ(clean.samples, 50);
  EXPECT_EQ(skipping.samples, 50);
  EXPECT_EQ(skipping.accuracy, clean.accuracy);
  EXPECT_NEAR(skipping.loss, clean.loss, 1e-5 * std::abs(clean.loss));
}

TEST(ImageFolder, AClassWithNoReadableImageIsAnErrorEvenWithSkipBad) {
  TempDir dir;
  write_folder(dir.path());
  fs::create_directories(dir.path() / "empty_inside");
  write_bytes((dir.path() / "empty_inside" / "x.jpg").string(), jpeg_claiming(1, 65535));
  write_bytes((dir.path() / "empty_inside" / "y.png").string(), {'n', 'o', 'p', 'e'});
  ImageFolderOptions o = options(dir.path(), true);
  o.skip_bad = true;
  const auto ds = load_imagefolder_dataset(o);
  std::vector<float> px(3 * 24 * 24);
  std::string e;
  for (int64_t i = 0; i < ds->size() && e.empty(); ++i) {
    try {
      ds->sample(i, 0, px.data());
    } catch (const DataError& error) {
      e = error.what();
    }
  }
  EXPECT_NE(e.find("class 'empty_inside' has no readable image (all 2 skipped)"), std::string::npos)
      << e;
}

// Every batch of `epochs` epochs, images and labels concatenated.
std::vector<float> all_batches(std::shared_ptr<const Dataset> ds, int workers, int64_t epochs) {
  LoaderOptions lo;
  lo.batch_size = 2;
  lo.seed = 11;
  lo.workers = workers;
  lo.epochs = epochs;
  lo.mean = {0.485f, 0.456f, 0.406f};
  lo.stddev = {0.229f, 0.224f, 0.225f};
  DataLoader loader(std::move(ds), lo);
  std::vector<float> out;
  while (Batch b = loader.next()) {
    const int64_t n = b.size() * 3 * 24 * 24;
    out.insert(out.end(), b.images(), b.images() + n);
    for (int64_t i = 0; i < b.size(); ++i) out.push_back(static_cast<float>(b.labels()[i]));
  }
  return out;
}

TEST(ImageFolder, WorkersDoNotChangeTheBatchesAndEpochsChangeTheAugmentation) {
  TempDir dir;
  write_folder(dir.path());
  std::shared_ptr<const Dataset> ds = load_imagefolder_dataset(options(dir.path(), true));
  const std::vector<float> one = all_batches(ds, 1, 2);
  const std::vector<float> three = all_batches(ds, 3, 2);
  ASSERT_EQ(one.size(), 2u * 6 * (3 * 24 * 24 + 1));
  EXPECT_EQ(one, three);
  // The same sample differs between epochs (another crop and flip) but not between calls.
  std::vector<float> a(3 * 24 * 24), b(a.size()), c(a.size());
  ds->sample(5, 0, a.data());
  ds->sample(5, 1, b.data());
  ds->sample(5, 0, c.data());
  EXPECT_NE(a, b);
  EXPECT_EQ(a, c);
}

// data.scales: training's RandomResizedCrop targets the batch's side, the same box and flip as
// at data.crop (a function of seed, epoch and index, scaled to the side); evaluation cannot
// resize.
TEST(ImageFolder, TrainingCropsAtAnySideAndEvaluationKeepsItsCrop) {
  TempDir dir;
  write_folder(dir.path());
  std::shared_ptr<const Dataset> train = load_imagefolder_dataset(options(dir.path(), true));
  std::shared_ptr<const Dataset> eval = load_imagefolder_dataset(options(dir.path(), false));
  EXPECT_EQ(train->max_side(), kMaxScaleSide);
  EXPECT_EQ(eval->max_side(), 0);
  std::vector<float> at24(3 * 24 * 24), same(at24.size()), at40(3 * 40 * 40), again(at40.size());
  int32_t label24 = -1, label40 = -1, label = -1;
  train->read_at(5, 1, 24, same.data(), &label);
  label24 = train->sample(5, 1, at24.data());
  EXPECT_EQ(same, at24) << "at data.crop's side read_at is sample()";
  EXPECT_EQ(label, label24);
  train->read_at(5, 1, 40, at40.data(), &label40);
  train->read_at(5, 1, 40, again.data(), &label);
  EXPECT_EQ(at40, again);
  EXPECT_EQ(label40, label24);
  EXPECT_TRUE(std::all_of(at40.begin(), at40.end(), [](float v) { return v >= 0 && v <= 1; }));
  // The same crop at another resolution: the means agree closely.
  const double m24 = std::accumulate(at24.begin(), at24.end(), 0.0) / at24.size();
  const double m40 = std::accumulate(at40.begin(), at40.end(), 0.0) / at40.size();
  EXPECT_NEAR(m24, m40, 0.05);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(ImageFolder, TrainingStopsAtATruncatedJpegOrLogsTheSkipWithSkipBad) {
  TempDir dir;
  write_folder(dir.path() / "train");
  const auto good = encode_jpeg(pattern(64, 64, 3, 9), 64, 64, TJPF_RGB);
  const std::string bad = (dir.path() / "train" / "dog" / "d2_cut.jpg").string();
  write_bytes(bad, std::vector<uint8_t>(good.begin(), good.begin() + good.size() / 3));
  const std::string yaml =
      "run: {steps: 2, log_every: 1}\n"
      "model: {name: mlp, classes: 3, input: [3, 16, 16]}\n"
      "data: {source: imagefolder, path: " +
      (dir.path() / "train").string() +
      ", batch_size: 7, workers: 2}\n"
      "device: {memory: 256MiB, threads: 1}\n"
      "topology: {bind: false}\n";
  const std::string failing = (dir.path() / "fail").string();
  const std::string e = error_of<DataError>(
      [&] { train(parse_config_text(yaml, {"run.dir=" + failing}), RankInfo{}); });
  EXPECT_NE(e.find("cannot decode image '" + bad + "'"), std::string::npos) << e;
  const std::string skipping = (dir.path() / "skip").string();
  const TrainResult r =
      train(parse_config_text(yaml, {"run.dir=" + skipping, "data.skip_bad=true"}), RankInfo{});
  EXPECT_EQ(r.steps, 2);
  const std::string log = read_text(skipping + "/rank0.log");
  EXPECT_NE(log.find("warning: skipping unreadable image '" + bad + "'"), std::string::npos) << log;
  EXPECT_NE(log.find("1 unreadable image skipped"), std::string::npos) << log;
}

TEST(ImageFolder, EvalReadsValPathAndReportsTopOneAndTopFive) {
  TempDir dir;
  write_folder(dir.path() / "train");
  fs::create_directories(dir.path() / "val" / "a");
  fs::create_directories(dir.path() / "val" / "b");
  const char* names[] = {"a/v0.jpg", "a/v1.jpg", "b/v2.jpg"};
  for (int i = 0; i < 3; ++i) {
    write_bytes((dir.path() / "val" / names[i]).string(),
                encode_jpeg(pattern(30 + i, 20, 3, i), 30 + i, 20, TJPF_RGB));
  }
  const std::string run_dir = (dir.path() / "run").string();
  const std::string yaml = "run: {steps: 1, dir: " + run_dir +
                           "}\n"
                           "model: {name: mlp, classes: 7, input: [3, 16, 16]}\n"
                           "data: {source: imagefolder, path: " +
                           (dir.path() / "train").string() +
                           ", batch_size: 2, resize: 18}\n"
                           "checkpoint: {every: 1}\n"
                           "device: {memory: 256MiB, threads: 1}\n"
                           "topology: {bind: false}\n";
  train(parse_config_text(yaml), RankInfo{});
  const EvalResult all = evaluate(parse_config_text(yaml));
  EXPECT_EQ(all.samples, 6);
  const EvalResult val =
      evaluate(parse_config_text(yaml, {"data.val_path=" + (dir.path() / "val").string()}));
  EXPECT_EQ(val.samples, 3);
  EXPECT_GE(val.top5_accuracy, val.accuracy);
  const std::string json = read_text(run_dir + "/eval.json");
  EXPECT_NE(json.find("\"top5_accuracy\""), std::string::npos) << json;
}

TEST(ImageFolder, Resnet18TrainsAndTwoRunsWithTheSameSeedAreBitwiseEqual) {
  TempDir dir;
  write_folder(dir.path() / "train");
  const std::string yaml =
      "run: {steps: 3, log_every: 1, seed: 3}\n"
      "model: {name: resnet18, classes: 3, input: [3, 32, 32]}\n"
      "data: {source: imagefolder, path: " +
      (dir.path() / "train").string() +
      ", batch_size: 2, workers: 2, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}\n"
      "optim: {lr: 0.01}\n"
      "device: {memory: 2GiB, threads: 2}\n"
      "topology: {bind: false}\n";
  std::vector<std::string> runs;
  for (int r = 0; r < 2; ++r) {
    const std::string run_dir = (dir.path() / ("run" + std::to_string(r))).string();
    const Config config = parse_config_text(yaml, {"run.dir=" + run_dir});
    const TrainResult result = train(config, RankInfo{});
    EXPECT_EQ(result.steps, 3);
    EXPECT_TRUE(std::isfinite(result.last_loss));
    runs.push_back(read_text(run_dir + "/metrics.jsonl"));
  }
  // The losses (and everything else but timings) of each step are equal.
  const auto losses = [](const std::string& text) {
    std::vector<std::string> out;
    size_t at = 0;
    while ((at = text.find("\"loss\":", at)) != std::string::npos) {
      const size_t end = text.find(',', at);
      out.push_back(text.substr(at, end - at));
      at = end;
    }
    return out;
  };
  ASSERT_EQ(losses(runs[0]).size(), 3u) << runs[0];
  EXPECT_EQ(losses(runs[0]), losses(runs[1]));
}

}  // namespace
}  // namespace ferry
