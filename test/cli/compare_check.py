#!/usr/bin/env python3
"""scripts/compare end to end: two stages and a pipeline at 2 ranks on the committed sample data, a tiny model.

Checks that the table's CSV reports what the runs themselves logged (each run's metrics JSONL
summary and `train estimate --json`, read here independently), that stages 0 and 2 give the same
loss (the engine's promise), that the memory columns differ between the plans (a compare that
repeated one run's numbers would not), and that the three charts are PNG files. plans/pipeline2.json
(2 stages of one rank each) reports its mesh "P2 T1 D1" and, as "across", the bytes rank 0 sent to
the other stage (its summary's bytes_pipeline_group_per_step).

  /usr/bin/python3 test/cli/compare_check.py --train build/../train
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETS = ["data.train=data/sample/train_000.bin", "data.val=data/sample/val.bin", "data.tokenizer=",
        "model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.seq_len=32", "batch.micro_batch=2",
        "run.eval_batches=1", "optim.warmup_steps=1", "run.threads=1"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "train"))
    args = ap.parse_args()
    out = tempfile.mkdtemp(prefix="compare_check.")
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "compare"), "plans/ddp.json", "plans/zero2.json",
           "plans/pipeline2.json", "--ranks", "2",
           "--steps", "3", "--out", out, "--train", args.train] + [a for s in SETS for a in ("--set", s)]
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    text = p.stdout.decode(errors="replace")
    print(text)
    errors = []
    if p.returncode != 0:
        sys.exit(f"FAIL: compare exited {p.returncode}")
    rows = list(csv.DictReader(open(os.path.join(out, "compare.csv"))))
    if [r["plan"] for r in rows] != ["ddp", "zero2", "pipeline2"]:
        errors.append(f"CSV plans {[r['plan'] for r in rows]}, expected ddp, zero2, pipeline2")
    for r in rows:
        log = [json.loads(l) for l in open(os.path.join(out, r["plan"], "metrics.jsonl"))]
        summ = [x["summary"] for x in log if "summary" in x][0]
        steps = [x for x in log if "loss" in x]
        est = json.loads(subprocess.run([args.train, "estimate", f"plans/{r['plan']}.json", "--world", "2", "--json"] +
                                        [a for s in SETS for a in ("--set", s)] + ["--set", "run.steps=3"], cwd=ROOT,
                                        stdout=subprocess.PIPE, check=True).stdout)
        want = {
            "stage": str({"ddp": 0, "zero2": 2, "pipeline2": 1}[r["plan"]]),
            "ranks": "2",
            "tracked_host_bytes": str(summ["peak_memory_bytes"]["host"]["total"]),
            "estimate_host_bytes": str(est["memory"]["host"]["total"]),
            "peak_rss_bytes": str(summ["peak_rss_bytes"]),
            "bytes_per_step": str(summ["bytes_sent_per_step"]),
            "groups": "2",  # one shard group of 2 ranks (hybrid sharding would say "SxR")
            "bytes_across_replicas": str(summ["bytes_replicate_group_per_step"]),
        }
        if r["plan"] == "pipeline2":  # stages x tensor ranks x data ranks; across: between the stages
            want.update(groups="P2 T1 D1", bytes_across_replicas=str(summ["bytes_pipeline_group_per_step"]))
            if summ["bytes_pipeline_group_per_step"] <= 0:
                errors.append("pipeline2: no bytes between the stages in its summary")
        for k, v in want.items():
            if r[k] != v:
                errors.append(f"{r['plan']}: CSV {k} = {r[k]}, the run/estimate say {v}")
        if abs(float(r["final_loss"]) - steps[-1]["loss"]) > 1e-12:
            errors.append(f"{r['plan']}: CSV final_loss {r['final_loss']} != last logged loss {steps[-1]['loss']}")
        if len(steps) != 3:
            errors.append(f"{r['plan']}: {len(steps)} steps logged, asked for 3")
        if int(r["peak_rss_bytes"]) <= int(r["tracked_host_bytes"]):
            errors.append(f"{r['plan']}: resident peak {r['peak_rss_bytes']} not above tracked {r['tracked_host_bytes']}")
    if len(rows) == 3:
        a, b = float(rows[0]["final_loss"]), float(rows[1]["final_loss"])
        if abs(a - b) > 1e-5 * abs(a):
            errors.append(f"stage 0 and stage 2 final losses differ: {a} vs {b}")
        if rows[0]["estimate_host_bytes"] == rows[1]["estimate_host_bytes"]:
            errors.append("stage 0 and stage 2 have the same memory estimate: the column is not per plan")
    for png in ("memory.png", "loss.png", "throughput.png"):
        path = os.path.join(out, png)
        if not os.path.exists(path) or open(path, "rb").read(8) != b"\x89PNG\r\n\x1a\n":
            errors.append(f"{png} missing or not a PNG")
    for line in ("plan", "ddp", "zero2", "pipeline2", "P2 T1 D1", "written to"):
        if line not in text:
            errors.append(f"table output lacks {line!r}")
    if errors:
        print("compare_check FAILED:\n  - " + "\n  - ".join(errors))
        sys.exit(1)
    print(f"compare_check passed ({out})")


if __name__ == "__main__":
    main()
