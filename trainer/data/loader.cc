// DataLoader: one producer thread, a fixed set of batch buffers (slots) cycling between
// free -> filling -> ready -> leased -> free (or leased -> returning -> filling, when released
// after an event: the producer waits for the event, not the consumer), guarded by one mutex.
#include "trainer/data/loader.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>

#include <fmt/format.h>

#include "common/error.h"
#include "trainer/data/documents.h"
#include "trainer/data/loader_impl.h"

namespace ferry {

using loader_detail::Item;
using loader_detail::Slot;
using loader_detail::State;

namespace {

constexpr uint64_t kAlign = 64;

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

uint64_t input_bytes_of(const Shape& input, DType dtype) {
  return static_cast<uint64_t>(input.numel()) * dtype_size(dtype);
}

// Whether a dataset's rows are documents (labelled on some positions only, read by read_row).
bool documents(const Dataset& ds) { return ds.pads_per_batch() || ds.segmented(); }

// Throws ConfigError naming the data.* key when `o` does not fit `ds` or is out of range.
void check_options(const LoaderOptions& o, const Dataset& ds) {
  if (o.batch_size < 1) {
    throw ConfigError(fmt::format("batch size must be at least 1, got {}", o.batch_size),
                      "set data.batch_size");
  }
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    throw ConfigError(fmt::format("rank {} is not in a world of {} ranks", o.rank, o.world_size));
  }
  if (o.prefetch < 1 || o.max_leases < 1 || o.epochs < 0) {
    throw ConfigError(
        fmt::format("data loader needs prefetch >= 1, max_leases >= 1 and epochs "
                    ">= 0; got {}, {}, {}",
                    o.prefetch, o.max_leases, o.epochs));
  }
  if (o.workers < 1) {
    throw ConfigError(fmt::format("data loader needs at least 1 worker, got {}", o.workers),
                      "set data.workers >= 1");
  }
  const Shape sample = ds.sample_shape();
  const bool images = ds.input_dtype() == DType::kF32;
  FERRY_ASSERT(!images || sample.rank() == 3, "dataset image shape must be (C, H, W)");
  FERRY_ASSERT(ds.labels_per_sample() >= 1, "a sample needs at least one label");
  if (!images && (!o.mean.empty() || !o.stddev.empty())) {
    throw ConfigError(fmt::format("data.mean and data.std normalise images; dataset {} holds "
                                  "no images",
                                  ds.describe()),
                      "set data.mean=[] and data.std=[]");
  }
  const size_t channels = images ? static_cast<size_t>(sample[0]) : 0;
  if (o.mean.size() != o.stddev.size() || (!o.mean.empty() && o.mean.size() != channels)) {
    throw ConfigError(
        fmt::format("data.mean has {} values and data.std {}; the data has {} "
                    "channels",
                    o.mean.size(), o.stddev.size(), channels),
        fmt::format("give both with one value per channel ({}), or neither", channels));
  }
  for (float s : o.stddev) {
    if (!(s > 0) || !std::isfinite(s)) {
      throw ConfigError(fmt::format("data.std value {} is not a positive number", s),
                        "every data.std value must be > 0");
    }
  }
  if (o.len_bucket < 1) {
    throw ConfigError(fmt::format("data.len_bucket: must be >= 1, got {}", o.len_bucket),
                      "give the multiple of tokens a padded batch's length is rounded up to");
  }
  if (!o.scales.empty()) {
    if (!images || ds.max_side() == 0) {
      throw ConfigError(fmt::format("data.scales: dataset {} cannot make its images at another "
                                    "side",
                                    ds.describe()),
                        "data.scales works with synthetic data and imagefolder training; set "
                        "data.scales=[] for this source");
    }
    for (int64_t side : o.scales) {
      if (side < 1 || side > ds.max_side()) {
        throw ConfigError(
            fmt::format("data.scales: side {} is outside [1, {}], what dataset {} can give", side,
                        ds.max_side(), ds.describe()),
            fmt::format("give sides from 1 to {}", ds.max_side()));
      }
    }
  }
}

}  // namespace

// ---- Batch ----

Batch::Batch(Batch&& other) noexcept : state_(std::move(other.state_)), slot_(other.slot_) {
  other.slot_ = nullptr;
}

