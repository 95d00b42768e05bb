#!/usr/bin/env python3
"""How much of the CPU AdamW (offload.optimizer "cpu" on the CUDA backend) ran beside backward, from a
run.trace file of one rank: per step, the time of the host optimizer's updates (track "host optimizer")
and the part that ended before the step's "finish gradients" began (hidden behind backward).

usage: host_optimizer_overlap.py TRACE.rank0.json [--json]
"""
import json
import sys


def overlap(path):
    ev = json.load(open(path))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
    xs = sorted((e for e in ev if e.get("ph") == "X"), key=lambda e: e["ts"])
    steps = [e for e in xs if names.get(e["tid"]) == "step"]
    out = []
    for s in steps:
        t0, t1 = s["ts"], s["ts"] + s["dur"]
        inside = [e for e in xs if t0 <= e["ts"] < t1]
        fin = [e["ts"] for e in inside if e["name"] == "finish gradients"]
        upd = [e for e in inside if names.get(e["tid"], "").startswith("host optimizer")]
        if not fin or not upd:
            continue
        total = sum(e["dur"] for e in upd)
        hidden = sum(e["dur"] for e in upd if e["ts"] + e["dur"] <= fin[0])
        out.append({"step": len(out), "adamw_us": total, "hidden_us": hidden, "units": len(upd),
                    "units_hidden": sum(1 for e in upd if e["ts"] + e["dur"] <= fin[0])})
    return out


if __name__ == "__main__":
    rows = overlap(sys.argv[1])
    if "--json" in sys.argv:
        print(json.dumps(rows))
    else:
        for r in rows:
            share = r["hidden_us"] / r["adamw_us"] if r["adamw_us"] else 0.0
            print(f"step {r['step']}: CPU AdamW {r['adamw_us'] / 1e3:.2f} ms over {r['units']} units, "
                  f"{r['hidden_us'] / 1e3:.2f} ms ({100 * share:.1f} %, {r['units_hidden']} units) before backward ended")
