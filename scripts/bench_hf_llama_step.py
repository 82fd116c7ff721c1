#!/usr/bin/env python3
"""The Hugging Face peer of bench_step_time for Llama models: LlamaForCausalLM of the given sizes
(untied head, eager attention as transformers 4.46 runs it on this torch), AdamW, random tokens,
cross-entropy over every position, the same thread count. Prints the mean step time as JSON.

Usage: /usr/bin/python3 scripts/bench_hf_llama_step.py --layers 6 --heads 6 --kv-heads 2
           --width 384 --ffn 1024 --batch 8 --seq 256 [--vocab 32000] [--threads N]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from peer_setup import describe, peer_setup, time_lm_steps  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    for key, default in (("layers", 6), ("heads", 6), ("kv-heads", 2), ("width", 384),
                         ("ffn", 1024), ("vocab", 32000), ("context", 2048), ("batch", 8),
                         ("seq", 256), ("steps", 5), ("warmup", 2), ("threads", os.cpu_count())):
        p.add_argument(f"--{key}", type=int, default=default)
    p.add_argument("--attn", default="eager",
                   help="attn_implementation: eager (torch 1.13 has no sdpa) or sdpa")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    setup = peer_setup()
    print(describe(setup), file=sys.stderr)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.width,
                         intermediate_size=args.ffn, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         max_position_embeddings=args.context, tie_word_embeddings=False)
    model = LlamaForCausalLM(config) if args.attn == "default" else LlamaForCausalLM._from_config(
        config, attn_implementation=args.attn)
    model.train()
    times = time_lm_steps(model, args.vocab, args.batch, args.seq, args.warmup, args.steps)
    print(json.dumps({"layers": args.layers, "width": args.width, "batch": args.batch,
                      "seq": args.seq, "threads": args.threads, "attn": args.attn,
                      "mean_s": sum(times) / len(times), "min_s": min(times),
                      "torch": torch.__version__, "peer": setup}))


if __name__ == "__main__":
    main()
