#!/usr/bin/python3
"""Prints a `trainer simulate --shapes` schedule of padded row lengths from real documents.

    /usr/bin/python3 scripts/document_length_schedule.py --batch 16 --bucket 64 --cap 1024 \\
        --group-by-length '/usr/share/doc/*/copyright'

Each file is one document. Its length in GPT-2 tokens is counted with tiktoken's gpt2 encoding
when that works offline, else estimated as bytes / 4 (English text averages about 4 bytes per
GPT-2 token); the script says which on stderr. Documents are cut at --cap tokens, dealt into
batches of --batch (shuffled with --seed, or sorted by length with --group-by-length, as
length-grouped samplers do), and each batch is padded to its longest document rounded up to
--bucket tokens (data.len_bucket's rule). The output is LENGTH:WEIGHT,... with each weight the
fraction of batches padded to that length: a stand-in until the loader reports the lengths it
draws. Printed to stdout; the schedule's source goes to stderr.
"""

import argparse
import glob
import os
import random
import sys
from collections import Counter


def token_counter():
    try:
        import tiktoken  # noqa: PLC0415

        enc = tiktoken.get_encoding("gpt2")
        enc.encode("probe")
        return "GPT-2 tokens (tiktoken)", lambda data: len(
            enc.encode(data.decode("utf-8", "replace"), disallowed_special=()))
    except Exception:  # no tiktoken, or its files are not cached (no network here)
        return "bytes / 4 (no offline GPT-2 tokenizer)", lambda data: (len(data) + 3) // 4


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("globs", nargs="+")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--bucket", type=int, default=64)
    ap.add_argument("--cap", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--group-by-length", action="store_true")
    args = ap.parse_args()
    how, count = token_counter()
    lengths = []
    for pattern in args.globs:
        for path in sorted(glob.glob(pattern)):
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                lengths.append(min(args.cap, max(1, count(f.read()))))
    if len(lengths) < args.batch:
        sys.exit(f"error: {len(lengths)} documents, fewer than one batch of {args.batch}")
    if args.group_by_length:
        lengths.sort()
    else:
        random.Random(args.seed).shuffle(lengths)
    padded = Counter()
    for i in range(0, len(lengths) - args.batch + 1, args.batch):
        longest = max(lengths[i:i + args.batch])
        padded[min(args.cap, -(-longest // args.bucket) * args.bucket)] += 1
    total = sum(padded.values())
    print(f"{len(lengths)} documents, lengths in {how}, {total} batches of {args.batch} "
          f"{'grouped by length' if args.group_by_length else 'drawn at random'}, padded to a "
          f"multiple of {args.bucket}, cut at {args.cap}", file=sys.stderr)
    print(",".join(f"{n}:{padded[n] / total:.4f}" for n in sorted(padded)))


if __name__ == "__main__":
    main()
