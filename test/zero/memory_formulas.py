#!/usr/bin/python3
"""Per-rank memory against formulas written here, and resident memory against the tracked total.

`train estimate` and the tracked memory of a run both come from the model-state store's list
(list_model_state, src/zero/store.h) and GPT::activation_bytes(), so comparing them with each other (test/zero/zero_equivalence.py) cannot catch a
buffer that both size wrongly. Here every category is computed from the ZeRO layout rules and the
GPT-2 activation shapes, independently of the code:

  Ψ   = Σ over units of numel rounded up to lcm(N, 128): embedding (Vp + T)·C, each block
        12C² + 13C, final norm 2C (Vp = V rounded up to 128)
  params      stage 0-2: 4Ψ                  stage 3: 4Ψ/N
  grads       stage 0: 4Ψ    stage 1: 4(Ψ + Ψ/N) (full + reduced shard)    stage 2-3: 4Ψ/N
  optimizer   AdamW m + v, fp32: stage 0: 2·4Ψ    stage 1-3: 2·4Ψ/N
  comm        stage 0-2 with N > 1: the embedding's lookup exchange X = N·B·T·(C+1) (every rank's
              embedding-output gradient and token ids; 0 when X > P_0)
              stage 0-1: nothing else
              stage 2: embedding gradient staging P_0 + S staging slots of the largest bucket
                       (2 with overlap, else 1) + reduce-scatter receive (slots·bucket + P_0)/N
              stage 3: the embedding in block-sized row chunks (test/zero/layout_rules.py), so no
                       P_0; bucket staging and receive as stage 2, the chunks buckets of their own;
                       + gathered-unit slots ((prefetch + 1) with overlap, else 1) of the largest
                       unit (a block); all × 4 bytes. Buckets: blocks in backward order (final norm,
                       blocks L-1..0), closed once they reach bucket_mb MiB (every unit alone
                       without overlap); each embedding unit is a bucket of its own.
  activations 4 bytes × (B·T × (L·(17C + NH + 4) + 12C + 5) + P·Vp [+ 2·B·T with chunks]):
              per layer ln1 C, ln1 mean+rstd 2, qkv 3C, attention output C, attention
              log-sum-exp NH, attention projection C, residual C, ln2 C, ln2 mean+rstd 2, fc 4C,
              gelu 4C, residual C  (17C + NH + 4); the fc projection C once (no layer keeps it);
              once: input and target ids 2, embedding output C, ln_f C + mean+rstd 2, losses 1;
              backward scratch: residual gradient C, C-sized gradient C, one 4C gradient (the GELU's
              backward needs no second), qkv gradient 3C (12C + 5 in all); logits: one classifier chunk, P positions × Vp (P =
              B·T with whole logits; auto: ⌊B·T·(17C + NH + 4)/Vp⌋ clamped to [min(B·T, 256), B·T]), and
              with chunks a log-sum-exp and a running sum per position (2·B·T). The tracker starts every field on 64 bytes; B·T is a multiple
              of 16 here, so every field already is (asserted).

checked for stages 0-3 at world 1 and 3 in `train estimate --json` (overlap on and off) and in the
summary line of a real 1-step run (mpirun for N = 3; overlap on), category by category, exactly.

Activations under recompute.policy (docs/design.md §3.11), with W = 17C + NH + 4 one block's
working set without its output (the 14 fields of a layer: the list above with the fc projection for the output):
  selective   4·B·T × (L·(10C + NH + 4) + 8C + 11C + 5) + logits: per layer the LayerNorm statistics 4,
              qkv 3C, attention output C, log-sum-exp NH, attention projection C, fc 4C, block
              output C; once the dropped ln1, ln2, residual, gelu and fc projection (8C)
  block k     4·B·T × (K·(W - C) + L·C + W + 11C + 5) + logits: K = L - ceil(L/k) blocks keep
              everything but the fc projection, every block keeps its output (the next one's
              input), one block's working set W (with the fc projection) is the scratch
checked in the estimate for every policy (world 1 stage 0, world 3 stage 3) and in real runs (world
1); for GPT-2 124M at B = 8, T = 1024 the block estimate is printed next to none's and must be at
most one block's working set (W + the 9C backward gradient scratch) + the L + 1 block inputs
(embedding output and L block outputs) + the classifier buffers (ln_f C + 2, losses 1) + the 2
token ids + the chunks' log-sum-exp and running sum 2, per token, + one classifier chunk's logits
(auto: 2128 positions × Vp).

Resident memory under recompute: a 12-layer model with a 256-token vocabulary (token shards written
here, so the classifier does not dominate) runs one step with none, selective and block; block's
VmHWM must be lower than none's by at least 70% of the activation bytes none holds (the formula
predicts 80%: everything but the block outputs, one working set and the classifier buffers).

Resident memory: the summary's peak_rss_bytes (rank 0's VmHWM) must be

  tracked total + init transient + overhead,   |difference| <= RSS_SLACK

  init transient: while parameters are initialised every tracked buffer already exists, plus one
                  piece of a tensor's host values at a time: GPT::init_gpt2 works in pieces of at
                  most 2^18 values (1 MiB), so min(Vp·C, 2^18)·4 bytes (wte's); at stage 3 each
                  rank computes only its shard (counter-based init), one tensor range of one unit's
                  shard at a time, at most max(P_u)/N·4 bytes (an embedding chunk's or a block's). No rank builds the whole
                  model (the old stage-3 init built all 4Ψ on every rank to cut its shard from).
  overhead:       what the process holds besides: shared libraries' resident pages and their data
                  (cuBLASLt alone is ~62 MiB in a CUDA build), the C++/OpenMP/OpenBLAS/MPI runtimes,
                  the heap. It does not grow with the model: measured on the small model (one
                  thread, one rank), it must be at most OVERHEAD_MAX (~167 MiB seen in a CUDA
                  build), and then predicts a larger model (C 128 instead of 35, 4x the tracked
                  bytes) at stages 0 and 3 to within RSS_SLACK (seen: within 0.2 MiB). An
                  untracked buffer the size of that model's gradients (28 MiB) is far outside it.

Every rank, stage 3 at N = 4 (docs/design.md §3.10): each rank's VmHWM (the summary's
peak_rss_bytes_per_rank) must be within RSS_SLACK (8 MiB), either way, of

  `train estimate`'s per-rank total + init transient + overhead + MPI temporary

  MPI temporary:  the reduce-scatter's scratch, P_max the largest unit (gradients are reduce-scattered
                  unit by unit; at stage 3 the embedding is split into block-sized row chunks, so
                  P_max is a block: 1.5 MiB for the large model). Where a unit's share is at least
                  256 KiB per rank the comm thread runs a ring (src/comm/ring.h): per reduce-scatter in
                  flight (at most 2, comm.inflight) a received segment (at most 2^18 elements, 1 MiB)
                  and a partial sum (a chunk), 4·(min(P_max/N, 2^18) + P_max/N) bytes, on every rank. Below that, Open MPI's non-blocking reduce-scatter (libnbc)
                  reduces into a temporary of twice the message on the way to rank 0 (binomial tree,
                  then scatter): 2·4·P_max bytes on rank 0 (less elsewhere).
  overhead:       the N = 4 runtime's, a fixed cost that does not grow with the model: measured as
                  rank 0's VmHWM - tracked - init transient - MPI temporary on the small model at
                  N = 4, stage 3, and required to be at most OVERHEAD_MAX (256 MiB; seen 171 MiB,
                  within 4 MiB of the single-process overhead above).

The large model at N = 4, stage 3 is then held to it, rank by rank (seen: rank 0 +3.1 to +3.9 MiB,
the others -1.9 to +1.4 MiB): a buffer outside the estimate, or an estimated one never allocated, of
more than 8 MiB fails.

  /usr/bin/python3 test/zero/memory_formulas.py [--train ./train] [--mpirun mpirun] [--keep]
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import layout_rules  # test/zero/layout_rules.py: the layout's size rules, shared with zero_equivalence.py

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20

V = 50257                     # the committed sample data is GPT-2 tokens
VP = (V + 127) // 128 * 128   # 50304
SMALL = dict(L=3, NH=5, C=35, T=32, B=2)     # unit sizes divide by neither 3 nor 128
LARGE = dict(L=4, NH=4, C=128, T=128, B=2)
BUCKET_MB = 0.05              # 13107 fp32 elements: the final norm joins the last block's bucket
PREFETCH = 2
OVERHEAD_MAX = 256 * MiB
RSS_SLACK = 8 * MiB


# ---- the formulas ------------------------------------------------------------------------------
def unit_numels(m, world=1, stage=0):
    return layout_rules.unit_numels(m["L"], m["C"], m["T"], VP, world, stage)


def padded_units(m, world, stage=0):
    return layout_rules.padded_units(m["L"], m["C"], m["T"], VP, world, stage)


def embedding_units(m, world, stage):
    return len(unit_numels(m, world, stage)) - m["L"] - 1


def buckets(units, overlap, E):
    """Padded element counts of the gradient buckets (backward order): blocks and final norm by
    bucket_mb, then each of the E embedding units alone."""
    limit = int(BUCKET_MB * 1024 * 1024) // 4
    out, cur = [], 0
    for n in reversed(units[E:]):
        cur += n
        if not overlap or cur >= limit:
            out.append(cur)
            cur = 0
    if cur:
        out.append(cur)
    return out + list(reversed(units[:E]))


def classifier_rows(m, chunk=-1, world=1, stage=0):
    """Positions per classifier chunk (docs/design.md §3.11): B·T when whole (chunk 0); auto (-1):
    as many rows of Vp logits as fit in one block's activations (17C + NH + 4 per token, every
    field of a layer), at least min(B·T, 256). The same at every stage and world."""
    C, NH, BT, vp = m["C"], m["NH"], m["B"] * m["T"], m.get("VP", VP)
    if chunk == 0:
        return BT
    if chunk > 0:
        return min(chunk, BT)
    return max(min(BT, 256), min(BT, BT * (17 * C + NH + 4) // vp))


def activation_bytes(m, policy="none", every=1, chunk=-1, world=1, stage=0):
    C, L, NH, BT, vp = m["C"], m["L"], m["NH"], m["B"] * m["T"], m.get("VP", VP)
    assert (BT * 4) % 64 == 0, "pick B*T a multiple of 16 so no activation field needs 64-byte padding"
    rows = classifier_rows(m, chunk, world, stage)
    assert (rows * vp * 4) % 64 == 0  # Vp is a multiple of 128: the logits need no padding either
    per_layer = 17 * C + NH + 4  # fc projection (C) is one layer of scratch, kept by no policy
    once = 2 + C + (C + 2) + 1 + (C + C + 4 * C + 3 * C)
    assert once == 11 * C + 5
    logits = 4 * rows * vp + (4 * 2 * BT if rows < BT else 0)  # + log-sum-exp and running sum
    work = per_layer  # one block's working set without its output, with its fc projection
    if policy == "selective":
        kept = 2 + 3 * C + C + NH + C + 2 + 4 * C + C
        assert kept == 10 * C + NH + 4
        return 4 * BT * (L * kept + (C + C + C + 4 * C + C) + once) + logits
    if policy == "block":
        recomputed = (L + every - 1) // every
        return 4 * BT * ((L - recomputed) * (work - C) + L * C + work + once) + logits
    assert policy == "none"
    return 4 * BT * (L * per_layer + C + once) + logits


def expected(m, world, stage, overlap):
    """{category: bytes} per rank, fp32 (default plan: policy none, classifier chunk auto)."""
    units = padded_units(m, world, stage)
    E = embedding_units(m, world, stage)
    psi, N, e = sum(units), world, 4
    assert psi % N == 0
    out = {"params": e * (psi if stage <= 2 else psi // N),
           "grads": e * {0: psi, 1: psi + psi // N}.get(stage, psi // N),
           "optimizer": 2 * e * (psi if stage == 0 else psi // N),
           "activations": activation_bytes(m, world=world, stage=stage)}
    P0 = units[0] if E == 1 else 0
    X = N * m["B"] * m["T"] * (m["C"] + 1) if N > 1 and stage <= 2 else 0
    if X and X <= P0:
        out["comm"] = e * X
    if stage >= 2:
        slots = 2 if overlap else 1
        # A one-unit embedding has a staging slot of its own (P0); stage 3's chunks use the others.
        p0 = units[0] if E == 1 else 0
        slot = max(buckets(units, overlap, E)[:-1] if E == 1 else buckets(units, overlap, E))
        comm = p0 + slots * slot + (slots * slot) // N + p0 // N
        if stage == 3:  # one slot fits any unit, the others any unit but a one-unit embedding
            comm += max(units) + (PREFETCH if overlap else 0) * max(units[1:] if E == 1 else units)
        out["comm"] = out.get("comm", 0) + e * comm
    return out


INIT_PIECE = 1 << 18  # values per piece of GPT::init_gpt2 (src/model/gpt.cpp)


def init_transient(m, world, stage):
    """Bytes alive during parameter init beyond the tracked buffers (see the docstring)."""
    wte = VP * m["C"]
    if stage == 3:  # at most one unit's shard: the embedding chunks are the largest units
        return 4 * min(wte, max(padded_units(m, world, stage)) // world)
    return 4 * min(wte, INIT_PIECE)


# ---- running the binary ------------------------------------------------------------------------
def env():
    e = dict(os.environ, OMP_NUM_THREADS="1")
    if os.geteuid() == 0:
        e.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        e.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return e


def sets(m, stage, overlap, log, policy="none", every=1):
    s = {"model.n_layer": m["L"], "model.n_head": m["NH"], "model.n_embd": m["C"], "model.seq_len": m["T"],
         "model.vocab_size": m.get("V", V), "batch.micro_batch": m["B"],
         "data.train": m.get("train", "data/sample/train_*.bin"), "data.val": m.get("val", "data/sample/val.bin"),
         "data.tokenizer": "", "recompute.policy": policy, "recompute.every": every,
         "zero.stage": stage, "zero.overlap_comm": "true" if overlap else "false", "zero.bucket_mb": BUCKET_MB,
         "zero.prefetch_units": PREFETCH, "run.steps": 1, "run.eval_every": 0, "run.eval_batches": 1,
         "run.sample_every": 0, "run.threads": 1, "run.log": log, "device": "cpu"}
    return [a for k, v in s.items() for a in ("--set", f"{k}={v}")]


def run(cmd, timeout=180):
    p = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {' '.join(cmd)}\n" + "\n".join(out.splitlines()[-10:]))
    return out


def estimate(train, m, world, stage, overlap, work, policy="none", every=1):
    out = run([train, "estimate", "plans/default.json", "--world", str(world), "--json"]
              + sets(m, stage, overlap, os.path.join(work, "unused.jsonl"), policy, every))
    return json.loads(out)["memory"]["host"]


def train_run(train, mpirun, m, world, stage, work, policy="none", every=1):
    log = os.path.join(work, f"{m['L']}x{m['C']}_N{world}_s{stage}_{policy}{every}", "metrics.jsonl")
    cmd = [train, "plans/default.json"] + sets(m, stage, True, log, policy, every)
    if world > 1:
        cmd = [mpirun, "--oversubscribe", "-np", str(world)] + cmd
    run(cmd)
    summ = [json.loads(l)["summary"] for l in open(log) if "summary" in l]
    if len(summ) != 1 or summ[0]["world"] != world or summ[0]["zero_stage"] != stage:
        raise RuntimeError(f"{log}: expected one summary line for world {world}, stage {stage}")
    return summ[0]


def compare(where, got, want, failures):
    """got: {category: bytes, "total": bytes} from the binary; want: the formula's categories."""
    got = dict(got)
    total = got.pop("total", None)
    if total != sum(got.values()):
        failures.append(f"{where}: total {total} != sum of categories {sum(got.values())}")
    for cat in sorted(set(got) | set(want)):
        g, w = got.get(cat, 0), want.get(cat, 0)
        if g != w:
            failures.append(f"{where}: {cat} {g} bytes, formula {w} ({g - w:+d})")


