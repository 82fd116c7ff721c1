// bench_bf16_kernel_timing: fp32 against bf16 storage for the CPU backend's kernels (linear on GPT
// shapes, convolution on resnet18_cifar's layers at batch 64, or every kernel of a GPT step),
// best of several runs after a warm-up. Prints only; asserts nothing.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "device/cpu/bf16_storage.h"
#include "device/cpu/cpu_kernels.h"

// Note [bf16 kernel timing runs]
// Usage: bench_bf16_kernel_timing [threads=2] [reps=10] [linear|conv|all|gpt] [cpu|wall]
//                                 [auto|native|widened]
// "gpt" [.. products NAME] times every kernel (whose name contains NAME) of a 6 x 384 GPT step at 8
// x 256 tokens (LM head and loss over the 50257-token vocabulary included) with its count per step,
// and sums them per step. With "cpu", times are the process's CPU time instead of wall time: with 1
// thread on a busy machine that is the kernel's own work, unaffected by time slicing. The last
// argument picks how bf16 products run (cpu::Bf16Products; Note [bf16 products in fp32] in
// device/cpu). Each line gives one kernel's fp32 and bf16 times (ms) and bf16/fp32; below 1 is bf16
// faster. The weights are the same buffer on every run, as between two updates of a training step;
// the
// "+update" column times the forward with the weights rewritten before every run (the first use
// after an update; the rewrite not counted), which differs only for a kernel that caches
// something per weight version. The machine's load is printed before and after: on a shared
// machine the ratios are the figures to read, not the times.

