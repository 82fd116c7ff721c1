// Kernel and copy timing on scratch operands (Note [Scratch operands]).
#include "device/kernel_timing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {

namespace {

// Note [Timing a kernel robustly] in kernel_timing.h.
constexpr int kProbes = 3;
constexpr int kRounds = 3;
constexpr int kMaxLaunches = 20;
constexpr double kDisagree = 1.5;
constexpr int kRetimes = 2;

// Builds "name a=1 b=2 ...".
class KeyBuilder {
 public:
  explicit KeyBuilder(std::string_view name) : s_(name) {}
  KeyBuilder& operator()(std::string_view field, int64_t v) {
    s_ += fmt::format(" {}={}", field, v);
    return *this;
  }
  KeyBuilder& operator()(std::string_view field, bool v) { return (*this)(field, int64_t{v}); }
  KeyBuilder& operator()(std::string_view field, float v) {
    s_ += fmt::format(" {}={}", field, v);
    return *this;
  }
  std::string str() const { return s_; }

 private:
  std::string s_;
};

void conv(KeyBuilder& k, const ConvGeom& g) {
  k("n", g.n)("c", g.c)("h", g.h)("w", g.w)("k", g.k)("r", g.r)("s", g.s)("sh", g.stride_h)(
      "sw", g.stride_w)("ph", g.pad_h)("pw", g.pad_w)("g", g.groups);
}
void linear(KeyBuilder& k, const LinearGeom& g) {
  k("m", g.m)("k", g.k)("n", g.n);
  if (g.weight_in_out) k("weight_in_out", true);
}
void attention(KeyBuilder& k, const AttentionGeom& g) {
  k("n", g.n)("t", g.t)("heads", g.heads)("c", g.c)("dropout", g.dropout > 0);
}
void pool(KeyBuilder& k, const PoolGeom& g) {
  k("max", g.kind == PoolKind::kMax)("n", g.n)("c", g.c)("h", g.h)("w", g.w)("kh", g.kh)(
      "kw", g.kw)("sh", g.stride_h)("sw", g.stride_w)("ph", g.pad_h)("pw", g.pad_w)(
      "ceil", g.ceil_mode)("incl", g.count_include_pad);
}
void bn(KeyBuilder& k, const BatchNormGeom& g) { k("n", g.n)("c", g.c)("hw", g.hw); }

// Note [Scratch operands]
// A timed launch needs real device memory behind every operand the kernel touches, sized from
// the geometry, and values that keep the kernel on its normal path: labels in range (zeros),
// variances positive (ones), masks valid (zeros). Optional operands (a bias) are bound only
// when the caller's args had them, since their presence is part of the geometry. One helper
// per argument struct says which pointers it has and how large each is.
class Operands {
 public:
  explicit Operands(Device& device) : device_(device) {}
  // Scratch is released only once no launch can still be using it.
  ~Operands() {
    try {
      device_.synchronize();
    } catch (...) {
    }
  }
  Operands(const Operands&) = delete;
  Operands& operator=(const Operands&) = delete;

  // Binds `p` to fresh device memory of `count` elements of T, filled with `value`.
  template <typename T, typename P>
  void bind(P*& p, int64_t count, float value = 1.0f) {
    const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(count, 1)) * sizeof(T);
    buffers_.emplace_back(device_.memory(), bytes, "kernel timing scratch");
    p = static_cast<P*>(buffers_.back().data());
    init(buffers_.back().data(), bytes, value);
  }
  template <typename T, typename P>
  void bind_if(P*& p, int64_t count, float value = 1.0f) {
    if (p != nullptr) bind<T>(p, count, value);
  }
  void workspace(Workspace& ws, const KernelArgs& args) {
    ws.bytes = device_.kernels().workspace_bytes(args);
    ws.ptr = nullptr;
    if (ws.bytes == 0) return;
    buffers_.emplace_back(device_.memory(), ws.bytes, "kernel timing workspace");
    ws.ptr = buffers_.back().data();
  }

