#!/usr/bin/env python3
"""Pipeline parallelism (mesh.pipeline, issue 54) against one rank, fp32 CPU.

Every row trains a 5-layer model for 10 steps with the blocks cut into P stages (P 2 and P 3, both
uneven: 5 blocks, the head on the last stage) under each schedule (gpipe, 1f1b), with fewer
micro-batches (batch.grad_accum = m) than stages, as many, and more; P 2 x T 2 (tensor parallelism
inside each stage, with and without sequence parallelism), P 2 x data 2 at ZeRO stages 0 and 1, and
the 8-rank P 2 x T 2 x data 2, P 2 x data 2 with hybrid sharding inside the stages (zero.shard_group
1: two replicas of one-rank shard groups per stage) and with the optimizer state offloaded to disk
(offload.optimizer nvme); recompute inside the stages and a chunked classifier under GPipe (every
forward before the first backward); gradient clipping on and off; interleaved 1F1B with 2 and 3
model chunks per rank (mesh.chunks; P 2 and P 3, 5-7 layers, m = P to 3P), with recompute, with
P 2 x T 2 + sequence parallelism and with P 2 x data 2 at stage 1. The oracle: one rank, ZeRO stage
0, the same global batch (micro_batch x data axis) and m.

Per row:
  * every step's loss within 1e-5 relative, grad norm within 1e-4 (clipping spans all stages: the
    norm sums every stage's units and the tied embedding once), the final val loss within 1e-5
    (evaluation runs through the stages);
  * the banner's stage split equals the rule (blocks cut by forward FLOPs into P v parts, the last
    paying for the head; of equal splits the later parts hold more; stage s holds parts c P + s)
    computed here from the model's FLOPs;
  * every rank's tracked peak activations and total equal `train estimate`'s for its stage
    (pipeline_stages[s]), and the activations are its schedule's in-flight micro-batches: at m > P,
    1F1B's first stage holds P micro-batches, GPipe's m (so 1F1B's first stage is below GPipe's);
  * rank 0's bytes on the pipeline group (one tensor and data rank) equal the byte model.

Samples through the stages (P 3, P 2 x T 2 + SP, interleaved P 2 x 2 chunks) equal one rank's text.

Refusals (one line starting with "error", non-zero exit, nothing written; under mpirun and by
`train estimate`): more stages than blocks, a world the stages do not divide, ZeRO stage 2 and 3
(their per-micro-batch traffic, stated), interleaved with one chunk, with m not a multiple of P and
with more virtual stages than blocks, chunks without "interleaved", parameter offload (stage 3 only).

  /usr/bin/python3 test/pipeline/pipeline_equivalence.py [--train ./train] [--mpirun mpirun] [--keep]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "test", "zero"))
import zero_equivalence as zm  # noqa: E402  (launcher, env)

L, NH, C, SEQ, V = 5, 4, 32, 16, 50257
VP = (V + 127) // 128 * 128
STEPS = 10
LOSS_TOL, NORM_TOL = 1e-5, 1e-4
RSS_SLACK = 8 << 20  # as test/zero/memory_formulas.py


class Row:
    def __init__(self, P, W, sched, m, stage=0, T=1, B=2, extra=None, v=1):
        self.P, self.W, self.sched, self.m, self.stage, self.T, self.B, self.v = P, W, sched, m, stage, T, B, v
        self.extra = extra or {}
        self.L = int(self.extra.get("model.n_layer", L))

    @property
    def data(self):
        return self.W // (self.P * self.T)

    def sets(self):
        s = {"mesh.pipeline": self.P, "mesh.schedule": self.sched, "mesh.tensor": self.T,
             "mesh.chunks": self.v, "zero.stage": self.stage, "batch.micro_batch": self.B, "batch.grad_accum": self.m}
        s.update(self.extra)
        return s

    def ref_key(self):
        # offload moves the optimizer state, not its arithmetic: the reference keeps it in memory
        same = {k: v for k, v in self.extra.items() if not k.startswith(("mesh.", "offload."))}
        return (self.m, self.B * self.data, tuple(sorted(same.items())))

    def name(self):
        x = "".join(f" {k.split('.')[-1]}={v}" for k, v in self.extra.items())
        v = f" v{self.v}" if self.v > 1 else ""
        return f"P{self.P} T{self.T} data{self.data} W{self.W} {self.sched:5s}{v} m{self.m} stage{self.stage}{x}"


ROWS = [
    Row(2, 2, "1f1b", 4), Row(2, 2, "gpipe", 4), Row(2, 2, "1f1b", 2), Row(2, 2, "gpipe", 1), Row(2, 2, "1f1b", 1),
    Row(3, 3, "1f1b", 2), Row(3, 3, "gpipe", 2), Row(3, 3, "1f1b", 3), Row(3, 3, "1f1b", 5), Row(3, 3, "gpipe", 5),
    Row(2, 4, "1f1b", 3, T=2), Row(2, 4, "gpipe", 2, T=2, extra={"mesh.sequence_parallel": "true"}),
    Row(2, 4, "1f1b", 4, stage=1, B=1), Row(2, 4, "gpipe", 2, stage=0, B=1),
    Row(2, 8, "1f1b", 4, stage=1, T=2, B=1),
    Row(2, 4, "1f1b", 2, stage=1, B=1, extra={"zero.shard_group": "1"}),
    Row(2, 4, "gpipe", 3, stage=1, B=1, extra={"offload.optimizer": "nvme", "offload.nvme_dir": "@nvme"}),
    Row(3, 3, "1f1b", 4, extra={"recompute.policy": "selective"}),
    Row(2, 2, "gpipe", 3, extra={"recompute.classifier_chunk": 8, "recompute.policy": "block"}),
    Row(3, 3, "1f1b", 3, extra={"optim.grad_clip": 0.0}),
    # interleaved: v model chunks per rank, m a multiple of P
    Row(2, 2, "interleaved", 2, v=2), Row(2, 2, "interleaved", 6, v=2),
    Row(3, 3, "interleaved", 3, v=2, extra={"model.n_layer": 7}),
    Row(2, 2, "interleaved", 4, v=3, extra={"model.n_layer": 6, "recompute.policy": "selective"}),
    Row(2, 4, "interleaved", 2, v=2, T=2, extra={"mesh.sequence_parallel": "true"}),
    Row(2, 4, "interleaved", 4, v=2, stage=1, B=1),
]

# (world, plan fields, regexes the one error line must match)
REFUSALS = [
    (2, {"mesh.pipeline": 6}, [r"mesh\.pipeline", r"\b6\b", r"n_layer", r"\b5\b"]),
    (3, {"mesh.pipeline": 2}, [r"mesh\.pipeline", r"\b2\b", r"divide", r"\b3\b"]),
    (2, {"mesh.pipeline": 2, "zero.stage": 2}, [r"zero\.stage", r"every micro-batch", r"0 or 1"]),
    (2, {"mesh.pipeline": 2, "zero.stage": 3}, [r"zero\.stage", r"every micro-batch", r"0 or 1"]),
    (2, {"mesh.pipeline": 2, "mesh.schedule": "interleaved"}, [r"mesh\.chunks", r"at least 2", r"1f1b"]),
    (2, {"mesh.pipeline": 2, "mesh.schedule": "interleaved", "mesh.chunks": 2, "batch.grad_accum": 3},
     [r"batch\.grad_accum", r"\b3\b", r"multiple of 2"]),
    (2, {"mesh.pipeline": 2, "mesh.schedule": "interleaved", "mesh.chunks": 3, "batch.grad_accum": 2},
     [r"mesh\.chunks", r"\b6\b", r"n_layer 5"]),
    (2, {"mesh.pipeline": 2, "mesh.chunks": 2}, [r"mesh\.chunks", r"interleaved", r"1f1b"]),
    (2, {"mesh.pipeline": 2, "zero.stage": 1, "offload.params": "nvme", "offload.nvme_dir": "@nvme"},
     [r"offload\.params", r"zero\.stage 3"]),
]


def plan_sets(workdir, extra):
    s = {"model.n_layer": L, "model.n_head": NH, "model.n_embd": C, "model.seq_len": SEQ, "model.vocab_size": V,
         "data.train": "data/sample/train_*.bin", "data.val": "data/sample/val.bin", "data.tokenizer": "",
         "optim.lr": 3e-3, "optim.warmup_steps": 2, "optim.grad_clip": 1.0, "device": "cpu",
         "run.steps": STEPS, "run.eval_every": 0, "run.eval_batches": 2, "run.sample_every": 0,
         "run.threads": 1, "comm.timeout_s": 60, "run.log": os.path.join(workdir, "metrics.jsonl")}
    # "@name": a path in the run's directory
    s.update({k: (os.path.join(workdir, v[1:]) if isinstance(v, str) and v.startswith("@") else v)
              for k, v in extra.items()})
    out = []
    for k, v in s.items():
        out += ["--set", f"{k}={v}"]
    return out


def estimate(train, W, sets):
    p = subprocess.run([train, "estimate", "plans/default.json", "--world", str(W), "--json"] + sets, cwd=ROOT,
                       env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    if p.returncode != 0:
        raise zm.RunFailed(f"estimate --world {W} failed ({p.returncode}): {p.stderr.decode(errors='replace')}")
    return json.loads(p.stdout)


def run(train, mpirun, W, workdir, extra, timeout, n_steps=STEPS):
    os.makedirs(workdir, exist_ok=True)
    sets = plan_sets(workdir, extra)
    cmd = zm.launcher(mpirun, W) + [train, "plans/default.json"] + sets
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    secs = time.monotonic() - t0
    with open(os.path.join(workdir, "output.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n\n" + p.stdout)
    if p.returncode != 0:
        raise zm.RunFailed(f"exit {p.returncode}: {' '.join(cmd)}\n" + "\n".join(p.stdout.splitlines()[-12:]))
    rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    steps = [r for r in rows if "loss" in r and "step" in r]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    summ = [r["summary"] for r in rows if "summary" in r]
    if len(steps) != n_steps or len(summ) != 1 or not val:
        raise zm.RunFailed(f"{len(steps)} step lines, {len(summ)} summaries, {len(val)} val losses in {workdir}")
    return {"steps": steps, "val": val[-1], "summary": summ[0], "out": p.stdout, "secs": secs,
            "estimate": estimate(train, W, sets)}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def flops_split(P, B, T=1, layers=L):
    """The stage split the run must make: blocks by forward FLOPs (GPT::forward_flops: 2 per multiply-add
    of the matmuls, 12 C^2 / T per token; causal attention B (C / T) Tn (Tn + 1) multiply-adds), the
    head's 2 N C Vp / T on the last stage. The rule (pipeline/schedule.h balance_blocks): the last stage
    starts where the most expensive stage is least, the stages before it split the same way among
    themselves (so they are balanced too), and of equal choices the later stage holds more blocks."""
    N = B * SEQ
    block = 2.0 * N * 12 * C * C / T + 2.0 * B * (C / T) * SEQ * (SEQ + 1)
    head = 2.0 * N * C * VP / T

    def cost(p, a, b):  # part p of P holding blocks [a, b)
        return (b - a) * block + (head if p == P - 1 else 0.0)

    def best(p, b):  # parts 0..p over blocks [0, b): (most expensive, counts)
        if p == 0:
            return cost(0, 0, b), [b]
        choice = None
        for a in range(p, b):
            prev, counts = best(p - 1, a)
            c = max(prev, cost(p, a, b))
            if choice is None or c < choice[0]:
                choice = (c, counts + [b - a])
        return choice
    return best(P - 1, layers)[1]


def describe_split(s, P):
    """Stage by stage; with chunks (len(s) = P v parts) a stage's parts p = c P + stage, comma-separated."""
    runs, first = [], 0
    for n in s:
        runs.append(f"{first}-{first + n - 1}" if n > 1 else f"{first}")
        first += n
    return " | ".join(",".join(runs[j] for j in range(st, len(s), P)) for st in range(P))


