#!/usr/bin/env python3
"""Recomputation changes where numbers are computed, not what (docs/design.md §3.11, §5).

On the CPU backend, for one rank at stage 0 and three ranks at stage 3 (overlap on, grad_accum 2,
so each micro-step's backward regathers units and recomputes from them), every policy runs the
20-step model of test/zero/zero_equivalence.py next to `none` in the same configuration and must give

  * every step's loss and grad norm                      identical (==, not a tolerance)
  * the final weights (llm.c .bin written by the run)    identical, tensor by tensor
  * bytes sent per step                                  == the theory of zero_equivalence.py: at stage 3 the
                                                            recomputed forward uses the units backward
                                                            gathered anyway, so recomputing sends nothing
  * tracked peak memory per category                    == `train estimate` for that policy
  * activations (estimate)                               none > selective > block every 2 > block every 1

A recomputed LayerNorm, GELU or block runs the same kernel on the same inputs as forward did, so
anything short of bit equality is a bug (a stale scratch, a parameter not gathered yet, a
different fused/unfused op). Last, two ranks at stages 0-2 with classifier chunks and the
overlapped LM-head gradient against one rank with whole logits. 14 runs of a few seconds each.

Which policy runs where (RUNS) is a covering design, not the full 2 configurations x 2 chunk
sizes x 3 policies: `none` runs in all four (configuration, chunk) cells, and the policies are spread
so that every (configuration, policy), (chunk, policy) and (configuration, chunk) pair runs once
(check_design): 6 policy runs, not 12. A recompute fault is a function of the policy and one of the
others (a stale scratch at stage 3's regather, a chunked head that recomputes another way), and
each run is compared bit for bit. The activation ordering, which needs every policy in one cell, is
checked on `train estimate` (what the runs' own estimates are) for all four cells.

  /usr/bin/python3 test/recompute/recompute_equivalence.py [--train ./train] [--mpirun mpirun] [--keep]
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "zero"))
import zero_equivalence as zm  # noqa: E402  (the model, the runner and the byte/memory checks)

POLICIES = [("selective", 1), ("block", 1), ("block", 2)]
CONFIGS = [(1, 0, 1), (3, 3, 2)]  # (ranks, stage, grad_accum)
# Classifier chunks (recompute.classifier_chunk, docs/design.md §3.11): 0 = whole logits, 37 positions
# (divides neither T = 31 nor B*T; the auto default is 1 position at this C, slow, and is covered by
# memory_formulas and the unit tests). Every policy runs with each; the bit
# comparison is against none with the same chunk. Chunked none against whole none: the same
# formulas, but a BLAS call may sum a row in another order for another number of rows (OpenBLAS's
# Haswell and Zen kernels do) and the head's weight gradient is summed chunk by chunk, so
# zero_equivalence's tolerances from step 1 (docs/design.md §3.11). At N = 3 stage 3 the embedding is
# split: the log-sum-exp is folded over its vocabulary chunks (another rounding), and bytes per
# step include the embedding gathered once more for its gradient (zero_equivalence.theory_bytes, regather).
CHUNKS = [0, 37]
# (ranks, stage, grad_accum) -> chunk -> the policies run there besides none (module docstring).
RUNS = {(1, 0, 1): {0: [("selective", 1), ("block", 2)], 37: [("block", 1)]},
        (3, 3, 2): {0: [("block", 1)], 37: [("selective", 1), ("block", 2)]}}


def check_design():
    """Every cell runs, every policy runs in every configuration and with every chunk size."""
    assert sorted(RUNS) == sorted(CONFIGS) and all(sorted(RUNS[c]) == CHUNKS for c in CONFIGS)
    for c in CONFIGS:
        assert sorted(p for ch in CHUNKS for p in RUNS[c][ch]) == sorted(POLICIES), c
    for ch in CHUNKS:
        assert sorted(p for c in CONFIGS for p in RUNS[c][ch]) == sorted(POLICIES), ch


def estimate_activations(train, n, stage, accum, work, extra):
    """Host activations bytes of `train estimate` for this plan (the same call run_train makes)."""
    sets = zm.plan_sets(stage, True, accum, work, 0.05, extra)
    p = subprocess.run([train, "estimate", "plans/default.json", "--world", str(n), "--json"] + sets,
                       cwd=zm.ROOT, env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    if p.returncode != 0:
        raise zm.RunFailed(f"estimate failed ({p.returncode}): {p.stdout.decode(errors='replace')}")
    return json.loads(p.stdout)["memory"]["host"]["activations"]


def sets(policy, every, chunk=0):
    return {"recompute.policy": policy, "recompute.every": every, "recompute.classifier_chunk": chunk}


def bitwise(res, ref):
    errs = []
    for what in ("loss", "grad_norm"):
        a, b = [r[what] for r in res["steps"]], [r[what] for r in ref["steps"]]
        if a != b:
            i = next(i for i in range(len(a)) if a[i] != b[i])
            errs.append(f"{what} at step {i}: {a[i]!r} vs none {b[i]!r}")
    for name, w in ref["weights"].items():
        if not np.array_equal(res["weights"][name], w):
            errs.append(f"final tensor {name} differs from none (max |d| {np.max(np.abs(res['weights'][name] - w)):.3e})")
            break
    return errs


def close(res, ref):
    """Chunked against whole logits: zero_equivalence's tolerances."""
    errs = []
    a, b = [r["loss"] for r in res["steps"]], [r["loss"] for r in ref["steps"]]
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    if worst > zm.LOSS_TOL:
        errs.append(f"loss rel {worst:.2e} vs whole > {zm.LOSS_TOL}")
    num = sum(float(np.sum((res["weights"][k] - w) ** 2)) for k, w in ref["weights"].items())
    den = sum(float(np.sum(w ** 2)) for w in ref["weights"].values())
    if (num / den) ** 0.5 > zm.WEIGHT_TOL:
        errs.append(f"weights rel L2 {(num / den) ** 0.5:.2e} vs whole > {zm.WEIGHT_TOL}")
    return errs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", default=os.path.join(zm.ROOT, "train"))
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--timeout", type=int, default=180)
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    args = ap.parse_args()
    train = os.path.abspath(args.train)
    if not os.access(train, os.X_OK):
        sys.exit(f"recompute_equivalence: {train} is not executable")
    check_design()
    work = tempfile.mkdtemp(prefix="recompute_equivalence.")
    t0 = time.monotonic()
    failures = []
    whole_none = {}  # (N, stage) -> the none run with whole logits
    print(f"{'N':>2} {'stage':>5} {'accum':>5} {'policy':>10} {'every':>5} {'chunk':>5} {'activations':>12} {'bits':>5} "
          f"{'vs':>6} {'bytes':>5} {'mem':>4} {'sec':>5}")
    # Every run starts at once, args.jobs at a time (one run keeps the 2 cores of the reference
    # machine busy less than half the time); the checks below take the results in order.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)

    def start(n, stage, accum, d, extra):
        return pool.submit(zm.run_train, train, args.mpirun, n, stage, True, accum, os.path.join(work, d), args.timeout,
                           extra=extra)
    started = {(n, stage, accum, chunk, policy, every):
               start(n, stage, accum, f"N{n}_s{stage}_{policy}{every}_c{chunk}", sets(policy, every, chunk))
               for n, stage, accum in CONFIGS for chunk in CHUNKS
               for policy, every in [("none", 1)] + RUNS[(n, stage, accum)][chunk]}
    started_defer = {key: start(n, stage, accum, d, sets("none", 1, chunk)) for key, n, stage, accum, d, chunk in
                     [("ref", 1, 0, 4, "defer_ref", 0)] + [(s, 2, s, 2, f"defer_s{s}", 37) for s in (0, 1, 2)]}
    for n, stage, accum in CONFIGS:
      for chunk in CHUNKS:
        runs = {}
        for policy, every in [("none", 1)] + RUNS[(n, stage, accum)][chunk]:
            name = f"N={n} stage={stage} accum={accum} policy={policy} every={every} chunk={chunk}"
            try:
                runs[(policy, every)] = res = started[(n, stage, accum, chunk, policy, every)].result()
            except (zm.RunFailed, ValueError) as e:
                failures.append(f"{name}: {e}")
                continue
            if policy == "none" and chunk != 0:
                whole = whole_none[(n, stage)]
                ref = whole
                bits_vs = "whole"
                errs, m = zm.check(res, whole, n, stage, accum, True)
                # Same configuration but the chunk, so zm.check asks N = 1 for determinism (bits):
                # the head's weight gradient is summed in another order, so compare with tolerances
                # (at stage 3 with N > 1 the log-sum-exp is folded over vocabulary chunks too).
                errs = [e for e in errs if not e.startswith("determinism")] + close(res, whole)
            else:
                ref = runs.get(("none", 1))
                if ref is None:
                    failures.append(f"{name}: no reference run")
                    continue
                bits_vs = "none"
                # Bytes and memory against theory / estimate (the tolerances pass trivially when bits match).
                errs, m = zm.check(res, ref, n, stage, accum, True)
                errs += bitwise(res, ref)
            if policy == "none" and chunk == 0:
                whole_none[(n, stage)] = res
            failures += [f"{name}: {e}" for e in errs]
            act = res["estimate"]["memory"]["host"]["activations"]
            ok = "ok" if not [e for e in errs if "differs" in e or " vs " in e] else "BAD"
            print(f"{n:>2} {stage:>5} {accum:>5} {policy:>10} {every:>5} {chunk:>5} {act:>12d} {ok:>5} {bits_vs:>6} "
                  f"{'ok' if m['bytes_ok'] else 'BAD':>5} {'ok' if m['mem_ok'] else 'BAD':>4} {res['seconds']:5.1f}",
                  flush=True)
        try:
            acts = [estimate_activations(train, n, stage, accum, work, sets(p, e, chunk)) for p, e in
                    [("none", 1), ("selective", 1), ("block", 2), ("block", 1)]]
        except zm.RunFailed as e:
            failures.append(f"N={n} chunk={chunk}: {e}")
            continue
        if not all(a > b for a, b in zip(acts, acts[1:])):
            failures.append(f"N={n} chunk={chunk}: activations not none > selective > block/2 > block/1: {acts}")
        if chunk != 0 and not (n > 1 and stage == 3) and (n, stage) in whole_none:
            a, w = acts[0], whole_none[(n, stage)]["estimate"]["memory"]["host"]["activations"]
            if not a < w:
                failures.append(f"N={n} chunk={chunk}: chunked activations {a} not below whole {w}")

    # Classifier chunks with the overlapped LM-head gradient (docs/design.md §3.4): at stages 0-2 with
    # overlap the wte gradient's head part is reduced from the start of backward and its lookup part
    # is exchanged at the end (bytes term X); with chunks, the head part is written chunk by chunk
    # into the buffer that early reduction sends. Two ranks, grad_accum 2 (the exchange is deferred
    # to the last micro-step), against one rank with whole logits and the same global batch:
    # zero_equivalence's tolerances, its byte theory and the estimate.
    try:
        ref = started_defer["ref"].result()
    except (zm.RunFailed, ValueError) as e:
        failures.append(f"deferred lookup reference: {e}")
        ref = None
    for stage in (0, 1, 2) if ref else ():
        name = f"N=2 stage={stage} accum=2 chunk=37 (overlapped head gradient)"
        try:
            res = started_defer[stage].result()
        except (zm.RunFailed, ValueError) as e:
            failures.append(f"{name}: {e}")
            continue
        errs, m = zm.check(res, ref, 2, stage, 2, True)
        errs += close(res, ref)
        failures += [f"{name}: {e}" for e in errs]
        print(f"{name}: {'ok' if not errs else 'BAD'} vs N=1 whole, bytes {'ok' if m['bytes_ok'] else 'BAD'}, "
              f"mem {'ok' if m['mem_ok'] else 'BAD'}, {res['seconds']:.1f} s", flush=True)

    print(f"\n{time.monotonic() - t0:.0f} s; run directories in {work}" + ("" if args.keep or failures else " (removed)"))
    if failures:
        print(f"\nrecompute_check FAILED ({len(failures)}):")
        for f in failures:
            print("  - " + f)
        sys.exit(1)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print("recompute_equivalence passed")


if __name__ == "__main__":
    main()
