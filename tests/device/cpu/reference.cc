// Float64 reference kernels: direct loops over the definitions, no blocking, no shortcuts.
#include "tests/device/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ferry::ref {

// ---- convolution ----------------------------------------------------------------------------

namespace {

// Calls f(n, k, oh, ow, c, r, s, x_index, w_index) for every term of the convolution sum whose
// input position lies inside the image (padding contributes zero).
template <typename F>
void for_each_conv_term(const ConvGeom& g, F f) {
  const int64_t oh_n = g.out_h(), ow_n = g.out_w();
  const int64_t cg = g.c / g.groups, kg = g.k / g.groups;
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t k = 0; k < g.k; ++k) {
      const int64_t group = k / kg;
      for (int64_t oh = 0; oh < oh_n; ++oh) {
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          for (int64_t ci = 0; ci < cg; ++ci) {
            const int64_t c = group * cg + ci;
            for (int64_t r = 0; r < g.r; ++r) {
              const int64_t ih = oh * g.stride_h - g.pad_h + r;
              if (ih < 0 || ih >= g.h) continue;
              for (int64_t s = 0; s < g.s; ++s) {
                const int64_t iw = ow * g.stride_w - g.pad_w + s;
                if (iw < 0 || iw >= g.w) continue;
                const int64_t y_index = ((n * g.k + k) * oh_n + oh) * ow_n + ow;
                const int64_t x_index = ((n * g.c + c) * g.h + ih) * g.w + iw;
                const int64_t w_index = ((k * cg + ci) * g.r + r) * g.s + s;
                f(y_index, x_index, w_index);
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

Vec conv_forward(const ConvGeom& g, const Vec& x, const Vec& w, const Vec* bias) {
  const int64_t plane = g.out_h() * g.out_w();
  Vec y(g.n * g.k * plane, 0.0);
  if (bias) {
    for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i) y[i] = (*bias)[(i / plane) % g.k];
  }
  for_each_conv_term(g, [&](int64_t yi, int64_t xi, int64_t wi) { y[yi] += x[xi] * w[wi]; });
  return y;
}

Vec conv_backward_data(const ConvGeom& g, const Vec& dy, const Vec& w) {
  Vec dx(g.n * g.c * g.h * g.w, 0.0);
  for_each_conv_term(g, [&](int64_t yi, int64_t xi, int64_t wi) { dx[xi] += dy[yi] * w[wi]; });
  return dx;
}

Vec conv_backward_weights(const ConvGeom& g, const Vec& x, const Vec& dy, Vec* dbias) {
  Vec dw(g.k * (g.c / g.groups) * g.r * g.s, 0.0);
  for_each_conv_term(g, [&](int64_t yi, int64_t xi, int64_t wi) { dw[wi] += dy[yi] * x[xi]; });
  if (dbias) {
    const int64_t plane = g.out_h() * g.out_w();
    dbias->assign(g.k, 0.0);
    for (int64_t i = 0; i < static_cast<int64_t>(dy.size()); ++i) {
      (*dbias)[(i / plane) % g.k] += dy[i];
    }
  }
  return dw;
}

// ---- linear ---------------------------------------------------------------------------------

Vec linear_forward(const LinearGeom& g, const Vec& x, const Vec& w, const Vec* bias) {
  Vec y(g.m * g.n);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double acc = bias ? (*bias)[j] : 0.0;
      for (int64_t l = 0; l < g.k; ++l) acc += x[i * g.k + l] * w[j * g.k + l];
      y[i * g.n + j] = acc;
    }
  }
  return y;
}

Vec linear_backward_data(const LinearGeom& g, const Vec& dy, const Vec& w) {
  Vec dx(g.m * g.k, 0.0);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      for (int64_t l = 0; l < g.k; ++l) dx[i * g.k + l] += dy[i * g.n + j] * w[j * g.k + l];
    }
  }
  return dx;
}

Vec linear_backward_weights(const LinearGeom& g, const Vec& x, const Vec& dy, Vec* dbias) {
  Vec dw(g.n * g.k, 0.0);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      for (int64_t l = 0; l < g.k; ++l) dw[j * g.k + l] += dy[i * g.n + j] * x[i * g.k + l];
    }
  }
  if (dbias) {
    dbias->assign(g.n, 0.0);
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) (*dbias)[j] += dy[i * g.n + j];
    }
  }
  return dw;
}

