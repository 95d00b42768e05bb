#!/usr/bin/env python3
"""Where an offloaded step's disk traffic falls (docs/offload.md "Where the disk waits").

    offload_phases.py ./train PLAN --set ... --set run.trace=TRACE.json

Runs the training, samples /proc/PID/io (bytes submitted to the block layer, io_uring's included)
every 5 ms on the monotonic clock the trace uses (steady_clock), and prints for each step after
the first the bytes read and written in each phase the rank-0 trace marks: up to the first unit's
forward (the embedding's read), forward, backward, finishing the gradients, the grad norm, the
optimizer step.
"""
import bisect
import json
import subprocess
import sys
import time


def sample(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    io = []
    while p.poll() is None:
        try:
            f = dict(line.split(": ") for line in open(f"/proc/{p.pid}/io").read().splitlines())
            io.append((time.monotonic() * 1e6, int(f["read_bytes"]), int(f["write_bytes"])))
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.005)
    if p.returncode != 0:
        sys.exit(f"offload_phases: {cmd[0]} exited with {p.returncode}")
    return io


def main():
    cmd = sys.argv[1:]
    trace = next(a.split("=", 1)[1] for a in cmd if a.startswith("run.trace="))
    io = sample(cmd)
    times = [s[0] for s in io]
    at = lambda ts: io[max(bisect.bisect_right(times, ts) - 1, 0)][1:]  # bytes by time ts
    t = json.load(open(trace.replace(".json", ".rank0.json")))
    ev = [e for e in (t["traceEvents"] if isinstance(t, dict) else t) if e.get("ph") == "X"]
    steps = sorted((e for e in ev if e["name"].startswith("step ")), key=lambda e: e["ts"])
    for st in steps[1:]:
        s0, s1 = st["ts"], st["ts"] + st["dur"]
        inside = [e for e in ev if s0 <= e["ts"] < s1]
        fw = [e for e in inside if e["name"].startswith("fwd u")]
        bw = [e for e in inside if e["name"].startswith("bwd u")]
        marks = [("to the first unit", s0, min(e["ts"] for e in fw)),
                 ("forward", min(e["ts"] for e in fw), max(e["ts"] + e["dur"] for e in fw)),
                 ("backward", min(e["ts"] for e in bw), max(e["ts"] + e["dur"] for e in bw))]
        for name in ("finish gradients", "grad norm", "adamw"):
            e = [e for e in inside if e["name"] == name and e["tid"] != 6]  # not the CPU ops' lane
            if e:
                marks.append((name, e[0]["ts"], e[0]["ts"] + e[0]["dur"]))
        print(f"{st['name']}: {st['dur'] / 1e6:.2f} s")
        for name, a, b in marks:
            (r0, w0), (r1, w1) = at(a), at(b)
            d = max((b - a) / 1e6, 1e-9)
            print(f"  {name:18s} {(a - s0) / 1e6:6.2f} +{d:5.2f} s  read {(r1 - r0) / 1e9:5.2f} GB  "
                  f"write {(w1 - w0) / 1e9:5.2f} GB  together {(r1 - r0 + w1 - w0) / 1e9 / d:5.2f} GB/s")


if __name__ == "__main__":
    main()