def check_row(r, res, ref, errs):
    m = {}
    losses = [x["loss"] for x in res["steps"]]
    norms = [x["grad_norm"] for x in res["steps"]]
    rl = [x["loss"] for x in ref["steps"]]
    rn = [x["grad_norm"] for x in ref["steps"]]
    m["loss"] = max(rel(a, b) for a, b in zip(losses, rl))
    m["norm"] = max(rel(a, b) for a, b in zip(norms, rn))
    m["val"] = rel(res["val"], ref["val"])
    if m["loss"] > LOSS_TOL or m["val"] > LOSS_TOL:
        errs.append(f"{r.name()}: loss rel err {m['loss']:.2e}, val {m['val']:.2e} (tol {LOSS_TOL})")
    if m["norm"] > NORM_TOL:
        errs.append(f"{r.name()}: grad norm rel err {m['norm']:.2e} (tol {NORM_TOL})")
    # The split.
    want = describe_split(flops_split(r.P * r.v, r.B, r.T, r.L), r.P)
    got = re.search(r"mesh: pipeline of \d+ stages \(layers ([0-9|, -]+), cut", res["out"])
    m["split"] = got.group(1) if got else "?"
    if m["split"] != want:
        errs.append(f"{r.name()}: stage split {m['split']!r}, the FLOPs rule gives {want!r}")
    # Memory: tracked per rank == the estimate of its stage.
    s, est = res["summary"], res["estimate"]
    stages = est.get("pipeline_stages", [])
    acts, tracked = s.get("peak_activation_bytes_per_rank", []), s.get("peak_tracked_bytes_per_rank", [])
    per_stage = r.W // r.P
    bad = []
    for rank in range(r.W):
        st = stages[rank // per_stage] if len(stages) == r.P else {}
        e = st.get("memory", {}).get("host", {})
        if rank >= len(acts) or acts[rank] != e.get("activations") or tracked[rank] != e.get("total"):
            bad.append((rank, acts[rank] if rank < len(acts) else None, e.get("activations"),
                        tracked[rank] if rank < len(tracked) else None, e.get("total")))
    m["mem"] = not bad
    if bad:
        errs.append(f"{r.name()}: tracked != estimate per stage (rank, acts, est, total, est): {bad[:3]}")
    m["slots"] = [st.get("activation_slots") for st in stages]
    m["acts0"] = acts[0] if acts else None
    # Rank 0's bytes on the pipeline group (one tensor and data rank: the byte model is plain): m
    # (B, T, C) boundaries forward, and the tied embedding's gradient (the embedding unit: wte's
    # padded rows and wpe, padded to the unit multiple) once, to the last stage. With v chunks, each
    # chunk's forward sends its output, and each but the first's backward its input gradient.
    if r.T == 1 and r.data == 1:
        want_b = (2 * r.v - 1) * r.m * r.B * SEQ * C * 4 + (VP + SEQ) * C * 4
        got_b = s.get("bytes_pipeline_group_per_step", 0)
        if abs(got_b - want_b) > 0.01 * want_b:
            errs.append(f"{r.name()}: bytes_pipeline_group_per_step {got_b}, the byte model {want_b}")
    return m


def shipped_plan(train, mpirun, work, timeout):
    """plans/pipeline2.json as users run it (only the data, the step count and the sample's place changed)
    at 4 ranks (P 2 x data 2, ZeRO-1, 1F1B over 4 micro-batches), against plans/zero1.json at 2 ranks with
    the same global batch (grad_accum 4): losses, val loss, and the text sampled after step 3 (through
    the stages: the last draws each token, the first looks it up)."""
    runs, texts = {}, {}
    for name, plan, W, extra in (("pipeline2", "plans/pipeline2.json", 4, []),
                                 ("zero1", "plans/zero1.json", 2, ["--set", "batch.grad_accum=4"])):
        d = os.path.join(work, "shipped_" + name)
        os.makedirs(d)
        sets = ["--set", "data.train=data/sample/train_*.bin", "--set", "data.val=data/sample/val.bin",
                "--set", "data.tokenizer=data/sample/gpt2_tokenizer.bin", "--set", "run.sample_every=3",
                "--set", "run.sample_tokens=24",
                "--set", "run.steps=3", "--set", "device=cpu", "--set", f"run.log={d}/metrics.jsonl"] + extra
        p = subprocess.run(zm.launcher(mpirun, W) + [train, plan] + sets, cwd=ROOT, env=zm.env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if p.returncode != 0:
            return [f"shipped plan {plan} at {W} ranks: exit {p.returncode}: {p.stdout.strip()[-300:]}"]
        texts[name] = re.findall(r"---- sample at step 3 ----\n(.*)\n", p.stdout)
        rows = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
        runs[name] = ([r["loss"] for r in rows if "loss" in r and "step" in r],
                      [r["val_loss"] for r in rows if "val_loss" in r], next(r["summary"] for r in rows if "summary" in r))
    (a, va, sa), (b, vb, _) = runs["pipeline2"], runs["zero1"]
    worst = max(rel(x, y) for x, y in zip(a + va, b + vb)) if len(a) == len(b) == 3 and va and len(va) == len(vb) \
        else float("inf")
    same_text = len(texts["pipeline2"]) == 1 and texts["pipeline2"] == texts["zero1"] and texts["zero1"][0].strip()
    ok = worst <= LOSS_TOL and sa.get("pipeline") == 2 and bool(same_text)
    print(f"  {'ok ' if ok else 'BAD'} plans/pipeline2.json at 4 ranks against plans/zero1.json at 2: losses and val "
          f"loss rel err {worst:.2e}, the same sample after step 3: {texts['pipeline2'][:1]}", flush=True)
    return [] if ok else [f"shipped plans/pipeline2.json: rel err {worst:.2e} against plans/zero1.json, pipeline "
                          f"{sa.get('pipeline')}, samples {texts}"]


def samples(train, mpirun, work, timeout):
    """Sampling through the stages (run.sample_every): P 3 (1F1B, m 4), interleaved P 2 x 2 chunks and P 2 x T 2 with sequence
    parallelism (each token's (1, t, C) boundary is t padded to a multiple of T, cut T ways) print the
    text one rank prints after the same 2 steps."""
    out = {}
    for name, W, mesh in (("one", 1, {}), ("P3", 3, {"mesh.pipeline": 3}),
                          ("P2T2sp", 4, {"mesh.pipeline": 2, "mesh.tensor": 2, "mesh.sequence_parallel": "true"}),
                          ("P2v2", 2, {"mesh.pipeline": 2, "mesh.schedule": "interleaved", "mesh.chunks": 2})):
        d = os.path.join(work, "sample_" + name)
        os.makedirs(d)
        extra = dict(mesh, **{"data.tokenizer": "data/sample/gpt2_tokenizer.bin", "run.sample_every": 2,
                              "run.sample_tokens": 15, "run.steps": 2, "batch.grad_accum": 4, "batch.micro_batch": 2})
        p = subprocess.run(zm.launcher(mpirun, W) + [train, "plans/default.json"] + plan_sets(d, extra), cwd=ROOT,
                           env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        out[name] = re.findall(r"---- sample at step 2 ----\n(.*)\n", p.stdout) if p.returncode == 0 else \
            [f"exit {p.returncode}: {p.stdout.strip()[-200:]}"]
    errs = []
    for name in ("P3", "P2T2sp", "P2v2"):
        ok = len(out["one"]) == 1 and out["one"][0].strip() and out[name] == out["one"]
        print(f"  {'ok ' if ok else 'BAD'} {name} samples what one rank samples: {out[name]}", flush=True)
        if not ok:
            errs.append(f"sample at {name}: {out[name]} against one rank's {out['one']}")
    return errs


def resident(train, mpirun, work, timeout):
    return resident_case(train, mpirun, work, timeout, "P 3", 3, {"mesh.pipeline": 3}) + resident_case(
        train, mpirun, work, timeout, "P 2 x 3 chunks", 2,
        {"mesh.pipeline": 2, "mesh.schedule": "interleaved", "mesh.chunks": 3, "batch.grad_accum": 4})


def resident_case(train, mpirun, work, timeout, label, P, mesh):
    """Real memory per stage: 3 stages hold very different buffers (the first the embedding, the middle
    neither embedding nor head, the last the embedding and the head's logits), so each rank's VmHWM minus
    `train estimate`'s total for its stage (what the process holds besides the tracked buffers: libraries,
    runtimes, MPI) must be the same on every rank within RSS_SLACK. A buffer a stage allocates that its
    estimate does not count, or one it counts and never allocates, of more than that fails. The same for
    interleaved P 2 x 3 chunks (each stage three runs of blocks, the slots of whole micro-batches)."""
    d = os.path.join(work, "resident" + str(P))
    os.makedirs(d)
    extra = dict({"model.n_layer": 6, "model.n_embd": 128, "model.seq_len": 64, "batch.micro_batch": 4,
                  "batch.grad_accum": 3, "run.steps": 2}, **mesh)
    res = run(train, mpirun, P, d, extra, timeout, n_steps=2)
    rss = res["summary"].get("peak_rss_bytes_per_rank", [])
    est = [st["memory"]["host"]["total"] for st in res["estimate"].get("pipeline_stages", [])]
    if len(rss) != P or len(est) != P:
        return [f"resident {label}: {len(rss)} RSS values, {len(est)} stage estimates"]
    over = [r - e for r, e in zip(rss, est)]
    spread = max(over) - min(over)
    ok = spread <= RSS_SLACK
    mib = lambda x: f"{x / 2**20:.1f}"
    print(f"  {'ok ' if ok else 'BAD'} resident per stage ({label}, 6 x 128 channels): estimate {'/'.join(map(mib, est))} MiB, "
          f"VmHWM {'/'.join(map(mib, rss))} MiB, untracked {'/'.join(map(mib, over))} MiB: spread "
          f"{mib(spread)} MiB (slack {mib(RSS_SLACK)})", flush=True)
    return [] if ok else [f"resident {label}: VmHWM - estimate per stage {over} spreads {spread} B > {RSS_SLACK}"]


def refusal(train, mpirun, work, i, how):
    W, extra, says = REFUSALS[i]
    d = os.path.join(work, f"refusal{i}_{how}")
    os.makedirs(d)
    sets = plan_sets(d, extra)
    cmd = ([train, "estimate", "plans/default.json", "--world", str(W)] if how == "estimate"
           else zm.launcher(mpirun, W) + [train, "plans/default.json"]) + sets
    p = subprocess.run(cmd, cwd=ROOT, env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    lines = [l for l in p.stdout.splitlines() if l.startswith("error")]
    written = sorted(os.listdir(d))
    ok = p.returncode != 0 and len(lines) == 1 and all(re.search(s, lines[0]) for s in says) and not written
    name = " ".join(f"{k}={v}" for k, v in extra.items())
    print(f"  {'ok ' if ok else 'BAD'} {how:8s} W={W} {name}: exit {p.returncode}: "
          f"{lines[0][:160] if lines else p.stdout.strip()[-160:]}", flush=True)
    return None if ok else f"refusal {name} ({how}): exit {p.returncode}, lines {lines[:2]}, wanted {says}, written {written}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "train"))
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--timeout", type=int, default=300)
    a = ap.parse_args()
    train = os.path.realpath(a.train)
    work = tempfile.mkdtemp(prefix="pipeline_equivalence.")
    t0 = time.monotonic()
    errs = []
    refs = {}
    try:
        for r in ROWS:
            k = r.ref_key()
            if k in refs:
                continue
            m, B, same = k
            refs[k] = run(train, a.mpirun, 1, os.path.join(work, f"ref{len(refs)}"),
                          dict(same, **{"batch.micro_batch": B, "batch.grad_accum": m}), a.timeout)
            print(f"reference m {m} B {B} {dict(same)}: loss {refs[k]['steps'][0]['loss']:.4f} -> "
                  f"{refs[k]['steps'][-1]['loss']:.4f}, val {refs[k]['val']:.4f}, {refs[k]['secs']:.1f} s", flush=True)
        print(f"\n{'row':72s} {'loss err':>9s} {'norm err':>9s} {'val err':>9s}  {'split':14s} {'slots':10s} mem   sec")
        results = {}
        for i, r in enumerate(ROWS):
            try:
                res = run(train, a.mpirun, r.W, os.path.join(work, f"row{i}"), r.sets(), a.timeout)
            except (zm.RunFailed, subprocess.TimeoutExpired) as e:
                errs.append(f"{r.name()}: {e}")
                print(f"{r.name():72s} FAILED: {str(e).splitlines()[0][:120]}", flush=True)
                continue
            m = check_row(r, res, refs[r.ref_key()], errs)
            results[i] = m
            print(f"{r.name():72s} {m['loss']:9.2e} {m['norm']:9.2e} {m['val']:9.2e}  {m['split']:14s} "
                  f"{'|'.join(map(str, m['slots'])):10s} {'ok' if m['mem'] else 'BAD':4s} {res['secs']:5.1f}", flush=True)
        # 1F1B against GPipe at m > P: the first stage holds P micro-batches, not m.
        for a_i, b_i in ((8, 9), (0, 1)):
            if a_i in results and b_i in results:
                f, g = results[a_i], results[b_i]
                P, mm = ROWS[a_i].P, ROWS[a_i].m
                ok = f["slots"][0] == P and g["slots"][0] == mm and f["acts0"] < g["acts0"]
                print(f"  {'ok ' if ok else 'BAD'} P {P} m {mm}: first stage holds {f['slots'][0]} micro-batches under "
                      f"1f1b ({f['acts0']} B of activations), {g['slots'][0]} under gpipe ({g['acts0']} B)")
                if not ok:
                    errs.append(f"1f1b vs gpipe at P {P} m {mm}: slots {f['slots']} vs {g['slots']}, "
                                f"activations {f['acts0']} vs {g['acts0']}")
        print("\nthe shipped plan and real memory:")
        errs += shipped_plan(train, a.mpirun, work, a.timeout)
        errs += samples(train, a.mpirun, work, a.timeout)
        errs += resident(train, a.mpirun, work, a.timeout)
        print("\nrefusals:")
        for i in range(len(REFUSALS)):
            for how in ("mpirun", "estimate"):
                e = refusal(train, a.mpirun, work, i, how)
                if e:
                    errs.append(e)
    except (zm.RunFailed, subprocess.TimeoutExpired) as e:
        errs.append(f"reference: {e}")
    print(f"\n{len(ROWS)} pipeline runs + {len(refs)} references + {2 * len(REFUSALS)} refusals in "
          f"{time.monotonic() - t0:.0f} s; run directories in {work}")
    if not a.keep and not errs:
        shutil.rmtree(work, ignore_errors=True)
    if errs:
        print(f"\npipeline_equivalence FAILED ({len(errs)}):")
        for e in errs:
            print("  - " + e)
        return 1
    print("pipeline_equivalence passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
