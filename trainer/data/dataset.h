// Datasets behind one small interface: image classification (synthetic, MNIST, CIFAR-10, image
// folders) and token windows for language models. Invariant: get(), sample() and read() are pure,
// thread-safe functions of (index, epoch), so the loader's order alone decides what a batch holds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/dtype.h"
#include "device/shape.h"
#include "trainer/data/image_decode.h"

namespace ferry {

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Number of samples.
  virtual int64_t size() const = 0;
  // (C, H, W) of every sample (images); empty for a token source.
  virtual Shape image_shape() const = 0;
  // Labels lie in [0, classes()) (for tokens: the vocabulary).
  virtual int64_t classes() const = 0;

  // Note [Sample layout]: what one sample is, for the loader's buffers and the graph's input
  // and labels tensors. A batch of n samples is an input tensor of input_dtype() and shape
  // (n, sample_shape()...) and labels int32 (n, labels_per_sample()), row-major; with one
  // label per sample the labels are (n). Images (the defaults): float32 (C, H, W), 1 label.
  // Tokens: int32 (T) = window[0, T), labels (T) = window[1, T + 1).
  virtual DType input_dtype() const { return DType::kF32; }
  virtual Shape sample_shape() const { return image_shape(); }
  virtual int64_t labels_per_sample() const { return 1; }
  // Writes sample `index`'s draw in `epoch`: sample_shape().numel() values of input_dtype()
  // into `input` and labels_per_sample() labels into `labels`. Const and thread-safe. By
  // default sample() with its one label.
  virtual void read(int64_t index, int64_t epoch, void* input, int32_t* labels) const {
    labels[0] = sample(index, epoch, static_cast<float*>(input));
  }

  // Writes sample `index` (0 <= index < size()) into `pixels`: C*H*W floats, CHW order, scaled
  // to [0, 1]; returns its label. Const and safe to call from several threads at once.
  virtual int32_t get(int64_t index, float* pixels /* (C, H, W) */) const = 0;
  // As get(), for the sample's draw in `epoch`: a source with random augmentation (imagefolder
  // training) keys it by (its seed, epoch, index); by default the epoch changes nothing.
  virtual int32_t sample(int64_t index, int64_t epoch, float* pixels /* (C, H, W) */) const {
    (void)epoch;
    return get(index, pixels);
  }
  // Note [Per-batch sides] (data.scales, loader.h): a source that can make its images at another
  // square side says how large (0: it cannot resize; idx, cifar10, tokens), and read_at()
  // writes sample `index`'s draw in `epoch` as (C, side, side) floats: a synthetic image
  // generated at that side, an image folder's RandomResizedCrop to it (training only).
  virtual int64_t max_side() const { return 0; }
  virtual void read_at(int64_t index, int64_t epoch, int64_t side, float* pixels /* (C, s, s) */,
                       int32_t* labels) const;
  // Documents (Note [Documents as rows] in trainer/data/documents.h): samples whose rows carry
  // labels on only some positions. The positions of sample `index` that carry a label (a
  // document's length, a packed row's documents' total); -1: every position (the default).
  virtual int64_t labelled(int64_t index) const {
    (void)index;
    return -1;
  }
  // Whether a batch's rows are cut to its longest sample (padded documents: the loader computes
  // the batch length, batch_length in documents.h).
  virtual bool pads_per_batch() const { return false; }
  // Whether rows carry segment starts (packed documents: Note [Segments of a packed row] in
  // device/kernels.h).
  virtual bool segmented() const { return false; }
  // Writes sample `index` as a row of `len` positions (at most sample_shape()'s T, at least
  // labelled(index)): tokens into `input`, labels (-1 on positions without one), and, when
  // segmented(), the row's segment starts into `segments`. Const and thread-safe. By default
  // read(), for len equal to sample_shape()'s T.
  virtual void read_row(int64_t index, int64_t epoch, int64_t len, void* input, int32_t* labels,
                        int32_t* segments) const;
  // Warnings met since the last call (a skipped unreadable file), for the run's log.
  virtual std::vector<std::string> take_warnings() const { return {}; }
  // Samples whose file could not be read and was skipped so far.
  virtual int64_t skipped() const { return 0; }
  // Whether sample `index` was found unreadable (and so replaced by another) so far.
  virtual bool unreadable(int64_t index) const {
    (void)index;
    return false;
  }
  // One line for logs, e.g. "cifar10 'data/cifar' (50000 x (3, 32, 32), 10 classes)".
  virtual std::string describe() const = 0;
};

// The largest side data.scales may ask of a source that can resize (a 3 x 16384 x 16384 image is
// 3 GiB of floats).
constexpr int64_t kMaxScaleSide = 16384;

// A learnable, procedurally generated task (Note [Synthetic task] in synthetic_dataset.cc):
// class k is an oriented sinusoidal grating (orientation pi*k/classes, one of three spatial
// frequencies) under a Gaussian window, with random position, phase, contrast, colour and
// pixel noise. Each sample is generated from (seed, index) on demand; nothing is stored. The
// seed picks the samples, not the task: two seeds give a train and a held-out set of one task.
// ConfigError when `chw` is not (C, H, W) with positive dimensions, classes < 1 or samples < 1.
std::unique_ptr<Dataset> make_synthetic_dataset(const Shape& chw, int64_t classes, int64_t samples,
                                                uint64_t seed);

