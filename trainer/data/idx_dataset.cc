// MNIST IDX image and label files, validated before use: every size in a header is checked
// against the real file size, so a corrupt file is a DataError, never a crash.
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "trainer/data/dataset.h"
#include "trainer/data/read_file.h"

namespace ferry {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr const char* kHint =
    "data.path must name an uncompressed MNIST IDX images file such as train-images-idx3-ubyte "
    "(its labels file beside it); download and gunzip the dataset again if it is damaged";

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

[[noreturn]] void bad(const std::string& path, const std::string& problem) {
  throw DataError(fmt::format("IDX file '{}': {}", path, problem), kHint);
}

std::vector<uint8_t> read_idx(const std::string& path, const char* what, size_t header_bytes,
                              uint32_t magic) {
  std::vector<uint8_t> bytes = data_detail::read_file(path, what, kHint);
  if (data_detail::is_gzip(bytes)) bad(path, "is gzip-compressed; gunzip it first");
  if (bytes.size() < header_bytes) {
    bad(path, fmt::format("is {} bytes, too short for the {}-byte header of an {}", bytes.size(),
                          header_bytes, what));
  }
  const uint32_t found = big_endian_u32(bytes.data());
  if (found != magic) {
    std::string which;
    if (found == kImagesMagic) which = " (this is an images file)";
    if (found == kLabelsMagic) which = " (this is a labels file)";
    bad(path, fmt::format("magic number 0x{:08x}{}, expected 0x{:08x} for an {}", found, which,
                          magic, what));
  }
  return bytes;
}

// "train-images-idx3-ubyte" -> "train-labels-idx1-ubyte" (the file name part only).
std::string derive_labels_path(const std::string& images_path) {
  const std::filesystem::path p(images_path);
  std::string name = p.filename().string();
  const size_t at = name.find("images");
  if (at == std::string::npos) {
    throw DataError(fmt::format("cannot derive the labels file from IDX images file '{}': its name "
                                "does not contain 'images'",
                                images_path),
                    "name the labels file explicitly");
  }
  name.replace(at, 6, "labels");
  const size_t idx3 = name.find("idx3");
  if (idx3 != std::string::npos) name.replace(idx3, 4, "idx1");
  return (p.parent_path() / name).string();
}

class IdxDataset : public Dataset {
 public:
  IdxDataset(std::string images_path, std::string labels_path, std::vector<uint8_t> images,
             std::vector<uint8_t> labels, int64_t count, int64_t height, int64_t width,
             int64_t classes)
      : images_path_(std::move(images_path)),
        labels_path_(std::move(labels_path)),
        images_(std::move(images)),
        labels_(std::move(labels)),
        count_(count),
        height_(height),
        width_(width),
        classes_(classes) {}

  int64_t size() const override { return count_; }
  Shape image_shape() const override { return Shape{1, height_, width_}; }
  int64_t classes() const override { return classes_; }
  std::string describe() const override {
    return fmt::format("idx '{}' + '{}' ({} x {}, {} classes)", images_path_, labels_path_, count_,
                       image_shape().str(), classes_);
  }

  int32_t get(int64_t index, float* pixels) const override {
    FERRY_ASSERT(index >= 0 && index < count_, "IDX sample index out of range");
    const int64_t pixels_per_image = height_ * width_;
    const uint8_t* src = images_.data() + 16 + index * pixels_per_image;
    for (int64_t i = 0; i < pixels_per_image; ++i) pixels[i] = src[i] * (1.0f / 255.0f);
    return labels_[8 + index];
  }

 private:
  std::string images_path_, labels_path_;
  std::vector<uint8_t> images_;  // the whole images file, header included
  std::vector<uint8_t> labels_;  // the whole labels file, header included
  int64_t count_, height_, width_, classes_;
};

}  // namespace

std::unique_ptr<Dataset> load_idx_dataset(const std::string& images_path,
                                          const std::string& labels_path_in, int64_t classes) {
  if (images_path.empty()) {
    throw ConfigError("data source idx needs the images file path", "set data.path");
  }
  if (classes < 0 || classes > 256) {
    throw ConfigError(
        fmt::format("IDX labels are bytes: classes must be in [0, 256], got {}", classes),
        "set model.classes (10 for MNIST)");
  }
  const std::string labels_path =
      labels_path_in.empty() ? derive_labels_path(images_path) : labels_path_in;

  std::vector<uint8_t> images = read_idx(images_path, "IDX images file", 16, kImagesMagic);
  const uint64_t count = big_endian_u32(images.data() + 4);
  const uint64_t height = big_endian_u32(images.data() + 8);
  const uint64_t width = big_endian_u32(images.data() + 12);
  if (count == 0 || height == 0 || width == 0) {
    bad(images_path,
        fmt::format("header has an empty dimension: {} x {} x {}", count, height, width));
  }
  // Each factor is below 2^32, so count * (height * width) fits in 128 bits.
  const unsigned __int128 expected = static_cast<unsigned __int128>(count) * (height * width);
  const uint64_t have = images.size() - 16;
  if (expected != have) {
    bad(images_path,
        fmt::format("header says {} images of {} x {} but the file holds {} pixel bytes{}", count,
                    height, width, have,
                    expected > have ? " (truncated)" : " (trailing bytes after the images)"));
  }

  std::vector<uint8_t> labels = read_idx(labels_path, "IDX labels file", 8, kLabelsMagic);
  const uint64_t label_count = big_endian_u32(labels.data() + 4);
  if (label_count != labels.size() - 8) {
    bad(labels_path,
        fmt::format("header says {} labels but the file holds {}{}", label_count, labels.size() - 8,
                    label_count > labels.size() - 8 ? " (truncated)" : ""));
  }
  if (label_count != count) {
    throw DataError(fmt::format("IDX labels file '{}' has {} labels but images file '{}' has {} "
                                "images",
                                labels_path, label_count, images_path, count),
                    "pair train-images with train-labels and t10k-images with t10k-labels");
  }
  int64_t max_label = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const int64_t label = labels[8 + i];
    if (classes > 0 && label >= classes) {
      bad(labels_path,
          fmt::format("label {} of sample {} is not below the {} classes", label, i, classes));
    }
    max_label = std::max(max_label, label);
  }
  const int64_t resolved_classes = classes > 0 ? classes : max_label + 1;
  return std::make_unique<IdxDataset>(
      images_path, labels_path, std::move(images), std::move(labels), static_cast<int64_t>(count),
      static_cast<int64_t>(height), static_cast<int64_t>(width), resolved_classes);
}

}  // namespace ferry
