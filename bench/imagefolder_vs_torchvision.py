#!/usr/bin/python3
"""Image loading throughput: ferry's imagefolder loader vs torchvision's DataLoader with PIL.

Both read the same folder of generated JPEGs (about 500x375), apply RandomResizedCrop(224) +
RandomHorizontalFlip + ToTensor + Normalize with the same number of workers and batch size,
and are timed from their first batch over the following epochs. Prints images/s and the
ratio ferry / torchvision (goal >= 1.5); never asserts.
Usage: bench/imagefolder_vs_torchvision.py --tool build/bench_imagefolder_loader
           [--dir build/bench-runs/imagefolder] [--images 512] [--workers 2] [--reps 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def make_folder(root, count, np, Image):
    """`count` JPEGs of about 500x375 (some portrait, sizes vary a little) in 8 classes."""
    if os.path.exists(os.path.join(root, "done")):
        return
    rng = np.random.default_rng(1)
    for i in range(count):
        w, h = int(rng.integers(470, 530)), int(rng.integers(350, 400))
        if i % 4 == 3:
            w, h = h, w
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        img = np.stack([127 + 100 * np.sin(x * rng.uniform(0.01, 0.05) + y * rng.uniform(
            0.01, 0.05) + c) for c in range(3)], axis=-1)
        img += rng.normal(0, 20, img.shape)
        cls = os.path.join(root, f"class{i % 8}")
        os.makedirs(cls, exist_ok=True)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
            os.path.join(cls, f"img{i:04d}.jpg"), quality=90)
    open(os.path.join(root, "done"), "w").close()


def torchvision_rate(root, workers, batch, epochs, torch, torchvision, T):
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(root, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                         persistent_workers=True)
    it = iter(loader)
    next(it)  # workers started, first batch ready
    start = time.perf_counter()
    images = sum(len(y) for _, y in it)
    for _ in range(epochs):
        images += sum(len(y) for _, y in loader)
    seconds = time.perf_counter() - start
    # The first epoch's remaining batches plus `epochs` full ones, as ferry counts.
    return images / seconds, images


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool", required=True)
    parser.add_argument("--dir", default="build/bench-runs/imagefolder")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    try:
        import numpy as np
        import torch
        import torchvision
        from PIL import Image
        from torchvision import transforms as T
    except ImportError as e:
        print(f"skipped: {e}")
        return 0
    torch.set_num_threads(1)
    make_folder(args.dir, args.images, np, Image)
    ours, theirs = [], []
    for _ in range(args.reps):  # alternate, so both see the same machine load
        out = subprocess.run([args.tool, args.dir, "--workers", str(args.workers), "--batch",
                              str(args.batch), "--epochs", str(args.epochs)],
                             check=True, capture_output=True, text=True).stdout
        ours.append(json.loads(out)["images_per_s"])
        theirs.append(torchvision_rate(args.dir, args.workers, args.batch, args.epochs, torch,
                                       torchvision, T)[0])
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"imagefolder loader, {args.images} JPEGs ~500x375 -> RandomResizedCrop(224)+flip+"
          f"normalise, {args.workers} workers, batch {args.batch}, {os.cpu_count()} cores:")
    print(f"  ferry {o:.0f} images/s   torchvision+PIL {t:.0f} images/s   ratio {o / t:.2f} "
          f"(goal >= 1.5)   runs: ferry {', '.join(f'{x:.0f}' for x in ours)}; "
          f"torchvision {', '.join(f'{x:.0f}' for x in theirs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