// ---- pooling ----------------------------------------------------------------------------------

namespace {

// PyTorch's window along one axis: [lo, hi) inside the input; `span` the part inside the padded
// input (the include-pad divisor).
struct Range {
  int64_t lo, hi, span;
};

Range pool_range(int64_t o, int64_t in, int64_t k, int64_t s, int64_t p) {
  const int64_t start = o * s - p;
  const int64_t end_padded = std::min(start + k, in + p);
  return {std::max<int64_t>(start, 0), std::min(start + k, in), end_padded - start};
}

}  // namespace

Vec pool_forward(const PoolGeom& g, const Vec& x) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  Vec y(g.n * g.c * oh * ow);
  for (int64_t p = 0; p < g.n * g.c; ++p) {
    for (int64_t i = 0; i < oh; ++i) {
      const Range rh = pool_range(i, g.h, g.kh, g.stride_h, g.pad_h);
      for (int64_t j = 0; j < ow; ++j) {
        const Range rw = pool_range(j, g.w, g.kw, g.stride_w, g.pad_w);
        // Max as PyTorch scans: replace on strictly greater or NaN (a NaN propagates).
        double best = -std::numeric_limits<double>::infinity(), sum = 0.0;
        for (int64_t a = rh.lo; a < rh.hi; ++a) {
          for (int64_t b = rw.lo; b < rw.hi; ++b) {
            const double v = x[(p * g.h + a) * g.w + b];
            if (v > best || std::isnan(v)) best = v;
            sum += v;
          }
        }
        const double divisor = g.count_include_pad
                                   ? static_cast<double>(rh.span * rw.span)
                                   : static_cast<double>((rh.hi - rh.lo) * (rw.hi - rw.lo));
        y[(p * oh + i) * ow + j] = g.kind == PoolKind::kMax ? best : sum / divisor;
      }
    }
  }
  return y;
}

Vec pool_backward(const PoolGeom& g, const Vec& x, const Vec& dy) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  Vec dx(g.n * g.c * g.h * g.w, 0.0);
  for (int64_t p = 0; p < g.n * g.c; ++p) {
    for (int64_t i = 0; i < oh; ++i) {
      const Range rh = pool_range(i, g.h, g.kh, g.stride_h, g.pad_h);
      for (int64_t j = 0; j < ow; ++j) {
        const Range rw = pool_range(j, g.w, g.kw, g.stride_w, g.pad_w);
        const double grad = dy[(p * oh + i) * ow + j];
        if (g.kind == PoolKind::kMax) {
          // PyTorch's scan: start at the first element with -inf; replace on strictly greater
          // (so the first maximum stays) or on NaN (so the last NaN wins).
          int64_t arg = (p * g.h + rh.lo) * g.w + rw.lo;
          double best = -std::numeric_limits<double>::infinity();
          for (int64_t a = rh.lo; a < rh.hi; ++a) {
            for (int64_t b = rw.lo; b < rw.hi; ++b) {
              const int64_t idx = (p * g.h + a) * g.w + b;
              if (x[idx] > best || std::isnan(x[idx])) {
                best = x[idx];
                arg = idx;
              }
            }
          }
          dx[arg] += grad;
        } else {
          const double divisor = g.count_include_pad
                                     ? static_cast<double>(rh.span * rw.span)
                                     : static_cast<double>((rh.hi - rh.lo) * (rw.hi - rw.lo));
          for (int64_t a = rh.lo; a < rh.hi; ++a) {
            for (int64_t b = rw.lo; b < rw.hi; ++b) dx[(p * g.h + a) * g.w + b] += grad / divisor;
          }
        }
      }
    }
  }
  return dx;
}

