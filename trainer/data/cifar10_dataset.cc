// CIFAR-10 binary batches: 3073-byte records (label, then R, G, B planes of 32x32), already in
// CHW order. Invariant: every file is a whole number of records and every label is below 10.
#include <algorithm>
#include <filesystem>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "trainer/data/dataset.h"
#include "trainer/data/read_file.h"

namespace ferry {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kSide = 32;
constexpr int64_t kPixels = 3 * kSide * kSide;
constexpr int64_t kRecord = 1 + kPixels;
constexpr int64_t kClasses = 10;
constexpr const char* kHint =
    "data.path must name a CIFAR-10 binary batch file (data_batch_1.bin) or the "
    "cifar-10-batches-bin folder of the binary version (not the Python pickles)";

// The batch files of folder `dir` by the documented rule (see load_cifar10_dataset).
std::vector<fs::path> batch_files(const fs::path& dir) {
  std::vector<std::pair<long, fs::path>> numbered;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    constexpr std::string_view kPrefix = "data_batch_", kSuffix = ".bin";
    if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
        !name.ends_with(kSuffix)) {
      continue;
    }
    const std::string number =
        name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
    if (!std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        number.size() > 9) {
      continue;
    }
    numbered.emplace_back(std::stol(number), entry.path());
  }
  if (ec) {
    throw DataError(fmt::format("cannot list CIFAR-10 folder '{}': {}", dir.string(), ec.message()),
                    kHint);
  }
  std::sort(numbered.begin(), numbered.end());
  std::vector<fs::path> files;
  for (auto& [n, p] : numbered) files.push_back(p);
  if (files.empty() && fs::is_regular_file(dir / "test_batch.bin")) {
    files.push_back(dir / "test_batch.bin");
  }
  if (files.empty() && fs::is_directory(dir / "cifar-10-batches-bin")) {
    return batch_files(dir / "cifar-10-batches-bin");
  }
  return files;
}

class Cifar10Dataset : public Dataset {
 public:
  Cifar10Dataset(std::string path, std::vector<uint8_t> records, size_t files)
      : path_(std::move(path)), records_(std::move(records)), files_(files) {}

  int64_t size() const override { return static_cast<int64_t>(records_.size()) / kRecord; }
  Shape image_shape() const override { return Shape{3, kSide, kSide}; }
  int64_t classes() const override { return kClasses; }
  std::string describe() const override {
    return fmt::format("cifar10 '{}' ({} file{}, {} x {}, {} classes)", path_, files_,
                       files_ == 1 ? "" : "s", size(), image_shape().str(), kClasses);
  }

  int32_t get(int64_t index, float* pixels) const override {
    FERRY_ASSERT(index >= 0 && index < size(), "CIFAR-10 sample index out of range");
    const uint8_t* record = records_.data() + index * kRecord;
    for (int64_t i = 0; i < kPixels; ++i) pixels[i] = record[1 + i] * (1.0f / 255.0f);
    return record[0];
  }

 private:
  std::string path_;
  std::vector<uint8_t> records_;  // the files concatenated
  size_t files_;
};

}  // namespace

std::unique_ptr<Dataset> load_cifar10_dataset(const std::string& path) {
  if (path.empty()) throw ConfigError("data source cifar10 needs a path", "set data.path");
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    files = batch_files(path);
    if (files.empty()) {
      throw DataError(fmt::format("CIFAR-10 folder '{}' holds no data_batch_<n>.bin and no "
                                  "test_batch.bin",
                                  path),
                      kHint);
    }
  } else {
    files.push_back(path);
  }

  std::vector<uint8_t> records;
  for (const fs::path& file : files) {
    std::vector<uint8_t> bytes =
        data_detail::read_file(file.string(), "CIFAR-10 batch file", kHint);
    const std::string name = file.string();
    if (data_detail::is_gzip(bytes)) {
      throw DataError(fmt::format("CIFAR-10 batch file '{}' is gzip-compressed", name),
                      "unpack cifar-10-binary.tar.gz first (tar xzf)");
    }
    if (bytes.empty())
      throw DataError(fmt::format("CIFAR-10 batch file '{}' is empty", name), kHint);
    if (bytes.size() % kRecord != 0) {
      throw DataError(
          fmt::format("CIFAR-10 batch file '{}' is {} bytes, not a whole number of "
                      "{}-byte records ({} records and {} bytes over: truncated?)",
                      name, bytes.size(), kRecord, bytes.size() / kRecord, bytes.size() % kRecord),
          kHint);
    }
    for (size_t r = 0; r < bytes.size(); r += kRecord) {
      if (bytes[r] >= kClasses) {
        throw DataError(fmt::format("CIFAR-10 batch file '{}': record {} has label {}, not below "
                                    "10 (is this CIFAR-100 or another format?)",
                                    name, r / kRecord, bytes[r]),
                        kHint);
      }
    }
    if (records.empty()) {
      records = std::move(bytes);
    } else {
      records.insert(records.end(), bytes.begin(), bytes.end());
    }
  }
  return std::make_unique<Cifar10Dataset>(path, std::move(records), files.size());
}

}  // namespace ferry