Batch& Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
    slot_ = other.slot_;
    other.slot_ = nullptr;
  }
  return *this;
}

// A batch that was not generated has no contents to hand out: asking is a consumer's bug.
void* Batch::input() const {
  FERRY_ASSERT(!slot_ || slot_->generated, "the input of a batch that was not generated");
  return slot_ ? slot_->input : nullptr;
}
float* Batch::images() const {
  FERRY_ASSERT(!slot_ || slot_->generated, "the images of a batch that was not generated");
  return slot_ && slot_->float_input ? static_cast<float*>(slot_->input) : nullptr;
}
int32_t* Batch::labels() const {
  FERRY_ASSERT(!slot_ || slot_->generated, "the labels of a batch that was not generated");
  return slot_ ? slot_->labels : nullptr;
}
int32_t* Batch::segments() const {
  FERRY_ASSERT(!slot_ || slot_->generated, "the segments of a batch that was not generated");
  return slot_ ? slot_->segments : nullptr;
}
bool Batch::generated() const { return slot_ && slot_->generated; }
int64_t Batch::labelled() const { return slot_ ? slot_->labelled : 0; }
float Batch::loss_divisor() const { return slot_ ? slot_->loss_divisor : 0.0f; }
Shape Batch::shape() const { return slot_ ? slot_->shape : Shape{}; }
int64_t Batch::size() const { return slot_ ? slot_->n : 0; }
LoaderPosition Batch::position() const { return slot_ ? slot_->position : LoaderPosition{}; }

void Batch::release() {
  if (slot_ != nullptr) {
    state_->give_back(slot_);
    slot_ = nullptr;
  }
  state_.reset();
}

void Batch::release_after(std::shared_ptr<Event> done) {
  if (slot_ != nullptr) {
    state_->give_back_after(slot_, std::move(done));
    slot_ = nullptr;
  }
  state_.reset();
}

// ---- DataLoader ----

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  FERRY_ASSERT(dataset_ != nullptr, "DataLoader needs a dataset");
  const LoaderOptions& o = options_;
  check_options(o, *dataset_);
  const bool images = dataset_->input_dtype() == DType::kF32;
  const int64_t size = dataset_->size();
  if (size < 1) throw DataError(fmt::format("dataset {} is empty", dataset_->describe()));
  const int64_t global = o.batch_size * o.world_size;
  batches_ = BatchOrder(size, o.batch_size, o.world_size, o.rank, o.drop_last);
  if (batches_.per_epoch() == 0) {
    throw ConfigError(fmt::format("dataset {} has {} samples, fewer than one global batch of {} "
                                  "({} ranks x batch size {})",
                                  dataset_->describe(), size, global, o.world_size, o.batch_size),
                      "lower data.batch_size, or keep the partial batch (drop_last false)");
  }
  check_position(o.start, "start");

  state_ = std::make_shared<State>();
  state_->allocator = o.allocator;
  for (const Shape& s : o.skip_shapes) state_->skipped_shapes.insert(s.dims());
  // No input space when no batch is generated (Note [Batches too large to train]).
  const bool none_generated = !generates(batch_shape());
  const uint64_t input_bytes =
      none_generated ? 0 : round_up(input_bytes_of(batch_shape(), dataset_->input_dtype()), kAlign);
  const uint64_t labels_bytes =
      round_up(static_cast<uint64_t>(o.batch_size) *
                   static_cast<uint64_t>(dataset_->labels_per_sample()) * 4,
               kAlign);
  // Packed documents: a segment start per input position.
  const uint64_t segments_bytes = dataset_->segmented() && !none_generated
                                      ? static_cast<uint64_t>(batch_shape().numel()) * 4
                                      : 0;
  const uint64_t block_bytes = round_up(input_bytes + labels_bytes + segments_bytes, kAlign);
  for (int i = 0; i < o.prefetch + o.max_leases; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->block_bytes = block_bytes;
    slot->block =
        o.allocator ? o.allocator->allocate(block_bytes) : std::aligned_alloc(kAlign, block_bytes);
    if (slot->block == nullptr) throw std::bad_alloc();
    slot->input = slot->block;
    slot->labels = reinterpret_cast<int32_t*>(static_cast<char*>(slot->block) + input_bytes);
    if (segments_bytes > 0) {
      slot->segments =
          reinterpret_cast<int32_t*>(static_cast<char*>(slot->block) + input_bytes + labels_bytes);
    }
    slot->float_input = images;
    state_->free.push_back(slot.get());
    state_->slots.push_back(std::move(slot));
  }
  pool_ = std::make_unique<WorkerPool>(o.workers);
  position_ = o.start;
  start_thread(o.start);
}

