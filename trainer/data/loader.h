// The data loader: a background thread fills batch buffers ahead of the trainer, in an order that
// depends only on (seed, epoch) (Note [The loader's order and buffers]).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "device/host_pool.h"
#include "device/shape.h"
#include "device/stream.h"
#include "trainer/data/batch_order.h"
#include "trainer/data/dataset.h"
#include "trainer/data/worker_pool.h"

namespace ferry {

// Note [The loader's order and buffers]
// The data loader: a background thread (with workers - 1 helpers sharing each batch) fills
// batch buffers ahead of the trainer, in an order that depends only on (seed, epoch) and never
// on timing, on the number of workers or on the number of ranks.
// Invariant: next() returns the batches of position(), position()+1, ... in sequence; a buffer
// is reused only after the lease that holds it has been released.

struct LoaderOptions {
  int64_t batch_size = 32;  // per rank; the global batch is world_size * batch_size
  bool shuffle = true;      // false: file order in every epoch
  uint64_t seed = 0;        // the order of epoch e is a function of (seed, e)
  int world_size = 1;
  int rank = 0;
  // Per-channel normalisation after scaling to [0, 1]: x = (x - mean[c]) / stddev[c].
  // Both empty (none) or both of C values; empty for a non-image (token) dataset.
  std::vector<float> mean;
  std::vector<float> stddev;
  // true: a trailing partial global batch is skipped. false: it is kept and split across the
  // ranks as evenly as possible (Note [Partial global batch] in batch_order.h).
  bool drop_last = true;
  int prefetch = 2;      // batches prepared ahead of the consumer (>= 1)
  int workers = 1;       // threads preparing the samples of a batch (>= 1; data.workers)
  int max_leases = 2;    // batches the consumer may hold at once (>= 1)
  int64_t epochs = 0;    // 0: endless (training); n > 0: next() ends after n epochs (eval: 1)
  LoaderPosition start;  // where the first next() starts (resume)
  // Note [Per-batch sides]: image sides to draw each global batch at (data.scales); empty = the
  // dataset's own shape. The side of a batch is a pure function of (seed, epoch, batch index):
  // the same on every rank and for any worker count. Needs a dataset with max_side() >= each.
  std::vector<int64_t> scales;
  // Padded documents (data.len_bucket, Note [Documents as rows] in documents.h): a batch's rows
  // are its longest document rounded up to a multiple of this (at most the dataset's T), a pure
  // function of (seed, epoch, batch index) over the whole global batch: the same on every rank.
  int64_t len_bucket = 64;
  // Where batch buffers come from (pinned memory for asynchronous device copies); nullptr:
  // aligned host memory. Must outlive the loader and every Batch it returned.
  PinnedAllocator* allocator = nullptr;
  // > 0: a batch whose input would take more bytes than this (the device's memory budget) is
  // neither allocated nor generated (Note [Batches too large to train] in loader.cc).
  uint64_t max_input_bytes = 0;
  // Input shapes never generated (the consumer drops them: memory.oversize skip), as if passed
  // to DataLoader::skip_shape before the first batch; the buffers do not hold them either.
  std::vector<Shape> skip_shapes;
};

namespace loader_detail {
struct State;
struct Slot;
}  // namespace loader_detail

// A lease on one prepared batch. Its buffers go back to the loader when the lease is
// destroyed or released: release only after any asynchronous copy out of it has completed.
// A default-constructed (or end-of-pass) Batch is false.
class Batch {
 public:
  Batch() = default;
  Batch(Batch&& other) noexcept;
  Batch& operator=(Batch&& other) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch() { release(); }

  // false at the end of a finite pass (LoaderOptions::epochs > 0).
  explicit operator bool() const { return slot_ != nullptr; }
  // The graph's input rows (Note [Sample layout] in dataset.h): (n, sample_shape...) of the
  // dataset's input_dtype(): float (n, C, H, W) images or int32 (n, T) tokens. Rows beyond n
  // unspecified.
  void* input() const;
  // input() as floats for an image dataset; nullptr for any other input dtype.
  float* images() const;  // (n, C, H, W), rows beyond n unspecified
  // (n) class labels, or (n, labels_per_sample) (tokens: (n, T) next tokens; documents: -1 on
  // padding positions).
  int32_t* labels() const;
  // Packed documents: (n, T) segment starts (Note [Segments of a packed row] in
  // device/kernels.h); null for any other dataset.
  int32_t* segments() const;
  // Labelled positions in this rank's rows (documents: real tokens; otherwise every label).
  int64_t labelled() const;
  // What this rank's loss sum is divided by (Note [The mean over real tokens] in documents.h):
  // the global batch's labelled positions over the ranks; 0 (every label, the loss's own mean)
  // for any source but documents.
  float loss_divisor() const;
  // The input's shape: (n, C, H, W) images at this batch's side, or (n, T) tokens.
  Shape shape() const;
  // Rows in this batch: batch_size, fewer in a kept partial batch (possibly 0 on some ranks).
  int64_t size() const;
  // false for a batch the consumer drops unread (Note [Batches too large to train]): its shape,
  // size and position are set, its input, labels and segments must not be asked for.
  bool generated() const;
  LoaderPosition position() const;
  int64_t epoch() const { return position().epoch; }
  int64_t index_in_epoch() const { return position().batch; }
  // Returns the buffers to the loader; the Batch becomes false. Idempotent.
  void release();
  // Returns the buffers to the loader once `done` (recorded after the last asynchronous copy
  // out of them) has completed: the loader's thread waits for it before refilling them, so the
  // consumer never blocks here. The Batch becomes false.
  void release_after(std::shared_ptr<Event> done);

