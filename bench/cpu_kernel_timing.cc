// bench_cpu_kernel_timing: times the CPU kernels on the shapes of resnet18_cifar / vgg11_cifar at
// batch 64 and of small GPT-2s, the naive and fused attention cores at T = 256 to 2048, best of
// several runs after a warm-up, for comparison with PyTorch (Note [CPU kernel timing runs]).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "device/cpu/cpu_kernels.h"

// Note [CPU kernel timing runs]
// cpu_kernel_timing_torch.py times the same operations in PyTorch for comparison.
// Usage: bench_cpu_kernel_timing [threads] [reps] [cpu]
// With "cpu", times are process CPU time rather than wall time: with 1 thread on a busy machine
// that measures the kernel's own work, unaffected by time slicing.

namespace ferry {
namespace {

int g_reps = 10;
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

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

double best_ms(const std::function<void()>& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < g_reps; ++r) {
    const double t0 = now_ms();
    f();
    best = std::min(best, now_ms() - t0);
  }
  return best;
}

// Runs `args` with exactly the workspace it asks for.
template <typename Args>
std::function<void()> runner(cpu::CpuKernels& k, Args args, std::vector<char>& ws) {
  ws.resize(k.workspace_bytes(args));
  args.ws = Workspace{ws.data(), ws.size()};
  return [&k, args] { k.run(args); };
}

void time_conv(cpu::CpuKernels& k, int64_t n, int64_t c, int64_t hw, int64_t kout, int64_t r,
               int64_t stride, int64_t pad) {
  ConvGeom g;
  g.n = n, g.c = c, g.h = g.w = hw, g.k = kout, g.r = g.s = r;
  g.stride_h = g.stride_w = stride, g.pad_h = g.pad_w = pad;
  auto x = random_floats(n * c * hw * hw, 1), w = random_floats(kout * c * r * r, 2);
  auto dy = random_floats(n * kout * g.out_h() * g.out_w(), 3);
  std::vector<float> y(dy.size()), dx(x.size()), dw(w.size());
  std::vector<char> ws1, ws2, ws3;
  const double f = best_ms(runner(k, ConvForward{g, x.data(), w.data(), nullptr, y.data()}, ws1));
  const double d = best_ms(runner(k, ConvBackwardData{g, dy.data(), w.data(), dx.data()}, ws2));
  const double b =
      best_ms(runner(k, ConvBackwardWeights{g, x.data(), dy.data(), dw.data(), nullptr}, ws3));
  std::printf(
      "conv %3ld->%3ld %2ldx%-2ld k%ld s%ld   fwd %8.3f  bwd_data %8.3f  bwd_weights %8.3f ms\n", c,
      kout, hw, hw, r, stride, f, d, b);
}

void time_batchnorm_relu(cpu::CpuKernels& k, int64_t n, int64_t c, int64_t hw) {
  const BatchNormGeom g{n, c, hw * hw, 1e-5f};
  const int64_t size = n * c * hw * hw;
  auto x = random_floats(size, 4), dy = random_floats(size, 5);
  std::vector<float> y(size), dx(size), gamma(c, 1.0f), beta(c, 0.0f), rm(c, 0.0f), rv(c, 1.0f);
  std::vector<float> mean(c), var(c), dg(c), db(c);
  const double f = best_ms([&] {
    k.run(BatchNormForwardTraining{g, 0.1f, x.data(), gamma.data(), beta.data(), y.data(),
                                   rm.data(), rv.data(), mean.data(), var.data()});
  });
  const double b = best_ms([&] {
    k.run(BatchNormBackward{g, x.data(), dy.data(), gamma.data(), mean.data(), var.data(),
                            dx.data(), dg.data(), db.data()});
  });
  const double rf = best_ms([&] { k.run(ReluForward{size, x.data(), y.data()}); });
  const double rb = best_ms([&] { k.run(ReluBackward{size, y.data(), dy.data(), dx.data()}); });
  const double acc = best_ms([&] { k.run(Accumulate{size, x.data(), y.data()}); });
  std::printf(
      "bn   %3ld %2ldx%-2ld   fwd %8.3f  bwd %8.3f | relu fwd %7.3f bwd %7.3f | accumulate %7.3f "
      "ms\n",
      c, hw, hw, f, b, rf, rb, acc);
}

void time_maxpool(cpu::CpuKernels& k, int64_t n, int64_t c, int64_t hw) {
  PoolGeom g;
  g.n = n, g.c = c, g.h = g.w = hw, g.kh = g.kw = 2, g.stride_h = g.stride_w = 2;
  auto x = random_floats(n * c * hw * hw, 6);
  auto dy = random_floats(n * c * g.out_h() * g.out_w(), 7);
  std::vector<float> y(dy.size()), dx(x.size());
  const double f = best_ms([&] { k.run(PoolForward{g, x.data(), y.data()}); });
  const double b = best_ms([&] {
    k.run(PoolBackward{g, x.data(), y.data(), dy.data(), dx.data()});
  });
  std::printf("maxpool 2x2 %3ld %2ldx%-2ld   fwd %8.3f  bwd %8.3f ms\n", c, hw, hw, f, b);
}

void time_tail(cpu::CpuKernels& k) {
  const LinearGeom g{64, 512, 10};
  auto x = random_floats(g.m * g.k, 8), w = random_floats(g.n * g.k, 9);
  auto dy = random_floats(g.m * g.n, 10), b = random_floats(g.n, 11);
  std::vector<float> y(g.m * g.n), dx(x.size()), dw(w.size()), db(g.n);
  std::vector<char> ws1, ws2, ws3;
  const double f =
      best_ms(runner(k, LinearForward{g, x.data(), w.data(), b.data(), y.data()}, ws1));
  const double d = best_ms(runner(k, LinearBackwardData{g, dy.data(), w.data(), dx.data()}, ws2));
  const double bw =
      best_ms(runner(k, LinearBackwardWeights{g, x.data(), dy.data(), dw.data(), db.data()}, ws3));
  std::printf("linear 512->10      fwd %8.3f  bwd_data %8.3f  bwd_weights %8.3f ms\n", f, d, bw);

  const int64_t n = 11'173'962;  // resnet18_cifar's parameters
  auto p = random_floats(n, 12), grad = random_floats(n, 13);
  std::vector<float> buf(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
  const double sgd = best_ms([&] {
    k.run(SgdUpdate{n, 0.1f, 0.9f, 5e-4f, false, p.data(), grad.data(), buf.data()});
  });
  const double adamw = best_ms([&] {
    k.run(AdamWUpdate{n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, p.data(), grad.data(), m.data(),
                      v.data()});
  });
  std::printf("optimizer 11.2M     sgd(momentum, wd) %8.3f  adamw %8.3f ms\n", sgd, adamw);
}

// GPT-2 block pieces at (N, T, C, heads): the attention core (dropout p in training), layer norm
// over N*T rows and GELU on the MLP's N*T*4C activations.
void time_transformer(cpu::CpuKernels& k, int64_t n, int64_t t, int64_t c, int64_t heads,
                      float dropout) {
  const AttentionGeom g{n, t, heads, c, dropout};
  auto qkv = random_floats(n * t * 3 * c, 14), dy = random_floats(n * t * c, 15);
  std::vector<float> y(n * t * c), probs(n * heads * t * t), dqkv(qkv.size());
  std::vector<uint8_t> mask(probs.size());
  std::vector<char> ws1, ws2;
  AttentionForward af;
  af.g = g, af.seed = 1, af.qkv = qkv.data(), af.y = y.data(), af.probs = probs.data();
  af.mask = mask.data();
  AttentionBackward ab;
  ab.g = g, ab.qkv = qkv.data(), ab.probs = probs.data(), ab.mask = mask.data();
  ab.dy = dy.data(), ab.dqkv = dqkv.data();
  const double f = best_ms(runner(k, af, ws1));
  const double b = best_ms(runner(k, ab, ws2));

  const LayerNormGeom lg{n * t, c, 1e-5f};
  auto x = random_floats(n * t * c, 16);
  std::vector<float> ly(x.size()), ldx(x.size()), gamma(c, 1.0f), beta(c, 0.0f), mean(n * t),
      rstd(n * t), dg(c), db(c);
  const double lf = best_ms([&] {
    k.run(LayerNormForward{lg, x.data(), gamma.data(), beta.data(), ly.data(), mean.data(),
                           rstd.data()});
  });
  const double lb = best_ms([&] {
    k.run(LayerNormBackward{lg, x.data(), dy.data(), gamma.data(), mean.data(), rstd.data(),
                            ldx.data(), dg.data(), db.data()});
  });
  const int64_t m = n * t * 4 * c;
  auto h = random_floats(m, 17), dh = random_floats(m, 18);
  std::vector<float> hy(m), hdx(m);
  const double gf = best_ms([&] { k.run(GeluForward{m, h.data(), hy.data()}); });
  const double gb = best_ms([&] { k.run(GeluBackward{m, h.data(), dh.data(), hdx.data()}); });
  std::printf(
      "gpt N=%ld T=%ld C=%ld heads=%ld   attention(p=%.1f) fwd %8.3f bwd %8.3f | layernorm fwd "
      "%7.3f bwd %7.3f | gelu(4C) fwd %7.3f bwd %7.3f ms\n",
      n, t, c, heads, dropout, f, b, lf, lb, gf, gb);
}

// The naive and the fused attention cores at (N, T, C, heads) without dropout (issue 29's
// shapes: a 6 x 384 GPT at 2048 tokens per step), forward and backward.
void time_attention_cores(cpu::CpuKernels& k, int64_t n, int64_t t, int64_t c, int64_t heads) {
  const AttentionGeom g{n, t, heads, c, 0.0f};
  auto qkv = random_floats(n * t * 3 * c, 19), dy = random_floats(n * t * c, 20);
  std::vector<float> y(n * t * c), probs(n * heads * t * t), lse(n * heads * t), dqkv(qkv.size());
  std::vector<char> ws1, ws2;
  AttentionForward af;
  af.g = g, af.qkv = qkv.data(), af.y = y.data(), af.probs = probs.data();
  AttentionBackward ab;
  ab.g = g, ab.qkv = qkv.data(), ab.probs = probs.data(), ab.dy = dy.data();
  ab.dqkv = dqkv.data();
  const double nf = best_ms(runner(k, af, ws1));
  const double nb = best_ms(runner(k, ab, ws2));
  const double ff = best_ms([&] {
    k.run(FlashAttentionForward{g, true, 1, qkv.data(), y.data(), lse.data()});
  });
  const double fb = best_ms([&] {
    k.run(FlashAttentionBackward{g, 1, qkv.data(), y.data(), lse.data(), dy.data(), dqkv.data()});
  });
  std::printf(
      "attention N=%ld T=%ld C=%ld heads=%ld   naive fwd %8.3f bwd %8.3f | fused fwd %8.3f bwd "
      "%8.3f ms | fused/naive %.2f\n",
      n, t, c, heads, nf, nb, ff, fb, (ff + fb) / (nf + nb));
}

// The CNN shapes: resnet18_cifar / vgg11_cifar at batch 64.
void time_cnn(cpu::CpuKernels& k) {
  time_conv(k, 64, 3, 32, 64, 3, 1, 1);
  time_conv(k, 64, 64, 32, 64, 3, 1, 1);
  time_conv(k, 64, 64, 32, 128, 3, 2, 1);
  time_conv(k, 64, 64, 32, 128, 1, 2, 0);
  time_conv(k, 64, 128, 16, 128, 3, 1, 1);
  time_conv(k, 64, 256, 8, 256, 3, 1, 1);
  time_conv(k, 64, 512, 4, 512, 3, 1, 1);
  time_batchnorm_relu(k, 64, 64, 32);
  time_batchnorm_relu(k, 64, 128, 16);
  time_batchnorm_relu(k, 64, 512, 4);
  time_maxpool(k, 64, 64, 32);
  time_maxpool(k, 64, 256, 8);
  time_tail(k);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  if (argc > 2) ferry::g_reps = std::atoi(argv[2]);
  ferry::g_cpu_clock = argc > 3 && std::string(argv[3]) == "cpu";
  omp_set_num_threads(threads);
  ferry::cpu::CpuKernels k(threads);
  std::printf("threads %d, best of %d, %s time\n", threads, ferry::g_reps,
              ferry::g_cpu_clock ? "process CPU" : "wall");
  const bool only_gpt = argc > 4 && std::string(argv[4]) == "gpt";
  if (!only_gpt) ferry::time_cnn(k);
  ferry::time_transformer(k, 8, 256, 384, 6, 0.0f);
  ferry::time_transformer(k, 8, 256, 384, 6, 0.1f);
  ferry::time_transformer(k, 4, 256, 768, 12, 0.0f);
  ferry::time_transformer(k, 4, 256, 768, 12, 0.1f);
  for (int64_t t : {256, 1024, 2048}) ferry::time_attention_cores(k, 2048 / t, t, 384, 6);
  return 0;
}
