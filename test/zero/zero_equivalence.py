#!/usr/bin/env python3
"""Acceptance matrix of the distributed ZeRO engine (docs/design.md §5: "Single-rank DDP is the oracle for
every distributed plan"; "Counts, not impressions").

For world sizes N in 1-4, ZeRO stages 0-3 and eight (bucket size, overlap, gradient accumulation A)
rows, a short run under `mpirun --oversubscribe -np N` must reproduce the single-rank stage-0 run
with the same global batch (N = 1, grad_accum = A*N; the loader hands out the same sequences per
step, see src/data/loader.h). Bucket sizes (BUCKETS below) cover the three shapes a bucket can take:
one unit per bucket (smaller than a block), several units per bucket plus a remainder, and the
shipped default (25 MiB: every unit but the embedding in one bucket, so with accumulation >= 3 both
staging slots hold the same bucket at once, the case that once crashed the engine).

The design (ROWS, PAIRS, design()) is a Latin square, not the full 4 x 4 x 8 product: the eight rows
are split into four pairs and cell (N, stage) runs pair (index of N + stage) mod 4, so every
(N, stage) cell runs, and every row runs at every N and at every stage (32 runs, not 128; asserted in
check_design). Hence every pair of factor values (N, stage, bucket, overlap, A) meets at least once.
Why pairs suffice: the faults this matrix exists for are a function of two factors at most (a shard
or padding that is wrong at one N, a stage's reduction or gather order, a bucket shape, the staging
slots reused under accumulation, the prefetch with overlap on/off at stage 3), and each run checks
everything below exactly, with bytes against a closed formula; triples (say N = 4, stage 3, overlap
off) are left to the same code paths at the neighbouring cells. The full product took ~13 minutes of
a 2-core CI run, this design ~4.

  * loss per step               |loss - ref| / |ref|                          <= 1e-5
  * final weights (llm.c .bin)  ||w - w_ref||_2 / ||w_ref||_2 over everything <= 1e-5
                                per tensor max|dw| <= 1e-4 max|w_ref| + 1e-2 lr (see compare_weights)
                                (attention key bias: max|dw| <= 1e-4 absolute, see split_qkv_bias)
  * grad norm per step          relative                                      <= 1e-4

and the summary line of the metrics JSONL must count exactly what theory says:

  * bytes_sent_per_step (and every step's comm_bytes) == an independent formula (comm.h byte
    model, partition.h stage table): stage 0: 2(N-1)4Ψ/N + (N-1)4X/N; stage 1: 2(N-1)4(Ψ+X)/N;
    stage 2: (A+1)(N-1)4(Ψ+X)/N (X = N*B*T*(C+1): the embedding's lookup gradient all-gathered
    every reduction, and at stages 1-2 its rows reduce-scattered once per step);
    stage 3: A(N-1)4(3Ψ + Pe - Pl + Pc)/N (Pc = Pe with a chunked classifier over the split
    embedding, else 0); N = 1: 0. Ψ = Σ_units numel rounded up to lcm(N,128); at
    stage 3 the embedding is block-sized row chunks (layout_rules.py), Pe all of them padded, Pl
    the last. Also == `train estimate`'s bytes_per_step and the binary's own theory.
  * tracked peak memory per category == `train estimate PLAN --world N --json` memory.host
  * stages 2-3: grads == 4Ψ/N and no "gradients" buffer; stage 3: params == 4Ψ/N and
    max_gathered_units == prefetch_units + 1 with overlap (the prefetch really runs ahead) and
    == 1 without (the naive path gathers only the unit it needs).

Rows with N = 1 and stage 0 (pair 0) run the reference's own configuration (with world 1 stage 0 sends
nothing, so overlap and bucket size change nothing): they are determinism checks and must match
the reference bit for bit.

The model is a tiny GPT on the committed sample data whose unit sizes are divisible by neither
3 nor 4 (so every unit really gets padded and split unevenly before padding); the arithmetic is
asserted below. Runs are sequential (the reference machine has 2 cores).

  /usr/bin/python3 test/zero/zero_equivalence.py [--train ./train] [--quick] [--keep]

Exit status 0 when every configuration passes; otherwise a list of failures and exit 1.
"""
import argparse
import concurrent.futures
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import layout_rules  # test/zero/layout_rules.py: the layout's size rules, shared with memory_formulas.py

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ---- the model and run ----------------------------------------------------------------------
C, NH, L, T = 35, 5, 3, 31          # n_embd, n_head, n_layer, seq_len
V = 50257
VP = (V + 127) // 128 * 128         # 50304, as GPTConfig::pad_vocab
B, STEPS = 2, 20
LR, WARMUP, CLIP = 3e-3, 3, 1.0
PREFETCH = 2
# Gradient bucket sizes in MiB, and the bucket shapes they give for this model (asserted in
# check_bucket_arithmetic): unit sizes padded to lcm(N,128) are ~15.2K per block, 128 or 384 for the final norm.
BUCKETS = {
    0.05: "one unit per bucket",       # 13107 elements < one block
    0.1: "several units per bucket",   # 26214: {final, block 3, block 2}, {block 1}
    25.0: "default (one bucket)",      # plans/base.json: {final, blocks 3..1}
}
# (bucket MiB, overlap, accumulation): with the smallest buckets overlap on/off x grad_accum 1 and 3;
# with larger ones overlap on (the naive path has one slot and no reuse) and the accumulations that
# make the staging slots hold the same bucket. Split into PAIRS, one per (N, stage) cell (design()).
ROWS = [(0.05, True, 1), (0.05, False, 3),
        (0.05, False, 1), (0.05, True, 3),
        (0.1, True, 3), (25.0, True, 4),
        (25.0, True, 3), (0.1, True, 4)]