 private:
  friend class DataLoader;
  Batch(std::shared_ptr<loader_detail::State> state, loader_detail::Slot* slot)
      : state_(std::move(state)), slot_(slot) {}
  std::shared_ptr<loader_detail::State> state_;
  loader_detail::Slot* slot_ = nullptr;
};

class DataLoader {
 public:
  // Starts the background thread at options.start. ConfigError for invalid options (batch
  // size, rank, mean/std that do not match the channels, a dataset smaller than one global
  // batch with drop_last).
  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  // Stops and joins the thread, also when it waits for a free buffer. Leases stay valid.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The batch at position(), waiting for it if needed. Rethrows (as its own type) an error the
  // background thread met on this batch, and again on every later call. A false Batch at the
  // end of a finite pass. Throws ConfigError instead of blocking forever when the consumer
  // holds more than max_leases batches. Call from one thread.
  Batch next();
  // The position of the batch next() will return; save it in a checkpoint to resume.
  LoaderPosition position() const { return position_; }
  // Continues at `position` (drops prepared batches, restarts the thread). ConfigError when
  // batch >= batches_per_epoch() or the position is past the end of a finite pass.
  void seek(LoaderPosition position);
  // The position after `batches` calls of next() from the start of epoch 0.
  LoaderPosition position_after(int64_t batches) const;

  int64_t batches_per_epoch() const { return batches_.per_epoch(); }
  // Dataset indices this rank gets in the batch at `position`, in row order. A pure function of
  // the options: what next() returns for that position.
  std::vector<int64_t> indices(LoaderPosition position) const;
  // (batch_size, sample_shape...): the capacity of a batch buffer's input, e.g.
  // (batch_size, C, H, W) for images and (batch_size, T) for tokens; at the largest of
  // options.scales when given whose batches are generated (within max_input_bytes).
  Shape batch_shape() const;
  // Batches of this input shape are no longer generated, from the next one prepared on: the
  // consumer drops them (memory.oversize skip). Callable from any thread.
  void skip_shape(const Shape& input);
  // Whether a batch of `input` is generated: within max_input_bytes and not skipped.
  bool generates(const Shape& input) const;
  // The image side of the batch at `position` (Note [Per-batch sides]); 0 without scales.
  int64_t side(LoaderPosition position) const;
  // The row length of the batch at `position`: padded documents' batch_length over the global
  // batch (documents.h); the dataset's T for other token sources; 0 for images. A pure function,
  // cheap after the epoch's order: counting it over an epoch's positions gives the distribution
  // of lengths training draws (what a simulator's shape schedule would weigh).
  int64_t length(LoaderPosition position) const;
  // The input shape of this rank's batch at `position`: (rows, C, side, side) or (rows, T...).
  // A pure function of the options: what next() returns there has this shape.
  Shape input_shape(LoaderPosition position) const;
  // Every shape this rank's batches can take: one per scale or length bucket (and a partial
  // batch's).
  std::vector<Shape> input_shapes() const;
  const LoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }

 private:
  void start_thread(LoaderPosition from);
  void stop_thread();
  void produce(LoaderPosition from);  // the background thread
  void fill(loader_detail::Slot& slot, const std::vector<int64_t>& order) const;
  void check_position(LoaderPosition position, const char* what) const;
  // The sample order of `epoch` (epoch_order), cached for the last epoch asked.
  std::shared_ptr<const std::vector<int64_t>> order_of(int64_t epoch) const;
  // Padded documents: the batch length of global batch `batch` in `order`.
  int64_t length_in(const std::vector<int64_t>& order, int64_t batch) const;

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  BatchOrder batches_;  // set once the options are checked
  LoaderPosition position_;
  std::shared_ptr<loader_detail::State> state_;
  std::unique_ptr<WorkerPool> pool_;  // the producer thread plus workers - 1 helpers
  std::thread thread_;
  mutable std::mutex order_mu_;  // guards the cached order (asked from any thread)
  mutable int64_t order_epoch_ = -1;
  mutable std::shared_ptr<const std::vector<int64_t>> order_;
};

}  // namespace ferry
