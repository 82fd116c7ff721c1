#!/usr/bin/python3
"""The model zoo's reference: torchvision's models (and PyTorch twins of ferry's CIFAR, MLP and
LeNet-5 variants), as state_dict tables and layer-by-layer output shapes.

Run with Debian's python3-torch 1.13 / python3-torchvision 0.14:

    /usr/bin/python3 scripts/zoo_reference.py                  # rewrite the committed fixture
    /usr/bin/python3 scripts/zoo_reference.py --table resnet50 # print one model's table
    /usr/bin/python3 scripts/zoo_reference.py --counts         # print parameter counts only

The fixture (tests/trainer/model/zoo/torchvision_zoo.json) holds, per model:
  parameters  the number of trained parameters (elements),
  state_dict  every parameter and buffer in state_dict order: [name, shape, dtype, role],
  layers      every leaf-module call in forward order: [name, type, output shape]; a module
              called more than once (ResNet's shared `relu`) is "<name>", "<name>_1", ...
  logits      the output shape.
ImageNet models are built at input (2, 3, 224, 224) with 1000 classes, the others at their
default input with 10 classes. `build_torch_model(name, classes)` is importable, so benchmarks
can run exactly ferry's architecture in PyTorch.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn as nn
import torchvision

IMAGENET = [
    "alexnet",
    "vgg11", "vgg13", "vgg16", "vgg19",
    "vgg11_bn", "vgg13_bn", "vgg16_bn", "vgg19_bn",
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
]
RESNETS = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]
VGGS = ["vgg11", "vgg13", "vgg16", "vgg19", "vgg11_bn", "vgg13_bn", "vgg16_bn", "vgg19_bn"]
CIFAR = [m + "_cifar" for m in ["alexnet"] + VGGS + RESNETS]
SMALL = ["mlp", "lenet5"]


class Mlp(nn.Module):
    """ferry's `mlp`: flatten -> fc1 (512) -> relu -> fc2 (256) -> relu -> fc3 (classes)."""

    def __init__(self, in_features, classes):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 512)
        self.relu1 = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(512, 256)
        self.relu2 = nn.ReLU(inplace=True)
        self.fc3 = nn.Linear(256, classes)

    def forward(self, x):
        x = torch.flatten(x, 1)
        x = self.relu1(self.fc1(x))
        x = self.relu2(self.fc2(x))
        return self.fc3(x)


class LeNet5(nn.Module):
    """ferry's `lenet5`: conv1 6@5x5 (padding 2 below 32x32) -> relu -> maxpool 2 -> conv2
    16@5x5 -> relu -> maxpool 2 -> flatten -> fc1 120 -> relu -> fc2 84 -> relu -> fc3."""

    def __init__(self, channels, size, classes):
        super().__init__()
        pad = 2 if size < 32 else 0
        self.conv1 = nn.Conv2d(channels, 6, 5, padding=pad)
        self.relu1 = nn.ReLU(inplace=True)
        self.pool1 = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.relu2 = nn.ReLU(inplace=True)
        self.pool2 = nn.MaxPool2d(2, 2)
        s = ((size + 2 * pad - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(16 * s * s, 120)
        self.relu3 = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(120, 84)
        self.relu4 = nn.ReLU(inplace=True)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x):
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = self.relu3(self.fc1(x))
        x = self.relu4(self.fc2(x))
        return self.fc3(x)


def _alexnet_cifar(classes):
    """torchvision's AlexNet module layout for 32x32: 3x3 convs, 2x2 pools, 1024-wide MLP."""
    m = torchvision.models.alexnet(num_classes=classes)
    m.features = nn.Sequential(
        nn.Conv2d(3, 64, 3, stride=2, padding=1),  # 0: 32 -> 16
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2, 2),  # 2: 16 -> 8
        nn.Conv2d(64, 192, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2, 2),  # 5: 8 -> 4
        nn.Conv2d(192, 384, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2, 2),  # 12: 4 -> 2
    )
    m.avgpool = nn.Identity()
    m.classifier = nn.Sequential(
        nn.Dropout(0.5),
        nn.Linear(256 * 2 * 2, 1024),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        nn.Linear(1024, 1024),
        nn.ReLU(inplace=True),
        nn.Linear(1024, classes),
    )
    return m


def _vgg_cifar(name, classes):
    """torchvision's VGG `features` on 32x32 (five pools -> 512x1x1), no 7x7 pool, and a
    one-layer classifier `classifier.0` Linear(512, classes) initialised N(0, 0.01), bias 0."""
    m = getattr(torchvision.models, name)(num_classes=classes)
    m.avgpool = nn.Identity()
    m.classifier = nn.Sequential(nn.Linear(512, classes))
    nn.init.normal_(m.classifier[0].weight, 0, 0.01)
    nn.init.zeros_(m.classifier[0].bias)
    return m