PAIRS = [ROWS[i:i + 2] for i in range(0, len(ROWS), 2)]
WORLDS, STAGES = [1, 2, 3, 4], [0, 1, 2, 3]

LOSS_TOL, WEIGHT_TOL, TENSOR_TOL, NORM_TOL = 1e-5, 1e-5, 1e-4, 1e-4
ADAM_STEP_FRAC = 1e-2  # per-tensor floor: 1% of one AdamW step (lr), see compare_weights
KBIAS_ABS = 1e-4  # absolute, for the attention key bias (see split_qkv_bias)


def unit_sizes():
    """Real element counts of the units, as src/model/layout.h lays them out at stages 0-2."""
    emb = (VP + T) * C
    block = 12 * C * C + 13 * C
    final = 2 * C
    return [emb] + [block] * L + [final]


def stage_unit_sizes(n_ranks, stage):
    """At stage 3 the embedding is block-sized row chunks (layout_rules.embedding_chunks)."""
    return layout_rules.unit_numels(L, C, T, VP, n_ranks, stage)


def check_unit_arithmetic():
    sizes = unit_sizes()
    # Spelled out, so a change of dimensions cannot silently make the test trivial.
    assert sizes[0] == (50304 + 31) * 35 == 1761725, sizes
    assert sizes[1] == 12 * 35 * 35 + 13 * 35 == 15155, sizes
    assert sizes[-1] == 70, sizes
    for n in sizes:
        assert n % 3 != 0 and n % 4 != 0, f"unit of {n} elements divides by 3 or 4: pick other dims"
    # Stage 3's chunks: together the embedding, every one but the last whole shards (so they pad
    # nothing), the last one padded like the embedding, and several of them.
    assert stage_unit_sizes(1, 3) == sizes  # one rank shards nothing: stage 0's layout
    for n_ranks in (2, 3, 4):
        m, chunks = pad_multiple(n_ranks), stage_unit_sizes(n_ranks, 3)[:-L - 1]
        assert sum(chunks) == sizes[0] and len(chunks) > 10, (n_ranks, chunks)
        assert all(c % m == 0 for c in chunks[:-1]), (n_ranks, chunks)
    # The layer-stacked tensors of the llm.c file, for the weight comparison.
    assert C % NH == 0


def check_bucket_arithmetic():
    """The bucket shapes BUCKETS claims, by partition.h's rule (units from the final norm down; a
    bucket closes once it holds at least bucket_mb MiB; the embedding is always a bucket of its
    own), recomputed here so a change of dimensions cannot silently collapse the shapes."""
    base = plans_base_bucket_mb()
    assert base in BUCKETS, f"plans/base.json zero.bucket_mb {base} is not in the matrix"
    final, blocks = L + 1, list(range(L, 0, -1))  # unit indices: final norm, blocks L..1
    want = {
        0.05: [[final, blocks[0]]] + [[b] for b in blocks[1:]],  # the tiny final norm joins block L
        0.1: [[final] + blocks[:2], blocks[2:]],
        25.0: [[final] + blocks],
    }
    for n_ranks in (1, 2, 3, 4):
        m = pad_multiple(n_ranks)
        padded = [(n + m - 1) // m * m for n in unit_sizes()]
        for mb in BUCKETS:
            buckets = bucket_units(padded, mb)
            assert buckets == want[mb], (n_ranks, mb, buckets, want[mb])


def bucket_units(padded, bucket_mb, first=1, overlap=True):
    """partition.h's rule for the units after the embedding's (from `first`, the number of embedding
    units, on; each of those is a bucket of its own): from the final norm down, a bucket closes once
    it holds at least bucket_mb MiB of padded elements; with overlap off every unit is its own."""
    limit = int(bucket_mb * 1024 * 1024) // 4
    buckets, cur, size = [], [], 0
    for u in range(len(padded) - 1, first - 1, -1):
        cur.append(u)
        size += padded[u]
        if not overlap or size >= limit:
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)
    return buckets


def design(worlds):
    """The runs, (N, stage, bucket MiB, overlap, accumulation): a Latin square over (N, stage) whose
    symbols are PAIRS, so each N and each stage meet all four pairs."""
    return [(n, stage) + row for n in worlds for stage in STAGES
            for row in PAIRS[(WORLDS.index(n) + stage) % len(PAIRS)]]