DataLoader::~DataLoader() { stop_thread(); }

void DataLoader::check_position(LoaderPosition p, const char* what) const {
  const bool end_of_pass = options_.epochs > 0 && p.epoch == options_.epochs && p.batch == 0;
  if (p.epoch < 0 || p.batch < 0 || p.batch >= batches_.per_epoch() ||
      (options_.epochs > 0 && p.epoch >= options_.epochs)) {
    if (end_of_pass) return;
    throw ConfigError(
        fmt::format(
            "data loader {} (epoch {}, batch {}) is out of range: an epoch "
            "has {} batches{}",
            what, p.epoch, p.batch, batches_.per_epoch(),
            options_.epochs > 0 ? fmt::format(" and the pass {} epochs", options_.epochs) : ""),
        "resume from a checkpoint written with the same data and batch settings");
  }
}

void DataLoader::start_thread(LoaderPosition from) {
  state_->stop = false;
  thread_ = std::thread([this, from] { produce(from); });
}

void DataLoader::stop_thread() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  thread_.join();
}

void DataLoader::seek(LoaderPosition position) {
  check_position(position, "seek target");
  stop_thread();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (const Item& item : state_->ready) {
      if (item.slot != nullptr) state_->free.push_back(item.slot);
    }
    state_->ready.clear();
    state_->ready_batches = 0;
    state_->filling = false;
  }
  position_ = position;
  start_thread(position);
}

LoaderPosition DataLoader::position_after(int64_t batches) const { return batches_.after(batches); }

std::vector<int64_t> DataLoader::indices(LoaderPosition p) const {
  check_position(p, "position");
  const std::vector<int64_t> order =
      epoch_order(dataset_->size(), options_.shuffle, options_.seed, p.epoch);
  const SliceRange r = batches_.rank_slice(p.batch);
  return std::vector<int64_t>(order.begin() + r.begin, order.begin() + r.begin + r.count);
}

namespace {

// (rows, sample...) with an image's H and W replaced by `side` when it is not 0.
Shape rows_of(const Dataset& ds, int64_t rows, int64_t side) {
  const Shape sample = ds.sample_shape();
  std::vector<int64_t> dims{rows};
  for (size_t d = 0; d < sample.rank(); ++d) dims.push_back(side > 0 && d > 0 ? side : sample[d]);
  return Shape(dims);
}

}  // namespace

// Note [Batches too large to train]
// A batch's input must be on the device, whole, for its step; a shape whose input alone is
// larger than the device's memory budget can have no plan, whatever memory.oversize says. Such
// batches (a large side of data.scales) are neither allocated nor generated: the buffers hold
// the largest shape within LoaderOptions::max_input_bytes, and a batch beyond it comes out with
// its shape, size and position only (Batch::generated() false), for the consumer to refuse
// (memory.oversize error: before any step) or drop (skip). A shape the planner refuses for
// other reasons is not generated either when the consumer knows it before the loader starts
// (LoaderOptions::skip_shapes: the trainer plans each side of data.scales first under skip) or
// once it drops it (skip_shape). Which batches are generated never changes which position holds
// which samples or side, so the data order is the same with and without skipping.

bool DataLoader::generates(const Shape& input) const {
  if (options_.max_input_bytes > 0 &&
      input_bytes_of(input, dataset_->input_dtype()) > options_.max_input_bytes) {
    return false;
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  return !state_->skipped_shapes.count(input.dims());
}

Shape DataLoader::batch_shape() const {
  int64_t largest = 0;
  for (int64_t side : options_.scales) {
    if (generates(rows_of(*dataset_, options_.batch_size, side))) largest = std::max(largest, side);
  }
  // Every side too large: no batch is generated; the buffers hold the smallest (never filled).
  if (!options_.scales.empty() && largest == 0) {
    largest = *std::min_element(options_.scales.begin(), options_.scales.end());
  }
  return rows_of(*dataset_, options_.batch_size, largest);
}

void DataLoader::skip_shape(const Shape& input) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->skipped_shapes.insert(input.dims());
}

