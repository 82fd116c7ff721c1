// An image folder in torchvision's ImageFolder layout, each sample read, decoded and transformed
// on demand (Note [Image folder samples]). Invariant: a sample's pixels are a pure function of
// (files, options, epoch, index), so no thread count or timing can change a batch.
#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "device/counter_rng.h"
#include "trainer/data/dataset.h"
#include "trainer/data/image_decode.h"
#include "trainer/data/image_transform.h"
#include "trainer/data/read_file.h"

// Note [Image folder samples]
// The layout: one subfolder per class (classes sorted by name), image files anywhere below it.
// A sample's pixels are a pure function of (files, options, epoch, index): augmentation draws
// from a counter-based stream keyed by (seed, epoch, index), and a skipped file is replaced by
// the next readable one in folder order.

namespace ferry {

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kAugmentDomain = 0x496d616765417567ull;  // "ImageAug"
constexpr const char* kLayoutHint =
    "data.path must be a folder with one subfolder per class holding .jpg, .jpeg or .png "
    "files (torchvision's ImageFolder layout)";

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// The image files below `dir` in torchvision's order: folders (dir and its subfolders, links
// followed) sorted by path, files sorted by name within each.
std::vector<std::string> image_files(const fs::path& dir) {
  std::vector<std::pair<std::string, std::vector<std::string>>> folders;
  std::error_code ec;
  std::vector<fs::path> pending{dir};
  std::set<fs::path> seen;
  while (!pending.empty()) {
    const fs::path folder = pending.back();
    pending.pop_back();
    const fs::path canonical = fs::weakly_canonical(folder, ec);
    if (!seen.insert(ec ? folder : canonical).second) continue;  // a link cycle
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(folder, ec)) {
      std::error_code type_ec;
      if (entry.is_directory(type_ec)) {
        pending.push_back(entry.path());
      } else if (entry.is_regular_file(type_ec) && is_image_file(entry.path())) {
        files.push_back(entry.path().filename().string());
      }
    }
    if (ec) {
      throw DataError(fmt::format("cannot list folder '{}': {}", folder.string(), ec.message()),
                      kLayoutHint);
    }
    std::sort(files.begin(), files.end());
    folders.emplace_back(folder.string(), std::move(files));
  }
  std::sort(folders.begin(), folders.end());
  std::vector<std::string> out;
  for (const auto& [folder, files] : folders) {
    for (const auto& f : files) out.push_back((fs::path(folder) / f).string());
  }
  return out;
}

class ImageFolderDataset : public Dataset {
 public:
  ImageFolderDataset(ImageFolderOptions options, std::vector<std::string> classes,
                     std::vector<std::string> files, std::vector<int32_t> labels)
      : o_(std::move(options)),
        classes_(std::move(classes)),
        files_(std::move(files)),
        labels_(std::move(labels)) {}

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  Shape image_shape() const override { return Shape{3, o_.crop_height, o_.crop_width}; }
  int64_t classes() const override { return static_cast<int64_t>(classes_.size()); }
  std::string describe() const override {
    const std::string transform =
        o_.augment ? fmt::format("random-resized-crop {}x{} + flip", o_.crop_height, o_.crop_width)
                   : fmt::format("resize {} + center-crop {}x{}", o_.resize, o_.crop_height,
                                 o_.crop_width);
    return fmt::format("imagefolder '{}' ({} images, {} classes, {})", o_.path, size(), classes(),
                       transform);
  }

  int32_t get(int64_t index, float* pixels) const override { return sample(index, 0, pixels); }

  int32_t sample(int64_t index, int64_t epoch, float* pixels) const override {
    return sample_at(index, epoch, o_.crop_height, o_.crop_width, pixels);
  }

  // Training: RandomResizedCrop targets any side (evaluation keeps data.crop).
  int64_t max_side() const override { return o_.augment ? kMaxScaleSide : 0; }
  void read_at(int64_t index, int64_t epoch, int64_t side, float* pixels,
               int32_t* labels) const override {
    labels[0] = sample_at(index, epoch, side, side, pixels);
  }

 private:
  int32_t sample_at(int64_t index, int64_t epoch, int64_t height, int64_t width,
                    float* pixels) const {
    FERRY_ASSERT(index >= 0 && index < size(), "imagefolder sample index out of range");
    // With skip_bad, an unreadable file is replaced by the next readable one (deterministic).
    for (int64_t tries = 0; tries < size(); ++tries) {
      const int64_t i = (index + tries) % size();
      if (o_.skip_bad && is_bad(i)) continue;
      try {
        const std::string& path = files_[i];
        const RgbImage image = read_image(path);
        try {
          transform(image, i, epoch, height, width, pixels);
        } catch (const DataError& e) {
          throw DataError(fmt::format("image '{}': {}", path, e.what()), e.hint());
        }
        return labels_[i];
      } catch (const DataError& e) {
        if (!o_.skip_bad) throw;
        mark_bad(i, e.what());
      }
    }
    throw DataError(fmt::format("imagefolder '{}': no image could be read", o_.path), kLayoutHint);
  }

 public:
  bool unreadable(int64_t index) const override { return is_bad(index); }