RING_MIN_BYTES = 256 * 1024  # src/comm/mpi_thread.h, kRingMinBytes
RING_SEGMENT = 1 << 18       # src/comm/ring.h, Ring::kSegmentElems
COMM_INFLIGHT = 2           # comm.inflight, its default in plans/base.json


def mpi_temporary(m, world, stage):
    """The reduce-scatter's scratch (see the docstring): the ring's chunks, or libnbc's temporary."""
    p = max(padded_units(m, world, stage))
    if world > 1 and 4 * p // world >= RING_MIN_BYTES:
        chunk = -(-p // world)
        return COMM_INFLIGHT * 4 * (min(chunk, RING_SEGMENT) + chunk)
    return 2 * 4 * p


def check_ranks_n4(train, mpirun, work, failures):
    """Each rank's VmHWM at N = 4, stage 3 within estimate + init transient + the N = 4 overhead."""
    world, stage = 4, 3
    try:
        small = train_run(train, mpirun, SMALL, world, stage, work)
        large = train_run(train, mpirun, LARGE, world, stage, work)
        est = estimate(train, LARGE, world, stage, True, work)["total"]
    except RuntimeError as e:
        failures.append(str(e))
        return
    compare(f"large model world {world} stage {stage} (tracked peak)", large["peak_memory_bytes"]["host"],
            expected(LARGE, world, stage, True), failures)
    overhead = (small["peak_rss_bytes"] - small["peak_memory_bytes"]["host"]["total"]
                - init_transient(SMALL, world, stage) - mpi_temporary(SMALL, world, stage))
    print(f"\nresident, N = {world}, stage {stage}: runtime overhead (small model, rank 0) {overhead / MiB:.1f} MiB "
          f"(at most {OVERHEAD_MAX / MiB:.0f})")
    if not 0 < overhead <= OVERHEAD_MAX:
        failures.append(f"N = {world} runtime overhead {overhead / MiB:.1f} MiB outside (0, {OVERHEAD_MAX / MiB:.0f}] MiB")
    want = est + init_transient(LARGE, world, stage) + overhead + mpi_temporary(LARGE, world, stage)
    per_rank = large.get("peak_rss_bytes_per_rank", [])
    if len(per_rank) != world:
        failures.append(f"N = {world}: peak_rss_bytes_per_rank has {len(per_rank)} entries")
    for r, rss in enumerate(per_rank):
        d = rss - want
        print(f"resident, N = {world}, stage {stage}, large model, rank {r}: VmHWM {rss / MiB:.1f} MiB, predicted "
              f"{want / MiB:.1f} (estimate {est / MiB:.1f} + init transient "
              f"{init_transient(LARGE, world, stage) / MiB:.1f} + overhead {overhead / MiB:.1f} + MPI temporary "
              f"{mpi_temporary(LARGE, world, stage) / MiB:.1f}): {d / MiB:+.2f} MiB (slack {RSS_SLACK / MiB:.0f})")
        if abs(d) > RSS_SLACK:
            failures.append(f"N = {world} stage {stage} rank {r}: VmHWM {rss / MiB:.1f} MiB is {d / MiB:+.1f} MiB off "
                            f"the estimate + init transient + overhead + MPI temporary ({want / MiB:.1f} MiB; slack "
                            f"{RSS_SLACK / MiB:.0f}): " + ("memory outside the estimate" if d > 0 else
                                                          "estimated memory that is not resident"))


POLICIES = [("selective", 1), ("block", 1), ("block", 2), ("block", 3)]
GPT2 = dict(L=12, NH=12, C=768, T=1024, B=8)
DEEP = dict(L=12, NH=4, C=128, T=128, B=16, V=256, VP=256)  # the resident-memory model: a small vocabulary


def write_shard(path, n, vocab, seed):
    """An llm.c token shard of n random tokens below vocab (src/data/shard.h)."""
    import random
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *(rng.randrange(vocab) for _ in range(n))))


