#!/usr/bin/env python3
"""Writes the golden fixture for tests/trainer/golden: a small CNN with batch norm and a
residual block, run in PyTorch (Debian's python3-torch). The fixture holds the initial weights,
three batches, the logits, loss and gradients of the first step, and the loss, parameters and
BN running statistics after each of three SGD steps.

With --optim, writes the optimizer fixture instead: from the golden fixture's initial weights
and batches, three steps of each optimizer variant in OPTIM_VARIANTS (gradient clipping by
global norm, weight decay only on parameters of 2+ dimensions), the loss, the norm
torch.nn.utils.clip_grad_norm_ returns and the parameters after each step.

Usage: /usr/bin/python3 scripts/golden_reference.py [OUT.safetensors]
       /usr/bin/python3 scripts/golden_reference.py --optim [GOLDEN.safetensors [OUT.safetensors]]
"""
import json
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, CHANNELS, SIZE, CLASSES = 8, 3, 16, 5
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 5e-4


class GoldenNet(nn.Module):
    """Mirrored by tests/trainer/golden/golden_net.cc: same layers, same names."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(CHANNELS, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(8)
        self.conv4 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(x)))
        y = self.bn3(self.conv3(y))
        x = F.relu(x + y)
        x = F.max_pool2d(x, 2, 2)
        x = F.relu(self.conv4(x))
        x = F.adaptive_avg_pool2d(x, (1, 1)).flatten(1)
        return self.fc(x)


def save(path, tensors, metadata):
    """safetensors, written by hand so the generator needs nothing beyond torch."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        dtype = {torch.float32: "F32", torch.int32: "I32", torch.int64: "I64"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load(path):
    """The tensors of a safetensors file (F32, I32 and I64)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        dtype = {"F32": torch.float32, "I32": torch.int32, "I64": torch.int64}[e["dtype"]]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype)
        out[name] = t.reshape(e["shape"]).clone()
    return out


# name: (optimizer, lr, weight_decay, decay only parameters of 2+ dimensions, clip_norm or 0)
OPTIM_VARIANTS = {
    "sgd_clip": ("sgd", 0.1, 5e-4, False, 0.5),
    "sgd_matrices": ("sgd", 0.1, 0.05, True, 0.0),
    "adamw_matrices_clip": ("adamw", 0.01, 0.1, True, 0.5),
}


def optim_main(golden, out):
    torch.set_num_threads(1)
    fixture = load(golden)
    tensors = {}
    meta = {"torch": torch.__version__}
    for variant, (kind, lr, wd, matrices, clip) in OPTIM_VARIANTS.items():
        model = GoldenNet()
        model.load_state_dict({k[len("init."):]: v for k, v in fixture.items()
                               if k.startswith("init.")})
        params = list(model.parameters())
        decayed = [p for p in params if p.dim() >= 2 or not matrices]
        others = [p for p in params if not (p.dim() >= 2 or not matrices)]
        groups = [{"params": decayed, "weight_decay": wd}, {"params": others, "weight_decay": 0.0}]
        if kind == "sgd":
            opt = torch.optim.SGD(groups, lr=lr, momentum=MOMENTUM)
        else:
            opt = torch.optim.AdamW(groups, lr=lr)
        model.train()
        for k in range(3):
            x = fixture[f"batch{k}.images"]
            y = fixture[f"batch{k}.labels"]
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y.long())
            loss.backward()
            tensors[f"{variant}.step{k}.loss"] = loss.detach().reshape(())
            if clip > 0:
                norm = torch.nn.utils.clip_grad_norm_(params, clip)
                tensors[f"{variant}.step{k}.grad_norm"] = norm.detach().reshape(())
            opt.step()
            for name, p in model.named_parameters():
                tensors[f"{variant}.after{k}.{name}"] = p.detach().clone()
        meta[variant] = json.dumps({"optimizer": kind, "lr": lr, "weight_decay": wd,
                                    "decay": "matrices" if matrices else "all",
                                    "clip_norm": clip, "momentum": MOMENTUM})
    save(out, tensors, meta)
    print(f"wrote {out}: {len(tensors)} tensors; grad norms",
          {k: round(v.item(), 4) for k, v in tensors.items() if k.endswith("grad_norm")})


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--optim":
        args = sys.argv[2:]
        golden = args[0] if args else "tests/trainer/golden/golden_fixture.safetensors"
        out = args[1] if len(args) > 1 else "tests/trainer/golden/golden_optim_fixture.safetensors"
        optim_main(golden, out)
        return
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/trainer/golden/golden_fixture.safetensors"
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GoldenNet()
    # Non-trivial BN affine parameters, so their gradients and use are checked.
    with torch.no_grad():
        for bn in (model.bn1, model.bn2, model.bn3):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    tensors = {}
    for name, value in model.state_dict().items():
        tensors["init." + name] = value.clone()
    batches = []
    for k in range(3):
        x = torch.rand(BATCH, CHANNELS, SIZE, SIZE)
        y = torch.randint(0, CLASSES, (BATCH,), dtype=torch.int32)
        tensors[f"batch{k}.images"] = x
        tensors[f"batch{k}.labels"] = y
        batches.append((x, y))

    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    model.train()
    for k, (x, y) in enumerate(batches):
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits, y.long())
        loss.backward()
        tensors[f"step{k}.loss"] = loss.detach().reshape(())
        if k == 0:
            tensors["step0.logits"] = logits.detach()
            for name, p in model.named_parameters():
                tensors["step0.grad." + name] = p.grad.clone()
        opt.step()
        for name, value in model.state_dict().items():
            tensors[f"after{k}.{name}"] = value.clone()

    metadata = {"lr": str(LR), "momentum": str(MOMENTUM), "weight_decay": str(WEIGHT_DECAY),
                "torch": torch.__version__}
    save(out, tensors, metadata)
    print(f"wrote {out}: {len(tensors)} tensors, losses",
          [round(tensors[f'step{k}.loss'].item(), 6) for k in range(3)])


if __name__ == "__main__":
    main()
