// The token source: windows of seq_len + 1 tokens of a mapped token file (Note [Token windows]
// in dataset.h). Invariant: a window's place is a pure function of (seed, epoch, index), and
// every token is checked against the vocabulary as it is copied out.
#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"
#include "device/counter_rng.h"
#include "trainer/data/dataset.h"
#include "trainer/data/token_file.h"

namespace ferry {

namespace {

constexpr uint64_t kWindowDomain = 0x546f6b57696e646full;  // "TokWindo"

class TokenDataset : public Dataset {
 public:
  TokenDataset(TokenFile file, const TokenDatasetOptions& o)
      : file_(std::move(file)), o_(o), windows_((file_.size() - 1) / o.seq_len) {
    if (o_.scan_vocab) file_.check_vocab(o_.vocab);
    file_.advise(o.random);
  }

  int64_t size() const override { return windows_; }
  Shape image_shape() const override { return Shape{}; }
  int64_t classes() const override { return o_.vocab; }
  DType input_dtype() const override { return DType::kI32; }
  Shape sample_shape() const override { return Shape{o_.seq_len}; }
  int64_t labels_per_sample() const override { return o_.seq_len; }

  int32_t get(int64_t, float*) const override {
    FERRY_ASSERT(false, "a token dataset has no images: call read()");
    return 0;
  }

  void read(int64_t index, int64_t epoch, void* input, int32_t* labels) const override {
    FERRY_ASSERT(index >= 0 && index < windows_, "token window index out of range");
    const int64_t t = o_.seq_len;
    const int64_t start = token_window_start(file_.size(), t, o_.random, o_.seed, epoch, index);
    auto* tokens = static_cast<int32_t*>(input);
    file_.read(start, t, o_.vocab, tokens);
    // labels = window[1, T + 1): the inputs shifted by one, and the window's last token.
    for (int64_t i = 0; i + 1 < t; ++i) labels[i] = tokens[i + 1];
    file_.read(start + t, 1, o_.vocab, labels + t - 1);
  }

  std::string describe() const override {
    return fmt::format("tokens '{}' ({}, {} tokens, {} windows of {}{}, vocab {})",
                       printable(file_.path()), file_.format_name(), file_.size(), windows_,
                       o_.seq_len, o_.random ? " at random offsets" : "", o_.vocab);
  }

 private:
  TokenFile file_;
  TokenDatasetOptions o_;
  int64_t windows_;
};

}  // namespace

int64_t token_window_start(int64_t tokens, int64_t seq_len, bool random, uint64_t seed,
                           int64_t epoch, int64_t index) {
  if (!random) return index * seq_len;
  // Starts in [0, tokens - seq_len - 1]: tokens - seq_len choices, by multiply-high.
  const uint64_t choices = static_cast<uint64_t>(tokens - seq_len);
  const uint64_t key = counter_hash(seed ^ kWindowDomain, static_cast<uint64_t>(epoch));
  const unsigned __int128 wide =
      static_cast<unsigned __int128>(counter_hash(key, static_cast<uint64_t>(index))) * choices;
  return static_cast<int64_t>(wide >> 64);
}

std::unique_ptr<Dataset> load_token_dataset(const TokenDatasetOptions& options) {
  if (options.seq_len < 1) {
    throw ConfigError(fmt::format("token windows need data.seq_len >= 1, got {}", options.seq_len),
                      "set data.seq_len (0 = model.context)");
  }
  if (options.vocab < 1) {
    throw ConfigError(fmt::format("token source needs a vocabulary >= 1, got {}", options.vocab),
                      "set model.vocab");
  }
  TokenFile file(options.path);
  if (file.size() < options.seq_len + 1) {
    throw DataError(
        fmt::format("token file '{}': holds {} tokens, fewer than the {} of one window "
                    "(data.seq_len {} + 1)",
                    printable(options.path), file.size(), options.seq_len + 1, options.seq_len),
        "lower data.seq_len, or tokenise more text");
  }
  return std::make_unique<TokenDataset>(std::move(file), options);
}

}  // namespace ferry
