// First-fit allocation over the device range, with coalescing frees, and (with a backing) the
// granules under live allocations backed and given back (Note [Backing a heap on use]).
#include "device/heap.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

#include <fmt/format.h>

#include "common/bytes.h"

namespace ferry {

namespace {
uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }
}  // namespace

DeviceHeap::DeviceHeap(void* base, uint64_t capacity, HeapBacking* backing)
    : base_(static_cast<std::byte*>(base)), capacity_(capacity), backing_(backing) {
  stats_.capacity = capacity;
  if (capacity > 0) free_[0] = capacity;
  if (backing_) {
    const uint64_t g = backing_->granule();
    FERRY_ASSERT(g >= kAlignment && (g & (g - 1)) == 0 && g % kAlignment == 0,
                 "a heap backing's granule is a power of two and a multiple of the alignment");
    FERRY_ASSERT(reinterpret_cast<uintptr_t>(base) % g == 0,
                 "a backed heap's base is aligned to its granule");
  }
}

DeviceHeap::~DeviceHeap() {
  // Whatever is still allocated is given back to the backing (its holders outlived the heap).
  while (backing_ && !live_.empty()) release(base_ + live_.begin()->first);
}

bool DeviceHeap::take_first_fit(FreeMap& free, uint64_t size, uint64_t* offset) {
  for (auto it = free.begin(); it != free.end(); ++it) {
    if (it->second < size) continue;
    *offset = it->first;
    const uint64_t remaining = it->second - size;
    free.erase(it);
    if (remaining > 0) free[*offset + size] = remaining;
    return true;
  }
  return false;
}

void DeviceHeap::give(FreeMap& free, uint64_t start, uint64_t size) {
  auto next = free.lower_bound(start);
  if (next != free.end() && next->first == start + size) {
    size += next->second;
    next = free.erase(next);
  }
  if (next != free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free.erase(prev);
    }
  }
  free[start] = size;
}

std::vector<DeviceHeap::Piece> DeviceHeap::own_pieces(const LiveMap& live, uint64_t offset,
                                                      uint64_t size, uint64_t granule) {
  const uint64_t g = granule;
  const uint64_t end = offset + size;
  // The live blocks just before and just after the range: the only ones that can share a
  // granule with it.
  const auto next = live.lower_bound(offset);
  const uint64_t next_start = next == live.end() ? UINT64_MAX : next->first;
  const uint64_t prev_end =
      next == live.begin() ? 0 : std::prev(next)->first + std::prev(next)->second.bytes;
  // Whether another live block touches the granule starting at k.
  const auto shared = [&](uint64_t k) { return prev_end > k || next_start < k + g; };
  std::vector<Piece> pieces;
  const uint64_t whole_begin = round_up(offset, g);
  const uint64_t whole_end = end / g * g;
  if (whole_begin >= whole_end) {
    // No granule covered whole: one or two granules, each an edge.
    for (uint64_t k = offset / g * g; k < end; k += g)
      if (!shared(k)) pieces.push_back({k, g});
    return pieces;
  }
  if (offset != whole_begin && !shared(whole_begin - g)) pieces.push_back({whole_begin - g, g});
  pieces.push_back({whole_begin, whole_end - whole_begin});
  if (end != whole_end && !shared(whole_end)) pieces.push_back({whole_end, g});
  return pieces;
}

uint64_t DeviceHeap::total(const std::vector<Piece>& pieces) {
  uint64_t bytes = 0;
  for (const Piece& p : pieces) bytes += p.bytes;
  return bytes;
}

