#!/usr/bin/env python3
"""The Hugging Face peer of bench_step_time for GPT-2 models: GPT2LMHeadModel of the given sizes
(dropout 0), AdamW, random tokens, cross-entropy over every position, the same thread count.
Prints the mean step time as JSON.

Usage: /usr/bin/python3 scripts/bench_hf_gpt_step.py --layers 6 --heads 6 --width 384
           --batch 8 --seq 256 [--vocab 50257] [--threads N] [--steps N] [--warmup N]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from peer_setup import describe, peer_setup, time_lm_steps  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    for key, default in (("layers", 12), ("heads", 12), ("width", 768), ("vocab", 50257),
                         ("context", 1024), ("batch", 4), ("seq", 256), ("steps", 5),
                         ("warmup", 2), ("threads", os.cpu_count())):
        p.add_argument(f"--{key}", type=int, default=default)
    p.add_argument("--autocast", action="store_true",
                   help='torch.autocast("cpu", dtype=torch.bfloat16): the bf16 peer')
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    setup = peer_setup()
    print(describe(setup), file=sys.stderr)
    config = GPT2Config(n_layer=args.layers, n_head=args.heads, n_embd=args.width,
                        vocab_size=args.vocab, n_positions=args.context, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    model.train()
    times = time_lm_steps(model, args.vocab, args.batch, args.seq, args.warmup, args.steps,
                          autocast=args.autocast)
    print(json.dumps({"layers": args.layers, "width": args.width, "batch": args.batch,
                      "seq": args.seq, "threads": args.threads, "mean_s": sum(times) / len(times),
                      "min_s": min(times), "torch": torch.__version__,
                      "autocast": args.autocast, "peer": setup}))


if __name__ == "__main__":
    main()
