// Private to the CPU kernels: the oneDNN engine, the primitive plans (a primitive plus the
// reorders between the caller's plain layouts and the layouts it chose) and their cache.
// Invariant: a cached plan is immutable after creation, so threads may execute it concurrently.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "common/error.h"
#include "device/cpu/cpu_kernels.h"

namespace ferry::cpu {

// Runs a oneDNN call, turning dnnl::error into LibraryError with the call text and location.
#define DNNL_CHECK(expr) \
  ::ferry::cpu::dnnl_check([&]() -> decltype(auto) { return expr; }, #expr, __FILE__, __LINE__)

template <typename F>
decltype(auto) dnnl_check(F&& f, const char* call, const char* file, int line) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    throw LibraryError("oneDNN", call, e.what(), file, line);
  }
}

// The process's CPU engine (oneDNN CPU engines are interchangeable) and this thread's stream.
dnnl::engine& cpu_engine();
dnnl::stream& thread_stream();

// Sets this thread's OpenMP thread count for a scope, restoring it after. oneDNN fixes its
// work partitioning when a primitive is created, from the creating thread's count; plans are
// created under this scope so that the host thread (planning) and the compute worker agree.
class OmpThreadsScope {
 public:
  explicit OmpThreadsScope(int threads);
  ~OmpThreadsScope();
  OmpThreadsScope(const OmpThreadsScope&) = delete;
  OmpThreadsScope& operator=(const OmpThreadsScope&) = delete;

 private:
  int saved_;
};

inline constexpr uint64_t kWorkspaceAlign = 64;
inline uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// One oneDNN primitive with its operands. An operand whose layout the primitive chose
// differently from the caller's plain layout is staged in the workspace through a reorder
// (inputs before, outputs after). Workspace layout: [scratchpad | staging buffers...], the
// scratchpad (user mode) shared by the primitive and the reorders, which run one at a time;
// each part starts at a multiple of kWorkspaceAlign from ws.ptr. Any ws.ptr works and gives the
// same bits; a 64-byte aligned one (device allocations are 256-byte aligned) is the fast case.
class PrimitivePlan {
 public:
  struct Operand {
    int arg = 0;
    bool output = false;
    dnnl::memory::desc user;   // the caller's layout
    dnnl::memory::desc inner;  // the primitive's layout
    std::optional<dnnl::reorder> reorder;
    uint64_t offset = 0;  // of the staging buffer in the workspace, when reordered
  };

  // `user_scratchpad`: the scratchpad comes from the workspace (kernels with a Workspace);
  // otherwise oneDNN owns it (library mode).
  explicit PrimitivePlan(bool user_scratchpad) : user_scratchpad_(user_scratchpad) {}

  // The primitive attributes every primitive and reorder of this plan is created with.
  dnnl::primitive_attr attr() const;
  // Adds an operand; creates its reorder when `inner` differs from `user`.
  void add(int arg, bool output, const dnnl::memory::desc& user, const dnnl::memory::desc& inner);
  // Sets the primitive and lays out the workspace. Call after every add().
  void finish(dnnl::primitive prim, const dnnl::memory::desc& scratchpad);

  uint64_t workspace_bytes() const { return workspace_bytes_; }
  bool has(int arg) const;

  // Executes with the caller's pointers per arg (an arg missing from `ptrs` must not be an
  // operand). Throws when ws is smaller than workspace_bytes(); `what` names the kernel.
  void execute(const std::vector<std::pair<int, const void*>>& ptrs, const Workspace& ws,
               std::string_view what) const;

 private:
  bool user_scratchpad_;
  dnnl::primitive prim_;
  std::vector<Operand> operands_;
  uint64_t scratchpad_bytes_ = 0;
  uint64_t workspace_bytes_ = 0;
};

// Cache key: the kernel kind followed by the geometry's integers.
using PlanKey = std::array<int64_t, 16>;

// A key from up to 16 integers (the rest zero).
inline PlanKey make_key(std::initializer_list<int64_t> values) {
  FERRY_ASSERT(values.size() <= PlanKey{}.size(), "plan key too long");
  PlanKey key{};
  std::copy(values.begin(), values.end(), key.begin());
  return key;
}

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t v : key) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001b3ull;
    return static_cast<size_t>(h);
  }
};