 private:
  void init(void* p, uint64_t bytes, float value) {
    Stream& compute = device_.stream(StreamKind::kCompute);
    const int64_t floats = static_cast<int64_t>(bytes / sizeof(float));
    if (device_.kernels().supports(kernel_kind<Fill>(), DType::kF32) && bytes % 4 == 0) {
      device_.kernels().launch(Fill{floats, value, static_cast<float*>(p)}, compute);
      return;
    }
    // No fill kernel: copy the pattern from pinned memory.
    void* host = device_.pinned().allocate(bytes);
    std::vector<float> pattern(static_cast<size_t>(floats), value);
    std::memset(host, 0, bytes);
    std::memcpy(host, pattern.data(), pattern.size() * sizeof(float));
    device_.copy_async(p, host, bytes, compute);
    compute.synchronize();
    device_.pinned().deallocate(host, bytes);
  }

  Device& device_;
  std::vector<DeviceBuffer> buffers_;
};

int64_t image(const ConvGeom& g) { return g.n * g.c * g.h * g.w; }
int64_t weight(const ConvGeom& g) {
  return g.k * (g.c / std::max<int64_t>(g.groups, 1)) * g.r * g.s;
}
int64_t output(const ConvGeom& g) { return g.n * g.k * g.out_h() * g.out_w(); }
int64_t image(const PoolGeom& g) { return g.n * g.c * g.h * g.w; }
int64_t output(const PoolGeom& g) { return g.n * g.c * g.out_h() * g.out_w(); }

