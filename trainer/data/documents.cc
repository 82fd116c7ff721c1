// The document index, the packing and the document source (Note [Documents as rows] in
// documents.h). Invariant: rows are built from the index alone; reading one copies its tokens out
// of the mapped file, checked against the vocabulary, and never looks at another row.
#include "trainer/data/documents.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"
#include "trainer/data/token_file.h"

namespace ferry {

DocumentIndex index_documents(const TokenFile& file, int64_t eot, int64_t seq_len) {
  FERRY_ASSERT(seq_len >= 1, "documents need seq_len >= 1");
  DocumentIndex index;
  std::vector<int64_t> ends;
  if (eot >= 0 && eot <= UINT32_MAX) ends = file.positions_of(static_cast<uint32_t>(eot));
  if (ends.empty()) {
    throw DataError(fmt::format("token file '{}': holds no end-of-text token {} (data.eot_token) "
                                "among its {} tokens: nothing separates its documents",
                                printable(file.path()), eot, file.size()),
                    "scripts/prepare_tokens.py writes the separator before every file (bytes: "
                    "256, model.vocab 257; gpt2: 50256); re-tokenise, or set data.eot_token to "
                    "the file's separator");
  }
  const int64_t last = file.size() - 1;
  if (ends.empty() || ends.back() != last) ends.push_back(last);
  int64_t from = 0;  // the window's first token: the file's first, then each separator
  for (int64_t to : ends) {
    const int64_t w = to - from;
    // Nothing but separators (two in a row, or the file's first token one): no document.
    const bool empty = w == 0 || (w == 1 && file.at(from) == eot && file.at(to) == eot);
    if (!empty) {
      index.start.push_back(from);
      index.length.push_back(static_cast<int32_t>(std::min(w, seq_len)));
      index.tokens += std::min(w, seq_len);
      index.longest = std::max(index.longest, w);
      if (w > seq_len) ++index.cut;
    }
    from = to;
  }
  if (index.start.empty()) {
    throw DataError(fmt::format("token file '{}': holds no document ({} tokens, end-of-text token "
                                "{} (data.eot_token) at {} places)",
                                printable(file.path()), file.size(), eot, ends.size() - 1),
                    "a document needs a token that is not the separator; check data.eot_token");
  }
  return index;
}

PackedRows pack_documents(const std::vector<int32_t>& lengths, int64_t seq_len) {
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<int64_t>> rows;
  std::vector<int64_t> used;
  std::set<std::pair<int64_t, int64_t>> open;  // (free positions, row): the best fit is first
  for (int64_t d : order) {
    const int64_t len = lengths[d];
    FERRY_ASSERT(len >= 1 && len <= seq_len, "a packed document fits a row");
    auto it = open.lower_bound({len, -1});
    int64_t row;
    if (it == open.end()) {
      row = static_cast<int64_t>(rows.size());
      rows.emplace_back();
      used.push_back(0);
    } else {
      row = it->second;
      open.erase(it);
    }
    rows[row].push_back(d);
    used[row] += len;
    const int64_t free = seq_len - used[row];
    if (free > 0) open.insert({free, row});
  }
  PackedRows out;
  out.first.push_back(0);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::sort(rows[r].begin(), rows[r].end());
    out.docs.insert(out.docs.end(), rows[r].begin(), rows[r].end());
    out.first.push_back(static_cast<int64_t>(out.docs.size()));
    out.tokens.push_back(used[r]);
  }
  return out;
}

int64_t batch_length(int64_t longest, int64_t bucket, int64_t seq_len) {
  FERRY_ASSERT(bucket >= 1 && longest >= 0, "a length bucket is at least 1");
  // Any bucket up to INT64_MAX is valid (data.len_bucket): settle the cases where rounding up
  // reaches seq_len first, so the sum below stays under 2 seq_len and cannot overflow.
  const int64_t length = std::max<int64_t>(longest, 1);
  if (bucket >= seq_len || length >= seq_len) return seq_len;
  const int64_t rounded = (length + bucket - 1) / bucket * bucket;
  return std::min(rounded, seq_len);
}

std::vector<int64_t> length_buckets(int64_t bucket, int64_t seq_len) {
  std::vector<int64_t> out;
  for (int64_t len = bucket; len < seq_len; len += bucket) out.push_back(len);
  out.push_back(seq_len);
  return out;
}

namespace {

class DocumentDataset : public Dataset {
 public:
  DocumentDataset(TokenFile file, const DocumentOptions& o)
      : file_(std::move(file)), o_(o), index_(index_documents(file_, o.eot, o.seq_len)) {
    if (o_.scan_vocab) file_.check_vocab(o_.vocab);
    if (o_.pack) packed_ = pack_documents(index_.length, o_.seq_len);
    file_.advise(/*random=*/true);
  }

