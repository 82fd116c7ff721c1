#!/usr/bin/env python3
"""The PyTorch peer of bench_step_time: the same architecture (scripts/zoo_reference.py builds
it), SGD with momentum, synthetic data, the same thread count. Prints the mean step time.

Usage: /usr/bin/python3 scripts/bench_pytorch_step.py MODEL BATCH [--threads N] [--steps N]
       [--autocast]  (bf16 CPU autocast, the peer of device.precision bf16)
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from peer_setup import describe, peer_setup  # noqa: E402
from zoo_reference import build_torch_model, default_input  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("batch", type=int)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--autocast", action="store_true",
                   help='torch.autocast("cpu", dtype=torch.bfloat16): the bf16 peer')
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    setup = peer_setup()
    print(describe(setup), file=sys.stderr)
    chw = default_input(args.model)
    model = build_torch_model(args.model, classes=args.classes, input_chw=chw)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(args.batch, *chw)
    y = torch.randint(0, args.classes, (args.batch,))
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    mean = sum(times) / len(times)
    print(json.dumps({"model": args.model, "batch": args.batch, "threads": args.threads,
                      "mean_s": mean, "min_s": min(times), "torch": torch.__version__,
                      "autocast": args.autocast, "peer": setup}))


if __name__ == "__main__":
    main()
