// The CPU kernels in bf16 storage that are not native oneDNN bf16 primitives: each widens its
// bf16 operands (Note [Storage dtype of a kernel] in device/kernels.h) to fp32 buffers (whole, or
// a stage at a time for the elementwise ones), runs the fp32 kernel on them and narrows its bf16
// outputs back: the bits of the fp32 kernel on the same (bf16-rounded) inputs, rounded once.
#include <algorithm>
#include <array>
#include <bit>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cpu/bf16_storage.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

FERRY_SIMD_CLONES void widen_chunk(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(x[i]) << 16;
    y[i] = std::bit_cast<float>(u);
  }
}

FERRY_SIMD_CLONES void narrow_chunk(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(x[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    y[i] = static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
  }
}

// Note [Widened bf16 kernels]
// A widened kernel holds fp32 copies of its bf16 operands for the length of one launch, in
// buffers kept per thread (grown, never shrunk) outside the planned arena: host memory the CPU
// backend's device budget does not count, about twice the bf16 bytes of the kernel's operands.
// The matmul-bound kernels (convolution, linear) widen through their workspace instead (Note
// [bf16 products in fp32] in widened_matmul.cc); the elementwise kernels widen a few KiB at a
// time (Note [Staged bf16 elementwise kernels]) and the loss reads bf16 itself (Note
// [Exponentials of bf16 logits] in kernels_loss.cc). A native bf16 loop for the others is a
// speed improvement that changes no interface.
enum class Role { kIn, kOut, kInOut };

struct Slot {
  float** field;  // the operand's pointer field in the fp32 copy of the arguments
  int64_t count;  // elements
  Role role;
};

Slot in(const float*& field, int64_t count) {
  return {const_cast<float**>(&field), count, Role::kIn};
}
Slot out(float*& field, int64_t count) { return {&field, count, Role::kOut}; }
Slot inout(float*& field, int64_t count) { return {&field, count, Role::kInOut}; }

std::vector<float>& buffer(size_t i) {
  thread_local std::vector<std::vector<float>> buffers;
  if (buffers.size() <= i) buffers.resize(i + 1);
  return buffers[i];
}

// Runs the fp32 kernel on `fp32` (a copy of the arguments whose bf16 operands `slots` lists,
// each a field of it) with fp32 buffers in their place, then narrows the outputs back.
template <typename Args>
void widened(PlanCache& plans, Args& fp32, std::initializer_list<Slot> slots) {
  fp32.dtype = DType::kF32;
  std::vector<float*> originals;
  size_t i = 0;
  for (const Slot& s : slots) {
    float* original = *s.field;
    originals.push_back(original);
    if (original == nullptr || s.count <= 0) continue;
    std::vector<float>& buf = buffer(i++);
    if (buf.size() < static_cast<size_t>(s.count)) buf.resize(static_cast<size_t>(s.count));
    if (s.role != Role::kOut) widen_bf16(bf16_bits(original), buf.data(), s.count);
    *s.field = buf.data();
  }
  run(plans, fp32);
  size_t k = 0;
  for (const Slot& s : slots) {
    float* original = originals[k++];
    if (original == nullptr || s.count <= 0 || s.role == Role::kIn) continue;
    narrow_to_bf16(*s.field, bf16_bits(original), s.count);
  }
}

// Note [Staged bf16 elementwise kernels]
// An elementwise kernel in bf16 storage widens kStage elements of each input at a time into
// per-thread buffers (a few KiB, in L1), runs the fp32 kernel on them and narrows its outputs
// back: each element gets the fp32 kernel's math on its widened inputs, rounded once, the bits of
// widening whole arrays, without the whole-tensor fp32 copies and their passes through memory.
// The fp32 kernel runs on each stage alone (within one work item: serial).
constexpr int64_t kStage = 1024;

// The stages of `n` elements: `in` (bf16) widened into v[0, kIn), then `chunk(v, begin, len)`
// runs the fp32 kernel, then each output (a bf16 tensor, the index of its fp32 buffer in v)
// narrowed. Buffers v[kIn, 3) are free for outputs. A count the fp32 kernel refuses goes to it
// (its error); n == 0 does nothing.
template <int kIn, int kOut, typename Args, typename Chunk>
void staged(PlanCache& p, const Args& a, int64_t n, const std::array<const float*, kIn>& in,
            const std::array<std::pair<float*, int>, kOut>& out, const Chunk& chunk) {
  static_assert(kIn <= 3 && kOut <= 3);
  if (n < 0) {  // the fp32 kernel's error for the count
    Args f = a;
    f.dtype = DType::kF32;
    run(p, f);
    return;
  }
  parallel_chunks(n, kParallelGrain, [&](int64_t begin, int64_t end) {
    thread_local std::array<std::array<float, kStage>, 3> buffers;
    float* v[3] = {buffers[0].data(), buffers[1].data(), buffers[2].data()};
    for (int64_t b = begin; b < end; b += kStage) {
      const int64_t len = std::min(kStage, end - b);
      for (int i = 0; i < kIn; ++i) widen_chunk(bf16_bits(in[i]) + b, v[i], len);
      chunk(v, b, len);
      for (const auto& [y, buffer] : out) narrow_chunk(v[buffer], bf16_bits(y) + b, len);
    }
  });
}

}  // namespace