int64_t DataLoader::side(LoaderPosition p) const {
  return batch_side(options_.scales, options_.seed, p);
}

std::shared_ptr<const std::vector<int64_t>> DataLoader::order_of(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(order_mu_);
  if (order_epoch_ != epoch) {
    order_ = std::make_shared<const std::vector<int64_t>>(
        epoch_order(dataset_->size(), options_.shuffle, options_.seed, epoch));
    order_epoch_ = epoch;
  }
  return order_;
}

int64_t DataLoader::length_in(const std::vector<int64_t>& order, int64_t batch) const {
  const SliceRange g = batches_.global_slice(batch);
  int64_t longest = 0;
  for (int64_t i = g.begin; i < g.begin + g.count; ++i) {
    longest = std::max(longest, dataset_->labelled(order[i]));
  }
  return batch_length(longest, options_.len_bucket, dataset_->sample_shape()[0]);
}

int64_t DataLoader::length(LoaderPosition p) const {
  if (dataset_->input_dtype() == DType::kF32) return 0;
  if (!dataset_->pads_per_batch()) return dataset_->sample_shape()[0];
  check_position(p, "position");
  return length_in(*order_of(p.epoch), p.batch);
}

Shape DataLoader::input_shape(LoaderPosition p) const {
  const SliceRange r = batches_.rank_slice(p.batch);
  if (dataset_->pads_per_batch()) return Shape{r.count, length(p)};
  return rows_of(*dataset_, r.count, side(p));
}

std::vector<Shape> DataLoader::input_shapes() const {
  std::vector<int64_t> rows{options_.batch_size};
  const SliceRange last = batches_.rank_slice(batches_.per_epoch() - 1);
  if (last.count != options_.batch_size) rows.push_back(last.count);
  std::vector<int64_t> sides = options_.scales;
  if (sides.empty()) sides.push_back(0);
  std::vector<Shape> out;
  for (int64_t n : rows) {
    if (dataset_->pads_per_batch()) {
      for (int64_t len : length_buckets(options_.len_bucket, dataset_->sample_shape()[0])) {
        out.push_back(Shape{n, len});
      }
      continue;
    }
    for (int64_t side : sides) {
      const Shape s = rows_of(*dataset_, n, side);
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    }
  }
  return out;
}

Batch DataLoader::next() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  while (s.ready.empty()) {
    if (s.free.empty() && s.returning.empty() && !s.filling) {
      throw ConfigError(fmt::format("data loader: the consumer holds all {} batch buffers "
                                    "(max_leases {}); next() would wait forever",
                                    s.slots.size(), options_.max_leases),
                        "release a Batch before asking for the next, or raise max_leases");
    }
    s.cv.wait(lock);
  }
  Item item = s.ready.front();
  if (item.error) std::rethrow_exception(item.error);  // stays queued: later calls rethrow
  if (item.slot == nullptr) return Batch();            // end of the pass, stays queued
  s.ready.pop_front();
  --s.ready_batches;
  lock.unlock();
  s.cv.notify_all();  // the producer may fill another slot
  position_ = item.slot->position;
  position_ = batches_.next(position_);
  return Batch(state_, item.slot);
}