namespace {
int64_t cell_lo(int64_t o, int64_t in, int64_t out) {
  return static_cast<int64_t>(std::floor(static_cast<double>(o * in) / static_cast<double>(out)));
}
int64_t cell_hi(int64_t o, int64_t in, int64_t out) {
  return static_cast<int64_t>(
      std::ceil(static_cast<double>((o + 1) * in) / static_cast<double>(out)));
}
}  // namespace

Vec adaptive_avg_pool_forward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
                              const Vec& x) {
  Vec y(n * c * oh * ow);
  for (int64_t p = 0; p < n * c; ++p) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        double sum = 0.0;
        const int64_t h0 = cell_lo(i, h, oh), h1 = cell_hi(i, h, oh);
        const int64_t w0 = cell_lo(j, w, ow), w1 = cell_hi(j, w, ow);
        for (int64_t a = h0; a < h1; ++a) {
          for (int64_t b = w0; b < w1; ++b) sum += x[(p * h + a) * w + b];
        }
        y[(p * oh + i) * ow + j] = sum / static_cast<double>((h1 - h0) * (w1 - w0));
      }
    }
  }
  return y;
}

Vec adaptive_avg_pool_backward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
                               const Vec& dy) {
  Vec dx(n * c * h * w, 0.0);
  for (int64_t p = 0; p < n * c; ++p) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t h0 = cell_lo(i, h, oh), h1 = cell_hi(i, h, oh);
        const int64_t w0 = cell_lo(j, w, ow), w1 = cell_hi(j, w, ow);
        const double grad = dy[(p * oh + i) * ow + j] / static_cast<double>((h1 - h0) * (w1 - w0));
        for (int64_t a = h0; a < h1; ++a) {
          for (int64_t b = w0; b < w1; ++b) dx[(p * h + a) * w + b] += grad;
        }
      }
    }
  }
  return dx;
}

// ---- batch norm ---------------------------------------------------------------------------------

BatchNormResult batch_norm_train(const BatchNormGeom& g, const Vec& x, const Vec& gamma,
                                 const Vec& beta) {
  BatchNormResult r;
  r.y.resize(x.size());
  r.mean.assign(g.c, 0.0);
  r.var.assign(g.c, 0.0);
  const double count = static_cast<double>(g.n * g.hw);
  for (int64_t c = 0; c < g.c; ++c) {
    double sum = 0.0;
    for (int64_t n = 0; n < g.n; ++n) {
      for (int64_t i = 0; i < g.hw; ++i) sum += x[(n * g.c + c) * g.hw + i];
    }
    const double mean = sum / count;
    double sq = 0.0;
    for (int64_t n = 0; n < g.n; ++n) {
      for (int64_t i = 0; i < g.hw; ++i) {
        const double d = x[(n * g.c + c) * g.hw + i] - mean;
        sq += d * d;
      }
    }
    r.mean[c] = mean;
    r.var[c] = sq / count;
  }
  r.y = batch_norm_infer(g, x, gamma, beta, r.mean, r.var);
  return r;
}

Vec batch_norm_infer(const BatchNormGeom& g, const Vec& x, const Vec& gamma, const Vec& beta,
                     const Vec& mean, const Vec& var) {
  Vec y(x.size());
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t c = 0; c < g.c; ++c) {
      for (int64_t i = 0; i < g.hw; ++i) {
        const int64_t idx = (n * g.c + c) * g.hw + i;
        y[idx] = (x[idx] - mean[c]) / std::sqrt(var[c] + static_cast<double>(g.eps)) * gamma[c] +
                 beta[c];
      }
    }
  }
  return y;
}