// The primitive plans of one CpuKernels, by key.
class PlanCache {
 public:
  // `widen_bf16_products`: Note [bf16 products in fp32] (widened_matmul.cc).
  explicit PlanCache(int threads, bool widen_bf16_products = false)
      : threads_(threads), widen_bf16_products_(widen_bf16_products) {}
  int threads() const { return threads_; }
  // Whether bf16 convolutions and linear layers run as fp32 primitives on widened operands.
  bool widen_bf16_products() const { return widen_bf16_products_; }

  // The cached plan for `key`, made by `make()` on first use (under this backend's thread
  // count). Safe to call from any thread.
  template <typename Plan>
  std::shared_ptr<const Plan> plan(const PlanKey& key, const std::function<Plan()>& make) {
    {
      std::lock_guard lock(mu_);
      if (auto it = cache_.find(key); it != cache_.end()) {
        return std::static_pointer_cast<const Plan>(it->second);
      }
    }
    std::shared_ptr<const Plan> made;
    {
      OmpThreadsScope scope(threads_);
      made = std::make_shared<const Plan>(make());
    }
    std::lock_guard lock(mu_);
    auto [it, inserted] = cache_.try_emplace(key, made);
    return std::static_pointer_cast<const Plan>(it->second);
  }

 private:
  int threads_;
  bool widen_bf16_products_;
  std::mutex mu_;
  std::unordered_map<PlanKey, std::shared_ptr<const void>, PlanKeyHash> cache_;
};

struct CpuKernels::Impl {
  Impl(int threads, bool widen_bf16_products) : plans(threads, widen_bf16_products) {}
  PlanCache plans;
};

// Plain (row-major) memory descriptors, fp32 unless `type` says otherwise.
dnnl::memory::desc plain_desc(const dnnl::memory::dims& dims,
                              dnnl::memory::data_type type = dnnl::memory::data_type::f32);
dnnl::memory::desc strided_desc(const dnnl::memory::dims& dims, const dnnl::memory::dims& strides,
                                dnnl::memory::data_type type = dnnl::memory::data_type::f32);
// oneDNN's type for a kernel's storage dtype (kF32 or kBF16).
dnnl::memory::data_type dnnl_type(DType dtype);

// A cached oneDNN matmul on the caller's layouts (any strides, no reorders), user scratchpad:
// dst (..., rows, cols) = src (..., rows, inner) * weights (..., inner, cols) [+ bias (1, cols)],
// with up to two leading batch dimensions.
std::shared_ptr<const PrimitivePlan> matmul_plan(PlanCache& plans, const PlanKey& key,
                                                 const dnnl::memory::desc& src,
                                                 const dnnl::memory::desc& weights,
                                                 const dnnl::memory::desc* bias,
                                                 const dnnl::memory::desc& dst);

// C (rows, cols) = A (rows, inner) * B (inner, cols) [+ bias (1, cols), fp32] where A, B or C
// may be bf16: fp32 oneDNN matmuls on A's rows in chunks of widened_chunk_rows(), each bf16
// operand widened (A's chunk, B whole) and C's chunk narrowed through the workspace (Note [bf16
// products in fp32] in widened_matmul.cc). Layout: [scratchpad | B | A chunk | C chunk].
class WidenedMatmul {
 public:
  WidenedMatmul(const dnnl::memory::desc& a, const dnnl::memory::desc& b,
                const dnnl::memory::desc* bias, const dnnl::memory::desc& c,
                const dnnl::primitive_attr& attr);
  uint64_t workspace_bytes() const { return workspace_bytes_; }
  void execute(const void* a, const void* b, const void* bias, void* c, const Workspace& ws,
               std::string_view what) const;

