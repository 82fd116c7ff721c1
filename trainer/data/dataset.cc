// open_dataset (the one place a data source is chosen) and the file helper the sources share.
#include "trainer/data/dataset.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "common/strings.h"
#include "trainer/data/documents.h"
#include "trainer/data/read_file.h"

namespace ferry {

namespace data_detail {

namespace {

// `path` opened for reading at its end, after checking it is a regular file.
std::ifstream open_at_end(const std::string& path, const std::string& what,
                          const std::string& hint) {
  // Only a regular file: a directory opens as a stream whose size reads as 2^63 - 1.
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    throw DataError(
        fmt::format("{} '{}' is not a regular file (a directory?)", what, printable(path)), hint);
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    throw DataError(
        fmt::format("cannot open {} '{}': {}", what, printable(path), std::strerror(errno)), hint);
  }
  return in;
}

std::vector<uint8_t> read_prefix(std::ifstream& in, size_t n, const std::string& path,
                                 const std::string& what, const std::string& hint) {
  std::vector<uint8_t> bytes(n);
  in.seekg(0);
  if (n > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(n))) {
    throw DataError(fmt::format("cannot read {} '{}' ({} bytes)", what, printable(path), n), hint);
  }
  return bytes;
}

}  // namespace

std::vector<uint8_t> read_file(const std::string& path, const std::string& what,
                               const std::string& hint, uint64_t max_bytes) {
  std::ifstream in = open_at_end(path, what, hint);
  const std::streamoff size = in.tellg();
  if (size < 0)
    throw DataError(fmt::format("cannot read the size of {} '{}'", what, printable(path)), hint);
  if (static_cast<uint64_t>(size) > max_bytes) {
    throw DataError(
        fmt::format("{} '{}' is {}, more than the {} one such file may hold", what, printable(path),
                    format_bytes(static_cast<uint64_t>(size)), format_bytes(max_bytes)),
        hint);
  }
  return read_prefix(in, static_cast<size_t>(size), path, what, hint);
}

std::vector<uint8_t> read_file_head(const std::string& path, size_t n, const std::string& what,
                                    const std::string& hint) {
  std::ifstream in = open_at_end(path, what, hint);
  const std::streamoff size = in.tellg();
  if (size < 0)
    throw DataError(fmt::format("cannot read the size of {} '{}'", what, printable(path)), hint);
  return read_prefix(in, std::min(n, static_cast<size_t>(size)), path, what, hint);
}

bool is_gzip(const std::vector<uint8_t>& bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

}  // namespace data_detail

void Dataset::read_at(int64_t index, int64_t epoch, int64_t side, float* pixels,
                      int32_t* labels) const {
  (void)index, (void)epoch, (void)side, (void)pixels, (void)labels;
  FERRY_ASSERT(false, "read_at on a dataset that cannot resize: " + describe());
}

void Dataset::read_row(int64_t index, int64_t epoch, int64_t len, void* input, int32_t* labels,
                       int32_t* segments) const {
  (void)segments;
  FERRY_ASSERT(sample_shape().rank() == 1 && len == sample_shape()[0],
               "read_row of a fixed-size sample at another length: " + describe());
  read(index, epoch, input, labels);
}

std::unique_ptr<Dataset> open_dataset(const DatasetSpec& spec) {
  if (spec.source == "synthetic") {
    return make_synthetic_dataset(spec.image_shape, spec.classes, spec.samples, spec.seed);
  }
  if (spec.source == "idx") return load_idx_dataset(spec.path, spec.labels_path, spec.classes);
  if (spec.source == "cifar10") return load_cifar10_dataset(spec.path);
  if (spec.source == "imagefolder") {
    ImageFolderOptions o;
    o.path = spec.path;
    if (spec.image_shape.rank() == 3) {
      if (spec.image_shape[0] != 3) {
        throw ConfigError(fmt::format("imagefolder images have 3 channels (RGB), model.input "
                                      "has {}",
                                      spec.image_shape[0]),
                          "set model.input to [3, H, W]");
      }
      o.crop_height = spec.image_shape[1];
      o.crop_width = spec.image_shape[2];
    }
    o.resize = spec.resize;
    o.augment = spec.augment;
    o.seed = spec.seed;
    o.skip_bad = spec.skip_bad;
    return load_imagefolder_dataset(o);
  }
  if (spec.source == "tokens" && spec.documents) {
    DocumentOptions o;
    o.path = spec.path;
    o.seq_len = spec.seq_len;
    o.vocab = spec.classes;
    o.eot = spec.eot;
    o.pack = spec.pack;
    o.scan_vocab = true;
    return load_document_dataset(o);
  }
  if (spec.source == "tokens") {
    TokenDatasetOptions o;
    o.path = spec.path;
    o.seq_len = spec.seq_len;
    o.vocab = spec.classes;
    o.random = spec.augment;
    o.seed = spec.seed;
    o.scan_vocab = true;
    return load_token_dataset(o);
  }
  const std::string near =
      nearest(spec.source, {"synthetic", "idx", "cifar10", "imagefolder", "tokens"});
  throw ConfigError(fmt::format("unknown data source '{}'{}", spec.source,
                                near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near)),
                    "data.source is one of: synthetic, idx, cifar10, imagefolder, tokens");
}

}  // namespace ferry
