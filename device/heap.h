// Device memory with a hard capacity: one backend range cut by a labelled first-fit allocator.
// Invariant: in_use <= capacity, live ranges never overlap, and (backed) held = the granules live
// allocations touch (Note [A heap's range and labels]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"

// Note [A heap's range and labels]
// The range is handed over by the backend, and the first-fit allocator remembers a label per
// allocation, so an out-of-memory error can say what was resident. With a HeapBacking, physical
// memory lies only under live allocations (Note [Backing a heap on use]).

namespace ferry {

struct MemoryStats {
  uint64_t capacity = 0;
  uint64_t in_use = 0;
  uint64_t peak = 0;
  uint64_t window_peak = 0;  // the largest in_use since the last start_window()
  uint64_t oom_count = 0;
  uint64_t allocations = 0;
  // The bytes of device memory the heap holds: with a HeapBacking, the granules backed (Note
  // [Backing a heap on use]); without one, in_use (the backend holds the whole range anyway).
  uint64_t held = 0;
};

// Note [Backing a heap on use] (step 6 of Note [Life of a memory share], trainer/share/lease.h)
// A heap given a HeapBacking (a CUDA device sharing its GPU, memory.share) holds physical memory
// only under its live allocations: its range is reserved address space, and the heap tells the
// backing which granules to back and to give back. A granule is backed while some live
// allocation touches it, in pieces: the granules an allocation covers whole are one piece, backed
// when it is allocated and given back when it is released; a granule it covers only in part (its
// first or last, when it does not start or end on a granule boundary) is a piece of its own,
// backed by the first allocation to touch it and given back when the last one touching it goes.
// Live allocations never overlap, so only the live blocks just before and just after one can
// share its edge granules, and the heap finds them in its map of live blocks: no counts to keep
// or to get wrong. Hence every granule a live allocation touches is backed exactly once, nothing
// else is, every piece is given back exactly as it was backed (the CUDA driver unmaps whole
// mappings only), and an allocation of any size costs at most three pieces (a 40 GiB arena is
// not 20480 calls per switch, as one piece per granule would be). Mapping up to the high-water
// offset instead would be as simple but would hold every hole below the top; this holds the
// same in the trainer's layout (persistent blocks from offset 0, then the arena: one run, held <
// in_use + one granule) and less in any other. Placement is first fit as without a backing, so
// offsets and plans are the same on every backend; MemoryStats::held counts the backed bytes.
// A piece the backing cannot back (another process took the memory) fails the allocation with
// the backing's OutOfMemoryError and leaves the heap as it was.

// What stands behind a DeviceHeap's range when the heap holds memory on use (Note [Backing a
// heap on use]). The heap calls it under its lock.
class HeapBacking {
 public:
  virtual ~HeapBacking() = default;
  // Bytes per granule: a power of two, a multiple of DeviceHeap::kAlignment.
  virtual uint64_t granule() const = 0;
  // Backs [offset, offset + bytes) of the heap's range, whole granules none of which is backed,
  // as one piece, for the allocation `label` of `asked` bytes. Throws (OutOfMemoryError when
  // the memory is not there) with nothing of the piece backed.
  virtual void back(uint64_t offset, uint64_t bytes, const std::string& label, uint64_t asked) = 0;
  // Gives back a piece exactly as back() backed it; no live allocation touches it. Never throws.
  virtual void unback(uint64_t offset, uint64_t bytes) noexcept = 0;
};

class DeviceHeap {
 public:
  static constexpr uint64_t kAlignment = 256;

  // `base` points at `capacity` bytes of device memory owned by the caller. With `backing`
  // (which outlives the heap), `base` is aligned to its granule and the caller's range reaches
  // round_up(capacity, granule) bytes, backed only where allocations live; the heap gives back
  // whatever is still backed when it is destroyed.
  DeviceHeap(void* base, uint64_t capacity, HeapBacking* backing = nullptr);
  ~DeviceHeap();
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  // Reserves `bytes` (rounded up to kAlignment), backing its granules first when the heap has a
  // backing. Throws OutOfMemoryError naming the resident allocations when no free range fits,
  // or the backing's when it cannot back them (the heap then unchanged).
  void* allocate(uint64_t bytes, const std::string& label);
  void release(void* ptr);
  // MemoryStats::held once `replacing` (a live allocation, or null) were released and then
  // `bytes` allocated, without doing either: what a job sharing its device tells its ledger
  // before the memory is taken. Exact when the allocation fits; otherwise an upper bound.
  uint64_t held_after(uint64_t bytes, const void* replacing = nullptr) const;

  MemoryStats stats() const;
  void reset_peak();
  // Starts a new window for MemoryStats::window_peak (a job sharing its device measures its
  // peak per budget) without touching the run's peak.
  void start_window();
  // Live allocations, largest first.
  std::vector<ResidentBlock> resident() const;
  uint64_t capacity() const { return capacity_; }
  void* base() const { return base_; }
  // The backing's granule; 0 without a backing.
  uint64_t granule() const { return backing_ ? backing_->granule() : 0; }

 private:
  struct Block {
    uint64_t bytes;
    std::string label;
  };
  using LiveMap = std::map<uint64_t, Block>;     // offset -> block
  using FreeMap = std::map<uint64_t, uint64_t>;  // offset -> bytes, coalesced
  struct Piece {
    uint64_t offset;
    uint64_t bytes;
  };
  // The lowest free range of at least `size` bytes, taken from `free`; false when none fits.
  static bool take_first_fit(FreeMap& free, uint64_t size, uint64_t* offset);
  // Returns [start, start + size) to `free`, coalescing with its neighbours.
  static void give(FreeMap& free, uint64_t start, uint64_t size);
  // The pieces of [offset, offset + size) that no block of `live` touches (the range itself not
  // in `live`), in granules of `granule` (Note [Backing a heap on use]).
  static std::vector<Piece> own_pieces(const LiveMap& live, uint64_t offset, uint64_t size,
                                       uint64_t granule);
  static uint64_t total(const std::vector<Piece>& pieces);

  std::byte* base_;
  uint64_t capacity_;
  HeapBacking* backing_;
  mutable std::mutex mu_;
  LiveMap live_;
  FreeMap free_;
  MemoryStats stats_;
};

// An allocation owned by its holder; released on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceHeap& heap, uint64_t bytes, const std::string& label)
      : heap_(&heap), ptr_(heap.allocate(bytes, label)), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void reset();
  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  uint64_t bytes() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  DeviceHeap* heap_ = nullptr;
  void* ptr_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace ferry
