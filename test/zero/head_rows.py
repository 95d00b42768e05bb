#!/usr/bin/env python3
"""The LM head over the embedding's rows as its all-gather delivers them (docs/design.md §3.4).

At ZeRO stages 1-2 with overlap on, the embedding's parameter all-gather runs under the next
forward, last; with whole logits (recompute.classifier_chunk 0) the head computes the logits of this
rank's own rows first and of the other ranks' rows range by range as the ring delivers them
(ParamGatherer::head_rows, Comm::all_gather_arrived). A range read before its rows arrived would
read the last step's parameters there.

Oracle: the same run with overlap off, where every all-gather completes on the spot and the head
computes the whole unit at once. Both must agree bit for bit (loss, grad norm per step, final
weights): the schedule changes, the arithmetic does not (every range is wide enough that BLAS keeps
its column-independent kernels; ranges are at least half of 1/16 of the vocabulary).

So that the head really runs ahead of the all-gather on a machine where the ranks share memory, the
comm thread polls every 20 ms (comm.poll_us) and starts one collective at a time (comm.inflight):
each ring segment then takes a poll. The trace of each overlap-on run must show the head's forward
on rank 0 still running when the embedding's all-gather completes (else the check proved nothing).

Worlds 2 and 3 (3: the rows arrive from two ranks, in the ring's order), stages 1 and 2, gradient
accumulation 1 and 2 (the second micro-step reads the gathered embedding); about 1 minute.

  /usr/bin/python3 test/zero/head_rows.py [--train ./train] [--keep]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zero_equivalence as zm  # noqa: E402  (its tiny model and the runs' environment)

ROOT = zm.ROOT
# zero_equivalence's tiny model: C = 35, so rows straddle the shards' boundaries.
MODEL = {"model.n_layer": zm.L, "model.n_head": zm.NH, "model.n_embd": zm.C, "model.seq_len": zm.T,
         "model.vocab_size": zm.V}
STEPS = 4


def run(train, mpirun, np_, stage, accum, overlap, work):
    os.makedirs(work, exist_ok=True)
    sets = dict(MODEL)
    sets.update({
        "data.train": "data/sample/train_*.bin", "data.val": "data/sample/val.bin", "data.tokenizer": "",
        "batch.micro_batch": 2, "batch.grad_accum": accum, "recompute.classifier_chunk": 0,
        "zero.stage": stage, "zero.overlap_comm": "true" if overlap else "false",
        "run.steps": STEPS, "run.eval_every": 0, "run.sample_every": 0, "run.threads": 1,
        "run.log": os.path.join(work, "metrics.jsonl"), "run.final_weights": os.path.join(work, "final.bin"),
    })
    if overlap:
        sets.update({"comm.poll_us": 20000, "comm.inflight": 1, "run.trace": os.path.join(work, "trace.json")})
    cmd = [mpirun, "--oversubscribe", "-np", str(np_), train, "plans/default.json"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    p = subprocess.run(cmd, cwd=ROOT, env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"head_rows: run failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}")
    steps = []
    with open(os.path.join(work, "metrics.jsonl")) as f:
        for r in map(json.loads, f):
            if "step" in r and "loss" in r:
                steps.append((r["step"], r["loss"], r["grad_norm"]))
    with open(os.path.join(work, "final.bin"), "rb") as f:
        weights = f.read()
    return steps, weights


def head_overlapped_gather(work):
    """Steps in which rank 0's LM head computed logits before the embedding's all-gather (unit 0)
    completed: a "fwd u0" span (one per stretch between the head's waits for rows) after the final
    norm's forward ("fwd u{L+1}", so not the lookup's) that ends while the all-gather is in flight."""
    with open(os.path.join(work, "trace.rank0.json")) as f:
        evs = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    final = f"fwd u{MODEL['model.n_layer'] + 1}"
    gathers = [e for e in evs if e["name"].startswith("all_gather") and e.get("args", {}).get("unit") == 0]
    norms = [e for e in evs if e["name"] == final]
    heads = [e for e in evs if e["name"] == "fwd u0" and e["dur"] > 0]
    n = 0
    for g in gathers:
        end = g["ts"] + g["dur"]
        fs = [f["ts"] + f["dur"] for f in norms if g["ts"] < f["ts"] < end]
        n += bool(fs) and any(fs[0] <= h["ts"] and h["ts"] + h["dur"] < end for h in heads)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", default=os.path.join(ROOT, "train"))
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--keep", action="store_true", help="keep the runs' directories")
    a = ap.parse_args()
    top = tempfile.mkdtemp(prefix="zt_head_rows_")
    try:
        fails = check_all(a, top)
    finally:
        if a.keep:
            print(f"runs kept in {top}")
        else:
            shutil.rmtree(top, ignore_errors=True)
    if not fails:
        print("head_rows: every overlap-on run matches its overlap-off run bit for bit")
        return 0
    print("FAIL:\n  " + "\n  ".join(fails))
    return 1


def check_all(a, top):
    fails = []
    for np_, stage, accum in [(2, 1, 1), (2, 2, 2), (3, 1, 2), (3, 2, 1)]:
        tag = f"N={np_} stage={stage} grad_accum={accum}"
        on_dir, off_dir = os.path.join(top, f"on_{np_}_{stage}"), os.path.join(top, f"off_{np_}_{stage}")
        on = run(a.train, a.mpirun, np_, stage, accum, True, on_dir)
        off = run(a.train, a.mpirun, np_, stage, accum, False, off_dir)
        ahead = head_overlapped_gather(on_dir)
        ok = True
        if on[0] != off[0]:
            fails.append(f"{tag}: loss / grad norm with overlap on {on[0]} != off {off[0]}")
            ok = False
        if on[1] != off[1]:
            diff = sum(x != y for x, y in zip(on[1], off[1]))
            fails.append(f"{tag}: final weights differ from the overlap-off run in {diff} bytes")
            ok = False
        if ahead == 0:
            fails.append(f"{tag}: the head never ran while the embedding's all-gather was in flight (trace): "
                         "nothing was checked")
            ok = False
        print(f"{tag}: {'ok' if ok else 'FAIL'} (steps {len(on[0])}, head ahead of the gather in {ahead} step(s))")
    return fails


if __name__ == "__main__":
    sys.exit(main())
