// BatchOrder, epoch_order and batch_side (Note [Partial global batch] in batch_order.h): pure
// functions of their arguments, shared by every rank and worker count.
#include "trainer/data/batch_order.h"

#include <algorithm>
#include <utility>

#include "device/counter_rng.h"

namespace ferry {
namespace {

constexpr uint64_t kOrderDomain = 0x4f72646572536565ull;  // "OrderSee"
constexpr uint64_t kScaleDomain = 0x5363616c65536565ull;  // "ScaleSee"

}  // namespace

BatchOrder::BatchOrder(int64_t size, int64_t batch_size, int world_size, int rank, bool drop_last)
    : size_(size), batch_size_(batch_size), world_size_(world_size), rank_(rank) {
  const int64_t global = batch_size * world_size;
  per_epoch_ = drop_last ? size / global : (size + global - 1) / global;
}

SliceRange BatchOrder::rank_slice(int64_t batch) const {
  const SliceRange g = global_slice(batch);
  const int64_t base = g.count / world_size_;
  const int64_t extra = g.count % world_size_;
  SliceRange r;
  r.count = base + (rank_ < extra ? 1 : 0);
  r.begin = g.begin + rank_ * base + std::min<int64_t>(rank_, extra);
  return r;
}

SliceRange BatchOrder::global_slice(int64_t batch) const {
  const int64_t global = batch_size_ * world_size_;
  SliceRange r;
  r.begin = batch * global;
  r.count = std::min(global, size_ - r.begin);
  return r;
}

LoaderPosition BatchOrder::next(LoaderPosition p) const {
  if (++p.batch == per_epoch_) return LoaderPosition{p.epoch + 1, 0};
  return p;
}

LoaderPosition BatchOrder::after(int64_t batches) const {
  return LoaderPosition{batches / per_epoch_, batches % per_epoch_};
}

std::vector<int64_t> epoch_order(int64_t size, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) order[i] = i;
  if (!shuffle) return order;
  const uint64_t key = counter_hash(seed ^ kOrderDomain, static_cast<uint64_t>(epoch));
  for (int64_t i = size - 1; i > 0; --i) {
    // j uniform in [0, i] by multiply-high (bias below 2^-40 for any realistic size).
    const unsigned __int128 wide =
        static_cast<unsigned __int128>(counter_hash(key, static_cast<uint64_t>(i))) *
        static_cast<uint64_t>(i + 1);
    const int64_t j = static_cast<int64_t>(wide >> 64);
    std::swap(order[i], order[j]);
  }
  return order;
}

int64_t batch_side(const std::vector<int64_t>& scales, uint64_t seed, LoaderPosition p) {
  if (scales.empty()) return 0;
  const uint64_t key = counter_hash(seed ^ kScaleDomain, static_cast<uint64_t>(p.epoch));
  return scales[counter_hash(key, static_cast<uint64_t>(p.batch)) % scales.size()];
}

}  // namespace ferry
