// TokenFile: open, classify and validate a token file, then map it read-only (no copy: the page
// cache serves every rank and worker). Every size comes from fstat, never from the header.
#include "trainer/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"

namespace ferry {

namespace {

constexpr int32_t kLlmcModelMagic = 20240326;      // llm.c's gpt2_124M.bin
constexpr int32_t kLlmcTokenizerMagic = 20240328;  // llm.c's gpt2_tokenizer.bin
constexpr const char* kHint =
    "data.path (and data.val_path) must name a token file: llm.c's uint16 or uint32 format "
    "(scripts/prepare_tokens.py or llm.c's dev/data scripts write them) or nanoGPT's uint16 "
    "train.bin";

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
    if (magic == kLlmcTokensMagic || magic == kLlmcTokens32Magic) {
      const bool wide = magic == kLlmcTokens32Magic;
      format_ = wide ? TokenFormat::kLlmc32 : TokenFormat::kLlmc;
      const char* kind = wide ? "llm.c uint32" : "llm.c";
      if (bytes < static_cast<uint64_t>(kLlmcHeaderBytes)) {
        bad(path, fmt::format("{} header (magic {}) is cut short: the file is {} bytes, the "
                              "header {}",
                              kind, magic, bytes, kLlmcHeaderBytes));
      }
      const int32_t version = le_i32(p + 4);
      const int32_t expected = wide ? kLlmcTokens32Version : kLlmcTokensVersion;
      if (version != expected) {
        bad(path, fmt::format("{} token format version {}, expected {}", kind, version, expected));
      }
      const int32_t count = le_i32(p + 8);
      if (count < 0) {
        bad(path, fmt::format("{} header gives a negative token count ({})", kind, count));
      }
      offset = static_cast<uint64_t>(kLlmcHeaderBytes);
      const uint64_t payload = bytes - offset;
      const uint64_t width = wide ? 4 : 2;
      if (payload % width != 0) {
        bad(path, wide ? fmt::format("holds {} token bytes after the header, not a multiple of "
                                     "4; tokens are uint32",
                                     payload)
                       : fmt::format("holds an odd number of token bytes ({} after the header); "
                                     "tokens are uint16",
                                     payload));
      }
      if (payload / width != static_cast<uint64_t>(count)) {
        bad(path, fmt::format("{} header says {} tokens but the file holds {} ({})", kind, count,
                              payload / width,
                              payload / width < static_cast<uint64_t>(count)
                                  ? "truncated"
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
    count_ = static_cast<int64_t>((bytes - offset) / static_cast<uint64_t>(token_bytes()));
    if (count_ == 0) bad(path, "holds no tokens");
    tokens_ = p + offset;
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

namespace {

// Tokens of type T (uint16_t or uint32_t) at `base`: the mapping is page-aligned and the header
// 1024 bytes, so every token is aligned for its type.
template <typename T>
const T* as(const unsigned char* base) {
  return reinterpret_cast<const T*>(base);
}

template <typename T>
void copy_checked(const TokenFile& file, const T* src, int64_t begin, int64_t n, int64_t vocab,
                  int32_t* out) {
  T max = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<int32_t>(src[i]);
    max = src[i] > max ? src[i] : max;
  }
  vocab = std::min<int64_t>(vocab, int64_t{INT32_MAX} + 1);  // out is int32
  if (static_cast<int64_t>(max) < vocab) return;
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<int64_t>(src[i]) >= vocab) {
      throw DataError(fmt::format("token file '{}': token {} at position {} is outside the "
                                  "vocabulary of {} (model.vocab)",
                                  printable(file.path()), src[i], begin + i, vocab),
                      "set model.vocab to the tokenizer's vocabulary (scripts/prepare_tokens.py "
                      "prints it), or re-tokenise the text");
    }
  }
}

template <typename T>
std::vector<int64_t> positions(const T* tokens, int64_t count, uint32_t token) {
  std::vector<int64_t> out;
  if (token > std::numeric_limits<T>::max()) return out;
  const T t = static_cast<T>(token);
  for (int64_t i = 0; i < count; ++i) {
    if (tokens[i] == t) out.push_back(i);
  }
  return out;
}

// Note [Scanning a token file]
// check_vocab reads every token once, before training, so a token the model cannot embed is an
// error naming its position rather than a failure some hours in when its window is drawn. The
// pass is the maximum of each block of kScanBlock tokens - a reduction the compiler vectorizes
// with no branch in it - and only a block whose maximum reaches the vocabulary is searched
// again for its first bad position. On a mapped file in the page cache it runs at memory
// bandwidth (docs/data.md gives the time for 100M tokens); a file that is not cached costs what
// reading it from disk costs, once per rank and run, which the page cache then serves to the
// loader. A uint16 file under a vocabulary above 65,535 cannot hold a bad token: no pass.
constexpr int64_t kScanBlock = 1 << 14;

template <typename T>
T block_max(const T* p, int64_t n) {
  T m = 0;
  for (int64_t i = 0; i < n; ++i) m = p[i] > m ? p[i] : m;
  return m;
}

template <typename T>
TokenFile::VocabScan scan_tokens(const T* tokens, int64_t count, int64_t vocab) {
  TokenFile::VocabScan out;
  for (int64_t b = 0; b < count; b += kScanBlock) {
    const int64_t n = std::min(kScanBlock, count - b);
    const T m = block_max(tokens + b, n);
    out.largest = std::max<uint32_t>(out.largest, m);
    if (out.first_outside < 0 && static_cast<int64_t>(m) >= vocab) {
      for (int64_t i = 0; i < n; ++i) {
        if (static_cast<int64_t>(tokens[b + i]) >= vocab) {
          out.first_outside = b + i;
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace

uint32_t TokenFile::at(int64_t position) const {
  FERRY_ASSERT(position >= 0 && position < count_, "token position out of range");
  if (format_ == TokenFormat::kLlmc32) return as<uint32_t>(tokens_)[position];
  return as<uint16_t>(tokens_)[position];  // little-endian on every supported host
}

void TokenFile::read(int64_t begin, int64_t n, int64_t vocab, int32_t* out) const {
  FERRY_ASSERT(begin >= 0 && n >= 0 && begin + n <= count_, "token range out of the file");
  if (format_ == TokenFormat::kLlmc32) {
    copy_checked(*this, as<uint32_t>(tokens_) + begin, begin, n, vocab, out);
  } else {
    copy_checked(*this, as<uint16_t>(tokens_) + begin, begin, n, vocab, out);
  }
}

std::vector<int64_t> TokenFile::positions_of(uint32_t token) const {
  if (format_ == TokenFormat::kLlmc32) return positions(as<uint32_t>(tokens_), count_, token);
  return positions(as<uint16_t>(tokens_), count_, token);
}

TokenFile::VocabScan TokenFile::scan(int64_t vocab) const {
  if (format_ == TokenFormat::kLlmc32) return scan_tokens(as<uint32_t>(tokens_), count_, vocab);
  return scan_tokens(as<uint16_t>(tokens_), count_, vocab);
}

void TokenFile::check_vocab(int64_t vocab) const {
  if (format_ != TokenFormat::kLlmc32 && vocab > UINT16_MAX) return;  // no uint16 is outside
  // read() hands tokens out as int32: one above INT32_MAX is outside any vocabulary.
  const VocabScan s = scan(std::min<int64_t>(vocab, int64_t{INT32_MAX} + 1));
  if (s.first_outside < 0) return;
  throw DataError(
      fmt::format("token file '{}': token {} at position {} is outside the vocabulary of {} "
                  "(model.vocab); the file's largest token is {}",
                  printable(path_), at(s.first_outside), s.first_outside, vocab, s.largest),
      fmt::format("set model.vocab to the tokenizer's vocabulary, at least {} here "
                  "(scripts/prepare_tokens.py prints it), or re-tokenise the text",
                  int64_t{s.largest} + 1));
}

void TokenFile::advise(bool random) const {
  if (map_ != nullptr) ::madvise(map_, map_bytes_, random ? MADV_RANDOM : MADV_SEQUENTIAL);
}

const char* TokenFile::format_name() const {
  switch (format_) {
    case TokenFormat::kLlmc:
      return "llm.c";
    case TokenFormat::kLlmc32:
      return "llm.c uint32";
    case TokenFormat::kNanoGpt:
      break;
  }
  return "nanoGPT";
}

}  // namespace ferry