// MNIST-style IDX files: images u8 [N, H, W] (magic 0x00000803), labels u8 [N] (magic
// 0x00000801), big-endian dimensions. An empty `labels_path` is derived from `images_path` by
// replacing "images" with "labels" and "idx3" with "idx1" in the file name
// ("train-images-idx3-ubyte" -> "train-labels-idx1-ubyte", "t10k-images.idx3-ubyte" ->
// "t10k-labels.idx1-ubyte"). Every label must be below `classes` (0: classes = max label + 1).
// DataError naming the file and the problem for a missing, gzip-compressed, truncated or
// malformed file, or images and labels that disagree.
std::unique_ptr<Dataset> load_idx_dataset(const std::string& images_path,
                                          const std::string& labels_path = "",
                                          int64_t classes = 10);

// CIFAR-10 binary batches: records of 1 label byte + 3072 pixel bytes (R, G, B planes of
// 32x32). `path` is one batch file, or a folder: all data_batch_<n>.bin in it, in order of n;
// when there is none, test_batch.bin; when neither, the same rule inside its
// cifar-10-batches-bin subfolder (the folder the official archive unpacks to). DataError for
// a missing, empty or truncated file (size not a multiple of 3073) or a label above 9.
std::unique_ptr<Dataset> load_cifar10_dataset(const std::string& path);

// An image folder (torchvision's ImageFolder layout) and its transforms.
struct ImageFolderOptions {
  std::string path;  // one subfolder per class
  int64_t crop_height = 224, crop_width = 224;
  int64_t resize = 256;   // evaluation: the short side before the center crop
  bool augment = true;    // training: RandomResizedCrop + flip; false: resize + center crop
  uint64_t seed = 0;      // augmentation draws: a function of (seed, epoch, index)
  bool skip_bad = false;  // replace an unreadable file by the next readable one, with a warning
  DecodeLimits limits;
};

// torchvision's ImageFolder: classes are the subfolders of `options.path` sorted by name (label
// = position); samples are the .jpg/.jpeg/.png files (any case) below each, folders sorted by
// path and files by name. Each sample is decoded and transformed when read: (3, crop_height,
// crop_width) in [0, 1]. DataError for a missing folder, no class subfolder or a class folder
// without images (naming it); an unreadable image is a DataError naming the file when read
// (unless skip_bad).
std::unique_ptr<Dataset> load_imagefolder_dataset(const ImageFolderOptions& options);

// Note [Token windows]: a token source of N tokens and sequence length T has
// floor((N - 1) / T) samples (an epoch): as many as the non-overlapping windows of T + 1 tokens
// (T inputs and their T next tokens) that start at multiples of T. Sample k is
//   sequential (evaluation, or training with data.shuffle false): tokens [k*T, k*T + T + 1),
//     so one pass covers every full window once, in file order;
//   random (training): tokens [o, o + T + 1) at o = token_window_start(...), uniform in
//     [0, N - T - 1] and a pure function of (seed, epoch, k): the same whatever the worker
//     count, rank count or timing, and fresh windows every epoch.
// Input row = window[0, T), labels row = window[1, T + 1).
struct TokenDatasetOptions {
  std::string path;     // an llm.c or nanoGPT token file (trainer/data/token_file.h)
  int64_t seq_len = 0;  // T >= 1
  int64_t vocab = 0;    // every token read must be below it (>= 1)
  bool random = true;   // training: random windows; false: consecutive windows
  uint64_t seed = 0;    // random windows: a function of (seed, epoch, index)
  // Every token checked against vocab once, when the file opens (TokenFile::check_vocab);
  // open_dataset sets it, so a run refuses a bad file before training.
  bool scan_vocab = false;
};

// Opens a token source (Note [Token windows]). DataError naming the file for the TokenFile
// errors and for a file of fewer than seq_len + 1 tokens; ConfigError for seq_len or vocab
// < 1. A token >= vocab is a DataError naming the file and its position when it is read, or
// when the file opens with scan_vocab.
std::unique_ptr<Dataset> load_token_dataset(const TokenDatasetOptions& options);

// The first token of sample `index`'s window in `epoch` (Note [Token windows]) for a file of
// `tokens` tokens (>= seq_len + 1).
int64_t token_window_start(int64_t tokens, int64_t seq_len, bool random, uint64_t seed,
                           int64_t epoch, int64_t index);

// What a config's data section says about the source; the session fills it.
struct DatasetSpec {
  std::string source = "synthetic";  // "synthetic", "idx", "cifar10", "imagefolder", "tokens"
  std::string path;                  // idx: the images file; cifar10: a batch file or folder;
                                     // tokens: the token file
  std::string labels_path;           // idx only; empty = derived from `path`
  Shape image_shape;                 // synthetic: (C, H, W)
  int64_t classes = 10;              // synthetic: classes; idx: labels must be below it;
                                     // tokens: the vocabulary
  int64_t samples = 0;               // synthetic: number of samples
  uint64_t seed = 0;                 // synthetic: which samples; imagefolder: augmentation;
                                     // tokens: random windows
  int64_t seq_len = 0;               // tokens: T (resolved, >= 1)
  // tokens: documents split at `eot` (data.documents), packed into rows (data.pack); Note
  // [Documents as rows] in documents.h.
  bool documents = false;
  bool pack = false;
  int64_t eot = 0;
  // imagefolder: crop = image_shape's H and W; path = the folder.
  int64_t resize = 256;
  bool augment = true;  // tokens: random windows (false: consecutive, in file order)
  bool skip_bad = false;
};

// Opens the dataset `spec` describes. ConfigError for an unknown source (naming the nearest).
// A token source checks every token against the vocabulary here, before any training.
std::unique_ptr<Dataset> open_dataset(const DatasetSpec& spec);

}  // namespace ferry
