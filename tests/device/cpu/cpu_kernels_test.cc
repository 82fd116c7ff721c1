// The CpuKernels interface: supports(), workspace sizing for every kind, launching on a device's
// compute stream (same bits as run()), concurrent planning while the worker runs, errors that
// poison the stream, and loop kernels whose bits do not depend on threads or alignment.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <utility>

#include "common/error.h"
#include "device/cpu/cpu_device.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using test::random_floats;

template <size_t... I>
void for_each_kind(std::index_sequence<I...>, const auto& f) {
  (f(std::integral_constant<size_t, I>{}), ...);
}

TEST(CpuKernelsApi, SupportsEveryKernelOnF32Only) {
  cpu::CpuKernels kernels(1);
  for (KernelKind kind = 0; kind < std::variant_size_v<KernelArgs>; ++kind) {
    EXPECT_TRUE(kernels.supports(kind, DType::kF32)) << kernel_name(kind);
    EXPECT_FALSE(kernels.supports(kind, DType::kF64)) << kernel_name(kind);
    EXPECT_FALSE(kernels.supports(kind, DType::kU8)) << kernel_name(kind);
  }
  EXPECT_FALSE(kernels.supports(std::variant_size_v<KernelArgs>, DType::kF32));
}

// Kernels without a Workspace member need none; sizing never needs the pointers.
TEST(CpuKernelsApi, OnlyKernelsWithAWorkspaceAskForOne) {
  cpu::CpuKernels kernels(1);
  for_each_kind(std::make_index_sequence<std::variant_size_v<KernelArgs>>{}, [&](auto index) {
    using Args = std::variant_alternative_t<decltype(index)::value, KernelArgs>;
    Args args{};
    if constexpr (!requires { args.ws; }) {
      EXPECT_EQ(kernels.workspace_bytes(args), 0u) << kernel_name(index);
    }
  });
  ConvGeom g;
  g.n = 8, g.c = 32, g.h = g.w = 16, g.k = 32, g.r = g.s = 3, g.pad_h = g.pad_w = 1;
  const uint64_t conv = kernels.workspace_bytes(ConvForward{g});
  // Staging x and y in oneDNN's blocked layout needs at least their size unless it runs plain.
  if (conv > 0) {
    EXPECT_GE(conv, sizeof(float) * (8 * 32 * 16 * 16));
  }
  EXPECT_EQ(kernels.workspace_bytes(ConvForward{g}), conv);  // cached: same answer
}

class CpuDeviceKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceOptions options;
    options.memory = 256ull << 20;
    options.cpu.threads = test::kThreads;
    device_ = std::make_unique<cpu::CpuDevice>(options);
  }
  // A device allocation holding `values`.
  DeviceBuffer upload(const std::vector<float>& values, const std::string& label) {
    DeviceBuffer buf(device_->memory(), values.size() * sizeof(float), label);
    std::memcpy(buf.data(), values.data(), values.size() * sizeof(float));
    return buf;
  }
  std::vector<float> download(const DeviceBuffer& buf, size_t n) {
    std::vector<float> v(n);
    std::memcpy(v.data(), buf.data(), n * sizeof(float));
    return v;
  }
  std::unique_ptr<cpu::CpuDevice> device_;
};

