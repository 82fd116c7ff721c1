#!/usr/bin/python3
"""Interop of ferry's safetensors code with the reference library and torch.

A file written by ferry (safetensors_tool write) must load with safetensors.numpy and
safetensors.torch, into a torch.nn.Conv2d, and be byte-identical to what the reference writer
produces for the same tensors; a file written by safetensors.torch must read back in ferry
(safetensors_tool dump) with the same names, dtypes, shapes and values.
Exits 77 (ctest: skipped) when torch or the safetensors package is missing.
"""
import argparse
import json
import math
import os
import subprocess
import sys

SKIP = 77


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    try:
        import numpy as np
        import torch
        import safetensors
        import safetensors.numpy
        import safetensors.torch
    except ImportError as e:
        print(f"SKIP: {e}; install with: /usr/bin/python3 -m pip install "
              f"--break-system-packages safetensors (torch: Debian's python3-torch)")
        return SKIP
    os.makedirs(args.dir, exist_ok=True)
    print(f"safetensors {safetensors.__version__}, torch {torch.__version__}")

    # --- ferry writes, the reference reads ---
    ours = os.path.join(args.dir, "ferry_written.safetensors")
    subprocess.run([args.tool, "write", ours], check=True)
    expected = {
        "conv.weight": (np.arange(108, dtype=np.float32) * np.float32(0.25)
                        - np.float32(3)).reshape(4, 3, 3, 3),
        "conv.bias": np.array([0.5, -0.5, 1.0, -1.0], dtype=np.float32),
        "extra.f64": np.array([0.1, -2.5, 1e-300], dtype=np.float64),
        "extra.i32": np.array([-7, 0, 2**31 - 1, -2**31, 5, 6], dtype=np.int32).reshape(2, 3),
        "extra.step": np.array(1234567890123, dtype=np.int64),
        "extra.u8": np.array([0, 17, 255], dtype=np.uint8),
        "extra.empty": np.zeros((0,), dtype=np.float32),
    }
    loaded = safetensors.numpy.load_file(ours)
    assert sorted(loaded) == sorted(expected), (sorted(loaded), sorted(expected))
    for name, want in expected.items():
        got = loaded[name]
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        assert got.shape == want.shape, (name, got.shape, want.shape)
        assert np.array_equal(got, want), (name, got, want)
    with safetensors.safe_open(ours, framework="np") as f:
        assert f.metadata() == {"format": "pt"}, f.metadata()

    tensors = safetensors.torch.load_file(ours)
    assert tensors["extra.step"].dtype == torch.int64 and tensors["extra.step"].dim() == 0
    assert tensors["extra.u8"].dtype == torch.uint8
    assert tensors["extra.f64"].dtype == torch.float64
    assert tensors["extra.i32"].dtype == torch.int32
    conv = torch.nn.Conv2d(3, 4, 3)
    conv.load_state_dict({"weight": tensors["conv.weight"], "bias": tensors["conv.bias"]})
    x = torch.ones(1, 3, 3, 3)
    y = conv(x).flatten().tolist()
    w = expected["conv.weight"].astype(np.float64).reshape(4, -1).sum(axis=1)
    want_y = (w + expected["conv.bias"]).tolist()
    assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-5) for a, b in zip(y, want_y)), (y, want_y)

    reference = os.path.join(args.dir, "reference_written.safetensors")
    safetensors.numpy.save_file(expected, reference, metadata={"format": "pt"})
    with open(ours, "rb") as a, open(reference, "rb") as b:
        ours_bytes, ref_bytes = a.read(), b.read()
    if ours_bytes != ref_bytes:
        print("ferry:    ", ours_bytes[:400])
        print("reference:", ref_bytes[:400])
        raise AssertionError("ferry's file differs from the reference writer's")
    print(f"ferry -> reference: {len(expected)} tensors, byte-identical ({len(ours_bytes)} bytes)")

    # --- the reference (torch) writes, ferry reads ---
    theirs = os.path.join(args.dir, "torch_written.safetensors")
    torch.manual_seed(0)
    written = {
        "layer1.0.conv1.weight": torch.randn(8, 4, 3, 3),
        "bn.running_mean": torch.randn(8).double(),
        "bn.num_batches_tracked": torch.tensor(99, dtype=torch.int64),
        "labels": torch.tensor([[1, -2], [3, 2**31 - 1]], dtype=torch.int32),
        "mask": torch.tensor([0, 200, 255], dtype=torch.uint8),
        "nothing": torch.zeros(0, 5),
    }
    safetensors.torch.save_file(written, theirs, metadata={"step": "7", "model": "resnet18"})
    out = subprocess.run([args.tool, "dump", theirs], check=True, capture_output=True, text=True)
    dumped = json.loads(out.stdout)
    assert dumped["metadata"] == {"step": "7", "model": "resnet18"}, dumped["metadata"]
    names = {
        torch.float32: "F32", torch.float64: "F64", torch.int32: "I32", torch.int64: "I64",
        torch.uint8: "U8",
    }
    by_name = {t["name"]: t for t in dumped["tensors"]}
    assert sorted(by_name) == sorted(written), (sorted(by_name), sorted(written))
    for name, tensor in written.items():
        t = by_name[name]
        assert t["dtype"] == names[tensor.dtype], (name, t["dtype"])
        assert t["shape"] == list(tensor.shape), (name, t["shape"])
        want = tensor.flatten().tolist()
        if tensor.dtype == torch.float32:  # JSON carries the float's exact value
            assert t["values"] == [float(np.float32(v)) for v in want], name
        else:
            assert t["values"] == want, (name, t["values"], want)
    print(f"torch -> ferry: {len(written)} tensors equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
