#!/usr/bin/env python3
"""Tensor parallelism (mesh.tensor, issue 53) against single-rank training (docs/design.md §5:
"Single-rank DDP is the oracle for every distributed plan"; "Counts, not impressions").

With mesh.tensor = T, a world of W ranks is W / T tensor groups of T adjacent ranks (rank % T is
the tensor rank, rank / T the data rank); ZeRO (zero.stage, zero.shard_group) works on the data
axis of W / T ranks, and every rank of a tensor group reads the same batch. So a run at W ranks with
grad_accum A has the global batch of a one-rank run with grad_accum A * W / T, and must reproduce
its losses and grad norms per step (another reduction order, so fp32 rounding, not bits: measured
~1e-7 relative; a missed or doubled tensor-group reduction moves the loss by whole percents).
Every run writes run.final_weights (an llm.c file of whole tensors, from every tensor rank's slices).

Every run is a short run of a tiny GPT (n_layer 2, one row 3; n_head 6, n_embd 48, seq_len 32,
vocab 50257, one row 50500) on data/sample, under `mpirun --oversubscribe -np W`; the reference
is the one-rank stage-0 run with the same model and global batch (shared between rows). Checks:

  * loss per step rel <= 1e-5, grad norm per step rel <= 1e-4, the final weights' rel L2 <= 1e-5
    (zero_equivalence's tolerances; the file's Vp == vocab rounded up to lcm(128, T));
  * bytes on the tensor group per optimizer step, against a ring byte model written here
    (tensor_bytes; src/comm/comm.h rounds each collective down):
        ar(n) = 2(T-1)4n // T,  ag(n) = (T-1)4n,  N = micro_batch * seq_len,  NC = N * n_embd
        per micro-step: (1 + 2L + 1 + 2L + R) ar(NC) + ag(3N)
    (R = blocks recomputed: recompute.policy "block" ceil(L / every), else 0), times grad_accum;
    with mesh.sequence_parallel: (1 + 4L + 1 + 1 + 6L + 1 + 3R) parts of (T-1)4(NC/T) (reduce-scatters
    and all-gathers) + (2L + 1) ar(2C) (the LayerNorms' weight gradients) + ag(3N);
    == the summary's bytes_tensor_group_per_step (measured) and _theory, and `train estimate`'s
    bytes_per_step_tensor_group; the summary's bytes_sent_per_step == its theory == the estimate's
    bytes_per_step, and == every step's comm_bytes; and the total is the tensor, shard and
    replicate groups' figures summed;
  * tracked peak memory per category == `train estimate --world W --json` memory.host;
    summary and estimate "tensor" == T, estimate "data_world" == W / T;
  * the padded vocabulary the run reports (Vp) == vocab rounded up to lcm(128, T) (50500 at T = 3:
    50688 rows, where one rank pads to 50560).

Rows: T = 2 at W = 2 (data 1); T = 3 at W = 3; T = 2 at W = 4 (data 2) at zero.stage 0, 1, 2, 3 with
0.05 MiB buckets, grad_accum 1 and 2 mixed, recompute.policy "selective" and "block", overlap off in
some; stage 3 with zero.shard_group "1" (2 replicas of shard groups of 1); T = 3 with vocab 50500;
n_layer 3 with "block" every 2 (R = 2 of 3 blocks); sequence parallelism at T = 2 and 3 (seq_len 30),
and at data 2 stages 1 and 3 with "block" and "selective" (its activations, by the estimate, below the
same plan's without); offload.optimizer "nvme" at stage 1, and at stage 3 without clipping (the update
inside backward); offload.params "nvme" at stage 3 (the norm from per-unit sums, split and replicated
tensors apart); recompute.classifier_chunk at T 2 (one embedding unit) and at T 2 x data 2, stage 3
with sequence parallelism (the embedding split in units, the classifier regathering them). mesh.tensor 1 given explicitly is the run without the key bit for bit (losses, grad
norms, per-step bytes, summary bytes and memory). A tensor rank that skips a collective: the rank left
waiting times out naming the group "tensor" and ends the job; a traced run has a "comm tensor" lane. The shipped
plans/tensor2.json (4 ranks) trains plans/zero1.json's losses (2 ranks, the same global batch). Each
rank's VmHWM at T 2 x data 2, stage 3 with sequence parallelism = `train estimate` + the runtime's
overhead measured on a smaller model, within 8 MiB (tensor_side_checks.resident()).

Refusals (each one invocation; under mpirun, and by `train estimate` for the mesh ones): non-zero
exit, exactly one line starting with "error" naming the cause, no metrics written: mesh.tensor not
dividing the world, not dividing n_head, 0 and -1; mesh.sequence_parallel with mesh.tensor 1 and
with a seq_len mesh.tensor does not divide (the CUDA backend's, under emulation:
test/emu/tensor_emu.sh). model.init (an llm.c file) at T 2 x data 2, stage 3 with sequence parallelism
gives one rank's losses from the same file. The control: the same binary accepts mesh.tensor 2 at world 4 (so an
unknown key cannot pass for a refusal).

  /usr/bin/python3 test/tensor/tensor_equivalence.py [--train ./train] [--mpirun mpirun] [--keep]

Exit status 0 when everything passes; otherwise a list of failures and exit 1.
"""
import argparse
import concurrent.futures
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "zero"))
import zero_equivalence as zm  # noqa: E402  (env(), launcher(), RunFailed, tolerances)

