#!/usr/bin/env python3
"""Writes a token file of uniform random byte-valued tokens (little-endian uint16, seed 1) for
the benchmarks that need text without a corpus. Same seed, same file: runs compare.
Usage: scripts/random_tokens.py OUT [COUNT]   (COUNT default 200000)"""
import random
import struct
import sys

if len(sys.argv) not in (2, 3):
    sys.exit(__doc__)
count = int(sys.argv[2]) if len(sys.argv) == 3 else 200000
r = random.Random(1)
with open(sys.argv[1], "wb") as f:
    f.write(b"".join(struct.pack("<H", r.randrange(256)) for _ in range(count)))
