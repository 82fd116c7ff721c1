// Documents of a token file (data.documents), each a row of its own, padded or packed (data.pack).
// Invariant: index and packing are pure functions of (file, end-of-text token, data.seq_len),
// built once at open; a row's content is a pure function of its index.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/data/dataset.h"

// Note [Documents as rows]
// The separator (data.eot_token; GPT-2's <|endoftext|> 50256, and 256 in the bytes tokenizer of
// scripts/prepare_tokens.py, which writes it before every file as llm.c does) cuts the stream.
// A document is the window from one separator (or the file's first token) to the next separator
// (or the file's last token), both ends included: W + 1 tokens give W positions, inputs
// window[0, W) and labels window[1, W + 1), so a document led by its separator predicts its
// first token from the separator and ends by predicting the next separator. Windows holding
// nothing but separators are no documents. A document longer than data.seq_len is cut to its
// first seq_len positions (the rest is not trained on).
//  - Padded (data.documents alone): one document per row; a batch's rows are as long as its
//    longest document rounded up to data.len_bucket, at most seq_len (batch_length), the same on
//    every rank: the loader computes it from the whole global batch. Positions past a document's
//    end hold the separator (a valid token) with label -1. With causal attention a real position
//    never sees them, and the loss ignores them (kernels.h), so they add exactly nothing to the
//    loss or any gradient.
//  - Packed (data.pack): rows of seq_len holding whole documents (Note [Packing documents]) with
//    their segment starts, so attention stays inside each document and positions restart at
//    each one (Note [Segments of a packed row] in device/kernels.h): a document trains exactly
//    as it would alone. The tail of a row that no document fills is padding, as above.
//
// Note [The mean over real tokens]
// The loss of a step is the mean over the real (labelled) tokens of the whole global batch, as
// one rank holding the global batch would compute it: rank r's loss is the sum over its labelled
// positions divided by G / W, G the global batch's labelled positions and W the ranks. The
// all-reduce averages the ranks' gradients (divides their sum by W), so the gradient is that of
// (sum over every rank's tokens) / G. Every rank knows G without communicating: the loader
// computes it from the document index over the global batch (Batch::loss_divisor). A rank logs
// the mean over its own real tokens (its loss times G / W over its own count, on the host), as
// an image run's rank logs the mean over its own rows: the global mean on one rank.
//
// Note [Packing documents]
// Best-fit decreasing, once at open: documents in decreasing length (file order among equals),
// each into the open row whose free space is smallest among those it fits, else a new row; in a
// row, documents keep file order. It leaves little padding (the tail of each row) and makes rows
// a pure function of the lengths; the loader shuffles the rows per epoch, so an epoch is every
// document once in a new order, though always with the same neighbours.

namespace ferry {

class TokenFile;

// The documents of a token file (Note [Documents as rows]), in file order.
struct DocumentIndex {
  std::vector<int64_t> start;   // the window's first token
  std::vector<int32_t> length;  // positions trained: min(W, seq_len)
  int64_t cut = 0;              // documents longer than seq_len
  int64_t longest = 0;          // the longest W, before cutting
  int64_t tokens = 0;           // sum of length: the labelled positions of an epoch
};

// Splits `file` at every `eot` token (one pass over the mapping). DataError naming the file when
// it holds no `eot` at all (a file tokenised without separators) or no document.
DocumentIndex index_documents(const TokenFile& file, int64_t eot, int64_t seq_len);

// Rows of packed documents (Note [Packing documents]): row r holds documents
// docs[first[r], first[r + 1]) in file order, `tokens[r]` labelled positions in all.
struct PackedRows {
  std::vector<int64_t> first;  // rows + 1 offsets into docs
  std::vector<int64_t> docs;
  std::vector<int64_t> tokens;
  int64_t rows() const { return static_cast<int64_t>(tokens.size()); }
};
// Packs documents of `lengths` (each in [1, seq_len]) into rows of seq_len positions.
PackedRows pack_documents(const std::vector<int32_t>& lengths, int64_t seq_len);

// The length of a padded batch whose longest document has `longest` positions: longest rounded up
// to a multiple of `bucket`, at most seq_len.
int64_t batch_length(int64_t longest, int64_t bucket, int64_t seq_len);
// Every length batch_length can give: bucket, 2 bucket, ... below seq_len, and seq_len.
std::vector<int64_t> length_buckets(int64_t bucket, int64_t seq_len);

struct DocumentOptions {
  std::string path;     // an llm.c or nanoGPT token file
  int64_t seq_len = 0;  // the longest row (>= 1)
  int64_t vocab = 0;    // every token read must be below it
  int64_t eot = 0;      // the separator, in [0, vocab)
  bool pack = false;    // rows of packed documents; false: one document per row
  // Every token checked when the file opens (as TokenDatasetOptions::scan_vocab).
  bool scan_vocab = false;
};

// Opens a token file as documents (Note [Documents as rows]): one sample per document, or per
// packed row. DataError as index_documents and the TokenFile; a token >= vocab is a DataError
// naming the file and position when its row is read, or when the file opens with scan_vocab.
std::unique_ptr<Dataset> load_document_dataset(const DocumentOptions& options);

}  // namespace ferry
