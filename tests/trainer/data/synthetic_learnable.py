#!/usr/bin/python3
"""The synthetic task is learnable at a moderate pace: a small CNN with BatchNorm, trained in
torch with SGD (lr 0.01, momentum 0.9) at batch 32 on 3x32x32 samples written by ferry's
generator (synthetic_dump), starts near chance, ends well below it within 120 steps, and
generalises to samples of another seed. Exits 77 (ctest: skipped) without torch or numpy.
"""
import argparse
import os
import subprocess
import sys

SKIP = 77


def load(path, n, chw):
    import numpy as np
    raw = np.fromfile(path, dtype=np.uint8)
    floats = n * chw[0] * chw[1] * chw[2]
    x = raw[:floats * 4].view(np.float32).reshape(n, *chw)
    y = raw[floats * 4:].view(np.int32).astype(np.int64)
    assert y.shape == (n,), y.shape
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    try:
        import numpy as np
        import torch
    except ImportError as e:
        print(f"SKIP: {e} (Debian's python3-torch provides torch and numpy)")
        return SKIP
    torch.set_num_threads(1)  # no OpenMP spinning on a busy machine
    os.makedirs(args.dir, exist_ok=True)
    chw, classes, steps, batch = (3, 32, 32), 10, 120, 32
    train_n, test_n = 3200, 1000
    train_path = os.path.join(args.dir, "train.bin")
    test_path = os.path.join(args.dir, "test.bin")
    subprocess.run([args.tool, *map(str, chw), str(classes), str(train_n), "1", train_path],
                   check=True)
    subprocess.run([args.tool, *map(str, chw), str(classes), str(test_n), "2", test_path],
                   check=True)
    x, y = (torch.from_numpy(a) for a in load(train_path, train_n, chw))
    xt, yt = (torch.from_numpy(a) for a in load(test_path, test_n, chw))
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0

    nn = torch.nn
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for step in range(steps):
        i = torch.arange(step * batch, (step + 1) * batch) % train_n
        loss = nn.functional.cross_entropy(net(x[i]), y[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    net.eval()
    with torch.no_grad():
        accuracy = (net(xt).argmax(1) == yt).float().mean().item()
    first, last = np.mean(losses[:10]), np.mean(losses[-20:])
    print("loss by 20 steps:", " ".join(f"{np.mean(losses[j:j + 20]):.2f}"
                                         for j in range(0, steps, 20)))
    print(f"first 10 steps {first:.3f}, last 20 steps {last:.3f}, held-out accuracy {accuracy:.3f}")
    assert first > 1.8, f"too easy: the loss starts at {first:.2f}"
    assert last < 0.8, f"not learnable enough: the loss is still {last:.2f} after {steps} steps"
    assert accuracy > 0.7, f"does not generalise: held-out accuracy {accuracy:.2f}"
    return 0


if __name__ == "__main__":
    sys.exit(main())