// A training-step fragment launched on the compute stream gives exactly the bits of run() on
// the calling thread with the same thread count.
TEST_F(CpuDeviceKernels, LaunchOnTheComputeStreamEqualsRun) {
  ConvGeom g;
  g.n = 4, g.c = 8, g.h = 9, g.w = 13, g.k = 16, g.r = g.s = 3, g.stride_h = g.stride_w = 2;
  g.pad_h = g.pad_w = 1;
  const int64_t y_n = g.n * g.k * g.out_h() * g.out_w();
  const auto x = random_floats(g.n * g.c * g.h * g.w, 1), w = random_floats(g.k * g.c * 9, 2);
  const auto b = random_floats(g.k, 3);
  const BatchNormGeom bg{g.n, g.k, g.out_h() * g.out_w(), 1e-5f};
  const std::vector<float> ones(g.k, 1.0f), zeros(g.k, 0.0f);

  Kernels& kernels = device_->kernels();
  DeviceBuffer dx = upload(x, "x"), dw = upload(w, "w"), db = upload(b, "b");
  DeviceBuffer dgamma = upload(ones, "gamma"), dbeta = upload(zeros, "beta");
  DeviceBuffer dy(device_->memory(), y_n * 4, "y"), dz(device_->memory(), y_n * 4, "z");
  DeviceBuffer mean(device_->memory(), g.k * 4, "mean"), var(device_->memory(), g.k * 4, "var");
  ConvForward conv{g, dx.as<float>(), dw.as<float>(), db.as<float>(), dy.as<float>()};
  DeviceBuffer ws(device_->memory(), std::max<uint64_t>(kernels.workspace_bytes(conv), 1), "ws");
  conv.ws = Workspace{ws.data(), kernels.workspace_bytes(conv)};
  BatchNormForwardTraining bn{
      bg,      0.1f,    dy.as<float>(),   dgamma.as<float>(), dbeta.as<float>(), dz.as<float>(),
      nullptr, nullptr, mean.as<float>(), var.as<float>()};
  ReluForward relu{y_n, dz.as<float>(), dz.as<float>()};
  Stream& compute = device_->stream(StreamKind::kCompute);
  kernels.launch(conv, compute);
  kernels.launch(bn, compute);
  kernels.launch(relu, compute);
  auto done = device_->create_event();
  compute.record(*done);
  done->synchronize();
  const std::vector<float> launched = download(dz, y_n);

  test::KernelRunner runner;
  std::vector<float> y(y_n), z(y_n), m(g.k), v(g.k);
  runner.run(ConvForward{g, x.data(), w.data(), b.data(), y.data()});
  runner.run(BatchNormForwardTraining{bg, 0.1f, y.data(), ones.data(), zeros.data(), z.data(),
                                      nullptr, nullptr, m.data(), v.data()});
  runner.run(ReluForward{y_n, z.data(), z.data()});
  EXPECT_TRUE(test::bitwise_equal(launched, z));
}

// The host thread plans (workspace_bytes creates primitives) and runs kernels itself while the
// compute worker runs launched ones: every result is still right.
TEST_F(CpuDeviceKernels, PlanningWhileTheWorkerRunsIsSafe) {
  Kernels& kernels = device_->kernels();
  Stream& compute = device_->stream(StreamKind::kCompute);
  ConvGeom g;
  g.n = 2, g.c = 8, g.h = g.w = 10, g.k = 8, g.r = g.s = 3, g.pad_h = g.pad_w = 1;
  const auto x = random_floats(g.n * g.c * g.h * g.w, 5), w = random_floats(g.k * g.c * 9, 6);
  const ref::Vec y_ref = ref::conv_forward(g, test::to_f64(x), test::to_f64(w), nullptr);
  constexpr int kLaunches = 20;
  DeviceBuffer dx = upload(x, "x"), dw = upload(w, "w");
  std::vector<DeviceBuffer> outs;
  ConvForward conv{g, dx.as<float>(), dw.as<float>(), nullptr, nullptr};
  const uint64_t bytes = kernels.workspace_bytes(conv);
  std::vector<DeviceBuffer> workspaces;
  for (int i = 0; i < kLaunches; ++i) {
    outs.emplace_back(device_->memory(), y_ref.size() * 4, "y");
    workspaces.emplace_back(device_->memory(), std::max<uint64_t>(bytes, 1), "ws");
    conv.y = outs.back().as<float>();
    conv.ws = Workspace{workspaces.back().data(), bytes};
    kernels.launch(conv, compute);
  }
  // Meanwhile: new geometries planned and run here.
  for (int64_t k = 1; k <= 6; ++k) {
    ConvGeom h = g;
    h.k = k;
    h.stride_h = 1 + k % 2;
    const auto wk = random_floats(k * g.c * 9, 10 + k);
    std::vector<float> y(h.n * h.k * h.out_h() * h.out_w());
    ConvForward local{h, x.data(), wk.data(), nullptr, y.data()};
    std::vector<std::byte> ws(device_->kernels().workspace_bytes(local));
    local.ws = Workspace{ws.data(), ws.size()};
    static_cast<cpu::CpuKernels&>(kernels).run(local);
    EXPECT_TRUE(test::all_close(y, ref::conv_forward(h, test::to_f64(x), test::to_f64(wk), nullptr),
                                1e-4, 1e-4));
  }
  compute.synchronize();
  for (const auto& out : outs) {
    EXPECT_TRUE(test::all_close(download(out, y_ref.size()), y_ref, 1e-4, 1e-4));
  }
}

// A kernel that fails on the worker poisons the compute stream: later kernels are skipped and
// synchronize() rethrows the kernel's typed error.
TEST_F(CpuDeviceKernels, AFailingKernelPoisonsTheStream) {
  Kernels& kernels = device_->kernels();
  Stream& compute = device_->stream(StreamKind::kCompute);
  const std::vector<float> logits(6, 0.0f);
  const std::vector<int32_t> labels = {0, 7};  // 7 is not one of 3 classes
  std::vector<float> loss(1), probs(6), filled(4, 0.0f);
  kernels.launch(SoftmaxCrossEntropyForward{2, 3, logits.data(), labels.data(), loss.data(),
                                            probs.data(), nullptr},
                 compute);
  kernels.launch(Fill{4, 1.0f, filled.data()}, compute);
  EXPECT_THROW(compute.synchronize(), DataError);
  EXPECT_EQ(filled, std::vector<float>(4, 0.0f)) << "a kernel ran after the failure";
}

