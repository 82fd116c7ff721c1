// Token files for language-model training, mapped read-only: llm.c's format (a header of 256
// little-endian int32 - magic 20240520, version 1, token count - then uint16 tokens) and
// nanoGPT's headerless uint16 train.bin, told apart by the magic. Invariant: the token count is
// checked against the file's real size when it is opened, so no read leaves the mapping; a
// token's range (< vocab) is checked when it is read, so opening a large file costs nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

inline constexpr int32_t kLlmcTokensMagic = 20240520;
inline constexpr int32_t kLlmcTokensVersion = 1;
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

enum class TokenFormat { kLlmc, kNanoGpt };

class TokenFile {
 public:
  // Maps `path`. A file whose first int32 is 20240520 is llm.c's format, any other nanoGPT's
  // (uint16 tokens, nothing else). DataError "token file 'PATH': PROBLEM" for a missing,
  // unreadable or non-regular file, an empty file, a gzip-compressed file, an llm.c header that
  // is cut short, has another version or a negative count, a token count that disagrees with
  // the file's size (truncated, or bytes after the tokens), an odd number of token bytes, no
  // token at all, and llm.c's model and tokenizer files (magics 20240326, 20240328).
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  TokenFormat format() const { return format_; }
  // Tokens in the file (after the header).
  int64_t size() const { return count_; }
  // The token at `position` (0 <= position < size()), unchecked against any vocabulary.
  uint16_t at(int64_t position) const;
  // Writes tokens [begin, begin + n) as int32 into `out` (0 <= begin, begin + n <= size()).
  // DataError "token file 'PATH': token V at position P is outside the vocabulary of VOCAB
  // (model.vocab)" for the first token >= vocab, P counting tokens from 0 after any header.
  void read(int64_t begin, int64_t n, int64_t vocab, int32_t* out) const;
  // Every position holding `token`, in increasing order: one pass over the mapping.
  std::vector<int64_t> positions_of(uint16_t token) const;
  // "llm.c" or "nanoGPT".
  const char* format_name() const;
  // Tells the kernel how windows will be read: random (training: no read-ahead of pages no
  // window needs) or in order (evaluation: read ahead). Only a hint.
  void advise(bool random) const;

 private:
  void unmap();

  std::string path_;
  TokenFormat format_ = TokenFormat::kNanoGpt;
  void* map_ = nullptr;  // the whole file
  uint64_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;  // (count_)
  int64_t count_ = 0;
};

}  // namespace ferry
