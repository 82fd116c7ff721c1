"""What the Hugging Face parity scripts share (gpt2_parity.py, llama_parity.py): llm.c token
files, the windows `trainer eval` scores, Hugging Face's mean token loss over them, and the
commands and tolerances around them."""
import subprocess


def write_tokens(path, tokens):
    """llm.c's token file: 256 int32 (magic 20240520, version 1, count), then uint16 tokens."""
    import numpy as np
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def windows(tokens, seq):
    """Consecutive non-overlapping windows: inputs tokens[kT, kT+T), targets shifted by one."""
    count = (len(tokens) - 1) // seq
    return [(tokens[k * seq:k * seq + seq], tokens[k * seq + 1:k * seq + seq + 1])
            for k in range(count)]


def mean_loss(model, tokens, seq):
    import torch
    import torch.nn.functional as F
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in windows(tokens, seq):
            logits = model(torch.tensor([x])).logits[0]
            total += F.cross_entropy(logits.double(), torch.tensor(y), reduction="sum").item()
            count += len(y)
    return total / count


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def close(a, b, rtol):
    return abs(a - b) <= rtol * max(abs(b), 1e-12)
