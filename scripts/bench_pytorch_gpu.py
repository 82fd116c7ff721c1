#!/usr/bin/env python3
"""The PyTorch peer of ferry's GPU benchmark (scripts/gpu-bench.sh): a torchvision model at
ImageNet shapes on one CUDA GPU, synthetic data already on the GPU, SGD with momentum,
cudnn.benchmark on, PyTorch's default numerics (TF32 for convolutions, not for matmuls), every
activation kept on the GPU. Times steps with CUDA events after warm-up and prints one JSON line:
{"model", "batch", "step_s" (median), "min_s", "peak_gib", "torch", "gpu"}. Prints, never asserts.

Usage: python3 scripts/bench_pytorch_gpu.py MODEL BATCH [--steps N] [--warmup N] [--classes K]
"""
import argparse
import json
import statistics
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model", help="a torchvision.models name: resnet50, vgg16, ...")
    p.add_argument("batch", type=int)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--classes", type=int, default=1000)
    args = p.parse_args()

    import torch
    import torch.nn.functional as F
    import torchvision

    if not torch.cuda.is_available():
        print(json.dumps({"model": args.model, "batch": args.batch, "error": "no CUDA device"}))
        return 0
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=args.classes)
    model = model.to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(args.batch, 3, 224, 224, device=dev)
    y = torch.randint(0, args.classes, (args.batch,), device=dev)
    times = []
    try:
        for step in range(args.warmup + args.steps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            end.record()
            end.synchronize()
            if step >= args.warmup:
                times.append(start.elapsed_time(end) / 1e3)
    except torch.cuda.OutOfMemoryError:
        print(json.dumps({"model": args.model, "batch": args.batch, "error": "out of memory"}))
        return 0
    print(json.dumps({"model": args.model, "batch": args.batch,
                      "step_s": statistics.median(times), "min_s": min(times),
                      "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                      "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