def _resnet_cifar(name, classes):
    """torchvision's ResNet with a 3x3 stride-1 stem and no first max-pool (kuangliu-style)."""
    m = getattr(torchvision.models, name)(num_classes=classes)
    m.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(m.conv1.weight, mode="fan_out", nonlinearity="relu")
    m.maxpool = nn.Identity()
    return m


def default_input(name):
    if name in IMAGENET:
        return (3, 224, 224)
    if name in CIFAR:
        return (3, 32, 32)
    return (1, 28, 28)


def build_torch_model(name, classes=None, input_chw=None):
    """The PyTorch model ferry's `name` is equal to (tensor names, shapes and layer order)."""
    if classes is None:
        classes = 1000 if name in IMAGENET else 10
    c, h, w = input_chw or default_input(name)
    if name in IMAGENET:
        return getattr(torchvision.models, name)(num_classes=classes)
    if name == "alexnet_cifar":
        return _alexnet_cifar(classes)
    if name.endswith("_cifar") and name[: -len("_cifar")] in VGGS:
        return _vgg_cifar(name[: -len("_cifar")], classes)
    if name.endswith("_cifar") and name[: -len("_cifar")] in RESNETS:
        return _resnet_cifar(name[: -len("_cifar")], classes)
    if name == "mlp":
        return Mlp(c * h * w, classes)
    if name == "lenet5":
        assert h == w, "the reference LeNet-5 takes square inputs"
        return LeNet5(c, h, classes)
    raise KeyError(name)


_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32", torch.int64: "I64"}


def describe(name, batch=2, classes=None):
    """The fixture entry of one model."""
    if classes is None:
        classes = 1000 if name in IMAGENET else 10
    chw = default_input(name)
    model = build_torch_model(name, classes, chw).eval()
    params = {n for n, _ in model.named_parameters()}
    state = [
        [k, list(v.shape), _DTYPES[v.dtype], "param" if k in params else "buffer"]
        for k, v in model.state_dict().items()
    ]
    count = sum(p.numel() for p in model.parameters())

    layers, calls = [], {}
    module_names = {m: n for n, m in model.named_modules()}

    def hook(module, _inputs, output):
        base = module_names[module]
        k = calls.get(base, 0)
        calls[base] = k + 1
        layers.append([base if k == 0 else f"{base}_{k}", type(module).__name__,
                       list(output.shape)])

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if len(list(m.children())) == 0 and not isinstance(m, nn.Identity)]
    with torch.no_grad():
        logits = model(torch.zeros((batch,) + chw))
    for h in handles:
        h.remove()
    return {"input": [batch, *chw], "classes": classes, "parameters": count, "state_dict": state,
            "layers": layers, "logits": list(logits.shape)}


def _dump(fixture):
    """JSON with one table row per line: readable in review, diff-friendly."""
    out = ['{', f'  "generator": {json.dumps(fixture["generator"])},',
           f'  "torch": {json.dumps(fixture["torch"])},',
           f'  "torchvision": {json.dumps(fixture["torchvision"])},', '  "models": {']
    names = list(fixture["models"])
    for i, name in enumerate(names):
        m = fixture["models"][name]
        out.append(f'    {json.dumps(name)}: {{')
        for key in ("input", "classes", "parameters", "logits"):
            out.append(f'      "{key}": {json.dumps(m[key])},')
        for key in ("state_dict", "layers"):
            out.append(f'      "{key}": [')
            rows = [f'        {json.dumps(r)}' for r in m[key]]
            out.append(",\n".join(rows))
            out.append('      ]' + (',' if key == "state_dict" else ''))
        out.append('    }' + (',' if i + 1 < len(names) else ''))
    out += ['  }', '}']
    return "\n".join(out) + "\n"


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(root, "tests/trainer/model/zoo/torchvision_zoo.json"))
    ap.add_argument("--table", metavar="MODEL", help="print one model's layers and state_dict")
    ap.add_argument("--counts", action="store_true", help="print parameter counts and exit")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    if args.table:
        d = describe(args.table)
        for name, kind, shape in d["layers"]:
            print(f"{name:32s} {kind:20s} {tuple(shape)}")
        for name, shape, dtype, role in d["state_dict"]:
            print(f"{name:40s} {role:6s} {dtype:3s} {tuple(shape)}")
        print(f"parameters: {d['parameters']:,}")
        return 0
    if args.counts:
        for name in IMAGENET + CIFAR + SMALL:
            n = sum(p.numel() for p in build_torch_model(name).parameters())
            print(f"{name:18s} {n:>13,}")
        return 0

    fixture = {"generator": "scripts/zoo_reference.py", "torch": torch.__version__,
               "torchvision": torchvision.__version__, "models": {}}
    for name in IMAGENET + CIFAR + SMALL:
        fixture["models"][name] = describe(name)
        print(f"{name:18s} {fixture['models'][name]['parameters']:>13,}", file=sys.stderr)
    with open(args.out, "w") as f:
        f.write(_dump(fixture))
    json.load(open(args.out))  # the hand-written layout must stay valid JSON
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