namespace ferry {
namespace {

int g_reps = 10;
std::string g_only;  // gpt: time only the kernels whose name contains this
bool g_cpu_clock = false;

double now_ms() {
  if (g_cpu_clock) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
  }
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// One operand in either storage: fp32 values, or their bf16 bits behind a float pointer
// (Note [Storage dtype of a kernel] in device/kernels.h).
struct Buffer {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  Buffer(size_t n, uint32_t seed, DType dtype) : f32(random_floats(n, seed)) {
    if (dtype == DType::kBF16) {
      bf16.resize(n);
      cpu::narrow_to_bf16(f32.data(), bf16.data(), static_cast<int64_t>(n));
    }
  }
  float* ptr() { return bf16.empty() ? f32.data() : reinterpret_cast<float*>(bf16.data()); }
  // Rewrites the contents (the same values), as an update's working copy does.
  void rewrite() {
    if (bf16.empty()) return;
    cpu::narrow_to_bf16(f32.data(), bf16.data(), static_cast<int64_t>(f32.size()));
  }
};

// Best of g_reps runs of `f` after one warm-up; `before` runs untimed ahead of each.
double best_ms(const std::function<void()>& f, const std::function<void()>& before = {}) {
  f();
  double best = 1e30;
  for (int r = 0; r < g_reps; ++r) {
    if (before) before();
    const double t0 = now_ms();
    f();
    best = std::min(best, now_ms() - t0);
  }
  return best;
}

template <typename Args>
std::function<void()> runner(cpu::CpuKernels& k, Args args, std::vector<char>& ws) {
  if constexpr (requires { args.ws; }) {
    ws.resize(k.workspace_bytes(args));
    args.ws = Workspace{ws.data(), ws.size()};
  }
  return [&k, args] { k.run(args); };
}

struct Times {
  double fwd = 0, fwd_update = 0, data = 0, weights = 0;
};

void print(const char* what, const Times& f, const Times& b) {
  std::printf(
      "%-34s fwd %8.3f %8.3f %5.2f | +update %8.3f %5.2f | bwd_data %8.3f %8.3f %5.2f | "
      "bwd_weights %8.3f %8.3f %5.2f\n",
      what, f.fwd, b.fwd, b.fwd / f.fwd, b.fwd_update, b.fwd_update / f.fwd, f.data, b.data,
      b.data / f.data, f.weights, b.weights, b.weights / f.weights);
  std::fflush(stdout);
}

Times time_linear(cpu::CpuKernels& k, const LinearGeom& g, DType dtype) {
  Buffer x(g.m * g.k, 1, dtype), w(g.k * g.n, 2, dtype), dy(g.m * g.n, 3, dtype);
  Buffer y(g.m * g.n, 4, dtype), dx(g.m * g.k, 5, dtype);
  auto bias = random_floats(g.n, 6);
  std::vector<float> dw(g.k * g.n), db(g.n);
  std::vector<char> ws1, ws2, ws3;
  Times t;
  auto fwd = runner(k, LinearForward{g, x.ptr(), w.ptr(), bias.data(), y.ptr(), {}, dtype}, ws1);
  t.fwd = best_ms(fwd);
  t.fwd_update = best_ms(fwd, [&] { w.rewrite(); });
  t.data = best_ms(runner(k, LinearBackwardData{g, dy.ptr(), w.ptr(), dx.ptr(), {}, dtype}, ws2));
  t.weights = best_ms(
      runner(k, LinearBackwardWeights{g, x.ptr(), dy.ptr(), dw.data(), db.data(), {}, dtype}, ws3));
  return t;
}

Times time_conv(cpu::CpuKernels& k, const ConvGeom& g, DType dtype) {
  Buffer x(g.n * g.c * g.h * g.w, 1, dtype), w(g.k * g.c * g.r * g.s, 2, dtype);
  const int64_t ys = g.n * g.k * g.out_h() * g.out_w();
  Buffer dy(ys, 3, dtype), y(ys, 4, dtype), dx(g.n * g.c * g.h * g.w, 5, dtype);
  std::vector<float> dw(g.k * g.c * g.r * g.s);
  std::vector<char> ws1, ws2, ws3;
  Times t;
  auto fwd = runner(k, ConvForward{g, x.ptr(), w.ptr(), nullptr, y.ptr(), {}, dtype}, ws1);
  t.fwd = best_ms(fwd);
  t.fwd_update = best_ms(fwd, [&] { w.rewrite(); });
  t.data = best_ms(runner(k, ConvBackwardData{g, dy.ptr(), w.ptr(), dx.ptr(), {}, dtype}, ws2));
  t.weights = best_ms(
      runner(k, ConvBackwardWeights{g, x.ptr(), dy.ptr(), dw.data(), nullptr, {}, dtype}, ws3));
  return t;
}

// Instructions per ns of 512-bit VFMADD231PS (32 flops) and VDPBF16PS (64 flops), on 12
// independent accumulators: the peak rates oneDNN's fp32 and native bf16 kernels build on.
__attribute__((target("avx512f,avx512bf16"))) void instruction_rates() {
  constexpr int64_t kIters = 20'000'000;
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
  const __m512bh ab = (__m512bh)_mm512_set1_epi16(0x3f80);
  g_cpu_clock = true;
  const double t0 = now_ms();
  for (int64_t i = 0; i < kIters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_fmadd_ps(a, b, acc[j]);
  }
  const double t1 = now_ms();
  for (int64_t i = 0; i < kIters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], ab, ab);
  }
  const double t2 = now_ms();
  float sink = 0.0f;
  alignas(64) float lanes[16];
  for (int i = 0; i < 12; ++i) {
    _mm512_store_ps(lanes, acc[i]);
    sink += lanes[0];
  }
  const double n = 12.0 * kIters;
  std::printf(
      "one core, CPU time: vfmadd231ps zmm %.2f/ns (%.0f GFLOP/s), vdpbf16ps zmm %.2f/ns (%.0f "
      "GFLOP/s)%s\n",
      n / (t1 - t0) * 1e-6, 32 * n / (t1 - t0) * 1e-6, n / (t2 - t1) * 1e-6,
      64 * n / (t2 - t1) * 1e-6, sink == 0.0f ? " " : "");
}

void linears(cpu::CpuKernels& k) {
  // A 6 x 384 GPT at 8 x 256 tokens: qkv, MLP up, MLP down, in both weight layouts (GPT-2's
  // Conv1D (K, N) and nn.Linear's (N, K), as Llama stores it).
  const int64_t m = 8 * 256;
  const int64_t shapes[][2] = {{384, 1152}, {384, 1536}, {1536, 384}};
  for (bool in_out : {true, false}) {
    for (const auto& s : shapes) {
      const LinearGeom g{m, s[0], s[1], in_out};
      char what[64];
      std::snprintf(what, sizeof what, "linear %ldx%ld->%ld %s", m, s[0], s[1],
                    in_out ? "(K,N)" : "(N,K)");
      print(what, time_linear(k, g, DType::kF32), time_linear(k, g, DType::kBF16));
    }
  }
}