BatchNormGrads batch_norm_backward(const BatchNormGeom& g, const Vec& x, const Vec& dy,
                                   const Vec& gamma) {
  // The textbook chain rule through mean and variance, per channel.
  const BatchNormResult fwd = batch_norm_train(g, x, Vec(g.c, 1.0), Vec(g.c, 0.0));  // y = xhat
  BatchNormGrads r;
  r.dx.resize(x.size());
  r.dgamma.assign(g.c, 0.0);
  r.dbeta.assign(g.c, 0.0);
  const double m = static_cast<double>(g.n * g.hw);
  for (int64_t c = 0; c < g.c; ++c) {
    const double invstd = 1.0 / std::sqrt(fwd.var[c] + static_cast<double>(g.eps));
    double dxhat_sum = 0.0, dxhat_xhat_sum = 0.0;
    for (int64_t n = 0; n < g.n; ++n) {
      for (int64_t i = 0; i < g.hw; ++i) {
        const int64_t idx = (n * g.c + c) * g.hw + i;
        r.dbeta[c] += dy[idx];
        r.dgamma[c] += dy[idx] * fwd.y[idx];
        dxhat_sum += dy[idx] * gamma[c];
        dxhat_xhat_sum += dy[idx] * gamma[c] * fwd.y[idx];
      }
    }
    for (int64_t n = 0; n < g.n; ++n) {
      for (int64_t i = 0; i < g.hw; ++i) {
        const int64_t idx = (n * g.c + c) * g.hw + i;
        const double dxhat = dy[idx] * gamma[c];
        r.dx[idx] = invstd / m * (m * dxhat - dxhat_sum - fwd.y[idx] * dxhat_xhat_sum);
      }
    }
  }
  return r;
}

// ---- loss
// ------------------------------------------------------------------------------------------

SoftmaxCeResult softmax_ce(int64_t n, int64_t k, const Vec& logits,
                           const std::vector<int32_t>& labels) {
  SoftmaxCeResult r;
  r.probs.resize(n * k);
  for (int64_t i = 0; i < n; ++i) {
    const double* z = logits.data() + i * k;
    double max = z[0];
    int64_t argmax = 0;
    for (int64_t j = 1; j < k; ++j) {
      if (z[j] > max) {
        max = z[j];
        argmax = j;
      }
    }
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += std::exp(z[j] - max);
    for (int64_t j = 0; j < k; ++j) r.probs[i * k + j] = std::exp(z[j] - max) / sum;
    r.loss += -std::log(r.probs[i * k + labels[i]]);
    r.correct += argmax == labels[i] ? 1 : 0;
  }
  r.loss /= static_cast<double>(n);
  return r;
}

// ---- optimizers
// -------------------------------------------------------------------------------------

void sgd_step(Vec& p, const Vec& grad, Vec& buf, double lr, double momentum, double wd,
              bool nesterov, bool first_step) {
  for (size_t i = 0; i < p.size(); ++i) {
    double d = grad[i];
    if (wd != 0.0) d += wd * p[i];
    if (momentum != 0.0) {
      buf[i] = first_step ? d : momentum * buf[i] + d;
      d = nesterov ? d + momentum * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

void adamw_step(Vec& p, const Vec& grad, Vec& m, Vec& v, double lr, double b1, double b2,
                double eps, double wd, int64_t step) {
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] *= 1.0 - lr * wd;
    m[i] = b1 * m[i] + (1.0 - b1) * grad[i];
    v[i] = b2 * v[i] + (1.0 - b2) * grad[i] * grad[i];
    const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
    p[i] -= lr / bc1 * m[i] / denom;
  }
}

// ---- transformers ---------------------------------------------------------------------------

namespace {

// Token (b, p)'s first key and its position's offset: its segment start, or 0.
int64_t segment_start(const std::vector<int32_t>* segments, int64_t b, int64_t t, int64_t p) {
  return segments ? (*segments)[static_cast<size_t>(b * t + p)] : 0;
}

}  // namespace

Vec embedding_forward(int64_t n, int64_t t, int64_t c, const std::vector<int32_t>& tokens,
                      const Vec& wte, const Vec& wpe, const std::vector<int32_t>* segments) {
  Vec y(n * t * c);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t p = 0; p < t; ++p) {
      const int64_t tok = tokens[b * t + p];
      const int64_t pos = p - segment_start(segments, b, t, p);
      for (int64_t j = 0; j < c; ++j) y[(b * t + p) * c + j] = wte[tok * c + j] + wpe[pos * c + j];
    }
  }
  return y;
}

