#!/usr/bin/env python3
"""Hybrid sharding (zero.shard_group, issue 52) against single-rank training (docs/design.md §5:
"Single-rank DDP is the oracle for every distributed plan"; "Counts, not impressions").

With zero.shard_group = S (S divides the world W), ranks r with the same r / S shard the model
state as ZeRO over a world of S does (a shard group), ranks with the same r % S hold the same shard
(a replicate group of R = W / S) and sum their reduced gradient shards once per optimizer step;
the embedding's lookup exchange is off when R > 1. Every run here is a short run of the tiny GPT of
test/zero/zero_equivalence.py (its model, runner, tolerances and checks are imported, not copied)
under `mpirun --oversubscribe -np W`, and must reproduce the single-rank stage-0 run with the same
global batch (W = 1, grad_accum = A*W):

  * loss per step, grad norm per step, final weights (run.final_weights): zero_equivalence's
    tolerances (loss 1e-5, grad norm 1e-4, weights 1e-5 rel L2 and per tensor, key bias 1e-4 absolute).
    A hybrid mesh sums within the shard group, then across replicas: another reduction order than
    one rank's, so fp32 rounding and not bits; a missed or doubled replica sum moves the loss by
    whole percents from step 2 on.
  * bytes sent per optimizer step, per rank, against a formula written here (hybrid_bytes): the
    shard group sends today's stage formula at N = S without the lookup exchange (X = 0;
    zero_equivalence.theory_bytes), the replicate group a ring all-reduce of the shard Ψ_S/S,
    2(R-1)4(Ψ_S/S)/R, Ψ_S the units padded to lcm(S, 128). That all-reduce is one per gradient
    bucket from stage 2 (stage 1: the whole shard once), each counted rounded down by
    src/comm/comm.h's byte model, so with R = 3, which divides no shard of S = 2 here, the sum of
    the pieces is what is exact (1-2 bytes below the single formula, which is also printed; docs/
    zero.md's "Hybrid sharding" table states the sum); the pieces come from partition.h's bucket
    rule written out in zero_equivalence.bucket_units and must cover the shard exactly. The summary's total (and every step's comm_bytes, the binary's
    own theory and `train estimate`'s bytes_per_step) == the sum, and its per-group figures
    (measured and theory) and the estimate's == each term.
  * tracked peak memory per category == `train estimate --world W --set zero.shard_group=S --json`,
    the shard sizes 4Ψ_S/S (grads from stage 2, params at stage 3), stage 3's max_gathered_units;
    and that estimate == today's estimate at world S (no key) less its embedding lookup exchange
    buffer: the contract's "today's estimate at world S with X = 0", from the binary before the key.

The design covers pairs, not the product: three meshes (4 ranks as 2 x 2: S = 2, R = 2; 6 ranks as
S = 3, R = 2 and as S = 2, R = 3) x stages 1-3 make nine cells, each running one of six rows of
(bucket MiB, overlap, grad_accum, offload.optimizer) (CELLS): 9 runs, not 54 (the pairs of a Latin
square, 18 runs, took twice the time for no pair more). Every (mesh, stage) cell runs, every row
runs somewhere, the rows hold every pair of values of their four factors, and each mesh's three
rows and each stage's three rows hold both values of every factor (check_design): every pair of
factor values meets. The faults this exists for depend on two factors at most (a
replica sum done per micro-step instead of per step: accumulation x mesh; a replicate group built
from the wrong ranks: mesh x stage; the NVMe optimizer updating a shard the replicas do not share:
offload x stage; stage 3's gathers leaving the shard group: stage x mesh), and each run checks
everything above exactly. Stage 0 has nothing to shard (refused with S < W, below).

S = W: at W = 4, stage 3, zero.shard_group 4 and "host" (mpirun on one machine: one host's ranks
are the world) must be the run without the key bit for bit (losses, grad norms, per-step bytes,
final weights, summary bytes and memory); that run itself passes zero_equivalence's check
(lookup exchange on). Refusals, each under mpirun and by `train estimate`: non-zero exit, one line
starting with "error", no metrics written: S not dividing W (the line names both), stage 0 with
S < W, offload.params nvme with S < W, shard_group 0, -1 and "banana"; and the control that a good
S is accepted by the same binary (so "unknown key" cannot pass for a refusal).

  /usr/bin/python3 test/zero/hybrid_equivalence.py [--train ./train] [--mpirun mpirun] [--keep]

Exit status 0 when everything passes; otherwise a list of failures and exit 1.
"""
import argparse
import concurrent.futures
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zero_equivalence as zm  # noqa: E402  (the model, runner, tolerances and checks)

