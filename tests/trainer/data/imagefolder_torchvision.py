#!/usr/bin/python3
"""ferry's imagefolder source against torchvision's ImageFolder (PIL loader).

Generates a folder of JPEGs and PNGs with PIL (colour, grey, CMYK, progressive, palette, RGBA,
grey+alpha, 1-bit; odd aspect ratios; up- and downscaling), then checks:
  1. the evaluation transform (Resize(256) + CenterCrop(224) + ToTensor) of every image is
     within 1/255 mean absolute difference of torchvision's, with the same labels in order;
  2. `trainer eval` of weights ferry trained (resnet18) gives the loss of torchvision's
     resnet18 on ImageFolder + the evaluation transforms (Resize(146) + CenterCrop(128), to
     keep it cheap) with those weights (checkpoint safetensors loaded in PyTorch) within 1e-2
     relative, and the same top-1/top-5.
Exits 77 (ctest: skipped) when numpy, PIL, torch or torchvision is missing.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

SKIP = 77
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def make_image(rng, np, w, h):
    """A smooth image with edges and noise, so resampling and crops matter."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        fx, fy, ph = rng.uniform(0.005, 0.08, 2).tolist() + [rng.uniform(0, 6.28)]
        img[..., c] = 127 + 100 * np.sin(x * fx + y * fy + ph)
    for _ in range(4):
        x0, y0 = rng.integers(0, w), rng.integers(0, h)
        r = rng.integers(5, max(6, min(w, h) // 3))
        mask = (x - x0) ** 2 + (y - y0) ** 2 < r * r
        img[mask] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 12, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_folder(root, np, Image):
    rng = np.random.default_rng(7)
    img = lambda w, h: Image.fromarray(make_image(rng, np, w, h))
    spec = {
        "c0_colour": [("a.jpg", lambda: img(500, 375), {"quality": 90}),
                      ("b.jpg", lambda: img(375, 500), {"quality": 85})],
        "c1_grey_cmyk": [("grey.jpg", lambda: img(300, 200).convert("L"), {"quality": 90}),
                         ("cmyk.jpg", lambda: img(320, 240).convert("CMYK"), {"quality": 95})],
        "c2_odd": [("wide.jpg", lambda: img(640, 90), {"quality": 90}),
                   ("small.jpeg", lambda: img(100, 80), {"quality": 90}),
                   ("prog.JPG", lambda: img(333, 444), {"quality": 80, "progressive": True})],
        "c3_palette": [("pal.png", lambda: img(260, 260).convert("P", palette=Image.ADAPTIVE), {}),
                       ("rgba.png", lambda: img(300, 257).convert("RGBA"), {})],
        "c4_grey_png": [("la.png", lambda: img(280, 300).convert("LA"), {}),
                        ("grey.PNG", lambda: img(257, 300).convert("L"), {}),
                        ("bits.png", lambda: img(300, 270).convert("1"), {})],
        "c5_more": [("c.jpg", lambda: img(450, 300), {"quality": 95, "subsampling": 0}),
                    ("d.png", lambda: img(230, 240), {})],
    }
    for cls, files in spec.items():
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        for name, make, kw in files:
            im = make()
            if im.mode == "RGBA":  # a real alpha channel
                a = np.array(im)
                a[..., 3] = (np.arange(a.shape[1]) % 256).astype(np.uint8)[None, :]
                im = Image.fromarray(a, "RGBA")
            im.save(os.path.join(root, cls, name), **kw)
    return sorted(spec)


def read_safetensors(path, np, torch):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32,
             "U8": np.uint8}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        a = np.frombuffer(data[lo:hi], dtype=kinds[t["dtype"]]).reshape(t["shape"])
        out[name] = torch.from_numpy(a.copy())
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump", required=True)
    parser.add_argument("--trainer", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    try:
        import numpy as np
        import torch
        import torchvision
        from PIL import Image
        from torchvision import transforms
    except ImportError as e:
        print(f"SKIP: {e} (Debian: python3-torch python3-torchvision python3-pil)")
        return SKIP
    torch.set_num_threads(2)
    shutil.rmtree(args.dir, ignore_errors=True)
    folder = os.path.join(args.dir, "images")
    classes = write_folder(folder, np, Image)

    # --- 1. the evaluation transform, image by image ---
    out = os.path.join(args.dir, "dump")
    subprocess.run([args.dump, folder, "256", "224", out], check=True)
    ours = np.fromfile(out + ".f32", dtype=np.float32).reshape(-1, 3, 224, 224)
    our_labels = [int(v) for v in open(out + ".txt").read().split()]
    eval_tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224),
                                  transforms.ToTensor()])
    ref = torchvision.datasets.ImageFolder(folder, transform=eval_tf)
    assert ref.classes == classes, (ref.classes, classes)
    assert len(ref) == len(ours), (len(ref), len(ours))
    worst = 0.0
    for i, (path, label) in enumerate(ref.samples):
        assert our_labels[i] == label, (i, path, our_labels[i], label)
        theirs = ref[i][0].numpy()
        mad = float(np.abs(theirs - ours[i]).mean()) * 255
        peak = float(np.abs(theirs - ours[i]).max()) * 255
        print(f"  {os.path.relpath(path, folder):28s} mean |diff| {mad:.4f}/255, max {peak:.0f}/255")
        assert mad <= 1.0, f"{path}: mean absolute difference {mad:.3f}/255 > 1/255"
        worst = max(worst, mad)
    print(f"eval transform: {len(ref)} images, worst mean |diff| {worst:.4f}/255 (limit 1/255)")

    # --- 2. evaluation loss of the same weights ---
    run_dir = os.path.join(args.dir, "run")
    common = [f"run.dir={run_dir}", "model.name=resnet18", f"model.classes={len(classes)}",
              "data.source=imagefolder", f"data.path={folder}", f"data.mean={MEAN}",
              f"data.std={STD}", "device.threads=2", "topology.bind=false"]
    config = os.path.join(args.dir, "config.yaml")
    with open(config, "w") as f:
        f.write("run: {steps: 2, log_every: 1, seed: 1}\n")
    subprocess.run([args.trainer, "train", config] + common +
                   ["model.input=[3,32,32]", "data.batch_size=4", "optim.lr=0.001",
                    "checkpoint.every=2"], check=True, stdout=subprocess.DEVNULL)
    # At a smaller evaluation size than part 1's 256/224, to keep the test cheap.
    subprocess.run([args.trainer, "eval", config] + common +
                   ["model.input=[3,128,128]", "data.resize=146", "data.batch_size=5"],
                   check=True)
    with open(os.path.join(run_dir, "eval.json")) as f:
        ferry = json.load(f)

    state = read_safetensors(os.path.join(run_dir, "checkpoints", "step_2.safetensors"), np,
                             torch)
    model = torchvision.models.resnet18(num_classes=len(classes))
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("optimizer.")})
    model.eval()
    def torch_eval(tf, mean=MEAN, std=STD):
        loader = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(
            folder, transform=transforms.Compose([tf, transforms.Normalize(mean, std)])),
            batch_size=5)
        loss_sum, top1, top5, n = 0.0, 0, 0, 0
        with torch.no_grad():
            for x, y in loader:
                logits = model(x)
                loss_sum += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
                top = logits.topk(5, dim=1).indices
                top1 += int((top[:, 0] == y).sum())
                top5 += int((top == y[:, None]).any(dim=1).sum())
                n += len(y)
        return loss_sum / n, top1, top5, n

    small_tf = transforms.Compose([transforms.Resize(146), transforms.CenterCrop(128),
                                   transforms.ToTensor()])
    loss, top1, top5, n = torch_eval(small_tf)
    # The check can fail: preprocessing mistakes move this loss by more than the tolerance.
    resize128 = torch_eval(transforms.Compose([transforms.Resize(128), transforms.CenterCrop(128),
                                               transforms.ToTensor()]))[0]
    no_norm = torch_eval(small_tf, [0, 0, 0], [1, 1, 1])[0]
    print(f"sensitivity: Resize(128) would give {resize128:.6f} (relative "
          f"{abs(resize128 - loss) / loss:.2e}), no normalisation {no_norm:.6f} (relative "
          f"{abs(no_norm - loss) / loss:.2e})")
    assert abs(no_norm - loss) > 1e-2 * loss, "the loss check is not sensitive to normalisation"
    print(f"eval loss: ferry {ferry['loss']:.6f}  torchvision {loss:.6f}  "
          f"(relative {abs(ferry['loss'] - loss) / loss:.2e}); top-1 {ferry['accuracy']:.4f} vs "
          f"{top1 / n:.4f}; top-5 {ferry['top5_accuracy']:.4f} vs {top5 / n:.4f}")
    assert ferry["samples"] == n, (ferry["samples"], n)
    assert abs(ferry["loss"] - loss) <= 1e-2 * loss, (ferry["loss"], loss)
    assert abs(ferry["accuracy"] - top1 / n) <= 1.0 / n + 1e-9, (ferry["accuracy"], top1 / n)
    assert abs(ferry["top5_accuracy"] - top5 / n) <= 1.0 / n + 1e-9
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