def check_design():
    """Every (N, stage) cell runs, every row runs at every N and at every stage: every pair of factor
    values meets (the rows themselves hold the allowed bucket x overlap x accumulation pairs)."""
    runs = design(WORLDS)
    assert len(PAIRS) == len(STAGES) == len(WORLDS) and sorted(r for p in PAIRS for r in p) == sorted(ROWS)
    assert {(n, s) for n, s, *_ in runs} == {(n, s) for n in WORLDS for s in STAGES}
    for n in WORLDS:
        assert sorted(tuple(r[2:]) for r in runs if r[0] == n) == sorted(ROWS), n
    for s in STAGES:
        assert sorted(tuple(r[2:]) for r in runs if r[1] == s) == sorted(ROWS), s
    assert {b for b, _, _ in ROWS} == set(BUCKETS) and {o for _, o, _ in ROWS} == {True, False}
    # Stage 3 with overlap off (max_gathered_units 1) at more than one rank, and N = 1 stage 0 (the
    # determinism rows) with both overlaps.
    assert any(n > 1 and s == 3 and not o for n, s, _, o, _ in runs)
    assert {o for n, s, _, o, _ in runs if n == 1 and s == 0} == {True, False}


def plans_base_bucket_mb():
    with open(os.path.join(ROOT, "plans", "base.json")) as f:
        return float(json.load(f)["zero"]["bucket_mb"])


pad_multiple = layout_rules.pad_multiple