void convs(cpu::CpuKernels& k) {
  // resnet18_cifar's convolutions at batch 64.
  struct Shape {
    int64_t c, hw, kout, r, stride, pad;
  };
  const Shape shapes[] = {{3, 32, 64, 3, 1, 1},   {64, 32, 64, 3, 1, 1},   {64, 32, 128, 3, 2, 1},
                          {64, 32, 128, 1, 2, 0}, {128, 16, 128, 3, 1, 1}, {128, 16, 256, 3, 2, 1},
                          {256, 8, 256, 3, 1, 1}, {256, 8, 512, 3, 2, 1},  {512, 4, 512, 3, 1, 1}};
  for (const Shape& s : shapes) {
    ConvGeom g;
    g.n = 64, g.c = s.c, g.h = g.w = s.hw, g.k = s.kout, g.r = g.s = s.r;
    g.stride_h = g.stride_w = s.stride, g.pad_h = g.pad_w = s.pad;
    char what[64];
    std::snprintf(what, sizeof what, "conv %ld->%ld %ldx%ld k%ld s%ld", s.c, s.kout, s.hw, s.hw,
                  s.r, s.stride);
    print(what, time_conv(k, g, DType::kF32), time_conv(k, g, DType::kBF16));
  }
}

// ---- a GPT step's kernels ----

// One kernel of a GPT step: its fp32 and bf16 times and how often a step runs it.
struct StepKernel {
  std::string what;
  int per_step = 1;
  double f32 = 0, bf16 = 0;
};

void print_step_kernel(const StepKernel& r) {
  std::printf("%-40s x%-3d %9.3f %9.3f %5.2f | per step %8.1f %8.1f %+8.1f\n", r.what.c_str(),
              r.per_step, r.f32, r.bf16, r.bf16 / r.f32, r.f32 * r.per_step, r.bf16 * r.per_step,
              (r.bf16 - r.f32) * r.per_step);
  std::fflush(stdout);
}

// Times `make(dtype)`'s kernel in both storages (each a fresh set of buffers).
template <typename Make>
StepKernel time_both(const std::string& what, int per_step, const Make& make) {
  StepKernel r{what, per_step};
  if (what.find(g_only) == std::string::npos) return r;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const double t = make(dtype);
    (dtype == DType::kF32 ? r.f32 : r.bf16) = t;
  }
  print_step_kernel(r);
  return r;
}