 private:
  struct Chunk {
    int64_t rows = 0;
    dnnl::memory::desc a_user, a32, c_user, c32;
    std::optional<dnnl::reorder> a_widen, c_narrow;
    dnnl::primitive matmul;
  };
  dnnl::memory::desc a_, b_, b32_, bias_, c_;
  bool has_bias_;
  int64_t chunk_rows_ = 0, a_elem_ = 0, c_elem_ = 0;
  std::optional<dnnl::reorder> b_widen_;
  std::vector<Chunk> chunks_;  // the full chunk, then the shorter last one if any
  uint64_t scratchpad_bytes_ = 0, b_offset_ = 0, a_offset_ = 0, c_offset_ = 0;
  uint64_t workspace_bytes_ = 0;
};

// fp32 staging bytes of one chunk's A and C rows the chunking aims at (a cache-sized block, so
// the narrowing reads C's rows while they are warm).
inline constexpr int64_t kWidenedChunkBytes = int64_t{1} << 20;
// Rows per chunk: the larger of kWidenedChunkBytes and `b_bytes` (B's fp32 bytes) of staged rows
// (`inner` fp32 elements of A and `cols` of C per row, 0 for an operand that is fp32 already),
// at least 64 and a multiple of 32, at most `rows`.
int64_t widened_chunk_rows(int64_t rows, int64_t inner, int64_t cols, int64_t b_bytes);

// The cached WidenedMatmul for `key`.
std::shared_ptr<const WidenedMatmul> widened_matmul_plan(PlanCache& plans, const PlanKey& key,
                                                         const dnnl::memory::desc& a,
                                                         const dnnl::memory::desc& b,
                                                         const dnnl::memory::desc* bias,
                                                         const dnnl::memory::desc& c);

// ---- the kernel families (kernels_*.cc) -------------------------------------------------------
// workspace(): bytes of args.ws the kernel needs; run(): runs it now on the calling thread.

uint64_t workspace(PlanCache& plans, const ConvForward& a);
uint64_t workspace(PlanCache& plans, const ConvBackwardData& a);
uint64_t workspace(PlanCache& plans, const ConvBackwardWeights& a);
void run(PlanCache& plans, const ConvForward& a);
void run(PlanCache& plans, const ConvBackwardData& a);
void run(PlanCache& plans, const ConvBackwardWeights& a);

uint64_t workspace(PlanCache& plans, const LinearForward& a);
uint64_t workspace(PlanCache& plans, const LinearBackwardData& a);
uint64_t workspace(PlanCache& plans, const LinearBackwardWeights& a);
void run(PlanCache& plans, const LinearForward& a);
void run(PlanCache& plans, const LinearBackwardData& a);
void run(PlanCache& plans, const LinearBackwardWeights& a);

void run(PlanCache& plans, const PoolForward& a);
void run(PlanCache& plans, const PoolBackward& a);
void run(PlanCache& plans, const AdaptiveAvgPoolForward& a);
void run(PlanCache& plans, const AdaptiveAvgPoolBackward& a);

void run(PlanCache& plans, const BatchNormForwardTraining& a);
void run(PlanCache& plans, const BatchNormForwardInference& a);
void run(PlanCache& plans, const BatchNormBackward& a);

void run(PlanCache& plans, const ReluForward& a);
void run(PlanCache& plans, const ReluBackward& a);
void run(PlanCache& plans, const AddForward& a);
void run(PlanCache& plans, const Accumulate& a);
void run(PlanCache& plans, const CopyDevice& a);
void run(PlanCache& plans, const Fill& a);
void run(PlanCache& plans, const Scale& a);
void run(PlanCache& plans, const DropoutForward& a);
void run(PlanCache& plans, const DropoutBackward& a);

void run(PlanCache& plans, const SoftmaxCrossEntropyForward& a);
void run(PlanCache& plans, const SoftmaxCrossEntropyBackward& a);

// kernels_optim.cc
void run(PlanCache& plans, const SumOfSquares& a);
void run(PlanCache& plans, const ClipByNorm& a);
void run(PlanCache& plans, const SgdUpdate& a);
void run(PlanCache& plans, const AdamWUpdate& a);