// Binds every operand of `args` (a copy) to scratch memory.
void bind_operands(Operands& o, KernelArgs& args) {
  const KernelArgs shape = args;  // workspace sizes are asked with the original geometry
  std::visit(
      [&](auto& a) {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, ConvForward>) {
          o.bind<float>(a.x, image(a.g));
          o.bind<float>(a.w, weight(a.g));
          o.bind_if<float>(a.bias, a.g.k);
          o.bind<float>(a.y, output(a.g));
          o.workspace(a.ws, shape);
        } else if constexpr (std::is_same_v<T, ConvBackwardData>) {
          o.bind<float>(a.dy, output(a.g));
          o.bind<float>(a.w, weight(a.g));
          o.bind<float>(a.dx, image(a.g));
          o.workspace(a.ws, shape);
        } else if constexpr (std::is_same_v<T, ConvBackwardWeights>) {
          o.bind<float>(a.x, image(a.g));
          o.bind<float>(a.dy, output(a.g));
          o.bind<float>(a.dw, weight(a.g));
          o.bind_if<float>(a.dbias, a.g.k);
          o.workspace(a.ws, shape);
        } else if constexpr (std::is_same_v<T, LinearForward>) {
          o.bind<float>(a.x, a.g.m * a.g.k);
          o.bind<float>(a.w, a.g.n * a.g.k);
          o.bind_if<float>(a.bias, a.g.n);
          o.bind<float>(a.y, a.g.m * a.g.n);
          o.workspace(a.ws, shape);
        } else if constexpr (std::is_same_v<T, LinearBackwardData>) {
          o.bind<float>(a.dy, a.g.m * a.g.n);
          o.bind<float>(a.w, a.g.n * a.g.k);
          o.bind<float>(a.dx, a.g.m * a.g.k);
          o.workspace(a.ws, shape);
        } else if constexpr (std::is_same_v<T, LinearBackwardWeights>) {
          o.bind<float>(a.x, a.g.m * a.g.k);
          o.bind<float>(a.dy, a.g.m * a.g.n);
          o.bind<float>(a.dw, a.g.n * a.g.k);
          o.bind_if<float>(a.dbias, a.g.n);
          o.workspace(a.ws, shape);
        } else if constexpr (std::is_same_v<T, PoolForward>) {
          o.bind<float>(a.x, image(a.g));
          o.bind<float>(a.y, output(a.g));
        } else if constexpr (std::is_same_v<T, PoolBackward>) {
          o.bind<float>(a.x, image(a.g));
          o.bind<float>(a.y, output(a.g));
          o.bind<float>(a.dy, output(a.g));
          o.bind<float>(a.dx, image(a.g));
        } else if constexpr (std::is_same_v<T, AdaptiveAvgPoolForward>) {
          o.bind<float>(a.x, a.n * a.c * a.h * a.w);
          o.bind<float>(a.y, a.n * a.c * a.oh * a.ow);
        } else if constexpr (std::is_same_v<T, AdaptiveAvgPoolBackward>) {
          o.bind<float>(a.dy, a.n * a.c * a.oh * a.ow);
          o.bind<float>(a.dx, a.n * a.c * a.h * a.w);
        } else if constexpr (std::is_same_v<T, BatchNormForwardTraining>) {
          const int64_t n = a.g.n * a.g.c * a.g.hw;
          o.bind<float>(a.x, n);
          o.bind<float>(a.gamma, a.g.c);
          o.bind<float>(a.beta, a.g.c);
          o.bind<float>(a.y, n);
          o.bind<float>(a.running_mean, a.g.c, 0.0f);
          o.bind<float>(a.running_var, a.g.c);
          o.bind<float>(a.save_mean, a.g.c);
          o.bind<float>(a.save_var, a.g.c);
        } else if constexpr (std::is_same_v<T, BatchNormForwardInference>) {
          const int64_t n = a.g.n * a.g.c * a.g.hw;
          o.bind<float>(a.x, n);
          o.bind<float>(a.gamma, a.g.c);
          o.bind<float>(a.beta, a.g.c);
          o.bind<float>(a.running_mean, a.g.c, 0.0f);
          o.bind<float>(a.running_var, a.g.c);
          o.bind<float>(a.y, n);
        } else if constexpr (std::is_same_v<T, BatchNormBackward>) {
          const int64_t n = a.g.n * a.g.c * a.g.hw;
          o.bind<float>(a.x, n);
          o.bind<float>(a.dy, n);
          o.bind<float>(a.gamma, a.g.c);
          o.bind<float>(a.save_mean, a.g.c, 0.0f);
          o.bind<float>(a.save_var, a.g.c);
          o.bind<float>(a.dx, n);
          o.bind<float>(a.dgamma, a.g.c);
          o.bind<float>(a.dbeta, a.g.c);
        } else if constexpr (std::is_same_v<T, ReluForward>) {
          o.bind<float>(a.x, a.n);
          o.bind<float>(a.y, a.n);
        } else if constexpr (std::is_same_v<T, ReluBackward>) {
          o.bind<float>(a.y, a.n);
          o.bind<float>(a.dy, a.n);
          o.bind<float>(a.dx, a.n);
        } else if constexpr (std::is_same_v<T, AddForward>) {
          o.bind<float>(a.a, a.n);
          o.bind<float>(a.b, a.n);
          o.bind<float>(a.y, a.n);
        } else if constexpr (std::is_same_v<T, Accumulate>) {
          o.bind<float>(a.x, a.n);
          o.bind<float>(a.y, a.n);
        } else if constexpr (std::is_same_v<T, CopyDevice>) {
          const int64_t floats = static_cast<int64_t>((a.bytes + 3) / 4);
          o.bind<float>(a.src, floats);
          o.bind<float>(a.dst, floats);
        } else if constexpr (std::is_same_v<T, Fill> || std::is_same_v<T, Scale>) {
          o.bind<float>(a.y, a.n);
        } else if constexpr (std::is_same_v<T, DropoutForward>) {
          o.bind<float>(a.x, a.n);
          o.bind<float>(a.y, a.n);
          o.bind<float>(a.mask, (a.n + 3) / 4, 0.0f);
        } else if constexpr (std::is_same_v<T, DropoutBackward>) {
          o.bind<float>(a.dy, a.n);
          o.bind<float>(a.mask, (a.n + 3) / 4, 0.0f);
          o.bind<float>(a.dx, a.n);
        } else if constexpr (std::is_same_v<T, SoftmaxCrossEntropyForward>) {
          o.bind<float>(a.logits, a.n * a.k);
          o.bind<int32_t>(a.labels, a.n, 0.0f);
          o.bind<float>(a.loss, 1);
          o.bind<float>(a.probs, a.n * a.k);
          o.bind_if<int32_t>(a.correct, 1, 0.0f);
        } else if constexpr (std::is_same_v<T, SoftmaxCrossEntropyBackward>) {
          o.bind<float>(a.probs, a.n * a.k);
          o.bind<int32_t>(a.labels, a.n, 0.0f);
          o.bind<float>(a.dlogits, a.n * a.k);
        } else if constexpr (std::is_same_v<T, SgdUpdate>) {
          o.bind<float>(a.param, a.n);
          o.bind<float>(a.grad, a.n, 0.0f);
          if (a.momentum > 0) {
            o.bind<float>(a.momentum_buf, a.n, 0.0f);
          } else {
            a.momentum_buf = nullptr;
          }
        } else if constexpr (std::is_same_v<T, AdamWUpdate>) {
          o.bind<float>(a.param, a.n);
          o.bind<float>(a.grad, a.n, 0.0f);
          o.bind<float>(a.m, a.n, 0.0f);
          o.bind<float>(a.v, a.n, 0.0f);
        } else if constexpr (std::is_same_v<T, EmbeddingForward>) {
          o.bind<int32_t>(a.tokens, a.n * a.t, 0.0f);
          o.bind_if<int32_t>(a.segments, a.n * a.t, 0.0f);  // one document per row
          o.bind<float>(a.wte, a.vocab * a.c);
          o.bind_if<float>(a.wpe, a.t * a.c);
          o.bind<float>(a.y, a.n * a.t * a.c);
        } else if constexpr (std::is_same_v<T, EmbeddingBackward>) {
          o.bind<int32_t>(a.tokens, a.n * a.t, 0.0f);
          o.bind_if<int32_t>(a.segments, a.n * a.t, 0.0f);
          o.bind<float>(a.dy, a.n * a.t * a.c);
          o.bind<float>(a.dwte, a.vocab * a.c);
          o.bind_if<float>(a.dwpe, a.context * a.c);
        } else if constexpr (std::is_same_v<T, LayerNormForward>) {
          o.bind<float>(a.x, a.g.rows * a.g.c);
          o.bind<float>(a.gamma, a.g.c);
          o.bind<float>(a.beta, a.g.c);
          o.bind<float>(a.y, a.g.rows * a.g.c);
          o.bind<float>(a.mean, a.g.rows);
          o.bind<float>(a.rstd, a.g.rows);
        } else if constexpr (std::is_same_v<T, LayerNormBackward>) {
          o.bind<float>(a.x, a.g.rows * a.g.c);
          o.bind<float>(a.dy, a.g.rows * a.g.c);
          o.bind<float>(a.gamma, a.g.c);
          o.bind<float>(a.mean, a.g.rows, 0.0f);
          o.bind<float>(a.rstd, a.g.rows);
          o.bind<float>(a.dx, a.g.rows * a.g.c);
          o.bind<float>(a.dgamma, a.g.c);
          o.bind<float>(a.dbeta, a.g.c);
        } else if constexpr (std::is_same_v<T, GeluForward>) {
          o.bind<float>(a.x, a.n);
          o.bind<float>(a.y, a.n);
        } else if constexpr (std::is_same_v<T, GeluBackward>) {
          o.bind<float>(a.x, a.n);
          o.bind<float>(a.dy, a.n);
          o.bind<float>(a.dx, a.n);
        } else if constexpr (std::is_same_v<T, AttentionForward>) {
          const int64_t scores = a.g.n * a.g.heads * a.g.t * a.g.t;
          o.bind<float>(a.qkv, a.g.n * a.g.t * 3 * a.g.c);
          o.bind<float>(a.y, a.g.n * a.g.t * a.g.c);
          o.bind<float>(a.probs, scores);
          o.bind<float>(a.mask, (scores + 3) / 4, 0.0f);
          o.bind_if<int32_t>(a.segments, a.g.n * a.g.t, 0.0f);
          o.workspace(a.ws, shape);
        } else if constexpr (std::is_same_v<T, AttentionBackward>) {
          const int64_t scores = a.g.n * a.g.heads * a.g.t * a.g.t;
          o.bind<float>(a.qkv, a.g.n * a.g.t * 3 * a.g.c);
          o.bind<float>(a.probs, scores);
          o.bind<float>(a.mask, (scores + 3) / 4, 0.0f);
          o.bind<float>(a.dy, a.g.n * a.g.t * a.g.c);
          o.bind<float>(a.dqkv, a.g.n * a.g.t * 3 * a.g.c);
          o.bind_if<int32_t>(a.segments, a.g.n * a.g.t, 0.0f);
          o.workspace(a.ws, shape);
        } else if constexpr (std::is_same_v<T, FlashAttentionForward>) {
          o.bind<float>(a.qkv, a.g.n * a.g.t * 3 * a.g.c);
          o.bind_if<float>(a.y, a.g.n * a.g.t * a.g.c);
          o.bind<float>(a.lse, a.g.n * a.g.heads * a.g.t);
          o.bind_if<int32_t>(a.segments, a.g.n * a.g.t, 0.0f);
        } else if constexpr (std::is_same_v<T, FlashAttentionBackward>) {
          o.bind<float>(a.qkv, a.g.n * a.g.t * 3 * a.g.c);
          o.bind<float>(a.y, a.g.n * a.g.t * a.g.c);
          o.bind<float>(a.lse, a.g.n * a.g.heads * a.g.t);
          o.bind<float>(a.dy, a.g.n * a.g.t * a.g.c);
          o.bind<float>(a.dqkv, a.g.n * a.g.t * 3 * a.g.c);
          o.bind_if<int32_t>(a.segments, a.g.n * a.g.t, 0.0f);
        } else if constexpr (std::is_same_v<T, SumOfSquares>) {
          o.bind<float>(a.x, a.n);
          o.bind<float>(a.out, 1);
        } else if constexpr (std::is_same_v<T, ClipByNorm>) {
          o.bind<float>(a.sum_sq, 1);
          o.bind<float>(a.y, a.n);
        } else if constexpr (std::is_same_v<T, RmsNormForward>) {
          o.bind<float>(a.x, a.g.rows * a.g.c);
          o.bind<float>(a.weight, a.g.c);
          o.bind<float>(a.y, a.g.rows * a.g.c);
          o.bind<float>(a.rstd, a.g.rows);
        } else if constexpr (std::is_same_v<T, RmsNormBackward>) {
          o.bind<float>(a.x, a.g.rows * a.g.c);
          o.bind<float>(a.dy, a.g.rows * a.g.c);
          o.bind<float>(a.weight, a.g.c);
          o.bind<float>(a.rstd, a.g.rows);
          o.bind<float>(a.dx, a.g.rows * a.g.c);
          o.bind<float>(a.dweight, a.g.c);
        } else if constexpr (std::is_same_v<T, RopeQkvForward>) {
          const int64_t rows = a.g.n * a.g.t;
          o.bind<float>(a.q, rows * a.g.q_width());
          o.bind<float>(a.k, rows * a.g.kv_width());
          o.bind<float>(a.v, rows * a.g.kv_width());
          o.bind<float>(a.qkv, rows * 3 * a.g.q_width());
          o.bind_if<int32_t>(a.segments, rows, 0.0f);
        } else if constexpr (std::is_same_v<T, RopeQkvBackward>) {
          const int64_t rows = a.g.n * a.g.t;
          o.bind<float>(a.dqkv, rows * 3 * a.g.q_width());
          o.bind_if<float>(a.dq, rows * a.g.q_width());
          o.bind_if<float>(a.dk, rows * a.g.kv_width());
          o.bind_if<float>(a.dv, rows * a.g.kv_width());
          o.bind_if<int32_t>(a.segments, rows, 0.0f);
        } else if constexpr (std::is_same_v<T, SwigluForward>) {
          o.bind<float>(a.gate, a.n);
          o.bind<float>(a.up, a.n);
          o.bind<float>(a.y, a.n);
        } else if constexpr (std::is_same_v<T, SwigluBackward>) {
          o.bind<float>(a.gate, a.n);
          o.bind<float>(a.up, a.n);
          o.bind<float>(a.dy, a.n);
          o.bind<float>(a.dgate, a.n);
          o.bind<float>(a.dup, a.n);
        } else if constexpr (std::is_same_v<T, ConvertFloats>) {
          o.bind<float>(a.x, a.n);  // fp32-sized: room for either direction
          o.bind<float>(a.y, a.n);
        } else {
          static_assert(sizeof(T) == 0, "a kernel without scratch operands");
        }
      },
      args);
}

}  // namespace

