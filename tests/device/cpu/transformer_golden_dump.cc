// transformer_golden_dump DIR: runs the CPU transformer kernels on DIR/in.bin and writes
// DIR/out.bin, for transformer_golden_torch.py to compare with PyTorch. Both files are raw
// little-endian arrays in the order the script documents; no dropout (the RNGs differ).
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/cpu/cpu_kernels.h"

namespace ferry {
namespace {

std::vector<float> read_floats(std::ifstream& in, int64_t n) {
  std::vector<float> v(n);
  in.read(reinterpret_cast<char*>(v.data()), n * sizeof(float));
  if (!in) throw std::runtime_error("in.bin is short");
  return v;
}

void write(std::ofstream& out, const std::vector<float>& v) {
  out.write(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Workspace for one kernel, as the trainer sizes it.
template <typename Args>
void run_with_workspace(cpu::CpuKernels& k, Args args) {
  std::vector<char> ws(k.workspace_bytes(args));
  args.ws = Workspace{ws.data(), ws.size()};
  k.run(args);
}

int run(const std::string& dir) {
  std::ifstream in(dir + "/in.bin", std::ios::binary);
  int64_t dims[4];  // N, T, C, heads
  in.read(reinterpret_cast<char*>(dims), sizeof dims);
  const int64_t n = dims[0], t = dims[1], c = dims[2], heads = dims[3], rows = n * t;
  const auto qkv = read_floats(in, rows * 3 * c), dy = read_floats(in, rows * c);
  const auto x = read_floats(in, rows * c), gamma = read_floats(in, c), beta = read_floats(in, c);
  const auto h = read_floats(in, rows * 4 * c), dh = read_floats(in, rows * 4 * c);

  cpu::CpuKernels k(2);
  const AttentionGeom g{n, t, heads, c, 0.0f};
  std::vector<float> y(rows * c), probs(n * heads * t * t), dqkv(qkv.size());
  AttentionForward af;
  af.g = g, af.qkv = qkv.data(), af.y = y.data(), af.probs = probs.data();
  run_with_workspace(k, af);
  AttentionBackward ab;
  ab.g = g, ab.qkv = qkv.data(), ab.probs = probs.data(), ab.dy = dy.data(), ab.dqkv = dqkv.data();
  run_with_workspace(k, ab);

  const LayerNormGeom lg{rows, c, 1e-5f};
  std::vector<float> ly(rows * c), mean(rows), rstd(rows), ldx(rows * c), dg(c), db(c);
  k.run(LayerNormForward{lg, x.data(), gamma.data(), beta.data(), ly.data(), mean.data(),
                         rstd.data()});
  k.run(LayerNormBackward{lg, x.data(), dy.data(), gamma.data(), mean.data(), rstd.data(),
                          ldx.data(), dg.data(), db.data()});

  std::vector<float> gy(h.size()), gdx(h.size());
  k.run(GeluForward{static_cast<int64_t>(h.size()), h.data(), gy.data()});
  k.run(GeluBackward{static_cast<int64_t>(h.size()), h.data(), dh.data(), gdx.data()});

  std::ofstream out(dir + "/out.bin", std::ios::binary);
  for (const auto* v : {&y, &probs, &dqkv, &ly, &mean, &rstd, &ldx, &dg, &db, &gy, &gdx}) {
    write(out, *v);
  }
  return out ? 0 : 1;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: transformer_golden_dump DIR\n");
    return 2;
  }
  try {
    return ferry::run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transformer_golden_dump: %s\n", e.what());
    return 1;
  }
}