def psi(n_ranks, stage=0):
    """Ψ, and what stage 3 gathers beyond 2Ψ per micro-step: the LM head's embedding units once
    more, but for the last one, which backward's head reuses (0 with a one-unit embedding)."""
    m = pad_multiple(n_ranks)
    sizes = stage_unit_sizes(n_ranks, stage)
    padded = [(n + m - 1) // m * m for n in sizes]
    E = len(sizes) - L - 1
    return sum(padded), sum(padded[:E - 1])


def lookup_exchange(n_ranks, stage):
    """X of docs/zero.md: stages 0-2 with N > 1 all-gather every rank's embedding output gradient
    (B, T, C) and token ids (B, T) for the lookup part of the embedding's gradient, N*B*T*(C+1)
    elements, unless that exceeds the padded embedding P0 (then 0: reduced whole)."""
    if n_ranks == 1 or stage == 3:
        return 0
    m = pad_multiple(n_ranks)
    p0 = (unit_sizes()[0] + m - 1) // m * m
    x = n_ranks * B * T * (C + 1)
    return x if x <= p0 else 0


def theory_bytes(n_ranks, stage, accum, regather=False, exchange=True):
    """regather: a chunked classifier over the split embedding gathers every embedding unit once
    more per micro-step, for its gradient (docs/design.md §3.11): + Pe. exchange=False: without the
    embedding's lookup exchange (X = 0: a shard group of a hybrid mesh, test/zero/hybrid_equivalence.py)."""
    if n_ranks == 1:
        return 0
    P, again = psi(n_ranks, stage)
    if regather and stage == 3:
        m = pad_multiple(n_ranks)
        sizes = stage_unit_sizes(n_ranks, stage)
        again += sum((n + m - 1) // m * m for n in sizes[:len(sizes) - L - 1])
    N, A, e = n_ranks, accum, 4
    X = lookup_exchange(n_ranks, stage) if exchange else 0
    assert stage == 3 or not exchange or X == N * 2 * 31 * 36, X  # spelled out: on for this model at stages 0-2
    if stage == 0:
        return 2 * (N - 1) * e * P // N + (N - 1) * e * X // N
    if stage == 1:
        return 2 * (N - 1) * e * (P + X) // N
    if stage == 2:
        return (A + 1) * (N - 1) * e * (P + X) // N
    return A * (N - 1) * e * (3 * P + again) // N


# llm.c checkpoint: 256 int32 header (magic, version, maxT, V, L, NH, C, Vp) then fp32 tensors in
# this order; block tensors are stored layer after layer within each kind.
def tensor_list(maxT, L_, C_, Vp):
    g = [("wte", Vp * C_), ("wpe", maxT * C_)]
    per_layer = [("ln1w", C_), ("ln1b", C_), ("qkvw", 3 * C_ * C_), ("qkvb", 3 * C_), ("attprojw", C_ * C_),
                 ("attprojb", C_), ("ln2w", C_), ("ln2b", C_), ("fcw", 4 * C_ * C_), ("fcb", 4 * C_),
                 ("fcprojw", 4 * C_ * C_), ("fcprojb", C_)]
    out = list(g)
    for name, n in per_layer:
        out += [(f"{name}.{l}", n) for l in range(L_)]
    out += [("lnfw", C_), ("lnfb", C_)]
    return out


def load_weights(path):
    raw = np.fromfile(path, dtype=np.uint8)
    hdr = raw[:1024].view(np.int32)
    maxT, v, l_, nh, c_, vp = (int(x) for x in hdr[2:8])
    if (maxT, v, l_, nh, c_, vp) != (T, V, L, NH, C, VP):
        raise ValueError(f"{path}: header {hdr[:8].tolist()} does not describe the test model")
    tensors = tensor_list(maxT, l_, c_, vp)
    count = sum(n for _, n in tensors)
    body = raw[1024:].view(np.float32)
    if body.size != count:
        raise ValueError(f"{path}: {body.size} floats after the header, the header's dims imply {count}")
    out, off = {}, 0
    for name, n in tensors:
        out[name] = body[off:off + n].astype(np.float64)
        off += n
    return out


def split_qkv_bias(ws):
    """qkvb.l -> q, k and v parts. The key bias gets no gradient in exact arithmetic (adding a
    constant to every key shifts a query's scores uniformly; softmax ignores that), so its values
    are pure rounding noise that AdamW turns into updates of about lr * noise / eps, and they differ
    between reduction orders. It is compared in absolute terms (KBIAS_ABS) instead of relative to
    a tensor maximum that its noise has nothing to do with; q and v biases stay relative."""
    out = {}
    for name, x in ws.items():
        if name.startswith("qkvb."):
            l = name.split(".")[1]
            out[f"qkvb.{l}.q"], out[f"qkvb.{l}.k"], out[f"qkvb.{l}.v"] = x[:C], x[C:2 * C], x[2 * C:]
        else:
            out[name] = x
    return out


def compare_weights(w, ref):
    """(rel L2 over all parameters, worst per-tensor max|dw| / (max|w_ref| + ADAM_STEP_FRAC lr / TENSOR_TOL), its
    name, worst key-bias max|dw|)."""
    num = den = 0.0
    worst_t, worst_name, worst_k = 0.0, "", 0.0
    w, ref = split_qkv_bias(w), split_qkv_bias(ref)
    for name, r in ref.items():
        d = w[name] - r
        num += float(d @ d)
        den += float(r @ r)
        dmax = float(np.max(np.abs(d)))
        if name.endswith(".k"):
            worst_k = max(worst_k, dmax)
            continue
        # An element whose gradients nearly cancel over the steps has m/sqrt(v) ill-conditioned:
        # AdamW turns a last-bit difference of its gradient (another reduction order, or a BLAS
        # kernel that rounds a GEMM over fewer rows differently: OpenBLAS's Zen/Haswell kernels do)
        # into a fraction of one step, lr, whatever the tensor's scale. Measured on Zen: one element
        # of qkvw.2 (v part) at N=3 stage 3 off by 1.13e-5 = 0.4% of lr = 1.29e-4 of max|w|, the
        # rest of that tensor below 1e-5. So the bound is 1e-4 of the tensor's largest value plus
        # 1% of one step; a real fault (a missed or doubled bucket, a wrong shard) moves elements
        # by whole steps (lr = 3e-3 here) and stays 100x over it. Reported as max|dw| divided by
        # the bound's scale, so TENSOR_TOL stays the threshold.
        scale = float(np.max(np.abs(r))) + ADAM_STEP_FRAC * LR / TENSOR_TOL
        t = dmax / scale
        if t > worst_t:
            worst_t, worst_name = t, name
    return math.sqrt(num / den), worst_t, worst_name, worst_k


# ---- running the binary ---------------------------------------------------------------------
def env():
    e = dict(os.environ)
    if CLUSTER_NAME:
        e["ZT_CLUSTER"] = CLUSTER_NAME
    e.setdefault("OMP_NUM_THREADS", "1")
    if os.geteuid() == 0:
        e.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        e.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return e


def plan_sets(stage, overlap, accum, workdir, bucket_mb, extra=None):
    s = {
        "model.n_layer": L, "model.n_head": NH, "model.n_embd": C, "model.seq_len": T, "model.vocab_size": V,
        "data.train": "data/sample/train_*.bin", "data.val": "data/sample/val.bin", "data.tokenizer": "",
        "batch.micro_batch": B, "batch.grad_accum": accum,
        "optim.lr": LR, "optim.warmup_steps": WARMUP, "optim.grad_clip": CLIP,
        "recompute.classifier_chunk": 0,  # whole logits: the matrix is about ZeRO (chunks: recompute_equivalence)
        "zero.stage": stage, "zero.overlap_comm": "true" if overlap else "false",
        "zero.bucket_mb": bucket_mb, "zero.prefetch_units": PREFETCH,
        "run.steps": STEPS, "run.eval_every": 0, "run.eval_batches": 1, "run.sample_every": 0,
        "run.threads": 1, "run.log": os.path.join(workdir, "metrics.jsonl"),
        "run.final_weights": os.path.join(workdir, "final.bin"),
    }
    s.update(extra or {})
    args = []
    for k, v in s.items():
        args += ["--set", f"{k}={v}"]
    return args


class RunFailed(Exception):
    pass


# Multi-host mode (--hosts): "HxK" = H hosts (network namespaces of scripts/cluster) x K ranks each;
# mpirun runs on host 0 and reaches the others over TCP through the cluster's launch agent.
CLUSTER = os.path.join(ROOT, "scripts", "cluster")
CLUSTER_NAME = None   # set by --hosts: the cluster this run made (and removes)
HOSTS_OF = {}         # n_ranks -> "-H" host list of the cluster (only for the multi-host rows)


def launcher(mpirun, n_ranks):
    if n_ranks in HOSTS_OF:
        return [CLUSTER, "mpirun", "--oversubscribe", "-np", str(n_ranks), "-H", HOSTS_OF[n_ranks]]
    return [mpirun, "--oversubscribe", "-np", str(n_ranks)]


def run_train(train, mpirun, n_ranks, stage, overlap, accum, workdir, timeout_s, bucket_mb=0.05, extra=None,
              estimate_args=()):
    """extra: more plan fields to set ({"recompute.policy": "block"}, test/recompute/recompute_equivalence.py);
    estimate_args: more arguments of `train estimate` (--ranks-per-host K, test/zero/hybrid_equivalence.py)."""
    os.makedirs(workdir, exist_ok=True)
    sets = plan_sets(stage, overlap, accum, workdir, bucket_mb, extra)
    cmd = launcher(mpirun, n_ranks) + [train, "plans/default.json"] + sets
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"timed out after {timeout_s} s: {' '.join(cmd)}")
    secs = time.monotonic() - t0
    out = p.stdout.decode(errors="replace")
    with open(os.path.join(workdir, "output.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n\n" + out)
    if p.returncode != 0:
        tail = "\n".join(out.splitlines()[-15:])
        raise RunFailed(f"exit code {p.returncode}: {' '.join(cmd)}\n{tail}")
    rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    steps = [r for r in rows if "loss" in r]
    summ = [r["summary"] for r in rows if "summary" in r]
    if len(steps) != STEPS or len(summ) != 1:
        raise RunFailed(f"metrics log has {len(steps)} step lines and {len(summ)} summary lines")
    est_cmd = [train, "estimate", "plans/default.json", "--world", str(n_ranks), "--json"] + list(estimate_args) + sets
    pe = subprocess.run(est_cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    if pe.returncode != 0:
        raise RunFailed(f"estimate failed ({pe.returncode}): {pe.stdout.decode(errors='replace')}")
    est = json.loads(pe.stdout)
    return {"steps": steps, "summary": summ[0], "estimate": est, "weights": load_weights(sets_path(sets)),
            "seconds": secs}


def sets_path(sets):
    for a in sets:
        if a.startswith("run.final_weights="):
            return a.split("=", 1)[1]
    raise AssertionError


# ---- checks ---------------------------------------------------------------------------------
def check(res, ref, n_ranks, stage, accum, overlap):
    """Returns (errors, measures)."""
    errs, m = check_numerics(res, ref, n_ranks == 1 and stage == 0)
    want = theory_bytes(n_ranks, stage, accum, regathers(res["estimate"], n_ranks, stage))
    errs += check_counts(res, m, n_ranks, stage, overlap, want)
    return errs, m


def regathers(est, shard, stage):
    """Whether stage 3's chunked classifier gathers the split embedding once more (theory_bytes)."""
    return stage == 3 and est["recompute"]["classifier_chunk_rows"] < B * T and len(stage_unit_sizes(shard, 3)) > L + 2


def check_numerics(res, ref, identical=False):
    """Loss, grad norm and final weights against the reference (tolerances in the module docstring);
    identical: the reference's own configuration, which must also match it bit for bit. Returns
    (errors, measures)."""
    errs = []
    m = {}
    if identical:
        # Determinism check: the reference's own configuration must reproduce it exactly.
        for what in ("loss", "grad_norm"):
            a = [r[what] for r in res["steps"]]
            b = [r[what] for r in ref["steps"]]
            if a != b:
                errs.append(f"determinism: {what} differs from an identical run: {a[:3]}... vs {b[:3]}...")
        for name, r in ref["weights"].items():
            if not np.array_equal(res["weights"][name], r):
                errs.append(f"determinism: final tensor {name} differs from an identical run")
                break
    # Numerics vs the reference.
    loss = np.array([r["loss"] for r in res["steps"]])
    rloss = np.array([r["loss"] for r in ref["steps"]])
    m["loss"] = float(np.max(np.abs(loss - rloss) / np.abs(rloss)))
    if m["loss"] > LOSS_TOL:
        i = int(np.argmax(np.abs(loss - rloss) / np.abs(rloss)))
        errs.append(f"loss at step {i}: {loss[i]!r} vs reference {rloss[i]!r} (rel {m['loss']:.2e} > {LOSS_TOL})")
    norm = np.array([r["grad_norm"] for r in res["steps"]])
    rnorm = np.array([r["grad_norm"] for r in ref["steps"]])
    m["norm"] = float(np.max(np.abs(norm - rnorm) / np.abs(rnorm)))
    if m["norm"] > NORM_TOL:
        errs.append(f"grad norm rel err {m['norm']:.2e} > {NORM_TOL}")
    m["w"], m["t"], tname, m["k"] = compare_weights(res["weights"], ref["weights"])
    if m["w"] > WEIGHT_TOL:
        errs.append(f"final weights: rel L2 {m['w']:.2e} > {WEIGHT_TOL}")
    if m["t"] > TENSOR_TOL:
        errs.append(f"final weights: tensor {tname} max|dw|/max|w_ref| {m['t']:.2e} > {TENSOR_TOL}")
    if m["k"] > KBIAS_ABS:
        errs.append(f"final weights: key bias max|dw| {m['k']:.2e} > {KBIAS_ABS} (absolute)")
    return errs, m


def check_counts(res, m, n_ranks, stage, overlap, want, shard=None):
    """Bytes per step (summary, the binary's theory, the estimate, every step) == want, tracked
    memory == the run's estimate, and the shard sizes 4Ψ/N of grads (stages 2-3) and params
    (stage 3), Ψ padded for and divided by the shard group's size (default: the world). Adds
    bytes, bytes_ok and mem_ok to m; returns the errors."""
    errs = []
    shard = shard or n_ranks
    s, est = res["summary"], res["estimate"]
    got = {"summary": s["bytes_sent_per_step"], "binary's theory": s["bytes_sent_per_step_theory"],
           "estimate": est["bytes_per_step"]}
    bad_steps = [r["step"] for r in res["steps"] if r.get("comm_bytes") != want]
    m["bytes"] = s["bytes_sent_per_step"]
    bytes_ok = all(v == want for v in got.values()) and not bad_steps
    if not bytes_ok:
        errs.append(f"bytes per step: theory {want}, got {got}; steps whose comm_bytes differ: {bad_steps[:5]}")

    # Memory.
    P, _ = psi(shard)
    peak = s["peak_memory_bytes"].get("host", {})
    emem = est["memory"].get("host", {})
    keys = sorted(set(peak) | set(emem))
    diff = {k: (peak.get(k, 0), emem.get(k, 0)) for k in keys if peak.get(k, 0) != emem.get(k, 0)}
    mem_ok = not diff
    if diff:
        errs.append(f"tracked peak memory != estimate (tracked, estimate): {diff}")
    names = [b["name"] for b in est["buffers"]]
    if stage >= 2:
        for where, d in (("tracked", peak), ("estimate", emem)):
            if d.get("grads") != 4 * P // shard:
                mem_ok = False
                errs.append(f"stage {stage}: {where} grads {d.get('grads')} != 4Ψ/N = {4 * P // shard}")
        if "gradients" in names:
            mem_ok = False
            errs.append(f"stage {stage}: estimate lists a full 'gradients' buffer: {names}")
    if stage == 3:
        for where, d in (("tracked", peak), ("estimate", emem)):
            if d.get("params") != 4 * P // shard:
                mem_ok = False
                errs.append(f"stage 3: {where} params {d.get('params')} != 4Ψ/N = {4 * P // shard}")
        mg = s["max_gathered_units"]
        want_mg = PREFETCH + 1 if overlap else 1
        if mg != want_mg:
            mem_ok = False
            errs.append(f"stage 3: max_gathered_units {mg} != {want_mg} (overlap {'on: prefetch_units + 1' if overlap else 'off: 1'})")
    for k, v in (("world", n_ranks), ("zero_stage", stage), ("steps", STEPS)):
        if s.get(k) != v:
            errs.append(f"summary {k} = {s.get(k)}, expected {v}")
    m["bytes_ok"], m["mem_ok"] = bytes_ok, mem_ok
    return errs


def run_and_check(train, args, n, stage, ov, a, workdir, mb, name, refs, failures):
    """One row of the matrix: run it and check it against the reference with the same global
    batch. Failures are appended (named); returns (result, measures), or None if it did not run."""
    try:
        res = run_train(train, args.mpirun, n, stage, ov, a, workdir, args.timeout, mb)
    except (RunFailed, ValueError) as e:
        failures.append(f"{name}: {e}")
        return None
    errs, m = check(res, refs[n * a], n, stage, a, ov)
    failures += [f"{name}: {e}" for e in errs]
    return res, m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=os.path.join(ROOT, "train"), help="path to the train binary")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--quick", action="store_true", help="N in {1,3} only (their cells of the design)")
    ap.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    ap.add_argument("--timeout", type=int, default=180, help="seconds per run")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    ap.add_argument("--hosts", default="",
                    help="multi-host mode: comma-separated HxK (H hosts x K ranks, e.g. 3x1,2x2) in network "
                         "namespaces (scripts/cluster, needs root); every stage at every spec, overlap on "
                         "(grad_accum 1) and off (grad_accum 3) alternating by spec and stage, over TCP against "
                         "the single-rank reference. Exit 77 (skipped) where namespaces cannot be made")
    ap.add_argument("--steps", type=int, default=0, help=f"steps per run (default {STEPS})")
    args = ap.parse_args()
    if args.hosts:
        return main_hosts(args)
    train = os.path.abspath(args.train)
    if not os.access(train, os.X_OK):
        sys.exit(f"zero_equivalence: {train} is not an executable (build it, or pass --train)")
    if shutil.which(args.mpirun) is None:
        sys.exit(f"zero_equivalence: {args.mpirun} not found")
    check_unit_arithmetic()
    check_bucket_arithmetic()
    check_design()

    worlds = [1, 3] if args.quick else WORLDS
    runs = design(worlds)
    work = tempfile.mkdtemp(prefix="zero_equivalence.")
    t_all = time.monotonic()
    failures = []

    # References: one rank, stage 0, same global batch.
    # Runs go args.jobs at a time: a run of N ranks x 1 thread keeps the 2 cores of the reference
    # machine busy less than half the time (start-up, waits on the other ranks); rows print in order.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
    goals = sorted({n * a for n, _, _, _, a in runs})
    started = {g: pool.submit(run_train, train, args.mpirun, 1, 0, True, g, os.path.join(work, f"ref_A{g}"), args.timeout)
               for g in goals}
    refs = {}
    for g in goals:
        try:
            refs[g] = started[g].result()
        except (RunFailed, ValueError) as e:
            print(f"reference (N=1, stage 0, grad_accum {g}) FAILED: {e}")
            sys.exit(1)
        clipped = sum(1 for r in refs[g]["steps"] if r["grad_norm"] > CLIP)
        print(f"reference grad_accum {g:2d}: loss {refs[g]['steps'][0]['loss']:.4f} -> {refs[g]['steps'][-1]['loss']:.4f}, "
              f"clipped in {clipped}/{STEPS} steps, {refs[g]['seconds']:.1f} s", flush=True)
        if clipped == 0:
            failures.append(f"reference grad_accum {g}: gradient clipping never triggered (grad_clip {CLIP})")

    hdr = f"{'N':>2} {'stage':>5} {'bucket':>6} {'overlap':>7} {'accum':>5} {'loss err':>9} {'norm err':>9} {'w err':>9} " \
          f"{'tensor err':>10} {'bytes/step':>11} {'bytes':>5} {'mem':>4} {'sec':>5}"
    print("\n" + hdr + "\n" + "-" * len(hdr), flush=True)
    worst = {"loss": 0.0, "norm": 0.0, "w": 0.0, "t": 0.0, "k": 0.0}
    bytes_by = {}
    n_runs = 0
    rows = []
    for n, stage, mb, ov, a in runs:
        kind = " (determinism)" if n == 1 and stage == 0 else ""
        name = f"N={n} stage={stage} bucket_mb={mb} overlap={'on' if ov else 'off'} accum={a}{kind}"
        d = os.path.join(work, f"N{n}_s{stage}_b{mb}_o{int(ov)}_A{a}")
        row = f"{n:>2} {stage:>5} {mb:>6g} {'on' if ov else 'off':>7} {a:>5}"
        rows.append((n, stage, a, kind, row,
                     pool.submit(run_and_check, train, args, n, stage, ov, a, d, mb, name, refs, failures)))
    for n, stage, a, kind, row, started_row in rows:
        done = started_row.result()
        if done is None:
            print(f"{row}  RUN FAILED (see end)", flush=True)
            continue
        res, m = done
        n_runs += 1
        for k in worst:
            worst[k] = max(worst[k], m[k])
        bytes_by[(n, stage, a)] = m["bytes"]
        print(f"{row} {m['loss']:9.2e} {m['norm']:9.2e} "
              f"{m['w']:9.2e} {m['t']:10.2e} {m['bytes']:11d} {'ok' if m['bytes_ok'] else 'BAD':>5} "
              f"{'ok' if m['mem_ok'] else 'BAD':>4} {res['seconds']:5.1f}{kind}", flush=True)

    # ZeRO-3 / ZeRO-0 traffic: theory A(3Ψ + Pe - Pl)/(2Ψ + X). Stage 0's bytes depend on neither A,
    # overlap nor bucket size (each run's bytes were checked against theory_bytes above), so any
    # stage-0 run at N is the denominator for each stage-3 run at N.
    print("\nZeRO-3 / ZeRO-0 bytes per step:")
    for n in worlds:
        if n == 1:
            continue
        b0s = {b for (n_, s, _), b in bytes_by.items() if n_ == n and s == 0}
        for a in sorted({a for (n_, s, a) in bytes_by if n_ == n and s == 3}):
            b0, b3 = min(b0s, default=0), bytes_by[(n, 3, a)]
            if not b0:
                continue
            P, again = psi(n, 3)
            X = lookup_exchange(n, 0)  # ZeRO-0 also sends the embedding's lookup exchange
            want = a * (3 * P + again) / (2 * P + X)
            ok = abs(b3 / b0 - want) < 1e-12 * want
            print(f"  N={n} A={a}: {b3 / b0:.6f} (theory A(3Ψ+Pe-Pl)/(2Ψ+X) = {want:.6f}, Ψ={P}, Pe-Pl={again}, X={X}) "
                  f"{'ok' if ok else 'BAD'}")
            if not ok:
                failures.append(f"N={n} A={a}: ZeRO-3/ZeRO-0 byte ratio {b3 / b0} != {want}")

    total = time.monotonic() - t_all
    print(f"\nworst: loss rel {worst['loss']:.2e} (tol {LOSS_TOL}), grad norm rel {worst['norm']:.2e} (tol {NORM_TOL}), "
          f"weights rel L2 {worst['w']:.2e} (tol {WEIGHT_TOL}), per-tensor max|dw|/max|w| {worst['t']:.2e} (tol {TENSOR_TOL}), "
          f"key bias max|dw| {worst['k']:.2e} (tol {KBIAS_ABS} absolute)")
    print(f"{n_runs} configurations + {len(refs)} references in {total:.0f} s; run directories in {work}"
          + ("" if args.keep or failures else " (removed)"))
    if not args.keep and not failures:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"\nzero_equivalence FAILED ({len(failures)}):")
        for f in failures:
            print("  - " + f)
        sys.exit(1)
    print("zero_equivalence passed")


def main_hosts(args):
    """--hosts: the same checks (check()), rows run across hosts over Open MPI's TCP transport."""
    global CLUSTER_NAME, STEPS
    import signal
    STEPS = args.steps or STEPS
    train = os.path.abspath(args.train)
    if not os.access(train, os.X_OK):
        sys.exit(f"zero_equivalence: {train} is not an executable (build it, or pass --train)")
    chk = subprocess.run([CLUSTER, "check"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if chk.returncode != 0:
        print(f"zero_equivalence --hosts SKIPPED: {chk.stdout.strip()}")
        sys.exit(77)
    check_unit_arithmetic()
    specs = []
    for spec in args.hosts.split(","):
        h, k = (int(x) for x in spec.lower().split("x"))
        assert 1 <= h <= 8 and 1 <= k <= 4, spec
        specs.append((h, k))
    CLUSTER_NAME = f"ztm{os.getpid() % 100000}"
    max_h = max(h for h, _ in specs)

    def down(*sig):
        subprocess.run([CLUSTER, "down"], env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if sig:
            sys.exit(1)
    signal.signal(signal.SIGTERM, down)
    signal.signal(signal.SIGINT, down)
    work = tempfile.mkdtemp(prefix="zero_equivalence_hosts.")
    failures, t_all, n_runs = [], time.monotonic(), 0
    try:
        p = subprocess.run([CLUSTER, "up", str(max_h)], env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            print(f"zero_equivalence --hosts: scripts/cluster up failed: {p.stderr.strip()}")
            sys.exit(1)
        names = subprocess.run([CLUSTER, "hosts"], env=env(), stdout=subprocess.PIPE, text=True).stdout.split()
        print(f"cluster {CLUSTER_NAME}: {' '.join(names)}; mpirun options: {p.stdout.strip()}")
        plan = []
        on, off = (0.05, True, 1), (0.05, False, 3)
        for i, (h, k) in enumerate(specs):
            # Every stage at every spec, alternating overlap on (grad_accum 1) and off (grad_accum 3)
            # by spec + stage, so with two specs or more every (spec, stage), (spec, overlap) and
            # (stage, overlap) pair runs once (one spec alone runs both rows at every stage).
            n = h * k
            HOSTS_OF[n] = ",".join(f"{names[j]}:{k}" for j in range(h))
            for stage in (0, 1, 2, 3):
                rows = [on, off] if len(specs) == 1 else [on if (i + stage) % 2 == 0 else off]
                plan += [(h, k, n, stage, mb, ov, a) for mb, ov, a in rows]
        # args.jobs runs at a time, as in main(); rows print in order.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
        goals = sorted({n * a for _, _, n, _, _, _, a in plan})
        started = {g: pool.submit(run_train, train, args.mpirun, 1, 0, True, g, os.path.join(work, f"ref_A{g}"), args.timeout)
                   for g in goals}
        refs = {}
        for g in goals:
            refs[g] = started[g].result()
            print(f"reference grad_accum {g:2d} (one rank, shared memory): {refs[g]['seconds']:.1f} s", flush=True)
        hdr = f"{'hosts':>5} {'N':>2} {'stage':>5} {'overlap':>7} {'accum':>5} {'loss err':>9} {'w err':>9} " \
              f"{'bytes/step':>11} {'bytes':>5} {'mem':>4} {'sec':>5}"
        print("\n" + hdr + "\n" + "-" * len(hdr), flush=True)
        rows = []
        for h, k, n, stage, mb, ov, a in plan:
            name = f"{h}x{k} stage={stage} overlap={'on' if ov else 'off'} accum={a}"
            rows.append((f"{f'{h}x{k}':>5} {n:>2} {stage:>5} {'on' if ov else 'off':>7} {a:>5}",
                         pool.submit(run_and_check, train, args, n, stage, ov, a,
                                     os.path.join(work, f"H{h}x{k}_s{stage}_o{int(ov)}_A{a}"), mb, name, refs, failures)))
        for row, started_row in rows:
            done = started_row.result()
            if done is None:
                print(f"{row}  RUN FAILED (see end)", flush=True)
                continue
            res, m = done
            n_runs += 1
            print(f"{row} {m['loss']:9.2e} {m['w']:9.2e} {m['bytes']:11d} {'ok' if m['bytes_ok'] else 'BAD':>5} "
                  f"{'ok' if m['mem_ok'] else 'BAD':>4} {res['seconds']:5.1f}", flush=True)
        left = subprocess.run([CLUSTER, "pids"], env=env(), stdout=subprocess.PIPE, text=True).stdout.split()
        if left:
            failures.append(f"processes left in the host namespaces after the runs: pids {' '.join(left)}")
    finally:
        down()
    print(f"\n{n_runs} multi-host configurations + {len(refs)} references in {time.monotonic() - t_all:.0f} s")
    if failures:
        print(f"\nzero_equivalence --hosts FAILED ({len(failures)}), run directories in {work}:")
        for f in failures:
            print("  - " + f)
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)
    print("zero_equivalence --hosts passed")


if __name__ == "__main__":
    main()