// kernels_transformer.cc (attention: kernels_attention.cc)
// Segment starts are data (Note [Segments of a packed row] in device/kernels.h): DataError
// naming `what` unless 0 <= segments[r] <= r % t for every row r < rows; null passes.
void check_segments(const int32_t* segments, int64_t rows, int64_t t, const char* what);
void run(PlanCache& plans, const EmbeddingForward& a);
void run(PlanCache& plans, const EmbeddingBackward& a);
void run(PlanCache& plans, const LayerNormForward& a);
void run(PlanCache& plans, const LayerNormBackward& a);
void run(PlanCache& plans, const GeluForward& a);
void run(PlanCache& plans, const GeluBackward& a);
uint64_t workspace(PlanCache& plans, const AttentionForward& a);
uint64_t workspace(PlanCache& plans, const AttentionBackward& a);
void run(PlanCache& plans, const AttentionForward& a);
void run(PlanCache& plans, const AttentionBackward& a);
// kernels_flash_attention.cc (no workspace: Note [Fused attention] in device/kernels.h)
void run(PlanCache& plans, const FlashAttentionForward& a);
void run(PlanCache& plans, const FlashAttentionBackward& a);

// kernels_llama.cc
void run(PlanCache& plans, const RmsNormForward& a);
void run(PlanCache& plans, const RmsNormBackward& a);
void run(PlanCache& plans, const RopeQkvForward& a);
void run(PlanCache& plans, const RopeQkvBackward& a);
void run(PlanCache& plans, const SwigluForward& a);
void run(PlanCache& plans, const SwigluBackward& a);

// kernels_bf16.cc: the kernels that run in bf16 storage by widening to fp32 (Note [Widened bf16
// kernels] there); convolution and linear widen through their workspace in their own files
// (Note [bf16 products in fp32] in widened_matmul.cc).
void run_widened(PlanCache& plans, const PoolForward& a);
void run_widened(PlanCache& plans, const PoolBackward& a);
void run_widened(PlanCache& plans, const AdaptiveAvgPoolForward& a);
void run_widened(PlanCache& plans, const AdaptiveAvgPoolBackward& a);
void run_widened(PlanCache& plans, const BatchNormForwardTraining& a);
void run_widened(PlanCache& plans, const BatchNormForwardInference& a);
void run_widened(PlanCache& plans, const BatchNormBackward& a);
void run_widened(PlanCache& plans, const ReluForward& a);
void run_widened(PlanCache& plans, const ReluBackward& a);
void run_widened(PlanCache& plans, const AddForward& a);
void run_widened(PlanCache& plans, const Accumulate& a);
void run_widened(PlanCache& plans, const Fill& a);
void run_widened(PlanCache& plans, const Scale& a);
void run_widened(PlanCache& plans, const DropoutForward& a);
void run_widened(PlanCache& plans, const DropoutBackward& a);
void run_widened(PlanCache& plans, const EmbeddingForward& a);
void run_widened(PlanCache& plans, const EmbeddingBackward& a);
void run_widened(PlanCache& plans, const LayerNormForward& a);
void run_widened(PlanCache& plans, const LayerNormBackward& a);
void run_widened(PlanCache& plans, const GeluForward& a);
void run_widened(PlanCache& plans, const GeluBackward& a);
void run_widened(PlanCache& plans, const AttentionForward& a);
void run_widened(PlanCache& plans, const AttentionBackward& a);
void run_widened(PlanCache& plans, const FlashAttentionForward& a);
void run_widened(PlanCache& plans, const FlashAttentionBackward& a);
void run_widened(PlanCache& plans, const RmsNormForward& a);
void run_widened(PlanCache& plans, const RmsNormBackward& a);
void run_widened(PlanCache& plans, const RopeQkvForward& a);
void run_widened(PlanCache& plans, const RopeQkvBackward& a);
void run_widened(PlanCache& plans, const SwigluForward& a);
void run_widened(PlanCache& plans, const SwigluBackward& a);
// ConvertFloats (fp32 <-> bf16 in either direction; no dtype field).
void run(PlanCache& plans, const ConvertFloats& a);

// Whether this CPU runs bf16 natively (avx512_bf16, as oneDNN detects it).
bool cpu_has_bf16();
// Whether oneDNN runs bf16 products on AMX tiles here.
bool cpu_has_amx();

}  // namespace ferry::cpu