EmbeddingGrads embedding_backward(int64_t n, int64_t t, int64_t c, int64_t vocab, int64_t context,
                                  const std::vector<int32_t>& tokens, const Vec& dy,
                                  const std::vector<int32_t>* segments) {
  EmbeddingGrads gr{Vec(vocab * c, 0.0), Vec(context * c, 0.0)};
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t p = 0; p < t; ++p) {
      const int64_t tok = tokens[b * t + p];
      const int64_t pos = p - segment_start(segments, b, t, p);
      for (int64_t j = 0; j < c; ++j) {
        gr.dwte[tok * c + j] += dy[(b * t + p) * c + j];
        gr.dwpe[pos * c + j] += dy[(b * t + p) * c + j];
      }
    }
  }
  return gr;
}

LayerNormResult layer_norm_forward(const LayerNormGeom& g, const Vec& x, const Vec& gamma,
                                   const Vec& beta) {
  LayerNormResult r{Vec(g.rows * g.c), Vec(g.rows), Vec(g.rows)};
  for (int64_t i = 0; i < g.rows; ++i) {
    const double* row = x.data() + i * g.c;
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < g.c; ++j) mean += row[j];
    mean /= g.c;
    for (int64_t j = 0; j < g.c; ++j) var += (row[j] - mean) * (row[j] - mean);
    var /= g.c;
    const double rstd = 1.0 / std::sqrt(var + g.eps);
    for (int64_t j = 0; j < g.c; ++j) {
      r.y[i * g.c + j] = (row[j] - mean) * rstd * gamma[j] + beta[j];
    }
    r.mean[i] = mean;
    r.rstd[i] = rstd;
  }
  return r;
}

LayerNormGrads layer_norm_backward(const LayerNormGeom& g, const Vec& x, const Vec& dy,
                                   const Vec& gamma) {
  const LayerNormResult f = layer_norm_forward(g, x, gamma, Vec(g.c, 0.0));
  LayerNormGrads r{Vec(g.rows * g.c), Vec(g.c, 0.0), Vec(g.c, 0.0)};
  for (int64_t i = 0; i < g.rows; ++i) {
    // xhat = (x - mean) rstd; dxhat = dy gamma;
    // dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)).
    double m1 = 0.0, m2 = 0.0;
    for (int64_t j = 0; j < g.c; ++j) {
      const double xhat = (x[i * g.c + j] - f.mean[i]) * f.rstd[i];
      const double dxhat = dy[i * g.c + j] * gamma[j];
      m1 += dxhat;
      m2 += dxhat * xhat;
      r.dgamma[j] += dy[i * g.c + j] * xhat;
      r.dbeta[j] += dy[i * g.c + j];
    }
    m1 /= g.c;
    m2 /= g.c;
    for (int64_t j = 0; j < g.c; ++j) {
      const double xhat = (x[i * g.c + j] - f.mean[i]) * f.rstd[i];
      r.dx[i * g.c + j] = f.rstd[i] * (dy[i * g.c + j] * gamma[j] - m1 - xhat * m2);
    }
  }
  return r;
}

namespace {
const double kSqrt2OverPi = std::sqrt(2.0 / M_PI);
}

Vec gelu_forward(const Vec& x) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    y[i] = 0.5 * v * (1.0 + std::tanh(kSqrt2OverPi * (v + 0.044715 * v * v * v)));
  }
  return y;
}

Vec gelu_backward(const Vec& x, const Vec& dy) {
  Vec dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double u = kSqrt2OverPi * (v + 0.044715 * v * v * v);
    const double th = std::tanh(u);
    const double du = kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * v * v);
    dx[i] = dy[i] * (0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * du);
  }
  return dx;
}