void widen_bf16(const uint16_t* x, float* y, int64_t n) {
  parallel_chunks(n, kParallelGrain,
                  [&](int64_t b, int64_t e) { widen_chunk(x + b, y + b, e - b); });
}

void narrow_to_bf16(const float* x, uint16_t* y, int64_t n) {
  parallel_chunks(n, kParallelGrain,
                  [&](int64_t b, int64_t e) { narrow_chunk(x + b, y + b, e - b); });
}

void run_widened(PlanCache& p, const PoolForward& a) {
  const PoolGeom& g = a.g;
  PoolForward f = a;
  widened(p, f, {in(f.x, g.n * g.c * g.h * g.w), out(f.y, g.n * g.c * g.out_h() * g.out_w())});
}

void run_widened(PlanCache& p, const PoolBackward& a) {
  const PoolGeom& g = a.g;
  const int64_t xs = g.n * g.c * g.h * g.w, ys = g.n * g.c * g.out_h() * g.out_w();
  PoolBackward f = a;
  widened(p, f, {in(f.x, xs), in(f.y, ys), in(f.dy, ys), out(f.dx, xs)});
}

void run_widened(PlanCache& p, const AdaptiveAvgPoolForward& a) {
  AdaptiveAvgPoolForward f = a;
  widened(p, f, {in(f.x, a.n * a.c * a.h * a.w), out(f.y, a.n * a.c * a.oh * a.ow)});
}

void run_widened(PlanCache& p, const AdaptiveAvgPoolBackward& a) {
  AdaptiveAvgPoolBackward f = a;
  widened(p, f, {in(f.dy, a.n * a.c * a.oh * a.ow), out(f.dx, a.n * a.c * a.h * a.w)});
}

void run_widened(PlanCache& p, const BatchNormForwardTraining& a) {
  const int64_t n = a.g.n * a.g.c * a.g.hw;
  BatchNormForwardTraining f = a;
  widened(p, f, {in(f.x, n), out(f.y, n)});
}

void run_widened(PlanCache& p, const BatchNormForwardInference& a) {
  const int64_t n = a.g.n * a.g.c * a.g.hw;
  BatchNormForwardInference f = a;
  widened(p, f, {in(f.x, n), out(f.y, n)});
}

void run_widened(PlanCache& p, const BatchNormBackward& a) {
  const int64_t n = a.g.n * a.g.c * a.g.hw;
  BatchNormBackward f = a;
  widened(p, f, {in(f.x, n), in(f.dy, n), out(f.dx, n)});
}

void run_widened(PlanCache& p, const ReluForward& a) {
  staged<1, 1>(p, a, a.n, {a.x}, {{{a.y, 1}}}, [&](float* const* v, int64_t, int64_t len) {
    run(p, ReluForward{len, v[0], v[1]});
  });
}