// The kernels of a GPT-2 of 6 layers x 384 (6 heads, vocabulary 50257, tied LM head) at 8 x 256
// tokens, as one training step runs them (fused attention, no dropout), each timed alone, with
// the step's count: the per-step sums locate what a bf16 step adds over fp32.
void gpt_step(cpu::CpuKernels& k) {
  const int64_t n = 8, t = 256, c = 384, heads = 6, vocab = 50257, layers = 6, m = n * t;
  std::vector<StepKernel> rows;
  std::vector<int32_t> tokens(m), labels(m);
  for (int64_t i = 0; i < m; ++i) tokens[i] = labels[i] = static_cast<int32_t>((i * 7919) % vocab);
  std::vector<char> ws;
  // Linear layers (Conv1D weights, with bias) and the tied LM head (nn.Linear layout, no bias).
  struct Lin {
    const char* what;
    int64_t k, n;
    bool in_out, bias;
    int per_step;
  };
  const Lin lins[] = {{"c_attn 384->1152", c, 3 * c, true, true, int(layers)},
                      {"attn.c_proj 384->384", c, c, true, true, int(layers)},
                      {"mlp.c_fc 384->1536", c, 4 * c, true, true, int(layers)},
                      {"mlp.c_proj 1536->384", 4 * c, c, true, true, int(layers)},
                      {"lm_head 384->50257", c, vocab, false, false, 1}};
  for (const Lin& l : lins) {
    if (std::string(l.what).find(g_only) == std::string::npos) continue;
    const LinearGeom g{m, l.k, l.n, l.in_out};
    Times tf, tb;
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      Buffer x(g.m * g.k, 1, dtype), w(g.k * g.n, 2, dtype), dy(g.m * g.n, 3, dtype);
      Buffer y(g.m * g.n, 4, dtype), dx(g.m * g.k, 5, dtype);
      auto bias = random_floats(g.n, 6);
      std::vector<float> dw(g.k * g.n), db(g.n);
      Times& tt = dtype == DType::kF32 ? tf : tb;
      tt.fwd = best_ms(runner(
          k, LinearForward{g, x.ptr(), w.ptr(), l.bias ? bias.data() : nullptr, y.ptr(), {}, dtype},
          ws));
      tt.data =
          best_ms(runner(k, LinearBackwardData{g, dy.ptr(), w.ptr(), dx.ptr(), {}, dtype}, ws));
      tt.weights = best_ms(
          runner(k,
                 LinearBackwardWeights{
                     g, x.ptr(), dy.ptr(), dw.data(), l.bias ? db.data() : nullptr, {}, dtype},
                 ws));
    }
    const std::string w = l.what;
    rows.push_back({"fwd " + w, l.per_step, tf.fwd, tb.fwd});
    rows.push_back({"bwd data " + w, l.per_step, tf.data, tb.data});
    rows.push_back({"bwd weights " + w, l.per_step, tf.weights, tb.weights});
    for (size_t i = rows.size() - 3; i < rows.size(); ++i) print_step_kernel(rows[i]);
  }
  rows.push_back(time_both("loss fwd 2048x50257", 1, [&](DType dtype) {
    Buffer logits(m * vocab, 1, dtype), probs(m * vocab, 2, dtype);
    float loss = 0;
    return best_ms(runner(k,
                          SoftmaxCrossEntropyForward{m, vocab, logits.ptr(), labels.data(), &loss,
                                                     probs.ptr(), nullptr, 0.0f, dtype},
                          ws));
  }));
  rows.push_back(time_both("loss bwd 2048x50257", 1, [&](DType dtype) {
    Buffer probs(m * vocab, 1, dtype), dlogits(m * vocab, 2, dtype);
    return best_ms(runner(k,
                          SoftmaxCrossEntropyBackward{m, vocab, 1.0f, probs.ptr(), labels.data(),
                                                      dlogits.ptr(), 0.0f, dtype},
                          ws));
  }));
  const AttentionGeom ag{n, t, heads, c};
  rows.push_back(time_both("attention fwd (fused)", int(layers), [&](DType dtype) {
    Buffer qkv(m * 3 * c, 1, dtype), y(m * c, 2, dtype);
    std::vector<float> lse(n * heads * t);
    return best_ms(runner(
        k, FlashAttentionForward{ag, true, 0, qkv.ptr(), y.ptr(), lse.data(), nullptr, dtype}, ws));
  }));
  rows.push_back(time_both("attention bwd (fused)", int(layers), [&](DType dtype) {
    Buffer qkv(m * 3 * c, 1, dtype), y(m * c, 2, dtype), dy(m * c, 3, dtype);
    Buffer dqkv(m * 3 * c, 4, dtype);
    std::vector<float> lse(n * heads * t, 8.0f);
    return best_ms(runner(k,
                          FlashAttentionBackward{ag, 0, qkv.ptr(), y.ptr(), lse.data(), dy.ptr(),
                                                 dqkv.ptr(), nullptr, dtype},
                          ws));
  }));
  const LayerNormGeom lg{m, c};
  rows.push_back(time_both("layer norm fwd", int(2 * layers + 1), [&](DType dtype) {
    Buffer x(m * c, 1, dtype), y(m * c, 2, dtype);
    auto gamma = random_floats(c, 3), beta = random_floats(c, 4);
    std::vector<float> mean(m), rstd(m);
    return best_ms(runner(k,
                          LayerNormForward{lg, x.ptr(), gamma.data(), beta.data(), y.ptr(),
                                           mean.data(), rstd.data(), dtype},
                          ws));
  }));
  rows.push_back(time_both("layer norm bwd", int(2 * layers + 1), [&](DType dtype) {
    Buffer x(m * c, 1, dtype), dy(m * c, 2, dtype), dx(m * c, 3, dtype);
    auto gamma = random_floats(c, 3);
    std::vector<float> mean(m, 0.0f), rstd(m, 1.0f), dg(c), dbeta(c);
    return best_ms(runner(k,
                          LayerNormBackward{lg, x.ptr(), dy.ptr(), gamma.data(), mean.data(),
                                            rstd.data(), dx.ptr(), dg.data(), dbeta.data(), dtype},
                          ws));
  }));
  rows.push_back(time_both("gelu fwd 2048x1536", int(layers), [&](DType dtype) {
    Buffer x(m * 4 * c, 1, dtype), y(m * 4 * c, 2, dtype);
    return best_ms(runner(k, GeluForward{m * 4 * c, x.ptr(), y.ptr(), dtype}, ws));
  }));
  rows.push_back(time_both("gelu bwd 2048x1536", int(layers), [&](DType dtype) {
    Buffer x(m * 4 * c, 1, dtype), dy(m * 4 * c, 2, dtype), dx(m * 4 * c, 3, dtype);
    return best_ms(runner(k, GeluBackward{m * 4 * c, x.ptr(), dy.ptr(), dx.ptr(), dtype}, ws));
  }));
  rows.push_back(time_both("add 2048x384", int(2 * layers), [&](DType dtype) {
    Buffer a(m * c, 1, dtype), b(m * c, 2, dtype), y(m * c, 3, dtype);
    return best_ms(runner(k, AddForward{m * c, a.ptr(), b.ptr(), y.ptr(), dtype}, ws));
  }));
  rows.push_back(time_both("accumulate 2048x384", int(2 * layers), [&](DType dtype) {
    Buffer x(m * c, 1, dtype), y(m * c, 2, dtype);
    return best_ms(runner(k, Accumulate{m * c, x.ptr(), y.ptr(), dtype}, ws));
  }));
  std::vector<float> wte = random_floats(vocab * c, 5), wpe = random_floats(1024 * c, 6);
  rows.push_back(time_both("embedding fwd", 1, [&](DType dtype) {
    Buffer y(m * c, 1, dtype);
    return best_ms(runner(k,
                          EmbeddingForward{n, t, c, vocab, tokens.data(), wte.data(), wpe.data(),
                                           y.ptr(), nullptr, dtype},
                          ws));
  }));
  rows.push_back(time_both("embedding bwd (onto the head's dwte)", 1, [&](DType dtype) {
    Buffer dy(m * c, 1, dtype);
    std::vector<float> dwte(vocab * c), dwpe(1024 * c);
    return best_ms(runner(k,
                          EmbeddingBackward{n, t, c, vocab, 1024, tokens.data(), dy.ptr(),
                                            dwte.data(), dwpe.data(), true, nullptr, dtype},
                          ws));
  }));
  double f = 0, b = 0;
  for (const StepKernel& r : rows) {
    f += r.f32 * r.per_step;
    b += r.bf16 * r.per_step;
  }
  std::printf("%-45s %9s %9s %5.2f | per step %8.1f %8.1f %+8.1f\n", "step's kernels", "", "",
              f > 0 ? b / f : 0.0, f, b, b - f);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  if (argc > 2) ferry::g_reps = std::atoi(argv[2]);
  const std::string which = argc > 3 ? argv[3] : "all";
  ferry::g_cpu_clock = argc > 4 && std::string(argv[4]) == "cpu";
  omp_set_num_threads(threads);
  const std::string products = argc > 5 ? argv[5] : "auto";
  if (argc > 6) ferry::g_only = argv[6];
  using ferry::cpu::Bf16Products;
  ferry::cpu::CpuKernels k(threads, products == "native"    ? Bf16Products::kNative
                                    : products == "widened" ? Bf16Products::kWidened
                                                            : Bf16Products::kAuto);
  if (!k.supports(ferry::kernel_kind<ferry::LinearForward>(), ferry::DType::kBF16)) {
    std::printf("this CPU has no avx512_bf16 (or oneDNN may not use it): nothing to compare\n");
    return 0;
  }
  std::printf("threads %d, best of %d, %s ms: fp32 bf16 bf16/fp32; load %s\n", threads,
              ferry::g_reps, ferry::g_cpu_clock ? "process CPU" : "wall", ferry::loadavg().c_str());
  const bool cpu_clock = ferry::g_cpu_clock;
  ferry::instruction_rates();
  ferry::g_cpu_clock = cpu_clock;
  if (which == "gpt") {
    ferry::gpt_step(k);
  } else {
    if (which != "conv") ferry::linears(k);
    if (which != "linear") ferry::convs(k);
  }
  std::printf("load %s\n", ferry::loadavg().c_str());
  return 0;
}
