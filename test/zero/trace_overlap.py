#!/usr/bin/env python3
"""Timeline traces (plan field run.trace, docs/traces.md): the events are well-formed and
show what the engine does.

A 2-rank ZeRO-2 run of a tiny model (grad_accum 1, a bucket size that makes one bucket per unit,
so several buckets), twice: zero.overlap_comm true and false. For each run:

  * every X event has ts, dur >= 0, pid, tid; pid is the file's rank; every track is named
  * collectives (comm tracks) carry seq and bytes; seq strictly increases per rank in start order
  * reduce-scatters carry their bucket; there are forward and backward spans per unit
  * the ops track (CPU backend): every op span inside a step or an evaluation, every step with its
    matmuls, attention and layernorm backward and AdamW; no ops on the CUDA backend
  * scripts/trace_merge gives one process per rank, named "rank R"
  * overlap: a reduce-scatter overlaps backward compute when it is still in flight when the
    backward of a later unit (one that starts after it was launched) begins:
        rs.ts <= bwd.ts < rs.ts + rs.dur     (same rank)
    With overlap on at least one does; with overlap off none does (each bucket's collective is
    waited on before the next unit's backward starts).

With --nccl the same on the CUDA backend's NCCL path (comm.backend "nccl", one emulated device per
rank: ZT_EMU_DEVICES; --train is then build/zt_train_emu, or train on a host with a GPU per rank),
at --stage (2 or 3). Its comm lane is the NCCL comm stream: each collective from enqueue to the host
seeing its completion event. There also:
  * each step's collectives on the comm lanes carry the bytes the run counts
    (sum of their bytes = the summary's bytes_sent_per_step; control collectives aside)
  * no copy-track events (NCCL moves the device buffers: no host copies)
  * stage 3: every all-gather carries its unit

  /usr/bin/python3 test/zero/trace_overlap.py --train build/train [--mpirun mpirun] [--keep]
  /usr/bin/python3 test/zero/trace_overlap.py --train build/zt_train_emu --nccl --stage 3
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NP = 2
STEPS = 4


def env():
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    if os.geteuid() == 0:
        e.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        e.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return e


CONTROL = ("scalar_all_reduce", "scalar_all_gather", "barrier")


def run(train, mpirun, overlap, work, nccl, stage):
    sets = {
        "model.n_layer": 4, "model.n_head": 4, "model.n_embd": 64, "model.seq_len": 64, "model.vocab_size": 50257,
        "data.train": "data/sample/train_000.bin", "data.val": "data/sample/val.bin", "data.tokenizer": "",
        "batch.micro_batch": 2, "batch.grad_accum": 1,
        "zero.stage": stage, "zero.overlap_comm": "true" if overlap else "false", "zero.bucket_mb": 0.05,
        "run.steps": STEPS, "run.eval_every": 0, "run.eval_batches": 1, "run.sample_every": 0, "run.threads": 1,
        "run.log": os.path.join(work, "metrics.jsonl"), "run.trace": os.path.join(work, "trace.json"),
    }
    e = env()
    cmd = [mpirun, "--oversubscribe", "-np", str(NP)]
    if nccl:  # each rank a GPU of its own (under the emulator: an emulated device each)
        sets.update({"device": "cuda", "comm.backend": "nccl", "precision.compute": "fp32"})
        e["ZT_EMU_DEVICES"] = str(NP)
        cmd += ["-x", "ZT_EMU_DEVICES"]
    cmd += [train, "plans/default.json"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    p = subprocess.run(cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"trace_overlap: run failed ({p.returncode}):\n{p.stdout[-3000:]}")
    if nccl and "\ncomm: nccl " not in "\n" + p.stdout:
        raise SystemExit(f"trace_overlap: no 'comm: nccl' line at start:\n{p.stdout[-3000:]}")
    files = sorted(glob.glob(os.path.join(work, "trace.rank*.json")))
    want = [os.path.join(work, f"trace.rank{r}.json") for r in range(NP)]
    if files != want:
        raise SystemExit(f"trace_overlap: expected {want}, found {files}")
    with open(os.path.join(work, "metrics.jsonl")) as f:
        summary = next(r["summary"] for r in map(json.loads, f) if "summary" in r)
    return files, summary


def check(files, summary, overlap, merge_out, fails, nccl, stage):
    tag = f"{'nccl stage ' + str(stage) + ', ' if nccl else ''}overlap {'on' if overlap else 'off'}"

    def fail(msg):
        fails.append(f"{tag}: {msg}")

    overlapping = []
    n_rs = 0
    for rank, path in enumerate(files):
        with open(path) as f:
            doc = json.load(f)  # the file must be valid JSON (closed properly)
        evs = doc["traceEvents"]
        named = {e["tid"] for e in evs if e.get("ph") == "M" and e.get("name") == "thread_name"}
        procs = [e for e in evs if e.get("ph") == "M" and e.get("name") == "process_name"]
        if len(procs) != 1 or procs[0]["args"]["name"] != f"rank {rank}":
            fail(f"rank {rank}: process_name metadata {procs}")
        xs = [e for e in evs if e.get("ph") == "X"]
        if not xs:
            fail(f"rank {rank}: no X events")
        for e in xs:
            for k in ("name", "ts", "dur", "pid", "tid"):
                if k not in e:
                    fail(f"rank {rank}: X event without {k}: {e}")
                    break
            else:
                if e["dur"] < 0 or e["pid"] != rank or e["tid"] not in named:
                    fail(f"rank {rank}: bad X event {e}")
        comm_tids = {e["tid"] for e in evs if e.get("ph") == "M" and e.get("name") == "thread_name"
                     and e["args"]["name"].startswith("comm")}
        colls = sorted((e for e in xs if e["tid"] in comm_tids), key=lambda e: (e["ts"], e["args"]["seq"]))
        seqs = [e["args"]["seq"] for e in colls]
        if any(b <= a for a, b in zip(seqs, seqs[1:])):
            fail(f"rank {rank}: collective sequence numbers not strictly increasing in start order: {seqs[:40]}")
        if any("bytes" not in e["args"] for e in colls):
            fail(f"rank {rank}: a collective without bytes")
        # Gradient reduce-scatters (the embedding lookup's rows, tagged "lookup", carry no bucket).
        rs = [e for e in colls if e["name"] == "reduce_scatter" and "lookup" not in e["args"]]
        n_rs += len(rs)
        if not rs or any("bucket" not in e["args"] for e in rs):
            fail(f"rank {rank}: reduce-scatters missing or without their bucket ({len(rs)})")
        buckets = {e["args"]["bucket"] for e in rs}
        if len(buckets) < 3:
            fail(f"rank {rank}: expected several buckets, got {sorted(buckets)}")
        if nccl:
            copies = [e for e in evs if e.get("tid") == 5 and e.get("ph") in ("X", "i")]
            if copies:
                fail(f"rank {rank}: {len(copies)} copy-track events on the NCCL path, e.g. {copies[0]}")
            # Within each step's span (the evaluation after the last step gathers too, still as its step).
            spans = {e["args"]["step"]: (e["ts"], e["ts"] + e["dur"]) for e in xs
                     if e["tid"] == 0 and e["name"].startswith("step ")}
            per_step = {}
            for e in colls:
                k = e["args"]["step"]
                if e["name"] not in CONTROL and k in spans and spans[k][0] <= e["ts"] <= spans[k][1]:
                    per_step[k] = per_step.get(k, 0) + e["args"]["bytes"]
            want = summary["bytes_sent_per_step"]
            if sorted(per_step) != list(range(STEPS)) or any(b != want for b in per_step.values()):
                fail(f"rank {rank}: comm-lane bytes per step {per_step}, the run counts {want}")
            if stage == 3 and any("unit" not in e["args"] for e in colls if e["name"] == "all_gather"
                                  and "lookup" not in e["args"]):
                fail(f"rank {rank}: an all-gather without its unit")
        bwd = [e for e in xs if e["name"].startswith("bwd u")]
        fwd = [e for e in xs if e["name"].startswith("fwd u")]
        units = {e["args"]["unit"] for e in bwd}
        if stage == 2 and (len(units) != 4 + 2 or len(bwd) != STEPS * (4 + 3) or not fwd):
            fail(f"rank {rank}: backward spans per unit: {len(bwd)} over units {sorted(units)}")
        # Stage 3 splits the embedding into units of rows (zero_embedding_rows): every unit that runs
        # forward runs backward, in every step.
        fwd_units = {e["args"]["unit"] for e in fwd}
        if stage == 3 and (units != fwd_units or len(units) < 4 + 2 or len(bwd) % STEPS):
            fail(f"rank {rank}: backward spans per unit: {len(bwd)} over units {sorted(units)}, "
                 f"forward over {sorted(fwd_units)}")
        # The ops track (6): the CPU backend's ops, one span per call, each inside a step or an
        # evaluation, every step with the ops of forward, backward and the update; none on CUDA.
        ops = [e for e in xs if e["tid"] == 6]
        if nccl and ops:
            fail(f"rank {rank}: {len(ops)} ops-track events on the CUDA backend, e.g. {ops[0]}")
        if not nccl:
            outer = [(e["ts"], e["ts"] + e["dur"]) for e in xs if e["tid"] == 0]
            loose = [e for e in ops if not any(t0 <= e["ts"] and e["ts"] + e["dur"] <= t1 for t0, t1 in outer)]
            if loose:
                fail(f"rank {rank}: {len(loose)} ops outside every step and evaluation, e.g. {loose[0]}")
            for e in xs:
                if e["tid"] == 0 and e["name"].startswith("step "):
                    inside = {o["name"] for o in ops if e["ts"] <= o["ts"] < e["ts"] + e["dur"]}
                    need = {"matmul_forward", "attention_backward", "layernorm_backward", "adamw"}
                    if not need <= inside:
                        fail(f"rank {rank}: {e['name']} lacks ops {sorted(need - inside)} on the ops track")
        waits = [e for e in xs if e["name"].startswith("wait #")]
        if not any(e["name"] == "adamw" for e in xs):
            fail(f"rank {rank}: no adamw event")
        # NCCL at stage 3 with overlap: the compute stream waits on the collectives' events and the
        # host does not block (docs/design.md §3.4), so there is no wait to draw; elsewhere the host waits.
        if nccl and stage == 3 and overlap:
            if waits:
                fail(f"rank {rank}: {len(waits)} host waits on the NCCL path at stage 3, e.g. {waits[0]}")
        elif not waits:
            fail(f"rank {rank}: no wait events")
        for r in rs:
            for b in bwd:
                if r["ts"] <= b["ts"] < r["ts"] + r["dur"]:
                    overlapping.append((rank, r["args"]["seq"], r["args"]["bucket"], b["name"]))
    print(f"{tag}: {n_rs} reduce-scatters, {len(overlapping)} (rs, later backward) overlaps"
          + (f", e.g. rank {overlapping[0][0]} seq {overlapping[0][1]} bucket {overlapping[0][2]} "
             f"in flight as {overlapping[0][3]} starts" if overlapping else ""))
    if overlap and not overlapping:
        fail("no reduce-scatter overlaps the backward of a later unit (communication does not overlap compute)")
    if not overlap and overlapping:
        fail(f"{len(overlapping)} reduce-scatters overlap a later backward on the naive path: {overlapping[:5]}")

    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "trace_merge"), merge_out] + files,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        fail(f"trace_merge failed: {p.stdout}")
        return
    with open(merge_out) as f:
        merged = json.load(f)["traceEvents"]
    procs = sorted((e["pid"], e["args"]["name"]) for e in merged if e.get("ph") == "M" and e["name"] == "process_name")
    if procs != [(r, f"rank {r}") for r in range(NP)]:
        fail(f"merged file: processes {procs}")
    if {e["pid"] for e in merged} != set(range(NP)):
        fail("merged file: events outside the ranks' processes")
    if min(e["ts"] for e in merged if "ts" in e) != 0:
        fail("merged file: not shifted to start at 0")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "build", "train"))
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--nccl", action="store_true", help="device cuda, comm.backend nccl, a GPU per rank")
    ap.add_argument("--stage", type=int, default=2, choices=(2, 3))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="zt_trace_")
    fails = []
    try:
        for overlap in (True, False):
            d = os.path.join(work, f"overlap{int(overlap)}")
            os.makedirs(d)
            files, summary = run(os.path.abspath(args.train), args.mpirun, overlap, d, args.nccl, args.stage)
            check(files, summary, overlap, os.path.join(d, "merged.json"), fails, args.nccl, args.stage)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if fails:
        print("FAILED:\n  " + "\n  ".join(fails))
        return 1
    print("trace_overlap: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