TEST(CpuKernelsApi, LaunchOnAForeignStreamIsRefused) {
  struct OtherStream : Stream {
    StreamKind kind() const override { return StreamKind::kCompute; }
    void record(Event&) override {}
    void wait(Event&) override {}
    void synchronize() override {}
  } other;
  cpu::CpuKernels kernels(1);
  std::vector<float> y(4);
  EXPECT_THROW(kernels.launch(Fill{4, 1.0f, y.data()}, other), UnsupportedError);
}

// The loop kernels (batch norm, pooling backward, adaptive pooling, loss, optimizers, bias
// sums) give the same bits with 1 or 2 threads and with buffers at another alignment: an offload
// plan that moves tensors to other addresses cannot change the loss trajectory.
TEST(CpuKernelsApi, LoopKernelsDoNotDependOnThreadsOrAlignment) {
  const BatchNormGeom bg{8, 16, 15 * 17, 1e-5f};  // > 32k elements: the parallel path
  const int64_t n = bg.n * bg.c * bg.hw;
  const PoolGeom pg{PoolKind::kMax, 8, 16, 15, 17, 3, 3, 2, 2, 1, 1, true, true};
  const int64_t pn = pg.n * pg.c * pg.out_h() * pg.out_w();

  // Runs everything with inputs and outputs placed `shift` floats into their buffers.
  auto run_all = [&](int threads, size_t shift) {
    test::KernelRunner k(threads);
    auto place = [&](std::vector<float> v) {
      v.insert(v.begin(), shift, 0.0f);
      return v;
    };
    std::vector<float> x = place(random_floats(n, 1)), dy = place(random_floats(n, 2));
    std::vector<float> gamma = place(random_floats(bg.c, 3)), beta = place(random_floats(bg.c, 4));
    std::vector<float> y = place(std::vector<float>(n)), dx = place(std::vector<float>(n));
    std::vector<float> mean = place(std::vector<float>(bg.c)), var = mean, dg = mean, dbt = mean;
    std::vector<float> rm = place(std::vector<float>(bg.c, 0.0f)),
                       rv = place(std::vector<float>(bg.c, 1.0f));
    k.run(BatchNormForwardTraining{bg, 0.1f, x.data() + shift, gamma.data() + shift,
                                   beta.data() + shift, y.data() + shift, rm.data() + shift,
                                   rv.data() + shift, mean.data() + shift, var.data() + shift});
    k.run(BatchNormBackward{bg, x.data() + shift, dy.data() + shift, gamma.data() + shift,
                            mean.data() + shift, var.data() + shift, dx.data() + shift,
                            dg.data() + shift, dbt.data() + shift});
    std::vector<float> py = place(std::vector<float>(pn)), pdy = place(random_floats(pn, 5));
    std::vector<float> pdx = place(std::vector<float>(n));
    k.run(PoolForward{pg, x.data() + shift, py.data() + shift});
    k.run(PoolBackward{pg, x.data() + shift, py.data() + shift, pdy.data() + shift,
                       pdx.data() + shift});
    std::vector<float> ay = place(std::vector<float>(bg.n * bg.c * 4 * 3));
    std::vector<float> adx = place(std::vector<float>(n));
    k.run(AdaptiveAvgPoolForward{bg.n, bg.c, 15, 17, 4, 3, x.data() + shift, ay.data() + shift});
    k.run(AdaptiveAvgPoolBackward{bg.n, bg.c, 15, 17, 4, 3, ay.data() + shift, adx.data() + shift});
    const LinearGeom lg{300, 40, 250};
    std::vector<float> lx = place(random_floats(lg.m * lg.k, 6));
    std::vector<float> ldy = place(random_floats(lg.m * lg.n, 7));
    std::vector<float> ldw = place(std::vector<float>(lg.n * lg.k)),
                       ldb = place(std::vector<float>(lg.n));
    k.run(LinearBackwardWeights{lg, lx.data() + shift, ldy.data() + shift, ldw.data() + shift,
                                ldb.data() + shift});
    std::vector<float> p = place(random_floats(n, 8)), m = place(std::vector<float>(n));
    std::vector<float> v = place(std::vector<float>(n)), buf = place(std::vector<float>(n));
    k.run(AdamWUpdate{n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3, p.data() + shift, dy.data() + shift,
                      m.data() + shift, v.data() + shift});
    k.run(SgdUpdate{n, 0.1f, 0.9f, 1e-4f, true, p.data() + shift, dx.data() + shift,
                    buf.data() + shift});
    std::vector<float> logits = place(random_floats(1000 * 37, 9)),
                       probs = place(std::vector<float>(1000 * 37));
    std::vector<int32_t> labels(1000);
    for (int i = 0; i < 1000; ++i) labels[i] = (i * 7) % 37;
    std::vector<float> loss(1);
    k.run(SoftmaxCrossEntropyForward{1000, 37, logits.data() + shift, labels.data(), loss.data(),
                                     probs.data() + shift, nullptr});
    std::vector<std::vector<float>> outs = {y,  dx,  dg,  dbt, mean, var, rm,  rv,    py,  pdx,
                                            ay, adx, ldb, p,   m,    v,   buf, probs, loss};
    for (size_t i = 0; i + 1 < outs.size(); ++i) {
      outs[i].erase(outs[i].begin(), outs[i].begin() + shift);
    }
    return outs;
  };
  const auto base = run_all(2, 0);
  for (auto [threads, shift] :
       {std::pair{1, size_t{0}}, std::pair{2, size_t{1}}, std::pair{1, size_t{3}}}) {
    const auto other = run_all(threads, shift);
    for (size_t i = 0; i < base.size(); ++i) {
      EXPECT_TRUE(test::bitwise_equal(base[i], other[i]))
          << "output " << i << " with " << threads << " threads, shift " << shift;
    }
  }
}

