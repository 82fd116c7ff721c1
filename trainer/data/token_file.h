// Token files for language-model training, mapped read-only: llm.c's uint16 and uint32 formats
// and nanoGPT's headerless uint16 train.bin (docs/data.md, "Token files"). Invariant: the count is
// checked against the file's size at open, so no read leaves the mapping.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

inline constexpr int32_t kLlmcTokensMagic = 20240520;  // uint16 tokens (GPT-2)
inline constexpr int32_t kLlmcTokensVersion = 1;
inline constexpr int32_t kLlmcTokens32Magic = 20240801;  // uint32 tokens (llm.c's "llama-3")
inline constexpr int32_t kLlmcTokens32Version = 7;
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

enum class TokenFormat { kLlmc, kLlmc32, kNanoGpt };

class TokenFile {
 public:
  // Maps `path`. A file whose first int32 is 20240520 is llm.c's uint16 format, 20240801 its
  // uint32 one, any other nanoGPT's (uint16 tokens, nothing else). DataError "token file 'PATH':
  // PROBLEM" for a missing, unreadable or non-regular file, an empty file, a gzip-compressed
  // file, an llm.c header that is cut short, has another version or a negative count, a token
  // count that disagrees with the file's size (truncated, or bytes after the tokens), token
  // bytes that are not whole tokens, no token at all, and llm.c's model and tokenizer files
  // (magics 20240326, 20240328).
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  TokenFormat format() const { return format_; }
  // Bytes per token: 4 for llm.c's uint32 format, else 2.
  int token_bytes() const { return format_ == TokenFormat::kLlmc32 ? 4 : 2; }
  // Tokens in the file (after the header).
  int64_t size() const { return count_; }
  // The token at `position` (0 <= position < size()), unchecked against any vocabulary.
  uint32_t at(int64_t position) const;
  // Writes tokens [begin, begin + n) as int32 into `out` (0 <= begin, begin + n <= size()).
  // DataError "token file 'PATH': token V at position P is outside the vocabulary of VOCAB
  // (model.vocab)" for the first token >= vocab, P counting tokens from 0 after any header.
  void read(int64_t begin, int64_t n, int64_t vocab, int32_t* out) const;
  // Every position holding `token`, in increasing order: one pass over the mapping.
  std::vector<int64_t> positions_of(uint32_t token) const;
  // The first position holding a token >= vocab (-1: none) and the largest token: one pass.
  struct VocabScan {
    int64_t first_outside = -1;
    uint32_t largest = 0;
  };
  VocabScan scan(int64_t vocab) const;
  // Refuses the file before any of it is trained on: DataError with read()'s message for the
  // first token >= vocab, followed by "; the file's largest token is L". Note [Scanning a token
  // file] in token_file.cc.
  void check_vocab(int64_t vocab) const;
  // "llm.c", "llm.c uint32" or "nanoGPT".
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
  const unsigned char* tokens_ = nullptr;  // (count_) tokens of token_bytes() each
  int64_t count_ = 0;
};

}  // namespace ferry
