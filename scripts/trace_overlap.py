#!/usr/bin/env python3
"""Reads the Chrome traces of a data-parallel run with comm.overlap on and one with it off
(trace_rank0.json of each) and prints the step time of each, their ratio, and the share of
all-reduce time hidden behind backward compute.

Usage: scripts/trace_overlap.py ON.json OFF.json
"""
import json
import sys


def analyse(path):
    events = json.load(open(path))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    compute = sorted((e for e in spans if e["tid"] == 1), key=lambda e: e["ts"])
    reduce = [e for e in spans if e["tid"] == 4]
    backward = [(e["ts"], e["ts"] + e["dur"]) for e in compute if e["name"].startswith("bwd")]
    starts = [e["ts"] for e in compute if e["name"].startswith("load")]
    end = compute[-1]["ts"] + compute[-1]["dur"]
    bounds = starts + [end]
    steps = [b - a for a, b in zip(bounds, bounds[1:])]
    total = sum(e["dur"] for e in reduce)
    hidden = 0.0
    for r in reduce:
        a, b = r["ts"], r["ts"] + r["dur"]
        for (c, d) in backward:
            hidden += max(0.0, min(b, d) - max(a, c))
    return {
        "step_ms": sum(steps) / len(steps) / 1000.0,
        "allreduce_ms": total / len(steps) / 1000.0,
        "hidden": hidden / total if total else 0.0,
        "buckets": len(reduce) // max(1, len(steps)),
    }


def main():
    on, off = analyse(sys.argv[1]), analyse(sys.argv[2])
    for name, r in (("overlap on ", on), ("overlap off", off)):
        print(f"{name}: step {r['step_ms']:.1f} ms, all-reduce {r['allreduce_ms']:.1f} ms/step in "
              f"{r['buckets']} buckets, {100 * r['hidden']:.0f}% hidden behind backward")
    print(f"step time on / off: {on['step_ms'] / off['step_ms']:.3f}")


if __name__ == "__main__":
    main()