// The oneDNN kernels too: tensors and workspace at other addresses give the same bits.
TEST(CpuKernelsApi, OneDnnKernelsDoNotDependOnAlignment) {
  ConvGeom g;
  g.n = 4, g.c = 16, g.h = g.w = 12, g.k = 32, g.r = g.s = 3, g.pad_h = g.pad_w = 1;
  const LinearGeom lg{64, 200, 30};
  auto run_all = [&](size_t shift) {
    test::KernelRunner k;
    auto place = [&](std::vector<float> v) {
      v.insert(v.begin(), shift, 0.0f);
      return v;
    };
    const int64_t yn = g.n * g.k * g.out_h() * g.out_w();
    auto x = place(random_floats(g.n * g.c * g.h * g.w, 1)),
         w = place(random_floats(g.k * g.c * 9, 2));
    auto b = place(random_floats(g.k, 3)), dy = place(random_floats(yn, 4));
    auto y = place(std::vector<float>(yn)), dx = place(std::vector<float>(x.size() - shift));
    auto dw = place(std::vector<float>(w.size() - shift)), db = place(std::vector<float>(g.k));
    const size_t s = shift;
    k.run(ConvForward{g, x.data() + s, w.data() + s, b.data() + s, y.data() + s});
    k.run(ConvBackwardData{g, dy.data() + s, w.data() + s, dx.data() + s});
    k.run(ConvBackwardWeights{g, x.data() + s, dy.data() + s, dw.data() + s, db.data() + s});
    auto lx = place(random_floats(lg.m * lg.k, 5)), lw = place(random_floats(lg.n * lg.k, 6));
    auto ldy = place(random_floats(lg.m * lg.n, 7)), ly = place(std::vector<float>(lg.m * lg.n));
    auto ldx = place(std::vector<float>(lg.m * lg.k)), ldw = place(std::vector<float>(lg.n * lg.k));
    k.run(LinearForward{lg, lx.data() + s, lw.data() + s, nullptr, ly.data() + s});
    k.run(LinearBackwardData{lg, ldy.data() + s, lw.data() + s, ldx.data() + s});
    k.run(LinearBackwardWeights{lg, lx.data() + s, ldy.data() + s, ldw.data() + s, nullptr});
    auto relu = place(std::vector<float>(yn));
    k.run(ReluForward{yn, y.data() + s, relu.data() + s});
    std::vector<std::vector<float>> outs = {y, dx, dw, db, ly, ldx, ldw, relu};
    for (auto& o : outs) o.erase(o.begin(), o.begin() + shift);
    return outs;
  };
  const auto base = run_all(0);
  for (size_t shift : {1, 5}) {
    const auto other = run_all(shift);
    for (size_t i = 0; i < base.size(); ++i) {
      EXPECT_TRUE(test::bitwise_equal(base[i], other[i])) << "output " << i << ", shift " << shift;
    }
  }
}

}  // namespace
}  // namespace ferry