void DataLoader::fill(Slot& slot, const std::vector<int64_t>& order) const {
  const Dataset& ds = *dataset_;
  const SliceRange r = batches_.rank_slice(slot.position.batch);
  const int64_t side = this->side(slot.position);
  // Documents (Note [Documents as rows] in documents.h): rows of the batch's length, and what
  // the loss divides by, from the whole global batch.
  const bool docs = documents(ds);
  const int64_t len = ds.pads_per_batch() ? length_in(order, slot.position.batch) : 0;
  slot.shape = len > 0 ? Shape{r.count, len} : rows_of(ds, r.count, side);
  slot.generated = generates(slot.shape);  // Note [Batches too large to train]
  if (!slot.generated) {
    slot.n = r.count;
    slot.labelled = 0;
    slot.loss_divisor = 0.0f;
    return;
  }
  const Shape one = len > 0 ? Shape{1, len} : rows_of(ds, 1, side);  // (1, sample...)
  const Shape shape(std::vector<int64_t>(one.dims().begin() + 1, one.dims().end()));
  const int64_t sample = shape.numel();
  const int64_t row_bytes = sample * static_cast<int64_t>(dtype_size(ds.input_dtype()));
  const int64_t per_row = docs ? sample : ds.labels_per_sample();
  const int64_t plane = slot.float_input ? shape[1] * shape[2] : 0;
  const int64_t classes = ds.classes();
  slot.n = r.count;
  slot.labelled = r.count * per_row;
  slot.loss_divisor = 0.0f;
  if (docs) {
    const SliceRange g = batches_.global_slice(slot.position.batch);
    int64_t global = 0;
    slot.labelled = 0;
    for (int64_t i = g.begin; i < g.begin + g.count; ++i) {
      const int64_t l = ds.labelled(order[i]);
      global += l;
      if (i >= r.begin && i < r.begin + r.count) slot.labelled += l;
    }
    slot.loss_divisor =
        static_cast<float>(static_cast<double>(global) / static_cast<double>(options_.world_size));
  }
  // Rows are independent: the workers share them; each row's content depends only on
  // (index, epoch), so the result does not depend on which thread wrote it.
  pool_->run(r.count, [&](int64_t i) {
    if (state_->stop.load(std::memory_order_relaxed)) return;
    const int64_t index = order[r.begin + i];
    void* row = static_cast<char*>(slot.input) + i * row_bytes;
    int32_t* labels = slot.labels + i * per_row;
    if (side > 0) {
      ds.read_at(index, slot.position.epoch, side, static_cast<float*>(row), labels);
    } else if (docs) {
      ds.read_row(index, slot.position.epoch, sample, row, labels,
                  slot.segments ? slot.segments + i * sample : nullptr);
    } else {
      ds.read(index, slot.position.epoch, row, labels);
    }
    for (int64_t k = 0; k < per_row; ++k) {
      if (labels[k] < (docs ? -1 : 0) || labels[k] >= classes) {
        throw DataError(fmt::format("dataset {} gave label {} for sample {}, outside [0, {})",
                                    ds.describe(), labels[k], index, classes));
      }
    }
    if (!options_.mean.empty()) {
      float* pixels = static_cast<float*>(row);
      for (int64_t c = 0; c < shape[0]; ++c) {
        const float mean = options_.mean[c], stddev = options_.stddev[c];
        float* p = pixels + c * plane;
        for (int64_t k = 0; k < plane; ++k) p[k] = (p[k] - mean) / stddev;
      }
    }
  });
}

void DataLoader::produce(LoaderPosition position) {
  State& s = *state_;
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  Slot* slot = nullptr;
  try {
    while (true) {
      if (options_.epochs > 0 && position.epoch >= options_.epochs) {
        {
          std::lock_guard<std::mutex> lock(s.mu);
          s.ready.push_back(Item{});
        }
        s.cv.notify_all();
        return;
      }
      {
        std::unique_lock<std::mutex> lock(s.mu);
        s.cv.wait(lock, [&] {
          return s.stop ||
                 ((!s.free.empty() || !s.returning.empty()) && s.ready_batches < options_.prefetch);
        });
        if (s.stop) return;
        auto [taken, done] = s.take_slot();
        slot = taken;
        s.filling = true;
        lock.unlock();
        if (done) done->synchronize();  // the last copy out of this buffer has finished
      }
      if (order_epoch != position.epoch) {
        order = epoch_order(dataset_->size(), options_.shuffle, options_.seed, position.epoch);
        order_epoch = position.epoch;
      }
      slot->position = position;
      fill(*slot, order);
      {
        std::lock_guard<std::mutex> lock(s.mu);
        s.filling = false;
        if (s.stop) {
          s.free.push_back(slot);
          return;
        }
        s.ready.push_back(Item{slot, nullptr});
        ++s.ready_batches;
        slot = nullptr;
      }
      s.cv.notify_all();
      position = batches_.next(position);
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.filling = false;
      if (slot != nullptr) s.free.push_back(slot);
      s.ready.push_back(Item{nullptr, std::current_exception()});
    }
    s.cv.notify_all();
  }
}

}  // namespace ferry
