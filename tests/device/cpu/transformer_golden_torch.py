#!/usr/bin/python3
# Golden test of the CPU transformer kernels against PyTorch: Hugging Face GPT2Attention._attn's
# causal attention core, nn.LayerNorm and GELU(approximate="tanh"), forward and autograd backward,
# compared per tensor with stated tolerances. Exit 77 (skip) without torch.
# Usage: transformer_golden_torch.py --dump PATH/transformer_golden_dump --dir SCRATCH_DIR
import argparse
import os
import subprocess
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: {e} (Debian: python3-torch python3-numpy)")
    sys.exit(77)

ap = argparse.ArgumentParser()
ap.add_argument("--dump", required=True)
ap.add_argument("--dir", required=True)
args = ap.parse_args()
os.makedirs(args.dir, exist_ok=True)
torch.manual_seed(0)
n, t, c, heads = 2, 37, 48, 4  # T not a multiple of any vector width
d = c // heads

qkv = torch.randn(n, t, 3 * c, dtype=torch.float32)
dy = torch.randn(n, t, c)
x = torch.randn(n * t, c) * 2 + 0.5
gamma, beta = torch.randn(c), torch.randn(c)
h = torch.randn(n * t * 4 * c) * 3
dh = torch.randn(n * t * 4 * c)
with open(os.path.join(args.dir, "in.bin"), "wb") as f:
    f.write(np.array([n, t, c, heads], dtype=np.int64).tobytes())
    for a in (qkv, dy, x, gamma, beta, h, dh):
        f.write(a.numpy().astype(np.float32).tobytes())
subprocess.run([args.dump, args.dir], check=True)
out = np.fromfile(os.path.join(args.dir, "out.bin"), dtype=np.float32)

# PyTorch's side.
qkv_r = qkv.clone().requires_grad_(True)
q, k, v = (z.view(n, t, heads, d).permute(0, 2, 1, 3) for z in qkv_r.split(c, dim=2))
w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], d ** 0.5)
bias = torch.tril(torch.ones(t, t, dtype=torch.bool)).view(1, 1, t, t)
w = torch.where(bias, w, torch.full([], torch.finfo(w.dtype).min))
probs = torch.softmax(w, dim=-1)
y = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous().view(n, t, c)
y.backward(dy)
ln = torch.nn.LayerNorm(c, eps=1e-5)
with torch.no_grad():
    ln.weight.copy_(gamma)
    ln.bias.copy_(beta)
xr = x.clone().requires_grad_(True)
ly = ln(xr)
ly.backward(dy.view(n * t, c))
mean = x.mean(-1)
rstd = torch.rsqrt(x.var(-1, unbiased=False) + 1e-5)
hr = h.clone().requires_grad_(True)
gy = torch.nn.functional.gelu(hr, approximate="tanh")
gy.backward(dh)

expected = [("attention y", y, 1e-5), ("attention probs", probs, 1e-6),
            ("attention dqkv", qkv_r.grad, 1e-5), ("layer_norm y", ly, 1e-5),
            ("layer_norm mean", mean, 1e-6), ("layer_norm rstd", rstd, 1e-5),
            ("layer_norm dx", xr.grad, 1e-5), ("layer_norm dgamma", ln.weight.grad, 1e-4),
            ("layer_norm dbeta", ln.bias.grad, 1e-4), ("gelu y", gy, 1e-5),
            ("gelu dx", hr.grad, 1e-5)]
offset, failed = 0, False
for name, ref, tol in expected:
    ref = ref.detach().numpy().ravel()
    got = out[offset:offset + ref.size]
    offset += ref.size
    err = np.max(np.abs(got - ref) / (1.0 + np.abs(ref)))
    ok = got.size == ref.size and err <= tol
    failed |= not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name:20s} max |ferry - torch| / (1 + |torch|) = {err:.2e}"
          f" (tolerance {tol:.0e})")
if offset != out.size:
    print(f"FAIL out.bin holds {out.size} floats, expected {offset}")
    failed = True
sys.exit(1 if failed else 0)