  std::vector<std::string> take_warnings() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    out.swap(warnings_);
    return out;
  }
  int64_t skipped() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(bad_.size());
  }

 private:
  void transform(const RgbImage& image, int64_t index, int64_t epoch, int64_t height, int64_t width,
                 float* pixels) const {
    thread_local std::vector<uint8_t> hwc;
    hwc.resize(static_cast<size_t>(height) * width * 3);
    bool flip = false;
    if (o_.augment) {
      const uint64_t key =
          counter_hash(counter_hash(o_.seed ^ kAugmentDomain, static_cast<uint64_t>(epoch)),
                       static_cast<uint64_t>(index));
      flip = train_transform(image, static_cast<int>(height), static_cast<int>(width), key,
                             hwc.data());
    } else {
      eval_transform(image, static_cast<int>(o_.resize), static_cast<int>(o_.crop_height),
                     static_cast<int>(o_.crop_width), hwc.data());
    }
    hwc_to_chw(hwc.data(), static_cast<int>(width), static_cast<int>(height), flip, pixels);
  }

  // The signature is checked before the file is read, and its size before it is allocated.
  RgbImage read_image(const std::string& path) const {
    constexpr const char* kHint = "check the file's permissions, or set data.skip_bad=true";
    const std::vector<uint8_t> head = data_detail::read_file_head(path, 8, "image", kHint);
    if (sniff_image_format(head.data(), head.size()) == ImageFormat::kUnknown) {
      return decode_image(head.data(), head.size(), path, o_.limits);  // throws, naming why
    }
    const std::vector<uint8_t> bytes =
        data_detail::read_file(path, "image", kHint, o_.limits.max_file_bytes);
    return decode_image(bytes.data(), bytes.size(), path, o_.limits);
  }

  bool is_bad(int64_t i) const {
    std::lock_guard<std::mutex> lock(mu_);
    return bad_.count(i) != 0;
  }
  // A class whose every file is unreadable would train and evaluate without a single sample
  // of its own: that is an error, not a skip.
  void mark_bad(int64_t i, const std::string& why) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!bad_.insert(i).second) return;
    warnings_.push_back(
        fmt::format("warning: skipping unreadable image '{}' ({}); {} skipped so far", files_[i],
                    why, bad_.size()));
    const int32_t label = labels_[i];
    const int64_t in_class = std::count(labels_.begin(), labels_.end(), label);
    if (++bad_per_class_[label] == in_class) {
      throw DataError(
          fmt::format("imagefolder '{}': class '{}' has no readable image (all {} skipped)",
                      o_.path, classes_[label], in_class),
          "replace its images, or remove the class folder (every subfolder is a class)");
    }
  }

  ImageFolderOptions o_;
  std::vector<std::string> classes_;
  std::vector<std::string> files_;
  std::vector<int32_t> labels_;
  mutable std::mutex mu_;
  mutable std::set<int64_t> bad_;
  mutable std::map<int32_t, int64_t> bad_per_class_;
  mutable std::vector<std::string> warnings_;
};

}  // namespace

std::unique_ptr<Dataset> load_imagefolder_dataset(const ImageFolderOptions& options) {
  if (options.path.empty()) {
    throw ConfigError("data source imagefolder needs a path", "set data.path");
  }
  if (options.crop_height < 1 || options.crop_width < 1 || options.resize < 1) {
    throw ConfigError(fmt::format("imagefolder crop {}x{} and resize {} must be positive",
                                  options.crop_height, options.crop_width, options.resize),
                      "set data.crop and data.resize to positive sizes");
  }
  std::error_code ec;
  if (!fs::is_directory(options.path, ec)) {
    throw DataError(
        fmt::format("image folder '{}' {}", options.path,
                    fs::exists(options.path, ec) ? "is not a folder" : "does not exist"),
        kLayoutHint);
  }
  std::vector<std::string> classes;
  for (const auto& entry : fs::directory_iterator(options.path, ec)) {
    std::error_code type_ec;
    if (entry.is_directory(type_ec)) classes.push_back(entry.path().filename().string());
  }
  if (ec) {
    throw DataError(fmt::format("cannot list image folder '{}': {}", options.path, ec.message()),
                    kLayoutHint);
  }
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) {
    throw DataError(fmt::format("image folder '{}' holds no class subfolders", options.path),
                    kLayoutHint);
  }
  std::vector<std::string> files;
  std::vector<int32_t> labels;
  for (size_t c = 0; c < classes.size(); ++c) {
    const fs::path dir = fs::path(options.path) / classes[c];
    const std::vector<std::string> found = image_files(dir);
    if (found.empty()) {
      throw DataError(fmt::format("class folder '{}' of image folder '{}' holds no .jpg, .jpeg "
                                  "or .png file",
                                  dir.string(), options.path),
                      "add images to it or remove it (every subfolder is a class)");
    }
    files.insert(files.end(), found.begin(), found.end());
    labels.insert(labels.end(), found.size(), static_cast<int32_t>(c));
  }
  return std::make_unique<ImageFolderDataset>(options, std::move(classes), std::move(files),
                                              std::move(labels));
}

}  // namespace ferry
