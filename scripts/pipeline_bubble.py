#!/usr/bin/env python3
"""The pipeline's bubble measured from run.trace (docs/pipeline.md): trains a model cut into P stages
with mesh.pipeline for each m (batch.grad_accum), traced, and from each rank's "pipeline stage" track
(spans F<i> / B<i>) computes per step

  measured   1 - (a rank's busy time in its passes) / (the step's pipeline span: the first forward's
             start to the last backward's end over all ranks), averaged over ranks and steps
             (the first step, warm-up, left out)
  replayed   the same fraction for the schedule's table replayed with the measured mean forward and
             backward time of each stage (what the dependencies alone cost: unequal stages too)
  formula    (P-1)/(m+P-1), which assumes equal stages

Stages are balanced by FLOPs, so on a machine with a core per rank the three agree within the noise of
the passes' timing; `measured - replayed` is what the messages and the runner add.

usage: scripts/pipeline_bubble.py [--train build/train] [--P 2] [--m 1,2,4,8] [--schedule 1f1b]
                                  [--sets model.n_embd=512 ...]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def passes(trace):
    ev = json.load(open(trace))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
    steps = sorted((e for e in ev if e.get("ph") == "X" and names.get(e["tid"]) == "step" and
                    e["name"].startswith("step ")), key=lambda e: e["ts"])
    ops = sorted((e for e in ev if e.get("ph") == "X" and names.get(e["tid"]) == "pipeline stage"), key=lambda e: e["ts"])
    return steps, ops


def table(schedule, P, m, s):
    """Rank s's passes in order (pipeline/schedule.h pipe_ops, v = 1)."""
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(P - s - 1, m)
    out = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        out += [("F", f), ("B", b)]
        f += 1
        b += 1
    out += [("B", i) for i in range(b, m)]
    return out


def replay(schedule, P, m, tf, tb):
    """Bubble of the tables run with per-stage pass times tf[s], tb[s]."""
    end, busy = {}, [0.0] * P
    free = [0.0] * P
    order = [table(schedule, P, m, s) for s in range(P)]
    pos = [0] * P
    done = 0
    while done < P * 2 * m:
        moved = False
        for s in range(P):
            if pos[s] == len(order[s]):
                continue
            k, i = order[s][pos[s]]
            dep = ("F", s - 1, i) if k == "F" and s > 0 else ("B", s + 1, i) if k == "B" and s < P - 1 else \
                ("F", s, i) if k == "B" else None
            if dep and dep not in end:
                continue
            t0 = max(free[s], end[dep] if dep else 0.0)
            d = tf[s] if k == "F" else tb[s]
            end[(k, s, i)] = free[s] = t0 + d
            busy[s] += d
            pos[s] += 1
            done += 1
            moved = True
        if not moved:
            raise RuntimeError("the table would hang")
    span = max(free)
    return sum(1 - b / span for b in busy) / P


def measure(train, P, m, schedule, sets, work):
    d = os.path.join(work, f"P{P}m{m}")
    os.makedirs(d, exist_ok=True)
    s = {"mesh.pipeline": P, "mesh.schedule": schedule, "batch.grad_accum": m, "run.steps": 4,
         "run.eval_every": 0, "run.eval_batches": 1, "run.threads": 1, "device": "cpu", "data.tokenizer": "",
         "data.train": "data/sample/train_*.bin", "data.val": "data/sample/val.bin",
         "run.trace": os.path.join(d, "trace.json"), "run.log": os.path.join(d, "metrics.jsonl")}
    s.update(sets)
    args = sum((["--set", f"{k}={v}"] for k, v in s.items()), [])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(["mpirun", "--oversubscribe", "-np", str(P), train, "plans/default.json"] + args, cwd=ROOT,
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"P {P} m {m}: exit {p.returncode}\n{p.stdout[-2000:]}")
    split = re.search(r"layers ([0-9| -]+),", p.stdout)
    ranks = [passes(os.path.join(d, f"trace.rank{r}.json")) for r in range(P)]
    nsteps = min(len(st) for st, _ in ranks)
    fracs, tf, tb = [], [[] for _ in range(P)], [[] for _ in range(P)]
    for k in range(1, nsteps):
        per = []
        for r, (st, ops) in enumerate(ranks):
            t0, t1 = st[k]["ts"], st[k]["ts"] + st[k]["dur"]
            per.append([o for o in ops if t0 <= o["ts"] < t1])
        lo = min(o["ts"] for o in per[0])
        hi = max(o["ts"] + o["dur"] for ops in per for o in ops)
        for r, ops in enumerate(per):
            fracs.append(1 - sum(o["dur"] for o in ops) / (hi - lo))
            tf[r] += [o["dur"] for o in ops if o["name"].startswith("F")]
            tb[r] += [o["dur"] for o in ops if o["name"].startswith("B")]
    mean = lambda xs: sum(xs) / len(xs)
    tfm, tbm = [mean(x) for x in tf], [mean(x) for x in tb]
    return {"P": P, "m": m, "split": split.group(1) if split else "?", "measured": mean(fracs),
            "replayed": replay(schedule, P, m, tfm, tbm), "formula": (P - 1) / (m + P - 1),
            "tf_ms": [x / 1e3 for x in tfm], "tb_ms": [x / 1e3 for x in tbm]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "build", "train"))
    ap.add_argument("--P", type=int, default=2)
    ap.add_argument("--m", default="1,2,4,8")
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--sets", nargs="*", default=["model.n_layer=10", "model.n_embd=512", "model.n_head=8",
                                                  "model.seq_len=64", "batch.micro_batch=2"])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sets = dict(x.split("=", 1) for x in a.sets)
    work = tempfile.mkdtemp(prefix="pipeline_bubble.")
    rows = [measure(os.path.realpath(a.train), a.P, int(m), a.schedule, sets, work) for m in a.m.split(",")]
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{a.schedule}, P {a.P}, {' '.join(a.sets)} (stages {rows[0]['split']}); bubble = idle fraction of a rank")
    print(f"{'m':>3} {'measured':>9} {'replayed':>9} {'formula':>8}   forward / backward ms per stage")
    for r in rows:
        per = "  ".join(f"{f:.1f}/{b:.1f}" for f, b in zip(r["tf_ms"], r["tb_ms"]))
        print(f"{r['m']:>3} {r['measured']:9.3f} {r['replayed']:9.3f} {r['formula']:8.3f}   {per}")


if __name__ == "__main__":
    main()