void run_widened(PlanCache& p, const ReluBackward& a) {
  staged<2, 1>(p, a, a.n, {a.y, a.dy}, {{{a.dx, 2}}}, [&](float* const* v, int64_t, int64_t len) {
    run(p, ReluBackward{len, v[0], v[1], v[2]});
  });
}

void run_widened(PlanCache& p, const AddForward& a) {
  staged<2, 1>(p, a, a.n, {a.a, a.b}, {{{a.y, 2}}}, [&](float* const* v, int64_t, int64_t len) {
    run(p, AddForward{len, v[0], v[1], v[2]});
  });
}

void run_widened(PlanCache& p, const Accumulate& a) {
  staged<2, 1>(p, a, a.n, {a.x, a.y}, {{{a.y, 1}}}, [&](float* const* v, int64_t, int64_t len) {
    run(p, Accumulate{len, v[0], v[1]});
  });
}

void run_widened(PlanCache&, const Fill& a) {
  check_element_count(a.n, "fill");
  // The value's bf16 bits (a NaN stays NaN: poison mode), written as they are.
  const uint16_t bits = float_to_bf16(a.value).bits;
  uint16_t* y = bf16_bits(a.y);
  parallel_chunks(a.n, kParallelGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = bits;
  });
}

void run_widened(PlanCache& p, const Scale& a) {
  staged<1, 1>(p, a, a.n, {a.y}, {{{a.y, 0}}}, [&](float* const* v, int64_t, int64_t len) {
    run(p, Scale{len, a.alpha, v[0]});
  });
}

void run_widened(PlanCache& p, const DropoutForward& a) {
  check_dropout_forward(a);
  staged<1, 1>(p, a, a.n, {a.x}, {{{a.y, 1}}}, [&](float* const* v, int64_t b, int64_t len) {
    run(p, DropoutForward{len, a.p, a.seed, a.offset + static_cast<uint64_t>(b), v[0], v[1],
                          a.mask + b});
  });
}

void run_widened(PlanCache& p, const DropoutBackward& a) {
  staged<1, 1>(p, a, a.n, {a.dy}, {{{a.dx, 1}}}, [&](float* const* v, int64_t b, int64_t len) {
    run(p, DropoutBackward{len, a.p, v[0], a.mask + b, v[1]});
  });
}

void run_widened(PlanCache& p, const GeluForward& a) {
  staged<1, 1>(p, a, a.n, {a.x}, {{{a.y, 1}}}, [&](float* const* v, int64_t, int64_t len) {
    run(p, GeluForward{len, v[0], v[1]});
  });
}

void run_widened(PlanCache& p, const GeluBackward& a) {
  staged<2, 1>(p, a, a.n, {a.x, a.dy}, {{{a.dx, 2}}}, [&](float* const* v, int64_t, int64_t len) {
    run(p, GeluBackward{len, v[0], v[1], v[2]});
  });
}

void run_widened(PlanCache& p, const EmbeddingForward& a) {
  EmbeddingForward f = a;
  widened(p, f, {out(f.y, a.n * a.t * a.c)});
}

void run_widened(PlanCache& p, const EmbeddingBackward& a) {
  EmbeddingBackward f = a;
  widened(p, f, {in(f.dy, a.n * a.t * a.c)});
}

void run_widened(PlanCache& p, const LayerNormForward& a) {
  const int64_t n = a.g.rows * a.g.c;
  LayerNormForward f = a;
  widened(p, f, {in(f.x, n), out(f.y, n)});
}

void run_widened(PlanCache& p, const LayerNormBackward& a) {
  const int64_t n = a.g.rows * a.g.c;
  LayerNormBackward f = a;
  widened(p, f, {in(f.x, n), in(f.dy, n), out(f.dx, n)});
}

void run_widened(PlanCache& p, const AttentionForward& a) {
  const AttentionGeom& g = a.g;
  AttentionForward f = a;
  widened(p, f,
          {in(f.qkv, g.n * g.t * 3 * g.c), out(f.y, g.n * g.t * g.c),
           out(f.probs, g.n * g.heads * g.t * g.t)});
}