def check_recompute(train, mpirun, work, failures):
    """Activation bytes of every policy: formula == estimate == tracked; the 124M bound; resident memory."""
    print(f"\n{'policy':>10} {'every':>5} {'world':>5} {'stage':>5}  activations (formula, MiB)")
    for policy, every in POLICIES:
        for world, stage in ((1, 0), (3, 3)):
            want = expected(SMALL, world, stage, True)
            want["activations"] = activation_bytes(SMALL, policy, every, world=world, stage=stage)
            try:
                compare(f"estimate {policy}/{every} world {world} stage {stage}",
                        estimate(train, SMALL, world, stage, True, work, policy, every), want, failures)
            except RuntimeError as e:
                failures.append(str(e))
            print(f"{policy:>10} {every:>5} {world:>5} {stage:>5}  {want['activations'] / MiB:.3f}", flush=True)
        try:
            s = train_run(train, mpirun, SMALL, 1, 0, work, policy, every)
            want = expected(SMALL, 1, 0, True)
            want["activations"] = activation_bytes(SMALL, policy, every)
            compare(f"run {policy}/{every} world 1 stage 0 (tracked peak)", s["peak_memory_bytes"]["host"], want, failures)
        except RuntimeError as e:
            failures.append(str(e))

    # GPT-2 124M, B = 8, T = 1024: block against its bound (per token, 4 bytes each).
    C, L, NH, BT = GPT2["C"], GPT2["L"], GPT2["NH"], GPT2["B"] * GPT2["T"]
    rows = classifier_rows(GPT2)
    bound = 4 * BT * ((17 * C + NH + 4) + 9 * C + (L + 1) * C + (C + 2) + 1 + 2 + 2) + 4 * rows * VP
    try:
        none, block = (estimate(train, GPT2, 1, 0, True, work, p)["activations"] for p in ("none", "block"))
        for p, got in (("none", none), ("block", block)):
            if got != activation_bytes(GPT2, p):
                failures.append(f"GPT-2 124M {p}: estimate {got} != formula {activation_bytes(GPT2, p)}")
        print(f"\nGPT-2 124M, B 8, T 1024: activations none {none / 2**30:.2f} GiB, block {block / 2**30:.2f} GiB "
              f"(bound: one block's working set + L + 1 block inputs + one classifier chunk of {rows} positions = "
              f"{bound / 2**30:.2f} GiB; whole logits: none {activation_bytes(GPT2, 'none', chunk=0) / 2**30:.2f} GiB, "
              f"block {activation_bytes(GPT2, 'block', chunk=0) / 2**30:.2f} GiB)")
        if block > bound:
            failures.append(f"GPT-2 124M block activations {block} over the bound {bound}")
    except RuntimeError as e:
        failures.append(str(e))

    # Resident memory: a deep model whose activations are the blocks', not the classifier's.
    m = dict(DEEP, train=os.path.join(work, "deep_train.bin"), val=os.path.join(work, "deep_val.bin"))
    write_shard(m["train"], 16 * m["B"] * (m["T"] + 1), m["V"], 1)
    write_shard(m["val"], 2 * m["B"] * (m["T"] + 1), m["V"], 2)
    rss = {}
    for policy in ("none", "selective", "block"):
        try:
            s = train_run(train, mpirun, m, 1, 0, work, policy)
        except RuntimeError as e:
            failures.append(str(e))
            return
        rss[policy] = s["peak_rss_bytes"]
        act = s["peak_memory_bytes"]["host"]["activations"]
        if act != activation_bytes(m, policy):
            failures.append(f"deep model {policy}: tracked activations {act} != formula {activation_bytes(m, policy)}")
        print(f"resident, {m['L']} layers C {m['C']} B {m['B']} T {m['T']} V {m['V']}, {policy:>9}: VmHWM "
              f"{rss[policy] / MiB:.1f} MiB, activations {act / MiB:.1f} MiB", flush=True)
    act_none = activation_bytes(m, "none")
    drop = rss["none"] - rss["block"]
    print(f"resident: block lowers VmHWM by {drop / MiB:.1f} MiB = {100 * drop / act_none:.1f}% of none's "
          f"{act_none / MiB:.1f} MiB of activations (formula: "
          f"{100 * (act_none - activation_bytes(m, 'block')) / act_none:.1f}%; at least 70%)")
    if drop < 0.7 * act_none:
        failures.append(f"block lowers VmHWM by {drop / MiB:.1f} MiB, less than 70% of none's activations "
                        f"({act_none / MiB:.1f} MiB)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", default=os.path.join(ROOT, "train"))
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    train = os.path.abspath(args.train)
    if not os.access(train, os.X_OK):
        sys.exit(f"memory_formulas: {train} is not executable")
    # The small model's units really get padded at both world sizes, and its buckets are not trivial.
    for w in (1, 3):
        assert all(p != n for p, n in zip(padded_units(SMALL, w), unit_numels(SMALL))), padded_units(SMALL, w)
    assert len(buckets(padded_units(SMALL, 3), True, 1)) == SMALL["L"] + 1  # final norm joins a block
    # Stage 3 really splits the embedding of both models, into units no larger than a block.
    for m in (SMALL, LARGE):
        assert embedding_units(m, 1, 3) == 1  # one rank shards nothing: stage 0's layout
        for w in (3, 4):
            units, E = padded_units(m, w, 3), embedding_units(m, w, 3)
            assert E > 10 and max(units) == units[E], (m, w, E, units[:E + 1])

    work = tempfile.mkdtemp(prefix="memory_formulas.")
    t0 = time.monotonic()
    failures = []

    # ---- categories: estimate (overlap on/off) and a real run (overlap on) --------------------------
    print(f"{'world':>5} {'stage':>5} {'overlap':>7}  formula per category (MiB)")
    summaries = {}
    for world in (1, 3):
        for stage in range(4):
            for overlap in (True, False):
                want = expected(SMALL, world, stage, overlap)
                try:
                    compare(f"estimate world {world} stage {stage} overlap {overlap}",
                            estimate(train, SMALL, world, stage, overlap, work), want, failures)
                except RuntimeError as e:
                    failures.append(str(e))
                print(f"{world:>5} {stage:>5} {'on' if overlap else 'off':>7}  "
                      + " ".join(f"{k} {v / MiB:.3f}" for k, v in sorted(want.items())), flush=True)
            try:
                s = train_run(train, args.mpirun, SMALL, world, stage, work)
            except RuntimeError as e:
                failures.append(str(e))
                continue
            summaries[(world, stage)] = s
            compare(f"run world {world} stage {stage} (tracked peak)", s["peak_memory_bytes"]["host"],
                    expected(SMALL, world, stage, True), failures)

    # ---- resident memory ---------------------------------------------------------------------------
    base = summaries.get((1, 0))
    if base is None or "peak_rss_bytes" not in base:
        failures.append("no peak_rss_bytes in the summary of the small world-1 stage-0 run")
    else:
        overhead = base["peak_rss_bytes"] - base["peak_memory_bytes"]["host"]["total"] - init_transient(SMALL, 1, 0)
        print(f"\nresident: small model, stage 0: VmHWM {base['peak_rss_bytes'] / MiB:.1f} MiB = tracked "
              f"{base['peak_memory_bytes']['host']['total'] / MiB:.1f} + init transient "
              f"{init_transient(SMALL, 1, 0) / MiB:.1f} + overhead {overhead / MiB:.1f} MiB "
              f"(at most {OVERHEAD_MAX / MiB:.0f})")
        if not 0 < overhead <= OVERHEAD_MAX:
            failures.append(f"runtime overhead {overhead / MiB:.1f} MiB outside (0, {OVERHEAD_MAX / MiB:.0f}] MiB")
        for stage in (0, 3):
            try:
                s = train_run(train, args.mpirun, LARGE, 1, stage, work)
            except RuntimeError as e:
                failures.append(str(e))
                continue
            compare(f"large model stage {stage} (tracked peak)", s["peak_memory_bytes"]["host"],
                    expected(LARGE, 1, stage, True), failures)
            tracked = s["peak_memory_bytes"]["host"]["total"]
            want = tracked + init_transient(LARGE, 1, stage) + overhead
            d = s["peak_rss_bytes"] - want
            print(f"resident: large model, stage {stage}: VmHWM {s['peak_rss_bytes'] / MiB:.1f} MiB, predicted "
                  f"{want / MiB:.1f} (tracked {tracked / MiB:.1f} + init transient "
                  f"{init_transient(LARGE, 1, stage) / MiB:.1f} + overhead): {d / MiB:+.2f} MiB")
            if abs(d) > RSS_SLACK:
                failures.append(f"large model stage {stage}: VmHWM {s['peak_rss_bytes']} is {d / MiB:+.1f} MiB off "
                                f"tracked + init transient + overhead (slack {RSS_SLACK / MiB:.0f} MiB): "
                                + ("memory outside the tracker" if d > 0 else "tracked memory that is not resident"))

    # ---- every rank's resident memory, stage 3 at N = 4 ---------------------------------------------
    check_ranks_n4(train, args.mpirun, work, failures)

    # ---- recompute policies -------------------------------------------------------------------------
    check_recompute(train, args.mpirun, work, failures)

    print(f"\n{time.monotonic() - t0:.1f} s; work directory {work}" + ("" if args.keep or failures else " (removed)"))
    if not args.keep and not failures:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"memory_formulas FAILED ({len(failures)}):")
        for f in failures:
            print("  - " + f)
        sys.exit(1)
    print("memory_formulas passed")


if __name__ == "__main__":
    main()
