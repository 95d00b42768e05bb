#!/usr/bin/env python3
"""The pipeline's bubble measured from run.trace (docs/pipeline.md): trains a model cut into P stages
with mesh.pipeline for each m (batch.grad_accum), traced, and from each rank's "pipeline stage" track
(spans F<i> / B<i>, with chunks F<i><chunk letter>) computes per step

  measured   1 - (a rank's busy time in its passes) / (the step's pipeline span: the first forward's
             start to the last backward's end over all ranks), averaged over ranks and steps
             (the first step, warm-up, left out)
  replayed   the same fraction for the schedule's table replayed with the measured mean forward and
             backward time of each stage (what the dependencies alone cost: unequal stages too)
  formula    (P-1)/(m+P-1), interleaved (P-1)/(v m+P-1), which assumes equal stages

Stages are balanced by FLOPs, so on a machine with a core per rank the three agree within the noise of
the passes' timing; `measured - replayed` is what the messages and the runner add.

usage: scripts/pipeline_bubble.py [--train build/train] [--P 2] [--m 1,2,4,8] [--schedule 1f1b] [--chunks 1]
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


def table(schedule, P, m, s, v=1):
    """Rank s's passes in order as (kind, micro-batch, chunk) (pipeline/schedule.h pipe_ops)."""
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule == "interleaved":  # Megatron-LM's order: groups of P micro-batches, chunk by chunk
        def op(k, kind):
            c = (k % (P * v)) // P
            return (kind, (k // (P * v)) * P + k % P, v - 1 - c if kind == "B" else c)
        total = m * v
        warm = min((P - s - 1) * 2 + (v - 1) * P, total)
        out = [op(k, "F") for k in range(warm)]
        for k in range(total - warm):
            out += [op(warm + k, "F"), op(k, "B")]
        return out + [op(k, "B") for k in range(total - warm, total)]
    warm = min(P - s - 1, m)
    out = [("F", i, 0) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        out += [("F", f, 0), ("B", b, 0)]
        f += 1
        b += 1
    out += [("B", i, 0) for i in range(b, m)]
    return out


def replay(schedule, P, m, tf, tb, v=1):
    """Bubble of the tables run with per-rank pass times tf[s], tb[s] (each of its chunks alike)."""
    end, busy = {}, [0.0] * P
    free = [0.0] * P
    order = [table(schedule, P, m, s, v) for s in range(P)]
    pos = [0] * P
    done, last = 0, P * v - 1
    while done < P * 2 * m * v:
        moved = False
        for s in range(P):
            if pos[s] == len(order[s]):
                continue
            k, i, c = order[s][pos[s]]
            j = c * P + s  # the virtual stage
            dep = ("F", j - 1, i) if k == "F" and j > 0 else ("B", j + 1, i) if k == "B" and j < last else \
                ("F", j, i) if k == "B" else None
            if dep and dep not in end:
                continue
            t0 = max(free[s], end[dep] if dep else 0.0)
            d = tf[s] if k == "F" else tb[s]
            end[(k, j, i)] = free[s] = t0 + d
            busy[s] += d
            pos[s] += 1
            done += 1
            moved = True
        if not moved:
            raise RuntimeError("the table would hang")
    span = max(free)
    return sum(1 - b / span for b in busy) / P


def measure(train, P, m, schedule, sets, work, v=1):
    d = os.path.join(work, f"P{P}m{m}")
    os.makedirs(d, exist_ok=True)
    s = {"mesh.pipeline": P, "mesh.schedule": schedule, "mesh.chunks": v, "batch.grad_accum": m, "run.steps": 4,
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
    split = re.search(r"layers ([0-9|, -]+), cut", p.stdout)
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
            "replayed": replay(schedule, P, m, tfm, tbm, v), "formula": (P - 1) / (v * m + P - 1),
            "tf_ms": [x / 1e3 for x in tfm], "tb_ms": [x / 1e3 for x in tbm]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "build", "train"))
    ap.add_argument("--P", type=int, default=2)
    ap.add_argument("--m", default="1,2,4,8")
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--chunks", type=int, default=1, help="mesh.chunks (interleaved: at least 2)")
    ap.add_argument("--sets", nargs="*", default=["model.n_layer=10", "model.n_embd=512", "model.n_head=8",
                                                  "model.seq_len=64", "batch.micro_batch=2"])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sets = dict(x.split("=", 1) for x in a.sets)
    work = tempfile.mkdtemp(prefix="pipeline_bubble.")
    rows = [measure(os.path.realpath(a.train), a.P, int(m), a.schedule, sets, work, a.chunks) for m in a.m.split(",")]
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{a.schedule}{f' v {a.chunks}' if a.chunks > 1 else ''}, P {a.P}, {' '.join(a.sets)} (stages {rows[0]['split']}); bubble = idle fraction of a rank")
    print(f"{'m':>3} {'measured':>9} {'replayed':>9} {'formula':>8}   forward / backward ms per stage")
    for r in rows:
        per = "  ".join(f"{f:.1f}/{b:.1f}" for f, b in zip(r["tf_ms"], r["tb_ms"]))
        print(f"{r['m']:>3} {r['measured']:9.3f} {r['replayed']:9.3f} {r['formula']:8.3f}   {per}")


if __name__ == "__main__":
    main()