ROOT = zm.ROOT
L, NH, C, SEQ, V = 2, 6, 48, 32, 50257   # n_layer, n_head, n_embd, seq_len, vocab_size
B, STEPS = 2, 10
LR, WARMUP, CLIP = 3e-3, 3, 1.0
BUCKET_MB = 0.05
LOSS_TOL, NORM_TOL = zm.LOSS_TOL, zm.NORM_TOL


class Row:
    def __init__(self, T, W, stage=0, accum=1, overlap=True, policy="none", every=1, vocab=V, n_layer=L,
                 shard_group=None, sp=False, seq=SEQ, offload=None, clip=CLIP, chunk=-1):
        self.T, self.W, self.stage, self.accum, self.overlap = T, W, stage, accum, overlap
        self.policy, self.every, self.vocab, self.n_layer, self.shard_group = policy, every, vocab, n_layer, shard_group
        self.sp, self.seq, self.offload, self.clip, self.chunk = sp, seq, offload, clip, chunk

    def name(self):
        s = f"T={self.T} W={self.W} stage={self.stage} accum={self.accum} overlap={'on' if self.overlap else 'off'}"
        s += f" recompute={self.policy}" + (f"/every {self.every}" if self.policy == "block" else "")
        if self.vocab != V:
            s += f" vocab={self.vocab}"
        if self.n_layer != L:
            s += f" n_layer={self.n_layer}"
        if self.shard_group is not None:
            s += f" shard_group={self.shard_group}"
        if self.offload:
            s += " offload.optimizer=nvme" + (" offload.params=nvme" if self.offload == "params" else "")
        if self.clip != CLIP:
            s += f" grad_clip={self.clip}"
        if self.sp:
            s += " sequence_parallel"
        if self.seq != SEQ:
            s += f" seq_len={self.seq}"
        if self.chunk != -1:
            s += f" classifier_chunk={self.chunk}"
        return s

    def ref_key(self):
        """The reference's (grad_accum, vocab, n_layer, seq_len): one rank, the same global batch."""
        return (self.accum * self.W // self.T, self.vocab, self.n_layer, self.seq, self.clip)

    def extra(self):
        e = {"mesh.tensor": self.T, "zero.stage": self.stage, "zero.overlap_comm": "true" if self.overlap else "false",
             "recompute.policy": self.policy, "recompute.every": self.every, "model.vocab_size": self.vocab,
             "model.n_layer": self.n_layer, "batch.grad_accum": self.accum, "model.seq_len": self.seq,
             "mesh.sequence_parallel": "true" if self.sp else "false", "optim.grad_clip": self.clip,
             "recompute.classifier_chunk": self.chunk}
        if self.offload:  # the AdamW moments (and parameters) in swap files (a directory of the row's own: plan_sets)
            e["offload.optimizer"] = "nvme"
            if self.offload == "params":
                e["offload.params"] = "nvme"
        if self.shard_group is not None:
            e["zero.shard_group"] = self.shard_group
        return e


ROWS = [
    Row(2, 2),
    Row(3, 3, accum=2, policy="selective"),
    Row(2, 4, stage=0, overlap=False),
    Row(2, 4, stage=1, accum=2, policy="selective"),
    Row(2, 4, stage=2, policy="block"),
    Row(2, 4, stage=3, accum=2),
    Row(2, 4, stage=3, overlap=False, shard_group="1"),
    Row(3, 3, vocab=50500),
    Row(2, 4, stage=2, accum=2, overlap=False, policy="block", every=2, n_layer=3),
    # Sequence parallelism: T 2 and 3 (seq_len a multiple of 3), with the data axis at stages 1 and 3.
    Row(2, 2, sp=True),
    Row(3, 3, accum=2, sp=True, seq=30),
    Row(2, 4, stage=1, accum=2, policy="block", sp=True),
    Row(2, 4, stage=3, overlap=False, policy="selective", sp=True),
    # The AdamW moments in swap files: stage 1, and stage 3 without clipping (the update inside backward);
    # the parameters and gradient shard too at stage 3 with clipping (the norm from per-unit sums).
    Row(2, 4, stage=1, accum=2, sp=True, offload="optimizer"),
    Row(2, 4, stage=3, accum=2, offload="optimizer", clip=0.0),
    Row(2, 4, stage=3, offload="params"),
    # The classifier in chunks of positions: one embedding unit (each chunk's loss folded over the
    # group), and at stage 3 over a split embedding (the units' running statistics folded once).
    Row(2, 2, chunk=24),
    Row(2, 4, stage=3, accum=2, sp=True, chunk=16),
]
# mesh.tensor 1 given explicitly == no key: a data-parallel run (W = 2, stage 1).
SAME = (2, 1, 1)  # (W, stage, accum)


def check_design():
    # The model: heads divide by 2 and 3; the 50500 row pads differently at T = 3 than on one rank.
    assert NH % 2 == 0 and NH % 3 == 0 and C % NH == 0
    assert padded_vocab(50500, 3) == 50688 and padded_vocab(50500, 1) == 50560
    assert any(r.T == 3 and padded_vocab(r.vocab, 3) != padded_vocab(r.vocab, 1) for r in ROWS)
    assert {r.stage for r in ROWS if r.W // r.T > 1} == {0, 1, 2, 3}
    assert {r.accum for r in ROWS} == {1, 2} and {r.overlap for r in ROWS} == {True, False}
    assert {"selective", "block"} <= {r.policy for r in ROWS}
    assert any(r.shard_group is not None and r.W // r.T > int(r.shard_group) for r in ROWS)
    # Some row recomputes fewer blocks than it has (R = ceil(L / every) < L).
    assert any(r.policy == "block" and recomputed(r) < r.n_layer for r in ROWS)
    assert any(r.chunk > 0 and r.W == r.T for r in ROWS) and any(r.chunk > 0 and r.stage == 3 and r.W > r.T for r in ROWS)


def padded_vocab(vocab, T):
    m = 128 * T // math.gcd(128, T)
    return (vocab + m - 1) // m * m


def recomputed(r):
    return (r.n_layer - 1) // r.every + 1 if r.policy == "block" else 0


def tensor_bytes(r):
    """Bytes one rank sends on its tensor group per optimizer step (module docstring)."""
    T = r.T
    if T == 1:
        return 0

    def ar(n):
        return 2 * (T - 1) * 4 * n // T

    def ag(n):
        return (T - 1) * 4 * n
    N = B * r.seq
    NC = N * C
    Lr = r.n_layer
    loss = ag(3 * N)  # each position's max, sum of exp and target logit gathered (fp32)
    if not r.sp:
        # all-reduces of (N, C): the lookup, 2 per block forward; dlnf, 2 per block backward; 1 per recomputed block
        return r.accum * ((1 + 2 * Lr + 1 + 2 * Lr + recomputed(r)) * ar(NC) + loss)
    # Sequence parallelism: reduce-scatters / all-gathers of (N/T, C) parts, (T-1) 4 NC/T bytes each:
    # forward the lookup's RS, 4 per block, the final norm's AG; backward dlnf's RS, 6 per block, dresidual's
    # AG for the embedding; recompute 3 per block; and an all-reduce of 2C per LayerNorm (2L + 1).
    part = (T - 1) * 4 * (NC // T)
    parts = 1 + 4 * Lr + 1 + 1 + 6 * Lr + 1 + 3 * recomputed(r)
    return r.accum * (parts * part + (2 * Lr + 1) * ar(2 * C) + loss)


def plan_sets(workdir, extra):
    s = {
        "model.n_layer": L, "model.n_head": NH, "model.n_embd": C, "model.seq_len": SEQ, "model.vocab_size": V,
        "data.train": "data/sample/train_*.bin", "data.val": "data/sample/val.bin", "data.tokenizer": "",
        "batch.micro_batch": B, "batch.grad_accum": 1,
        "optim.lr": LR, "optim.warmup_steps": WARMUP, "optim.grad_clip": CLIP,
        "zero.bucket_mb": BUCKET_MB,
        "run.steps": STEPS, "run.eval_every": 0, "run.eval_batches": 1, "run.sample_every": 0,
        "run.threads": 1, "run.log": os.path.join(workdir, "metrics.jsonl"),
        "run.final_weights": os.path.join(workdir, "final.bin"),
    }
    s.update(extra)
    if s.get("offload.optimizer") == "nvme" and "offload.nvme_dir" not in s:
        s["offload.nvme_dir"] = os.path.join(workdir, "swap")
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


def run_train(train, mpirun, W, workdir, timeout, extra):
    os.makedirs(workdir, exist_ok=True)
    sets = plan_sets(workdir, extra)
    cmd = zm.launcher(mpirun, W) + [train, "plans/default.json"] + sets
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise zm.RunFailed(f"timed out after {timeout} s: {' '.join(cmd)}")
    secs = time.monotonic() - t0
    out = p.stdout.decode(errors="replace")
    with open(os.path.join(workdir, "output.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n\n" + out)
    if p.returncode != 0:
        raise zm.RunFailed(f"exit code {p.returncode}: {' '.join(cmd)}\n" + "\n".join(out.splitlines()[-15:]))
    rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    steps = [r for r in rows if "loss" in r]
    summ = [r["summary"] for r in rows if "summary" in r]
    if len(steps) != STEPS or len(summ) != 1:
        raise zm.RunFailed(f"metrics log has {len(steps)} step lines and {len(summ)} summary lines")
    vp = re.search(r"\(Vp=(\d+)\)", out)
    return {"steps": steps, "summary": summ[0], "estimate": estimate(train, W, sets), "seconds": secs,
            "vp": int(vp.group(1)) if vp else None, "weights": read_llmc(os.path.join(workdir, "final.bin"))}


def read_llmc(path):
    """An llm.c weight file: (header dims (maxT, V, L, NH, C, Vp), every parameter in file order with
    the vocabulary's padding rows left out, so files of two paddings compare)."""
    import numpy as np
    raw = np.fromfile(path, dtype=np.uint8)
    maxT, v, l_, nh, c_, vp = (int(x) for x in raw[:1024].view(np.int32)[2:8])
    body = raw[1024:].view(np.float32).astype(np.float64)
    return (maxT, v, l_, nh, c_, vp), np.concatenate([body[:v * c_], body[vp * c_:]])


def weights_rel(res, ref):
    """rel L2 of the final weights (run.final_weights: whole tensors, written from every tensor rank's slices)."""
    (dims, w), (rdims, r) = res["weights"], ref["weights"]
    if dims[:5] != rdims[:5] or w.size != r.size:
        return float("inf")
    d = w - r
    return math.sqrt(float(d @ d) / float(r @ r))


def rel(a, b):
    return abs(a - b) / abs(b)


def check_numerics(res, ref):
    errs, m = [], {}
    for what, tol, key in (("loss", LOSS_TOL, "loss"), ("grad_norm", NORM_TOL, "norm")):
        diffs = [rel(a[what], b[what]) for a, b in zip(res["steps"], ref["steps"])]
        m[key] = max(diffs)
        if m[key] > tol:
            i = diffs.index(m[key])
            errs.append(f"{what} at step {i + 1}: {res['steps'][i][what]!r} vs reference {ref['steps'][i][what]!r} "
                        f"(rel {m[key]:.2e} > {tol})")
    return errs, m


def check_row(res, ref, r):
    errs, m = check_numerics(res, ref)
    s, est = res["summary"], res["estimate"]
    want = tensor_bytes(r)
    m["tbytes"] = want
    got = {"summary measured": s.get("bytes_tensor_group_per_step"),
           "summary theory": s.get("bytes_tensor_group_per_step_theory"),
           "estimate": est.get("bytes_per_step_tensor_group")}
    m["bytes_ok"] = all(v == want for v in got.values())
    if not m["bytes_ok"]:
        errs.append(f"tensor group bytes per step: formula {want}, got {got}")
    total = s.get("bytes_sent_per_step")
    others = [s.get(k) for k in ("bytes_tensor_group_per_step", "bytes_shard_group_per_step",
                                 "bytes_replicate_group_per_step")]
    if not (total == s.get("bytes_sent_per_step_theory") == est.get("bytes_per_step")):
        m["bytes_ok"] = False
        errs.append(f"bytes_sent_per_step {total}, its theory {s.get('bytes_sent_per_step_theory')}, "
                    f"estimate bytes_per_step {est.get('bytes_per_step')}: not all equal")
    if None in others or total != sum(others):
        m["bytes_ok"] = False
        errs.append(f"bytes_sent_per_step {total} != tensor + shard + replicate groups {others}")
    bad = [x["step"] for x in res["steps"] if x.get("comm_bytes") != total]
    if bad:
        m["bytes_ok"] = False
        errs.append(f"steps whose comm_bytes != bytes_sent_per_step {total}: {bad[:5]}")
    m["total"] = total
    # Memory: tracked peak per category == the estimate.
    peak = s.get("peak_memory_bytes", {}).get("host", {})
    emem = est.get("memory", {}).get("host", {})
    diff = {k: (peak.get(k, 0), emem.get(k, 0)) for k in sorted(set(peak) | set(emem)) if peak.get(k, 0) != emem.get(k, 0)}
    m["mem_ok"] = not diff
    if diff:
        errs.append(f"tracked peak memory != estimate --world {r.W} (tracked, estimate): {diff}")
    for where, d, k, v in (("summary", s, "tensor", r.T), ("estimate", est, "tensor", r.T),
                           ("estimate", est, "data_world", r.W // r.T), ("summary", s, "world", r.W),
                           ("summary", s, "zero_stage", r.stage), ("summary", s, "steps", STEPS)):
        if d.get(k) != v:
            errs.append(f"{where} {k} = {d.get(k)}, expected {v}")
    m["w"] = weights_rel(res, ref)
    if m["w"] > zm.WEIGHT_TOL:
        errs.append(f"final weights (llm.c file) rel L2 {m['w']:.2e} against the reference's > {zm.WEIGHT_TOL}")
    if res["weights"][0][5] != padded_vocab(r.vocab, r.T):
        errs.append(f"final weights header Vp {res['weights'][0][5]}, expected {padded_vocab(r.vocab, r.T)}")
    m["vp"] = res["vp"]
    if res["vp"] != padded_vocab(r.vocab, r.T):
        errs.append(f"padded vocabulary Vp={res['vp']} in the run's header, expected {padded_vocab(r.vocab, r.T)} "
                    f"(vocab {r.vocab} rounded up to lcm(128, {r.T}))")
    return errs, m


def check_identical(res, base):
    errs = []
    for what in ("loss", "grad_norm", "comm_bytes"):
        a, b = [x.get(what) for x in res["steps"]], [x.get(what) for x in base["steps"]]
        if a != b:
            errs.append(f"per-step {what} differs from the run without the key: {a[:3]}... vs {b[:3]}...")
    for k in ("bytes_sent_per_step", "bytes_sent_per_step_theory", "bytes_tensor_group_per_step",
              "bytes_tensor_group_per_step_theory", "bytes_shard_group_per_step", "peak_memory_bytes", "tensor"):
        if res["summary"].get(k) != base["summary"].get(k):
            errs.append(f"summary {k}: {res['summary'].get(k)} vs {base['summary'].get(k)} without the key")
    if res["estimate"] != base["estimate"]:
        errs.append("estimate differs from the one without the key")
    return errs


def main():
    import tensor_side_checks as side  # noqa: E402  (imports this file's helpers: loaded after it)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=os.path.join(ROOT, "train"), help="path to the train binary")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per run")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1; at most 2 on 2 cores)")
    args = ap.parse_args()
    train = os.path.abspath(args.train)
    if not os.access(train, os.X_OK):
        sys.exit(f"tensor_equivalence: {train} is not an executable (build it, or pass --train)")
    if shutil.which(args.mpirun) is None:
        sys.exit(f"tensor_equivalence: {args.mpirun} not found")
    check_design()
    work = tempfile.mkdtemp(prefix="tensor_equivalence.")
    t_all = time.monotonic()
    failures = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)

    def start(W, d, extra):
        return pool.submit(run_train, train, args.mpirun, W, os.path.join(work, d), args.timeout, extra)

    def result(name, fut):
        try:
            return fut.result()
        except (zm.RunFailed, ValueError, KeyError) as e:
            failures.append(f"{name}: {e}")
            return None

    W0, st0, a0 = SAME
    keys = sorted({r.ref_key() for r in ROWS} | {(a0 * W0, V, L, SEQ, CLIP)})
    refs = {k: start(1, f"ref_A{k[0]}_V{k[1]}_L{k[2]}_S{k[3]}_c{k[4]}", {"batch.grad_accum": k[0],
                                                                          "model.vocab_size": k[1], "model.n_layer": k[2],
                                                                          "model.seq_len": k[3], "optim.grad_clip": k[4]})
            for k in keys}
    started = [(r, start(r.W, f"row{i}", r.extra())) for i, r in enumerate(ROWS)]
    same_extra = {"zero.stage": st0, "batch.grad_accum": a0}
    same = {key: start(W0, f"same_{key}", dict(same_extra, **({"mesh.tensor": 1} if key else {})))
            for key in (False, True)}

    for k in keys:
        refs[k] = result(f"reference grad_accum {k[0]} vocab {k[1]} n_layer {k[2]} seq_len {k[3]} grad_clip {k[4]}", refs[k])
        if refs[k] is None:
            print(f"reference FAILED:\n{failures[-1]}")
            sys.exit(1)
        clipped = sum(1 for x in refs[k]["steps"] if x["grad_norm"] > CLIP)
        print(f"reference grad_accum {k[0]} vocab {k[1]} n_layer {k[2]} seq_len {k[3]} grad_clip {k[4]}: loss {refs[k]['steps'][0]['loss']:.4f} -> "
              f"{refs[k]['steps'][-1]['loss']:.4f}, clipped in {clipped}/{STEPS} steps, Vp {refs[k]['vp']}, "
              f"{refs[k]['seconds']:.1f} s", flush=True)

    hdr = f"{'T':>2} {'W':>2} {'data':>4} {'stage':>5} {'sg':>3} {'accum':>5} {'overlap':>7} {'recompute':>11} " \
          f"{'L':>2} {'Vp':>6} {'loss err':>9} {'norm err':>9} {'w err':>8} {'tensor B':>9} {'total B':>9} {'bytes':>5} {'mem':>4} {'sec':>5}"
    print("\n" + hdr + "\n" + "-" * len(hdr), flush=True)
    worst = {"loss": 0.0, "norm": 0.0, "w": 0.0}
    for r, fut in started:
        rec = r.policy + (f"/{r.every}" if r.policy == "block" else "")
        row = f"{r.T:>2} {r.W:>2} {r.W // r.T:>4} {r.stage:>5} {r.shard_group or '-':>3} {r.accum:>5} " \
              f"{'on' if r.overlap else 'off':>7} {rec:>11} {r.n_layer:>2}"
        res = result(r.name(), fut)
        if res is None:
            print(f"{row}  RUN FAILED (see end)", flush=True)
            continue
        try:
            errs, m = check_row(res, refs[r.ref_key()], r)
        except (KeyError, TypeError, ValueError) as e:
            errs, m = [f"check failed: {e!r}"], None
        failures += [f"{r.name()}: {e}" for e in errs]
        if m is None:
            print(f"{row}  CHECK FAILED (see end)", flush=True)
            continue
        for k in worst:
            worst[k] = max(worst[k], m[k])
        sp_note = ""
        if r.sp:
            # Sequence parallelism holds the LayerNorm / residual regions' activations at 1/T: this plan's
            # activations against the same plan without it (both the estimate, which the run's tracked
            # peak equals: checked above).
            try:
                off = estimate(train, r.W, plan_sets(work, dict(r.extra(), **{"mesh.sequence_parallel": "false"})))
                a_sp, a_off = res["estimate"]["memory"]["host"]["activations"], off["memory"]["host"]["activations"]
                sp_note = f"  activations {a_sp} B with sequence parallelism, {a_off} B without"
                both = res["estimate"].get("sequence_parallel_activation_bytes")
                if not a_sp < a_off or both != {"with": a_sp, "without": a_off}:
                    failures.append(f"{r.name()}: activations with sequence parallelism {a_sp} B, without {a_off} B; "
                                    f"the estimate's own pair {both}")
                    sp_note += "  FAILED"
            except (zm.RunFailed, KeyError, ValueError) as e:
                failures.append(f"{r.name()}: the estimate without sequence parallelism: {e}")
        print(f"{row} {m['vp'] or 0:>6} {m['loss']:9.2e} {m['norm']:9.2e} {m['w']:8.1e} {m['tbytes']:9d} {m['total']:9d} "
              f"{'ok' if m['bytes_ok'] else 'BAD':>5} {'ok' if m['mem_ok'] else 'BAD':>4} {res['seconds']:5.1f}"
              + ("" if not errs else "  FAILED") + sp_note, flush=True)

    print(f"\nmesh.tensor 1 explicitly at W={W0} stage {st0} accum {a0}:")
    base, res = result("mesh.tensor 1: run without the key", same[False]), result("mesh.tensor 1", same[True])
    if base is not None and res is not None:
        errs, m = check_numerics(base, refs[(a0 * W0, V, L, SEQ, CLIP)])
        failures += [f"run without mesh.tensor against the reference: {e}" for e in errs]
        print(f"  {'ok ' if not errs else 'BAD'} without the key against the reference: loss err {m['loss']:.2e}, "
              f"norm err {m['norm']:.2e}", flush=True)
        errs = check_identical(res, base)
        if res["summary"].get("tensor") != 1 or res["summary"].get("bytes_tensor_group_per_step") != 0:
            errs.append(f"summary tensor {res['summary'].get('tensor')}, bytes_tensor_group_per_step "
                        f"{res['summary'].get('bytes_tensor_group_per_step')}; expected 1 and 0")
        failures += [f"mesh.tensor 1: {e}" for e in errs]
        print(f"  {'ok ' if not errs else 'BAD'} mesh.tensor 1: bit for bit the run without the key "
              f"(losses, grad norms, bytes, memory, estimate)", flush=True)

    print("\ndiagnosis and traces:", flush=True)
    failures += side.hang_and_trace(train, args.mpirun, work, args.timeout)
    failures += side.init_from_llmc(train, args.mpirun, work, args.timeout)
    failures += side.shipped_plan(train, args.mpirun, work, args.timeout)
    failures += side.resident(train, args.mpirun, work, args.timeout)

    print("\nrefusals:", flush=True)
    err = side.refusal_control(train, work)
    print(f"  {'ok ' if not err else 'BAD'} control: mesh.tensor 2 at world 4 accepted by `train estimate`")
    failures += [err] if err else []
    n_ref = 0
    for i, (_, _, _, _, by_estimate) in enumerate(side.REFUSALS):
        for how in ("mpirun", "estimate") if by_estimate else ("mpirun",):
            line, err = side.refusal(train, args.mpirun, work, args.timeout, i, how)
            n_ref += 1
            print(line, flush=True)
            failures += [err] if err else []

    total = time.monotonic() - t_all
    print(f"\nworst: loss rel {worst['loss']:.2e} (tol {LOSS_TOL}), grad norm rel {worst['norm']:.2e} (tol {NORM_TOL}), "
          f"final weights rel L2 {worst['w']:.2e} (tol {zm.WEIGHT_TOL})")
    print(f"{len(ROWS)} tensor-parallel runs + 2 mesh.tensor 1 runs + {len(refs)} references + {n_ref} refusals in "
          f"{total:.0f} s; run directories in {work}" + ("" if args.keep or failures else " (removed)"))
    if not args.keep and not failures:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"\ntensor_equivalence FAILED ({len(failures)}):")
        for f in failures:
            print("  - " + f)
        sys.exit(1)
    print("tensor_equivalence passed")


if __name__ == "__main__":
    main()