std::string kernel_key(const KernelArgs& args) {
  KeyBuilder k(kernel_name(args));
  std::visit(
      [&](const auto& a) {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, ConvForward>) {
          conv(k, a.g);
          k("bias", a.bias != nullptr);
        } else if constexpr (std::is_same_v<T, ConvBackwardData>) {
          conv(k, a.g);
        } else if constexpr (std::is_same_v<T, ConvBackwardWeights>) {
          conv(k, a.g);
          k("bias", a.dbias != nullptr);
        } else if constexpr (std::is_same_v<T, LinearForward>) {
          linear(k, a.g);
          k("bias", a.bias != nullptr);
        } else if constexpr (std::is_same_v<T, LinearBackwardData>) {
          linear(k, a.g);
        } else if constexpr (std::is_same_v<T, LinearBackwardWeights>) {
          linear(k, a.g);
          k("bias", a.dbias != nullptr);
        } else if constexpr (std::is_same_v<T, PoolForward> || std::is_same_v<T, PoolBackward>) {
          pool(k, a.g);
        } else if constexpr (std::is_same_v<T, AdaptiveAvgPoolForward> ||
                             std::is_same_v<T, AdaptiveAvgPoolBackward>) {
          k("n", a.n)("c", a.c)("h", a.h)("w", a.w)("oh", a.oh)("ow", a.ow);
        } else if constexpr (std::is_same_v<T, BatchNormForwardTraining> ||
                             std::is_same_v<T, BatchNormForwardInference> ||
                             std::is_same_v<T, BatchNormBackward>) {
          bn(k, a.g);
        } else if constexpr (std::is_same_v<T, CopyDevice>) {
          k("bytes", static_cast<int64_t>(a.bytes));
        } else if constexpr (std::is_same_v<T, SoftmaxCrossEntropyForward>) {
          k("n", a.n)("k", a.k)("correct", a.correct != nullptr);
        } else if constexpr (std::is_same_v<T, SoftmaxCrossEntropyBackward>) {
          k("n", a.n)("k", a.k);
        } else if constexpr (std::is_same_v<T, SgdUpdate>) {
          k("n", a.n)("momentum", a.momentum > 0)("nesterov", a.nesterov)("wd",
                                                                          a.weight_decay != 0);
        } else if constexpr (std::is_same_v<T, EmbeddingForward> ||
                             std::is_same_v<T, EmbeddingBackward>) {
          k("n", a.n)("t", a.t)("c", a.c)("vocab", a.vocab);
          if (a.segments != nullptr) k("segments", true);
        } else if constexpr (std::is_same_v<T, LayerNormForward> ||
                             std::is_same_v<T, LayerNormBackward>) {
          k("rows", a.g.rows)("c", a.g.c);
        } else if constexpr (std::is_same_v<T, AttentionForward>) {
          attention(k, a.g);
          k("training", a.training);
          if (a.segments != nullptr) k("segments", true);
        } else if constexpr (std::is_same_v<T, AttentionBackward> ||
                             std::is_same_v<T, FlashAttentionBackward>) {
          attention(k, a.g);
          if (a.segments != nullptr) k("segments", true);
        } else if constexpr (std::is_same_v<T, FlashAttentionForward>) {
          attention(k, a.g);
          k("training", a.training);
          if (a.segments != nullptr) k("segments", true);
        } else if constexpr (std::is_same_v<T, RmsNormForward> ||
                             std::is_same_v<T, RmsNormBackward>) {
          k("rows", a.g.rows)("c", a.g.c);
        } else if constexpr (std::is_same_v<T, RopeQkvForward> ||
                             std::is_same_v<T, RopeQkvBackward>) {
          k("n", a.g.n)("t", a.g.t)("heads", a.g.heads)("kv_heads", a.g.kv_heads)("d",
                                                                                  a.g.head_dim);
          if (a.segments != nullptr) k("segments", true);
        } else {
          k("n", a.n);
        }
        // bf16 storage is another kernel (fp32 keys stay as they were).
        if constexpr (requires { a.dtype; }) {
          if (a.dtype == DType::kBF16) k("bf16", true);
        }
      },
      args);
  return k.str();
}