zm.STEPS = 8  # run_train and check_counts read it: 8 steps (warm-up 3, then clipping and decay)
MESHES = [(4, 2), (6, 3), (6, 2)]  # (W, S): 2 x 2, 3 per group x 2 replicas, 2 per group x 3 replicas
STAGES = [1, 2, 3]
A = 2  # the accumulation of the rows with grad_accum > 1
# (bucket MiB, overlap, grad_accum, offload.optimizer). Rows 0-3 are an orthogonal array over
# (overlap, accum, offload); rows 4-5 put the default one-bucket size beside both values of each.
ROWS = [(0.05, True, 1, "none"), (0.05, False, A, "none"),
        (0.05, True, A, "nvme"), (0.05, False, 1, "nvme"),
        (25.0, True, A, "none"), (25.0, False, 1, "nvme")]
# The row of each cell: CELLS[mesh][stage - 1] (check_design says what it covers).
CELLS = [[0, 1, 5],   # 2 x 2
         [1, 3, 4],   # 3 per group x 2
         [5, 4, 2]]   # 2 per group x 3
SAME_W, SAME_STAGE, SAME_ROW = 4, 3, (0.05, True, A, "nvme")  # the S = W row
# The summary's (src/train/report.cpp) and the estimate's per-group byte figures: measured and the
# binary's theory; `train estimate --json`'s.
SUMMARY_GROUPS = [("bytes_shard_group_per_step", "bytes_replicate_group_per_step"),
                  ("bytes_shard_group_per_step_theory", "bytes_replicate_group_per_step_theory")]
ESTIMATE_GROUPS = ("bytes_per_step_shard_group", "bytes_per_step_replicate_group")
LOOKUP_BUFFER = "embedding lookup exchange"  # the estimate's buffer of the X term


def design():
    """The runs, (W, S, stage, bucket, overlap, accum, offload), one per (mesh, stage) cell."""
    return [mesh + (stage,) + ROWS[CELLS[i][stage - 1]] for i, mesh in enumerate(MESHES) for stage in STAGES]


def check_design():
    runs = design()
    assert len(runs) == len(MESHES) * len(STAGES) and {r for c in CELLS for r in c} == set(range(len(ROWS)))
    assert {(w, s, st) for w, s, st, *_ in runs} == {m + (st,) for m in MESHES for st in STAGES}
    # Each mesh's runs and each stage's runs hold both values of every row factor.
    for key in [lambda r, m=m: r[:2] == m for m in MESHES] + [lambda r, st=st: r[2] == st for st in STAGES]:
        for f in range(3, 7):
            assert len({r[f] for r in runs if key(r)}) == 2, (f, [r for r in runs if key(r)])
    # Every pair of the rows' factors takes every pair of values.
    for i, j in itertools.combinations(range(4), 2):
        vi, vj = {r[i] for r in ROWS}, {r[j] for r in ROWS}
        assert len(vi) == len(vj) == 2 and {(r[i], r[j]) for r in ROWS} == set(itertools.product(vi, vj)), (i, j)
    # Every mesh is hybrid (1 < S < W), S = 3 pads to 384 and R = 3 all-reduces shards R does not divide.
    assert all(1 < s < w and w % s == 0 for w, s in MESHES)
    P2 = zm.psi(2)[0] // 2
    assert (2 * 2 * 4 * P2) % 3 != 0, "pick a model whose S = 2 shard the 3-replica ring does not divide"
    # Stage 3 with overlap off (max_gathered_units 1) and with accumulation on a hybrid mesh.
    assert any(st == 3 and not ov for _, _, st, _, ov, _, _ in runs)
    assert any(st == 3 and a > 1 for _, _, st, _, _, a, _ in runs)


