// Float64 references of the Llama kernels (device/kernels_llama.h), written from Hugging Face's
// modeling_llama formulas (LlamaRMSNorm, rotate_half / apply_rotary_pos_emb, repeat_kv, LlamaMLP's
// act_fn(gate) * up) for the CPU tests and the CUDA parity tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace ferry::ref {

using Vec64 = std::vector<double>;

// y = x / sqrt(mean(x^2) + eps) * w per row of c.
inline Vec64 rms_norm_forward(const Vec64& x, const Vec64& w, int64_t rows, int64_t c, double eps) {
  Vec64 y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < c; ++i) ms += x[r * c + i] * x[r * c + i];
    const double rstd = 1.0 / std::sqrt(ms / static_cast<double>(c) + eps);
    for (int64_t i = 0; i < c; ++i) y[r * c + i] = x[r * c + i] * rstd * w[i];
  }
  return y;
}

// HF's angles: inv_freq in float32 (1 / theta^(2i/D)), then position * inv_freq in float32.
inline double rope_angle(int64_t pos, int64_t i, int64_t d, double theta) {
  const float e = static_cast<float>(2 * i) / static_cast<float>(d);
  const float inv = 1.0f / static_cast<float>(std::pow(theta, static_cast<double>(e)));
  return static_cast<double>(static_cast<float>(pos) * inv);
}

// qkv (rows, 3*H*D) from q (rows, H*D), k, v (rows, KV*D): apply_rotary_pos_emb on q and k, then
// repeat_kv on k and v. positions[r]: row r's position.
inline Vec64 rope_qkv_forward(const Vec64& q, const Vec64& k, const Vec64& v,
                              const std::vector<int64_t>& positions, int64_t heads, int64_t kv,
                              int64_t d, double theta) {
  const int64_t rows = static_cast<int64_t>(positions.size()), half = d / 2, rep = heads / kv;
  Vec64 out(static_cast<size_t>(rows * 3 * heads * d));
  auto rot = [&](const double* x, int64_t pos, double* y) {
    for (int64_t i = 0; i < d; ++i) {
      const int64_t f = i % half;
      const double a = rope_angle(pos, f, d, theta);
      const double rotated = i < half ? -x[i + half] : x[i - half];  // rotate_half
      y[i] = x[i] * std::cos(a) + rotated * std::sin(a);
    }
  };
  for (int64_t r = 0; r < rows; ++r) {
    double* o = out.data() + r * 3 * heads * d;
    for (int64_t h = 0; h < heads; ++h) {
      rot(q.data() + (r * heads + h) * d, positions[r], o + h * d);
      rot(k.data() + (r * kv + h / rep) * d, positions[r], o + heads * d + h * d);
      for (int64_t i = 0; i < d; ++i) o[2 * heads * d + h * d + i] = v[(r * kv + h / rep) * d + i];
    }
  }
  return out;
}

inline double silu(double x) { return x / (1.0 + std::exp(-x)); }

inline Vec64 swiglu_forward(const Vec64& gate, const Vec64& up) {
  Vec64 y(gate.size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = silu(gate[i]) * up[i];
  return y;
}

}  // namespace ferry::ref