KernelTiming time_rounds(const std::function<double(int launches)>& round, double target_seconds) {
  KernelTiming t;
  double best = std::numeric_limits<double>::infinity();
  for (int p = 0; p < kProbes; ++p) {
    best = std::min(best, round(1));
    ++t.launches;
  }
  // Short kernels are launched more often per round, to see past the timer's grain.
  const int launches = std::clamp(
      static_cast<int>(std::ceil(target_seconds / std::max(best, 1e-7))), 1, kMaxLaunches);
  for (int set = 0; set <= kRetimes; ++set) {
    double fastest = std::numeric_limits<double>::infinity();
    double slowest = 0;
    for (int r = 0; r < kRounds; ++r) {
      const double s = round(launches);
      t.launches += launches;
      fastest = std::min(fastest, s);
      slowest = std::max(slowest, s);
    }
    // A slower round was interrupted (a shared machine, a timer's grain), which is not the
    // kernel's own cost.
    best = std::min(best, fastest);
    if (slowest <= kDisagree * fastest || set == kRetimes) break;
    ++t.retimed;
  }
  t.seconds = std::max(best, 0.0);
  return t;
}

KernelTiming time_kernel(Device& device, const KernelArgs& args, double target_seconds) {
  if (!device.kernels().supports(args.index(), DType::kF32)) {
    throw UnsupportedError(
        fmt::format("{} cannot time {}: the backend lacks it", device.name(), kernel_name(args)));
  }
  KernelTiming t;
  {
    Operands operands(device);
    KernelArgs bound = args;
    bind_operands(operands, bound);
    Stream& compute = device.stream(StreamKind::kCompute);
    device.kernels().launch(bound, compute);  // warm-up: algorithm choice, caches, first touch
    compute.synchronize();
    // One launch ahead of each start mark keeps the stream busy, so timed launches run back to
    // back as in a step, not after an idle stream's wake-up.
    auto start = device.create_timing_event();
    auto end = device.create_timing_event();
    t = time_rounds(
        [&](int launches) {
          device.kernels().launch(bound, compute);
          compute.record(*start);
          for (int i = 0; i < launches; ++i) device.kernels().launch(bound, compute);
          compute.record(*end);
          end->synchronize();
          return device.elapsed_ms(*start, *end) / 1e3 / launches;
        },
        target_seconds);
    device.synchronize();
  }
  return t;
}

double time_copy(Device& device, bool to_host, uint64_t bytes, int repeats) {
  DeviceBuffer on_device(device.memory(), bytes, "link timing scratch");
  void* host = device.pinned().allocate(bytes);
  std::memset(host, 0, bytes);
  Stream& stream = device.stream(to_host ? StreamKind::kDeviceToHost : StreamKind::kHostToDevice);
  auto start = device.create_timing_event();
  auto end = device.create_timing_event();
  double best = 0;
  try {
    for (int i = 0; i <= repeats; ++i) {
      stream.record(*start);
      if (to_host) {
        device.copy_async(host, on_device.data(), bytes, stream);
      } else {
        device.copy_async(on_device.data(), host, bytes, stream);
      }
      stream.record(*end);
      end->synchronize();
      const double seconds = device.elapsed_ms(*start, *end) / 1e3;
      if (i > 0 && seconds > 0) best = std::max(best, static_cast<double>(bytes) / seconds / 1e9);
    }
  } catch (...) {
    device.synchronize();
    device.pinned().deallocate(host, bytes);
    throw;
  }
  device.synchronize();
  device.pinned().deallocate(host, bytes);
  return best;
}

}  // namespace ferry