def replicate_pieces(S, stage, mb, overlap):
    """The replicate group's all-reduces, in elements of my shard: stage 1 the whole shard at once;
    stages 2-3 one per gradient bucket (zero_equivalence.bucket_units: the blocks and final norm by
    bucket_mb, every unit alone with overlap off; then each embedding unit alone)."""
    m = zm.pad_multiple(S)
    padded = [(n + m - 1) // m * m for n in zm.stage_unit_sizes(S, stage)]
    if stage == 1:
        return [sum(padded) // S]
    E = len(padded) - zm.L - 1
    return [sum(padded[u] for u in b) // S for b in zm.bucket_units(padded, mb, E, overlap)] + \
        [padded[u] // S for u in range(E - 1, -1, -1)]


def hybrid_bytes(W, S, stage, mb, overlap, accum, regather=False):
    """(shard group, replicate group) bytes per optimizer step and rank, by the contract: the stage's
    formula over a world of S (lookup exchange on only when R = 1), and a ring all-reduce of the
    Ψ_S/S shard over the R replicas once per step, in replicate_pieces, each rounded down. Also the
    contract's single formula 2(R-1)4(Ψ_S/S)/R, for the report."""
    R = W // S
    shard = zm.theory_bytes(S, stage, accum, regather, exchange=(R == 1))
    P = zm.psi(S, stage)[0]
    pieces = replicate_pieces(S, stage, mb, overlap) if R > 1 else []
    assert not pieces or sum(pieces) == P // S, (S, stage, mb, overlap, pieces, P)
    return shard, sum(2 * (R - 1) * 4 * n // R for n in pieces), 2 * (R - 1) * 4 * (P // S) // R


def plan_extra(S, offload, workdir):
    e = {} if S is None else {"zero.shard_group": S}
    if offload == "nvme":
        e.update({"offload.optimizer": "nvme", "offload.nvme_dir": os.path.join(workdir, "swap")})
    return e


def estimate(train, world, sets):
    p = subprocess.run([train, "estimate", "plans/default.json", "--world", str(world), "--json"] + sets,
                       cwd=zm.ROOT, env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    if p.returncode != 0:
        raise zm.RunFailed(f"estimate --world {world} failed ({p.returncode}): {p.stderr.decode(errors='replace')}")
    return json.loads(p.stdout)


def check_hybrid(train, res, ref, W, S, stage, mb, overlap, accum, offload, workdir):
    """Returns (errors, measures) of one hybrid run (module docstring)."""
    errs, m = zm.check_numerics(res, ref)
    est, summ = res["estimate"], res["summary"]
    shard, rep, m["rep_single"] = hybrid_bytes(W, S, stage, mb, overlap, accum, zm.regathers(est, S, stage))
    errs += zm.check_counts(res, m, W, stage, overlap, shard + rep, shard=S)
    for where, d, keys in [("summary", summ, k) for k in SUMMARY_GROUPS] + [("estimate", est, ESTIMATE_GROUPS)]:
        got = tuple(d.get(k) for k in keys)
        if got != (shard, rep):
            m["bytes_ok"] = False
            errs.append(f"{where} per group {keys} = {got}, theory {(shard, rep)}")
    for where, d in (("summary", summ), ("estimate", est)):
        if (d.get("shard_group"), d.get("replicas")) != (S, W // S):
            errs.append(f"{where} shard_group, replicas = {d.get('shard_group')}, {d.get('replicas')}; "
                        f"expected {S}, {W // S}")
    # The estimate at (W, S) is today's estimate at world S, without the lookup exchange when R > 1.
    sets = zm.plan_sets(stage, overlap, accum, workdir, mb, plan_extra(None, offload, workdir))
    base = estimate(train, S, sets)
    x = sum(b["bytes"] for b in base["buffers"] if b["name"] == LOOKUP_BUFFER) if W > S else 0
    want = dict(base["memory"]["host"])
    want["comm"] = want.get("comm", 0) - x
    want["total"] -= x
    want = {k: v for k, v in want.items() if v}
    got = {k: v for k, v in est["memory"]["host"].items() if v}
    if got != want:
        m["mem_ok"] = False
        errs.append(f"estimate at world {W} shard_group {S}: {got} != world {S}'s without the lookup exchange: {want}")
    m["shard"], m["rep"] = shard, rep
    return errs, m


def check_identical(res, same):
    """The S = W run (res) against the run without the key (same): bit for bit."""
    errs, _ = zm.check_numerics(res, same, identical=True)
    if [r.get("comm_bytes") for r in res["steps"]] != [r.get("comm_bytes") for r in same["steps"]]:
        errs.append("determinism: per-step comm_bytes differ from the run without the key")
    for k in ("bytes_sent_per_step", "bytes_sent_per_step_theory", "peak_memory_bytes", "max_gathered_units"):
        if res["summary"].get(k) != same["summary"].get(k):
            errs.append(f"summary {k}: {res['summary'].get(k)} vs {same['summary'].get(k)} without the key")
    if res["estimate"]["memory"] != same["estimate"]["memory"] or \
            res["estimate"]["bytes_per_step"] != same["estimate"]["bytes_per_step"]:
        errs.append("estimate (memory, bytes_per_step) differs from the one without the key")
    return errs


# (W, stage, shard_group, more plan fields, what the one error line must also say)
REFUSALS = [
    (4, 1, 3, {}, [r"\b3\b", r"\b4\b"]),
    (4, 1, 8, {}, [r"\b8\b", r"\b4\b"]),
    (4, 0, 2, {}, [r"stage"]),
    (4, 3, 2, {"offload.params": "nvme"}, [r"offload\.params"]),
    (2, 1, 0, {}, [r"\b0\b"]),
    (2, 1, -1, {}, [r"-1\b"]),
    (2, 1, "banana", {}, [r"banana"]),
]


def refusal(train, mpirun, work, timeout, i, how):
    """REFUSALS[i] under mpirun or by `train estimate`: (its line of the report, the error or None)."""
    W, stage, S, extra, says = REFUSALS[i]
    d = os.path.join(work, f"refusal{i}_{how}")
    os.makedirs(d)
    x = dict(extra, **{"zero.shard_group": S})
    if "offload.params" in x:
        x["offload.nvme_dir"] = os.path.join(d, "swap")
    sets = zm.plan_sets(stage, True, 1, d, 0.05, x)
    name = f"W={W} stage={stage} shard_group={S}" + "".join(f" {k}={v}" for k, v in extra.items())
    cmd = (zm.launcher(mpirun, W) + [train, "plans/default.json"] if how == "mpirun" else
           [train, "estimate", "plans/default.json", "--world", str(W)]) + sets
    p = subprocess.run(cmd, cwd=zm.ROOT, env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    lines = [l for l in (p.stdout + p.stderr).splitlines() if l.startswith("error")]
    ok = (p.returncode != 0 and len(lines) == 1 and "shard_group" in lines[0] and "unknown key" not in lines[0]
          and all(re.search(s, lines[0]) for s in says) and not os.path.exists(os.path.join(d, "metrics.jsonl")))
    line = (f"  {'ok ' if ok else 'BAD'} {how:8s} {name}: exit {p.returncode}: "
            f"{lines[0][:150] if lines else (p.stdout + p.stderr).strip()[-150:]}")
    return line, None if ok else (f"refusal {name} ({how}): exit {p.returncode}, {len(lines)} error line(s) "
                                  f"{lines[:2]}; wanted one naming shard_group and {says}, nothing written")


def refusal_control(train, work):
    """A good S is accepted by the same binary: the refusals are of values, not of an unknown key."""
    try:
        estimate(train, 4, zm.plan_sets(1, True, 1, os.path.join(work, "control"), 0.05, {"zero.shard_group": 2}))
    except zm.RunFailed as e:
        return f"control: zero.shard_group 2 at world 4 stage 1 is not accepted: {e}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=os.path.join(zm.ROOT, "train"), help="path to the train binary")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    ap.add_argument("--timeout", type=int, default=180, help="seconds per run")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    args = ap.parse_args()
    train = os.path.abspath(args.train)
    if not os.access(train, os.X_OK):
        sys.exit(f"hybrid_equivalence: {train} is not an executable (build it, or pass --train)")
    if shutil.which(args.mpirun) is None:
        sys.exit(f"hybrid_equivalence: {args.mpirun} not found")
    zm.check_unit_arithmetic()
    check_design()
    work = tempfile.mkdtemp(prefix="hybrid_equivalence.")
    t_all = time.monotonic()
    failures = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)

    def start(W, S, stage, mb, ov, a, offload, d):
        d = os.path.join(work, d)
        # "host": `train estimate` is told the ranks per host that mpirun on this one machine gives.
        more = ["--ranks-per-host", str(W)] if S == "host" else []
        return pool.submit(zm.run_train, train, args.mpirun, W, stage, ov, a, d, args.timeout, mb,
                           plan_extra(S, offload, d), more)
    runs = design()
    # The refusals first, on their own threads: a refused mpirun job spends seconds ending its ranks,
    # idle; they overlap the training runs.
    waiting = concurrent.futures.ThreadPoolExecutor(max_workers=4)
    refused = [waiting.submit(refusal, train, args.mpirun, work, args.timeout, i, how)
               for i in range(len(REFUSALS)) for how in ("mpirun", "estimate")]
    goals = sorted({w * a for w, _, _, _, _, a, _ in runs} | {SAME_W * SAME_ROW[2]})
    refs = {g: start(1, None, 0, 0.05, True, g, "none", f"ref_A{g}") for g in goals}
    same = {S: start(SAME_W, S, SAME_STAGE, *SAME_ROW, f"same_{S}") for S in (None, SAME_W, "host")}
    dirs = [f"W{r[0]}_S{r[1]}_s{r[2]}_b{r[3]}_o{int(r[4])}_A{r[5]}_{r[6]}" for r in runs]
    started = [(r, d, start(*r, d)) for r, d in zip(runs, dirs)]

    def result(name, fut):
        try:
            return fut.result()
        except (zm.RunFailed, ValueError) as e:
            failures.append(f"{name}: {e}")
            return None
    for g in goals:
        refs[g] = result(f"reference grad_accum {g}", refs[g])
        if refs[g] is None:
            print(f"reference (W=1, stage 0, grad_accum {g}) FAILED:\n" + failures[-1])
            sys.exit(1)
        print(f"reference grad_accum {g:2d}: loss {refs[g]['steps'][0]['loss']:.4f} -> "
              f"{refs[g]['steps'][-1]['loss']:.4f}, {refs[g]['seconds']:.1f} s", flush=True)

    hdr = f"{'W':>2} {'S':>2} {'R':>2} {'stage':>5} {'bucket':>6} {'overlap':>7} {'accum':>5} {'offload':>7} " \
          f"{'loss err':>9} {'norm err':>9} {'w err':>9} {'shard B':>9} {'repl B':>9} {'1-formula':>9} {'bytes':>5} " \
          f"{'mem':>4} {'sec':>5}"
    print("\n" + hdr + "\n" + "-" * len(hdr), flush=True)
    worst = {"loss": 0.0, "norm": 0.0, "w": 0.0, "t": 0.0, "k": 0.0}
    for (W, S, stage, mb, ov, a, off), d, fut in started:
        name = f"W={W} S={S} stage={stage} bucket_mb={mb} overlap={'on' if ov else 'off'} accum={a} offload={off}"
        row = f"{W:>2} {S:>2} {W // S:>2} {stage:>5} {mb:>6g} {'on' if ov else 'off':>7} {a:>5} {off:>7}"
        res = result(name, fut)
        if res is None:
            print(f"{row}  RUN FAILED (see end)", flush=True)
            continue
        try:
            errs, m = check_hybrid(train, res, refs[W * a], W, S, stage, mb, ov, a, off, os.path.join(work, d))
        except (zm.RunFailed, KeyError, TypeError) as e:
            errs, m = [f"check failed: {e!r}"], None
        failures += [f"{name}: {e}" for e in errs]
        if m is None:
            print(f"{row}  CHECK FAILED (see end)", flush=True)
            continue
        for k in worst:
            worst[k] = max(worst[k], m[k])
        print(f"{row} {m['loss']:9.2e} {m['norm']:9.2e} {m['w']:9.2e} {m['shard']:9d} {m['rep']:9d} {m['rep_single']:9d} "
              f"{'ok' if m['bytes_ok'] else 'BAD':>5} {'ok' if m['mem_ok'] else 'BAD':>4} {res['seconds']:5.1f}",
              flush=True)

    mb, ov, a, off = SAME_ROW
    print(f"\nS = W at W={SAME_W} stage {SAME_STAGE} (bucket {mb}, overlap {'on' if ov else 'off'}, accum {a}, offload {off}):")
    base = result("S=W without the key", same[None])
    if base is not None:
        errs, m = zm.check(base, refs[SAME_W * a], SAME_W, SAME_STAGE, a, ov)
        failures += [f"S=W without the key: {e}" for e in errs]
        print(f"  {'ok ' if not errs else 'BAD'} without the key against the reference (zero_equivalence's check): "
              f"loss err {m['loss']:.2e}, bytes {m['bytes']}", flush=True)
    for S in (SAME_W, "host"):
        res = result(f"S=W shard_group={S}", same[S])
        if res is None or base is None:
            print(f"  BAD shard_group {S}: RUN FAILED (see end)", flush=True)
            continue
        errs = check_identical(res, base)
        failures += [f"S=W shard_group={S}: {e}" for e in errs]
        print(f"  {'ok ' if not errs else 'BAD'} shard_group {S}: bit for bit the run without the key", flush=True)

    print("\nrefusals:", flush=True)
    err = refusal_control(train, work)
    print(f"  {'ok ' if not err else 'BAD'} control: zero.shard_group 2 at world 4 stage 1 accepted by `train estimate`")
    failures += [err] if err else []
    for fut in refused:
        line, err = fut.result()
        print(line, flush=True)
        failures += [err] if err else []

    total = time.monotonic() - t_all
    print(f"\nworst: loss rel {worst['loss']:.2e} (tol {zm.LOSS_TOL}), grad norm rel {worst['norm']:.2e} "
          f"(tol {zm.NORM_TOL}), weights rel L2 {worst['w']:.2e} (tol {zm.WEIGHT_TOL}), per-tensor "
          f"{worst['t']:.2e} (tol {zm.TENSOR_TOL}), key bias {worst['k']:.2e} (tol {zm.KBIAS_ABS} absolute)")
    print("(repl B: the replicate group's bytes, one all-reduce per bucket each rounded down; 1-formula: "
          "2(R-1)4(Ψ_S/S)/R rounded once)")
    print(f"{len(runs)} hybrid runs + 3 S=W runs + {len(refs)} references + {2 * len(REFUSALS)} refusals in "
          f"{total:.0f} s; run directories in {work}" + ("" if args.keep or failures else " (removed)"))
    if not args.keep and not failures:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"\nhybrid_equivalence FAILED ({len(failures)}):")
        for f in failures:
            print("  - " + f)
        sys.exit(1)
    print("hybrid_equivalence passed")


if __name__ == "__main__":
    main()
