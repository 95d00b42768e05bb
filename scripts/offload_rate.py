#!/usr/bin/env python3
"""The disk bytes an offloaded training step moves, and how fast (docs/offload.md).

    offload_rate.py OUT.json ./train PLAN --set ... --set run.log=METRICS.jsonl

Runs the training and samples /proc/PID/io (the bytes the process's reads and writes took from
and gave to the block layer, io_uring's workers included) each time a step's line appears in
run.log. Per step after the first (which also carries the start-up's tail): read and written
bytes and the seconds between two step lines. Writes OUT.json: {"steps": [{"read", "write", "s"}],
"read", "write", "s" (their sums), "startup_s" (launch to the first step's start: the swap files
created, the parameters initialised into theirs)}.
"""
import json
import os
import subprocess
import sys
import time


def io_bytes(pid):
    f = dict(line.split(": ") for line in open(f"/proc/{pid}/io").read().splitlines())
    return int(f["read_bytes"]), int(f["write_bytes"])


def main():
    out, cmd = sys.argv[1], sys.argv[2:]
    log = next(a.split("=", 1)[1] for a in cmd if a.startswith("run.log="))
    if os.path.exists(log):
        os.remove(log)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    marks, seen = [], 0  # (time, read, write) at each step line
    while p.poll() is None:
        try:
            lines = [l for l in open(log) if '"step"' in l and '"ms"' in l]
        except FileNotFoundError:
            lines = []
        if len(lines) > seen:
            try:
                r, w = io_bytes(p.pid)
            except (FileNotFoundError, ProcessLookupError):
                break
            marks.append((time.perf_counter(), r, w))
            seen = len(lines)
        time.sleep(0.02)
    if p.wait() != 0:
        sys.exit(f"offload_rate: {cmd[0]} exited with {p.returncode}")
    steps = [{"read": b[1] - a[1], "write": b[2] - a[2], "s": b[0] - a[0]} for a, b in zip(marks, marks[1:])]
    if not steps:
        sys.exit("offload_rate: fewer than two steps logged")
    first_ms = json.loads(next(l for l in open(log) if '"step"' in l and '"ms"' in l))["ms"]
    res = {"steps": steps, **{k: sum(s[k] for s in steps) for k in ("read", "write", "s")},
           "startup_s": marks[0][0] - t0 - first_ms / 1e3}
    json.dump(res, open(out, "w"))


if __name__ == "__main__":
    main()
