#!/usr/bin/python3
# The operations of bench_cpu_kernel_timing, timed in PyTorch 1.13 through the same aten calls its
# autograd uses (best of several runs after a warm-up), for a like-for-like comparison.
# Usage: /usr/bin/python3 kernel_timing_torch.py [threads] [reps] [cpu|wall] [gpt (only GPT-2)]
# With "cpu", times are process CPU time rather than wall time (see cpu_kernel_timing.cc).
import sys
import time

import torch

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
clock = time.process_time if len(sys.argv) > 3 and sys.argv[3] == "cpu" else time.perf_counter
torch.set_num_threads(threads)
torch.manual_seed(0)
aten = torch.ops.aten


def best_ms(f):
    f()
    best = 1e30
    for _ in range(reps):
        t0 = clock()
        f()
        best = min(best, clock() - t0)
    return best * 1e3


def conv(c, hw, k, r, stride, pad):
    x = torch.randn(64, c, hw, hw)
    w = torch.randn(k, c, r, r)
    y = torch.nn.functional.conv2d(x, w, None, stride, pad)
    dy = torch.randn_like(y)
    args = ([0], [stride, stride], [pad, pad], [1, 1], False, [0, 0], 1)
    f = best_ms(lambda: torch.nn.functional.conv2d(x, w, None, stride, pad))
    d = best_ms(lambda: aten.convolution_backward(dy, x, w, *args, [True, False, False]))
    b = best_ms(lambda: aten.convolution_backward(dy, x, w, *args, [False, True, False]))
    print(f"conv {c:3d}->{k:3d} {hw:2d}x{hw:<2d} k{r} s{stride}   fwd {f:8.3f}  bwd_data {d:8.3f}"
          f"  bwd_weights {b:8.3f} ms")


def bn_relu(c, hw):
    x = torch.randn(64, c, hw, hw)
    dy = torch.randn_like(x)
    g, b = torch.ones(c), torch.zeros(c)
    rm, rv = torch.zeros(c), torch.ones(c)
    _, mean, invstd = aten.native_batch_norm(x, g, b, rm, rv, True, 0.1, 1e-5)
    f = best_ms(lambda: aten.native_batch_norm(x, g, b, rm, rv, True, 0.1, 1e-5))
    bw = best_ms(lambda: aten.native_batch_norm_backward(dy, x, g, rm, rv, mean, invstd, True,
                                                         1e-5, [True, True, True]))
    y = torch.relu(x)
    rf = best_ms(lambda: torch.relu(x))
    rb = best_ms(lambda: aten.threshold_backward(dy, y, 0))
    acc = best_ms(lambda: y.add_(x))
    print(f"bn   {c:3d} {hw:2d}x{hw:<2d}   fwd {f:8.3f}  bwd {bw:8.3f} | relu fwd {rf:7.3f}"
          f" bwd {rb:7.3f} | accumulate {acc:7.3f} ms")


def maxpool(c, hw):
    x = torch.randn(64, c, hw, hw)
    y, idx = aten.max_pool2d_with_indices(x, [2, 2], [2, 2], [0, 0], [1, 1], False)
    dy = torch.randn_like(y)
    f = best_ms(lambda: aten.max_pool2d_with_indices(x, [2, 2], [2, 2], [0, 0], [1, 1], False))
    b = best_ms(lambda: aten.max_pool2d_with_indices_backward(dy, x, [2, 2], [2, 2], [0, 0],
                                                              [1, 1], False, idx))
    print(f"maxpool 2x2 {c:3d} {hw:2d}x{hw:<2d}   fwd {f:8.3f}  bwd {b:8.3f} ms")


def tail():
    x, w, b = torch.randn(64, 512), torch.randn(10, 512), torch.randn(10)
    dy = torch.randn(64, 10)
    f = best_ms(lambda: torch.nn.functional.linear(x, w, b))
    d = best_ms(lambda: dy.mm(w))
    bw = best_ms(lambda: (dy.t().mm(x), dy.sum(0)))
    print(f"linear 512->10      fwd {f:8.3f}  bwd_data {d:8.3f}  bwd_weights {bw:8.3f} ms")
    n = 11173962
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n)
    sgd = torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=5e-4)
    adamw = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01)
    with torch.no_grad():
        s = best_ms(sgd.step)
        a = best_ms(adamw.step)
    print(f"optimizer 11.2M     sgd(momentum, wd) {s:8.3f}  adamw {a:8.3f} ms")


def transformer(n, t, c, heads, p):
    # Hugging Face GPT2Attention._attn (transformers 4.x) on the fused qkv, autograd backward.
    d = c // heads
    qkv = torch.randn(n, t, 3 * c, requires_grad=True)
    dy = torch.randn(n, t, c)
    bias = torch.tril(torch.ones(t, t, dtype=torch.uint8)).view(1, 1, t, t)
    drop = torch.nn.Dropout(p)

    def attn():
        q, k, v = qkv.split(c, dim=2)
        q, k, v = (z.view(n, t, heads, d).permute(0, 2, 1, 3) for z in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype)
        mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype)
        w = torch.where(bias[:, :, :t, :t].bool(), w, mask_value)
        w = drop(torch.nn.functional.softmax(w, dim=-1))
        return torch.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(n, t, c)

    f = best_ms(attn)
    y = attn()
    b = best_ms(lambda: torch.autograd.backward(y, dy, retain_graph=True))
    x = torch.randn(n * t, c)
    gamma, beta = torch.ones(c), torch.zeros(c)
    _, mean, rstd = aten.native_layer_norm(x, [c], gamma, beta, 1e-5)
    dyl = torch.randn(n * t, c)
    lf = best_ms(lambda: aten.native_layer_norm(x, [c], gamma, beta, 1e-5))
    lb = best_ms(lambda: aten.native_layer_norm_backward(dyl, x, [c], mean, rstd, gamma, beta,
                                                         [True, True, True]))
    h, dh = torch.randn(n * t * 4 * c), torch.randn(n * t * 4 * c)
    gf = best_ms(lambda: aten.gelu(h, approximate="tanh"))
    gb = best_ms(lambda: aten.gelu_backward(dh, h, approximate="tanh"))
    print(f"gpt N={n} T={t} C={c} heads={heads}   attention(p={p:.1f}) fwd {f:8.3f} bwd {b:8.3f}"
          f" | layernorm fwd {lf:7.3f} bwd {lb:7.3f} | gelu(4C) fwd {gf:7.3f} bwd {gb:7.3f} ms")


print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, best of {reps}, "
      f"{'process CPU' if clock is time.process_time else 'wall'} time")
if not (len(sys.argv) > 4 and sys.argv[4] == "gpt"):
    conv(3, 32, 64, 3, 1, 1)
    conv(64, 32, 64, 3, 1, 1)
    conv(64, 32, 128, 3, 2, 1)
    conv(64, 32, 128, 1, 2, 0)
    conv(128, 16, 128, 3, 1, 1)
    conv(256, 8, 256, 3, 1, 1)
    conv(512, 4, 512, 3, 1, 1)
    bn_relu(64, 32)
    bn_relu(128, 16)
    bn_relu(512, 4)
    maxpool(64, 32)
    maxpool(256, 8)
    tail()
transformer(8, 256, 384, 6, 0.0)
transformer(8, 256, 384, 6, 0.1)
transformer(4, 256, 768, 12, 0.0)
transformer(4, 256, 768, 12, 0.1)
