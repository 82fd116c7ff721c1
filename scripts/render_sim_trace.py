#!/usr/bin/python3
"""Renders one simulated training step under `fifo` and under `topology` (trainer simulate
--trace) to a PNG: per GPU its compute (stalls in red) and its copies to host and to device, and
per switch uplink and root complex its use over time as a share of its capacity. Uses
matplotlib when installed, else PIL (Debian: python3-matplotlib or python3-pil).

Usage: scripts/render_sim_trace.py [--trainer build/trainer] [--config C] [--hardware H]
                                   [--out docs/topology_step.png] [extra key=value ...]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

COLORS = {"compute": (90, 130, 190), "stall": (220, 50, 40), "to host": (240, 150, 40),
          "to device": (60, 170, 90), "grid": (200, 200, 200), "text": (20, 20, 20)}


def run(trainer, config, hardware, scheduler, extra):
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "trace.json")
        r = subprocess.run([trainer, "simulate", config, "--hardware", hardware, "--scheduler",
                            scheduler, "--json", "--trace", trace, *extra],
                           capture_output=True, text=True, check=True)
        summary = json.loads(r.stdout)
        events = json.load(open(trace))["traceEvents"]
    gpus = {}
    names = {}
    for e in events:
        if e.get("ph") == "M" and e["name"] == "process_name":
            names[e["pid"]] = e["args"]["name"]
    link_pid = max(names)
    spans = [e for e in events if e.get("ph") == "X"]
    for e in spans:
        g = gpus.setdefault(e["pid"], {"compute": [], "stall": [], "to host": [], "to device": []})
        kind = "stall" if e["cat"] == "stall" else ["compute", "to host", "to device"][e["tid"]]
        g[kind].append((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6))
    caps = {l["name"]: (l["to_host_gbps"], l["to_device_gbps"]) for l in summary["links"]}
    shown = [l["name"] for l in summary["links"]
             if l["kind"] in ("switch-uplink", "root-complex") and l["bytes"] > 0]
    series = {n: [] for n in shown}
    for e in events:
        if e.get("ph") == "C" and e["pid"] == link_pid and e["name"] in series:
            series[e["name"]].append((e["ts"] / 1e6, e["args"]["to_host_gbps"],
                                      e["args"]["to_device_gbps"]))
    return {"summary": summary, "gpus": [gpus[p] for p in sorted(gpus)],
            "gpu_names": [names[p] for p in sorted(gpus)], "links": shown, "series": series,
            "caps": caps, "scheduler": scheduler}


def title(p):
    s = p["summary"]
    return (f"{s['scheduler']} + {s['policy']} ({'contention-aware' if s['ranks'][0]['contention_aware'] else 'oblivious'}): "
            f"step {s['step_s']:.2f} s, stall {s['stall_s']:.2f} s, {s['samples_per_s']:.0f} samples/s, "
            f"{s['offload_bytes'] / 2**30:.1f} GiB offloaded per GPU")


def render_pil(panels, out, tmax):
    from PIL import Image, ImageDraw
    W, left, row, gap = 1600, 230, 16, 40
    rows = sum(2 * len(p["gpus"]) + 2 * len(p["links"]) for p in panels)
    H = rows * row + len(panels) * (gap + 30) + 60
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    x = lambda t: left + (W - left - 20) * t / tmax
    y = 10
    for p in panels:
        d.text((10, y), title(p), fill=COLORS["text"])
        y += 22
        for name, g in zip(p["gpu_names"], p["gpus"]):
            d.text((10, y + 2), f"{name} compute", fill=COLORS["text"])
            for kind in ("compute", "stall"):
                for a, b in g[kind]:
                    d.rectangle([x(a), y + 2, max(x(a) + 1, x(b)), y + row - 2], fill=COLORS[kind])
            y += row
            d.text((10, y + 2), f"{name} copies", fill=COLORS["text"])
            for kind, off in (("to host", 0), ("to device", row // 2)):
                for a, b in g[kind]:
                    d.rectangle([x(a), y + off + 1, max(x(a) + 1, x(b)), y + off + row // 2 - 1],
                                fill=COLORS[kind])
            y += row
        for name in p["links"]:
            cap = p["caps"][name]
            pts = p["series"][name]
            for k, (label, color) in enumerate((("out", "to host"), ("in", "to device"))):
                d.text((10, y + 2), f"{name.split(' ')[0]} {name.split(' ')[1]} {label}",
                       fill=COLORS["text"])
                d.line([left, y + row - 1, W - 20, y + row - 1], fill=COLORS["grid"])
                for (t0, a0, b0), (t1, _, _) in zip(pts, pts[1:] + [(tmax, 0, 0)]):
                    u = min(1.0, (a0 if k == 0 else b0) / max(cap[k], 1e-9))
                    if u > 0:
                        d.rectangle([x(t0), y + row - 1 - (row - 3) * u, max(x(t0) + 1, x(t1)),
                                     y + row - 1], fill=COLORS[color])
                y += row
        y += gap
    ticks = [i * tmax / 10 for i in range(11)]
    for t in ticks:
        d.line([x(t), 30, x(t), y - gap], fill=COLORS["grid"])
        d.text((x(t) - 10, y - gap + 4), f"{t:.2f}s", fill=COLORS["text"])
    img.save(out)


def render_matplotlib(panels, out, tmax):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    c = {k: tuple(v / 255 for v in rgb) for k, rgb in COLORS.items()}
    fig, axes = plt.subplots(len(panels), 1, figsize=(16, 5 + 0.3 * sum(
        2 * len(p["gpus"]) + 2 * len(p["links"]) for p in panels) / len(panels)), sharex=True)
    for ax, p in zip(axes, panels):
        labels, ypos = [], 0
        for name, g in zip(p["gpu_names"], p["gpus"]):
            for kind in ("compute", "stall"):
                ax.broken_barh([(a, b - a) for a, b in g[kind]], (ypos, 0.8), color=c[kind])
            labels.append(f"{name} compute")
            ypos -= 1
            ax.broken_barh([(a, b - a) for a, b in g["to host"]], (ypos + 0.4, 0.4), color=c["to host"])
            ax.broken_barh([(a, b - a) for a, b in g["to device"]], (ypos, 0.4), color=c["to device"])
            labels.append(f"{name} copies")
            ypos -= 1
        for name in p["links"]:
            pts = p["series"][name]
            ts = [t for t, _, _ in pts] + [tmax]
            for k, color in ((1, "to host"), (2, "to device")):
                u = [min(1, q[k] / max(p["caps"][name][k - 1], 1e-9)) for q in pts]
                ax.stairs([ypos + 0.9 * v for v in u], ts, baseline=ypos, fill=True, color=c[color])
                labels.append(f"{' '.join(name.split(' ')[:2])} {'out' if k == 1 else 'in'}")
                ypos -= 1
        ax.set_yticks([-i + 0.4 for i in range(len(labels))], labels, fontsize=7)
        ax.set_title(title(p), fontsize=9)
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", default="build/trainer")
    ap.add_argument("--config", default="configs/simulate/vgg16-dgx1.yaml")
    ap.add_argument("--hardware", default="v100-pcie3")
    ap.add_argument("--out", default="docs/topology_step.png")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    panels = [run(a.trainer, a.config, a.hardware, s, a.extra) for s in ("fifo", "topology")]
    tmax = max(p["summary"]["step_s"] for p in panels)
    try:
        render_matplotlib(panels, a.out, tmax)
    except ImportError:
        render_pil(panels, a.out, tmax)
    print(f"{a.out}: " + "; ".join(title(p) for p in panels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