void run_widened(PlanCache& p, const AttentionBackward& a) {
  const AttentionGeom& g = a.g;
  AttentionBackward f = a;
  widened(p, f,
          {in(f.qkv, g.n * g.t * 3 * g.c), in(f.probs, g.n * g.heads * g.t * g.t),
           in(f.dy, g.n * g.t * g.c), out(f.dqkv, g.n * g.t * 3 * g.c)});
}

// lse stays fp32 (a statistic: Note [Which tensors are bf16]); qkv, y, dy and dqkv are bf16.
void run_widened(PlanCache& p, const FlashAttentionForward& a) {
  const AttentionGeom& g = a.g;
  FlashAttentionForward f = a;
  widened(p, f, {in(f.qkv, g.n * g.t * 3 * g.c), out(f.y, g.n * g.t * g.c)});
}

void run_widened(PlanCache& p, const FlashAttentionBackward& a) {
  const AttentionGeom& g = a.g;
  FlashAttentionBackward f = a;
  widened(p, f,
          {in(f.qkv, g.n * g.t * 3 * g.c), in(f.y, g.n * g.t * g.c), in(f.dy, g.n * g.t * g.c),
           out(f.dqkv, g.n * g.t * 3 * g.c)});
}

// The Llama kernels: fp32 math on widened values as the rest. RMSNorm's mean of squares, its
// backward reductions, its weight and weight gradient and the saved rstd stay fp32 (a statistic:
// Note [Which tensors are bf16]); x, y, dy and dx are bf16.
void run_widened(PlanCache& p, const RmsNormForward& a) {
  const int64_t n = a.g.rows * a.g.c;
  RmsNormForward f = a;
  widened(p, f, {in(f.x, n), out(f.y, n)});
}

void run_widened(PlanCache& p, const RmsNormBackward& a) {
  const int64_t n = a.g.rows * a.g.c;
  RmsNormBackward f = a;
  widened(p, f, {in(f.x, n), in(f.dy, n), out(f.dx, n)});
}

void run_widened(PlanCache& p, const RopeQkvForward& a) {
  const int64_t rows = a.g.n * a.g.t, qw = a.g.q_width(), kvw = a.g.kv_width();
  RopeQkvForward f = a;
  widened(
      p, f,
      {in(f.q, rows * qw), in(f.k, rows * kvw), in(f.v, rows * kvw), out(f.qkv, rows * 3 * qw)});
}

// A null dq, dk or dv (not wanted) stays null.
void run_widened(PlanCache& p, const RopeQkvBackward& a) {
  const int64_t rows = a.g.n * a.g.t, qw = a.g.q_width(), kvw = a.g.kv_width();
  RopeQkvBackward f = a;
  widened(p, f,
          {in(f.dqkv, rows * 3 * qw), out(f.dq, rows * qw), out(f.dk, rows * kvw),
           out(f.dv, rows * kvw)});
}

void run_widened(PlanCache& p, const SwigluForward& a) {
  SwigluForward f = a;
  widened(p, f, {in(f.gate, a.n), in(f.up, a.n), out(f.y, a.n)});
}

void run_widened(PlanCache& p, const SwigluBackward& a) {
  SwigluBackward f = a;
  widened(p, f,
          {in(f.gate, a.n), in(f.up, a.n), in(f.dy, a.n), out(f.dgate, a.n), out(f.dup, a.n)});
}

void run(PlanCache&, const ConvertFloats& a) {
  check_element_count(a.n, "convert_floats");
  const bool narrow = a.from == DType::kF32 && a.to == DType::kBF16;
  const bool widen = a.from == DType::kBF16 && a.to == DType::kF32;
  if (!narrow && !widen) {
    throw UnsupportedError(
        fmt::format("convert_floats: {} to {} is not a conversion the CPU backend runs",
                    dtype_name(a.from), dtype_name(a.to)),
        "convert between f32 and bf16");
  }
  if (narrow) {
    narrow_to_bf16(static_cast<const float*>(a.x), static_cast<uint16_t*>(a.y), a.n);
  } else {
    widen_bf16(static_cast<const uint16_t*>(a.x), static_cast<float*>(a.y), a.n);
  }
}

}  // namespace ferry::cpu
