// bench_bf16_kernel_timing: fp32 against bf16 storage for the CPU backend's matmul-bound kernels
// (linear on GPT shapes, convolution on resnet18_cifar's layers at batch 64), forward and both
// backward passes, best of several runs after a warm-up. Prints only; asserts nothing.
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
// Usage: bench_bf16_kernel_timing [threads=2] [reps=10] [linear|conv|all] [cpu|wall]
//                                 [auto|native|widened]
// With "cpu", times are the process's CPU time instead of wall time: with 1 thread on a busy
// machine that is the kernel's own work, unaffected by time slicing. The last argument picks how
// bf16 products run (cpu::Bf16Products; Note [bf16 products in fp32] in device/cpu).
// Each line gives one kernel's fp32 and bf16 wall times (ms) and bf16/fp32; below 1 is bf16
// faster. The weights are the same buffer on every run, as they are between two updates of a
// training step, so a kernel that keeps a converted copy of its weights per weight version
// (Note [Cached bf16 weights] in device/cpu) pays the conversion once, in the warm-up. The
// "+update" column times the forward when the weights are rewritten before every run (the
// first use after an update), the rewrite itself not counted. The machine's load is printed
// before and after: on a shared machine the ratios are the figures to read, not the times.

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
  ws.resize(k.workspace_bytes(args));
  args.ws = Workspace{ws.data(), ws.size()};
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

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  if (argc > 2) ferry::g_reps = std::atoi(argv[2]);
  const std::string which = argc > 3 ? argv[3] : "all";
  ferry::g_cpu_clock = argc > 4 && std::string(argv[4]) == "cpu";
  omp_set_num_threads(threads);
  const std::string products = argc > 5 ? argv[5] : "auto";
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
  if (which != "conv") ferry::linears(k);
  if (which != "linear") ferry::convs(k);
  std::printf("load %s\n", ferry::loadavg().c_str());
  return 0;
}