void* DeviceHeap::allocate(uint64_t bytes, const std::string& label) {
  const uint64_t size = round_up(std::max<uint64_t>(bytes, 1), kAlignment);
  std::lock_guard lock(mu_);
  uint64_t offset = 0;
  if (take_first_fit(free_, size, &offset)) {
    uint64_t backed = size;
    if (backing_) {
      // Note [Backing a heap on use]: the granules no live block touches yet, before the
      // allocation is handed out; on a failure, those backed so far go back and so does the range.
      const std::vector<Piece> pieces = own_pieces(live_, offset, size, backing_->granule());
      size_t done = 0;
      try {
        for (; done < pieces.size(); ++done)
          backing_->back(pieces[done].offset, pieces[done].bytes, label, bytes);
      } catch (...) {
        while (done > 0) {
          --done;
          backing_->unback(pieces[done].offset, pieces[done].bytes);
        }
        give(free_, offset, size);
        ++stats_.oom_count;
        throw;
      }
      backed = total(pieces);
    }
    live_[offset] = Block{size, label};
    stats_.in_use += size;
    stats_.held += backed;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
    stats_.window_peak = std::max(stats_.window_peak, stats_.in_use);
    ++stats_.allocations;
    return base_ + offset;
  }
  ++stats_.oom_count;
  std::vector<ResidentBlock> resident;
  for (const auto& [at, block] : live_) resident.push_back({block.label, block.bytes});
  std::sort(resident.begin(), resident.end(),
            [](const ResidentBlock& a, const ResidentBlock& b) { return a.bytes > b.bytes; });
  uint64_t largest_free = 0;
  for (const auto& [at, len] : free_) largest_free = std::max(largest_free, len);
  throw OutOfMemoryError(
      OutOfMemoryError::Where::kDevice, label, size, stats_.in_use, capacity_, std::move(resident),
      fmt::format("raise device.memory (largest free range {}), lower data.batch_size, or set "
                  "memory.policy to vdnn-all or auto with a memory.budget",
                  format_bytes(largest_free)));
}

void DeviceHeap::release(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mu_);
  const uint64_t offset = static_cast<uint64_t>(static_cast<std::byte*>(ptr) - base_);
  auto it = live_.find(offset);
  FERRY_ASSERT(it != live_.end(), "release of a pointer the heap did not allocate");
  const uint64_t size = it->second.bytes;
  stats_.in_use -= size;
  live_.erase(it);
  if (backing_) {
    // Note [Backing a heap on use]: the granules no other live block touches, after it is gone.
    const std::vector<Piece> pieces = own_pieces(live_, offset, size, backing_->granule());
    for (auto p = pieces.rbegin(); p != pieces.rend(); ++p) backing_->unback(p->offset, p->bytes);
    stats_.held -= total(pieces);
  } else {
    stats_.held -= size;
  }
  give(free_, offset, size);
}

uint64_t DeviceHeap::held_after(uint64_t bytes, const void* replacing) const {
  const uint64_t size = round_up(std::max<uint64_t>(bytes, 1), kAlignment);
  std::lock_guard lock(mu_);
  uint64_t held = stats_.held;
  uint64_t at = 0, old = 0;
  if (replacing != nullptr) {
    at = static_cast<uint64_t>(static_cast<const std::byte*>(replacing) - base_);
    const auto it = live_.find(at);
    FERRY_ASSERT(it != live_.end(), "held_after: replacing a pointer the heap did not allocate");
    old = it->second.bytes;
  }
  if (!backing_) return held - old + size;
  // The same steps as release() and allocate(), on copies.
  const uint64_t g = backing_->granule();
  LiveMap live = live_;
  FreeMap free = free_;
  if (replacing != nullptr) {
    live.erase(at);
    held -= total(own_pieces(live, at, old, g));
    give(free, at, old);
  }
  uint64_t offset = 0;
  if (!take_first_fit(free, size, &offset)) return held + round_up(size, g);
  return held + total(own_pieces(live, offset, size, g));
}

MemoryStats DeviceHeap::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void DeviceHeap::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak = stats_.in_use;
}

void DeviceHeap::start_window() {
  std::lock_guard lock(mu_);
  stats_.window_peak = stats_.in_use;
}

std::vector<ResidentBlock> DeviceHeap::resident() const {
  std::lock_guard lock(mu_);
  std::vector<ResidentBlock> out;
  for (const auto& [offset, block] : live_) out.push_back({block.label, block.bytes});
  std::sort(out.begin(), out.end(),
            [](const ResidentBlock& a, const ResidentBlock& b) { return a.bytes > b.bytes; });
  return out;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    heap_ = o.heap_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.heap_ = nullptr;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (heap_ && ptr_) heap_->release(ptr_);
  heap_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace ferry
