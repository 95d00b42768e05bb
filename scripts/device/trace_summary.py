#!/usr/bin/env python3
"""Where a step's host time goes, from a run.trace file (Chrome JSON, src/runtime/trace.h).

    trace_summary.py TRACE.rank0.json [--skip 2] [--json OUT]

Groups the spans by name (unit numbers folded: "fwd u3" -> "fwd u*"), sums each group per step and
prints the mean over the steps after the first --skip. Host spans: with the CUDA backend a span ends
when its launches are queued, except where the host waits for the GPU (the loss and the grad norm
read back to the host): a long "grad norm" therefore means the GPU is behind the host (GPU-bound),
long "fwd u*"/"bwd u*" with a short "grad norm" mean the host cannot launch fast enough.
"""
import argparse
import collections
import json
import re
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    with open(a.trace) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in ev if re.fullmatch(r"step \d+", e["name"])), key=lambda e: e["ts"])[a.skip:]
    if not steps:
        print("trace_summary: no steps after the skipped ones")
        return 1
    per = collections.defaultdict(float)
    for s in steps:
        t0, t1 = s["ts"], s["ts"] + s["dur"]
        for e in ev:
            if e is s or e["tid"] >= 10 or not (t0 <= e["ts"] < t1):
                continue
            per[re.sub(r"\d+", "*", e["name"])] += e["dur"]
    n = len(steps)
    step_ms = sum(s["dur"] for s in steps) / n / 1e3
    rows = sorted(((k, v / n / 1e3) for k, v in per.items()), key=lambda r: -r[1])
    print(f"mean over {n} steps: step {step_ms:.2f} ms (host wall clock)")
    for k, ms in rows:
        print(f"  {k:32s} {ms:8.2f} ms  {100 * ms / step_ms:5.1f}%")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": n, "step_ms": step_ms, "spans_ms": dict(rows)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