  int64_t size() const override {
    return o_.pack ? packed_.rows() : static_cast<int64_t>(index_.start.size());
  }
  Shape image_shape() const override { return Shape{}; }
  int64_t classes() const override { return o_.vocab; }
  DType input_dtype() const override { return DType::kI32; }
  Shape sample_shape() const override { return Shape{o_.seq_len}; }
  int64_t labels_per_sample() const override { return o_.seq_len; }
  int64_t labelled(int64_t index) const override {
    return o_.pack ? packed_.tokens[index] : index_.length[index];
  }
  bool pads_per_batch() const override { return !o_.pack; }
  bool segmented() const override { return o_.pack; }

  int32_t get(int64_t, float*) const override {
    FERRY_ASSERT(false, "a document dataset has no images: call read_row()");
    return 0;
  }
  void read(int64_t index, int64_t epoch, void* input, int32_t* labels) const override {
    FERRY_ASSERT(!o_.pack, "packed rows carry segment starts: call read_row()");
    read_row(index, epoch, o_.seq_len, input, labels, nullptr);
  }

  void read_row(int64_t index, int64_t, int64_t len, void* input, int32_t* labels,
                int32_t* segments) const override {
    FERRY_ASSERT(index >= 0 && index < size(), "document index out of range");
    auto* tokens = static_cast<int32_t*>(input);
    int64_t at = 0;
    if (o_.pack) {
      FERRY_ASSERT(len == o_.seq_len && segments != nullptr, "a packed row is seq_len long");
      for (int64_t k = packed_.first[index]; k < packed_.first[static_cast<size_t>(index) + 1];
           ++k) {
        const int64_t d = packed_.docs[k];
        const int64_t n = copy_document(d, tokens + at, labels + at);
        std::fill(segments + at, segments + at + n, static_cast<int32_t>(at));
        at += n;
      }
      std::fill(segments + at, segments + len, static_cast<int32_t>(at));  // the padding's own
    } else {
      FERRY_ASSERT(index_.length[index] <= len, "a row holds its document");
      at = copy_document(index, tokens, labels);
    }
    std::fill(tokens + at, tokens + len, static_cast<int32_t>(o_.eot));
    std::fill(labels + at, labels + len, -1);
  }

  std::string describe() const override {
    const int64_t docs = static_cast<int64_t>(index_.start.size());
    std::string text = fmt::format(
        "documents '{}' ({}, {} tokens, {} documents split at token {}, mean {:.1f} positions, "
        "longest {}, {} cut at seq_len {}",
        printable(file_.path()), file_.format_name(), file_.size(), docs, o_.eot,
        static_cast<double>(index_.tokens) / static_cast<double>(docs), index_.longest, index_.cut,
        o_.seq_len);
    if (o_.pack) {
      text += fmt::format("; packed into {} rows, {:.1f}% filled", packed_.rows(),
                          100.0 * static_cast<double>(index_.tokens) /
                              static_cast<double>(packed_.rows() * o_.seq_len));
    }
    return text + fmt::format(", vocab {})", o_.vocab);
  }

 private:
  // Document d's inputs and labels; returns its length.
  int64_t copy_document(int64_t d, int32_t* tokens, int32_t* labels) const {
    const int64_t start = index_.start[d];
    const int64_t n = index_.length[d];
    file_.read(start, n, o_.vocab, tokens);
    file_.read(start + 1, n, o_.vocab, labels);
    return n;
  }

  TokenFile file_;
  DocumentOptions o_;
  DocumentIndex index_;
  PackedRows packed_;
};

}  // namespace

std::unique_ptr<Dataset> load_document_dataset(const DocumentOptions& options) {
  if (options.seq_len < 1) {
    throw ConfigError(fmt::format("documents need data.seq_len >= 1, got {}", options.seq_len),
                      "set data.seq_len (0 = model.context)");
  }
  if (options.eot < 0 || options.eot >= options.vocab) {
    throw ConfigError(fmt::format("data.eot_token: must be below model.vocab ({}), got {}",
                                  options.vocab, options.eot),
                      "set data.eot_token to the tokenizer's end-of-text token (-1 = model.vocab "
                      "- 1: GPT-2's 50256, prepare_tokens.py's bytes separator 256)");
  }
  return std::make_unique<DocumentDataset>(TokenFile(options.path), options);
}

}  // namespace ferry