namespace {

// Element (n, t, part, h, d) of qkv (N, T, 3C), part 0 q, 1 k, 2 v.
size_t qkv_at(const AttentionGeom& g, int64_t n, int64_t t, int part, int64_t h, int64_t d) {
  return ((n * g.t + t) * 3 + part) * g.c + h * g.head_dim() + d;
}

}  // namespace

AttentionResult attention_forward(const AttentionGeom& g, const Vec& qkv,
                                  const std::vector<uint8_t>* mask,
                                  const std::vector<int32_t>* segments) {
  const int64_t hd = g.head_dim();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  AttentionResult r{Vec(g.n * g.t * g.c, 0.0), Vec(g.n * g.heads * g.t * g.t, 0.0)};
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t h = 0; h < g.heads; ++h) {
      for (int64_t i = 0; i < g.t; ++i) {
        double* p = r.probs.data() + ((n * g.heads + h) * g.t + i) * g.t;
        double mx = -INFINITY;
        const int64_t first = segment_start(segments, n, g.t, i);
        for (int64_t j = first; j <= i; ++j) {
          double s = 0.0;
          for (int64_t d = 0; d < hd; ++d)
            s += qkv[qkv_at(g, n, i, 0, h, d)] * qkv[qkv_at(g, n, j, 1, h, d)];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = first; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int64_t j = first; j <= i; ++j) p[j] /= sum;
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0.0;
          for (int64_t j = first; j <= i; ++j) {
            const size_t e = ((n * g.heads + h) * g.t + i) * g.t + j;
            const double pd = mask ? ((*mask)[e] ? p[j] / (1.0 - g.dropout) : 0.0) : p[j];
            acc += pd * qkv[qkv_at(g, n, j, 2, h, d)];
          }
          r.y[(n * g.t + i) * g.c + h * hd + d] = acc;
        }
      }
    }
  }
  return r;
}

Vec attention_backward(const AttentionGeom& g, const Vec& qkv, const Vec& dy,
                       const std::vector<uint8_t>* mask, const std::vector<int32_t>* segments) {
  const int64_t hd = g.head_dim(), t = g.t;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const AttentionResult f = attention_forward(g, qkv, mask, segments);
  Vec dqkv(qkv.size(), 0.0);
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t h = 0; h < g.heads; ++h) {
      const size_t base = (n * g.heads + h) * t * t;
      for (int64_t i = 0; i < t; ++i) {
        // dP'[j] = dy_i . v_j; dP = dropout'(dP'); dv_j += P'[i, j] dy_i.
        Vec dp(t, 0.0);
        const int64_t first = segment_start(segments, n, t, i);
        for (int64_t j = first; j <= i; ++j) {
          const size_t e = base + i * t + j;
          const double keep = mask ? ((*mask)[e] ? 1.0 / (1.0 - g.dropout) : 0.0) : 1.0;
          double s = 0.0;
          for (int64_t d = 0; d < hd; ++d) {
            const double dyv = dy[(n * t + i) * g.c + h * hd + d];
            s += dyv * qkv[qkv_at(g, n, j, 2, h, d)];
            dqkv[qkv_at(g, n, j, 2, h, d)] += f.probs[e] * keep * dyv;
          }
          dp[j] = s * keep;
        }
        // dS[j] = P[j] (dP[j] - sum_k P[k] dP[k]) scale; dq_i += dS k_j; dk_j += dS q_i.
        double dot = 0.0;
        for (int64_t j = first; j <= i; ++j) dot += f.probs[base + i * t + j] * dp[j];
        for (int64_t j = first; j <= i; ++j) {
          const double ds = f.probs[base + i * t + j] * (dp[j] - dot) * scale;
          for (int64_t d = 0; d < hd; ++d) {
            dqkv[qkv_at(g, n, i, 0, h, d)] += ds * qkv[qkv_at(g, n, j, 1, h, d)];
            dqkv[qkv_at(g, n, j, 1, h, d)] += ds * qkv[qkv_at(g, n, i, 0, h, d)];
          }
        }
      }
    }
  }
  return dqkv;
}

}  // namespace ferry::ref
