// TokenFile: open, classify and validate a token file, then map it read-only (no copy: the page
// cache serves every rank and worker). Every size comes from fstat, never from the header.
#include "trainer/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"

namespace ferry {

namespace {

constexpr int32_t kLlmcModelMagic = 20240326;      // llm.c's gpt2_124M.bin
constexpr int32_t kLlmcTokenizerMagic = 20240328;  // llm.c's gpt2_tokenizer.bin
constexpr const char* kHint =
    "data.path (and data.val_path) must name a token file: llm.c's format (scripts/"
    "prepare_tokens.py or llm.c's dev/data scripts write it) or nanoGPT's uint16 train.bin";

[[noreturn]] void bad(const std::string& path, const std::string& problem) {
  throw DataError(fmt::format("token file '{}': {}", printable(path), problem), kHint);
}

int32_t le_i32(const unsigned char* p) {
  return static_cast<int32_t>(uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) |
                              (uint32_t(p[3]) << 24));
}

// Closes a descriptor on every path out of the constructor.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

TokenFile::TokenFile(const std::string& path) : path_(path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) {
    throw DataError(
        fmt::format("cannot open token file '{}': {}", printable(path), std::strerror(errno)),
        kHint);
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) bad(path, fmt::format("cannot stat: {}", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) bad(path, "is not a regular file (a directory?)");
  const uint64_t bytes = static_cast<uint64_t>(st.st_size);
  if (bytes == 0) bad(path, "is empty");
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (map == MAP_FAILED)
    bad(path, fmt::format("cannot map {} bytes: {}", bytes, std::strerror(errno)));
  map_ = map;
  map_bytes_ = bytes;
  try {
    const auto* p = static_cast<const unsigned char*>(map);
    if (bytes >= 2 && p[0] == 0x1f && p[1] == 0x8b)
      bad(path, "is gzip-compressed; gunzip it first");
    const int32_t magic = bytes >= 4 ? le_i32(p) : 0;
    if (magic == kLlmcModelMagic || magic == kLlmcTokenizerMagic) {
      bad(path, fmt::format("is an llm.c {} file (magic {}), not tokens",
                            magic == kLlmcModelMagic ? "model" : "tokenizer", magic));
    }
    uint64_t offset = 0;
    if (magic == kLlmcTokensMagic) {
      format_ = TokenFormat::kLlmc;
      if (bytes < static_cast<uint64_t>(kLlmcHeaderBytes)) {
        bad(path, fmt::format("llm.c header (magic {}) is cut short: the file is {} bytes, the "
                              "header {}",
                              kLlmcTokensMagic, bytes, kLlmcHeaderBytes));
      }
      const int32_t version = le_i32(p + 4);
      if (version != kLlmcTokensVersion) {
        bad(path,
            fmt::format("llm.c token format version {}, expected {}", version, kLlmcTokensVersion));
      }
      const int32_t count = le_i32(p + 8);
      if (count < 0)
        bad(path, fmt::format("llm.c header gives a negative token count ({})", count));
      offset = static_cast<uint64_t>(kLlmcHeaderBytes);
      const uint64_t payload = bytes - offset;
      if (payload % 2 != 0) {
        bad(path, fmt::format("holds an odd number of token bytes ({} after the header); tokens "
                              "are uint16",
                              payload));
      }
      if (payload / 2 != static_cast<uint64_t>(count)) {
        bad(path, fmt::format(
                      "llm.c header says {} tokens but the file holds {} ({})", count, payload / 2,
                      payload / 2 < static_cast<uint64_t>(count) ? "truncated"
                                                                 : "bytes after the last token"));
      }
    } else {
      format_ = TokenFormat::kNanoGpt;
      if (bytes % 2 != 0) {
        bad(path, fmt::format("holds an odd number of bytes ({}); a headerless (nanoGPT) token "
                              "file is uint16 tokens",
                              bytes));
      }
    }
    count_ = static_cast<int64_t>((bytes - offset) / 2);
    if (count_ == 0) bad(path, "holds no tokens");
    tokens_ = reinterpret_cast<const uint16_t*>(p + offset);
  } catch (...) {
    unmap();
    throw;
  }
}

TokenFile::~TokenFile() { unmap(); }

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      format_(other.format_),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      count_(std::exchange(other.count_, 0)) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    format_ = other.format_;
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

void TokenFile::unmap() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  count_ = 0;
}

uint16_t TokenFile::at(int64_t position) const {
  FERRY_ASSERT(position >= 0 && position < count_, "token position out of range");
  uint16_t v;
  std::memcpy(&v, tokens_ + position, sizeof v);  // little-endian on every supported host
  return v;
}

void TokenFile::read(int64_t begin, int64_t n, int64_t vocab, int32_t* out) const {
  FERRY_ASSERT(begin >= 0 && n >= 0 && begin + n <= count_, "token range out of the file");
  const uint16_t* src = tokens_ + begin;
  uint16_t max = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = src[i];
    max = src[i] > max ? src[i] : max;
  }
  if (max < vocab) return;
  for (int64_t i = 0; i < n; ++i) {
    if (src[i] >= vocab) {
      throw DataError(fmt::format("token file '{}': token {} at position {} is outside the "
                                  "vocabulary of {} (model.vocab)",
                                  printable(path_), src[i], begin + i, vocab),
                      "set model.vocab to the tokenizer's vocabulary (scripts/prepare_tokens.py "
                      "prints it), or re-tokenise the text");
    }
  }
}

std::vector<int64_t> TokenFile::positions_of(uint16_t token) const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < count_; ++i) {
    uint16_t v;
    std::memcpy(&v, tokens_ + i, sizeof v);  // the mapping may be unaligned for uint16 (nanoGPT)
    if (v == token) out.push_back(i);
  }
  return out;
}

void TokenFile::advise(bool random) const {
  if (map_ != nullptr) ::madvise(map_, map_bytes_, random ? MADV_RANDOM : MADV_SEQUENTIAL);
}

const char* TokenFile::format_name() const {
  return format_ == TokenFormat::kLlmc ? "llm.c" : "nanoGPT";
}

}  // namespace ferry
