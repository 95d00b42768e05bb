#!/usr/bin/env python3
"""Checkpoints across shard groups (zero.shard_group, issue 52; docs/design.md §3.7): a checkpoint
holds every tensor at its global offsets, so one saved by any mesh loads into any world, stage and
shard group. Through the real binary under mpirun, on checkpoint_test.py's tiny GPT (L = 2, C = 35:
units that split unevenly over 2 and 4 ranks), 10 steps saving at 5 (its helpers: sets, run,
losses, same_bytes, check).

  hybrid  4 ranks, stage 3, shard_group 2 (2 x 2) saves at step 5 of its 10; it is the
          uninterrupted run of every resume below, each from its step 5 with the same global batch
          of 8 sequences:
            (a) the same mesh: losses of steps 6-10 and the final weights bit for bit
            (b) 4 ranks stage 3 with shard_group 4 (full ZeRO-3)
            (c) 1 rank stage 0, grad_accum 4
            (d) 2 ranks stage 1 with shard_group 1 (1 x 2: plain replicas)
  world   4 ranks, stage 3, shard_group omitted ("world": full ZeRO-3) saves at step 5 of its 10;
            (e) 4 ranks stage 2 with shard_group 2 resumes it.

(b)-(e) continue within fp32 rounding: every loss of steps 6-10 within 1e-5 relative and the final
weights within 1e-5 relative L2 of the uninterrupted run, the tolerances of checkpoint_test.py's
reshard part and zero_equivalence.py. The state loads exactly (global offsets: a wrong offset or
a shard of another rank moves the loss by percents at step 6); what differs is the order of the
fp32 sums of the next five steps' gradients (within a shard group, then across replicas, or one
rank's accumulation), relative rounding of ~1e-7 per sum, which five AdamW steps at lr 3e-3 keep
far below 1e-5.

  /usr/bin/python3 test/checkpoint/hybrid_checkpoint.py [CASE...] --train ./train [--mpirun mpirun] [--keep]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_test as ct  # noqa: E402  (sets, run, losses, same_bytes, check, llmc_tensors, run_case_script)

STEPS, SAVE, MB = 10, 5, 2
GLOBAL = 8  # sequences per step: world x grad_accum x MB
TOL = 1e-5


def group(S):
    """The plan fields of shard group S (None: the key omitted, "world")."""
    return {} if S is None else {"zero__shard_group": S}


def train(work, world, stage, S, **extra):
    """A 10-step run at this mesh, the global batch kept through grad_accum; returns the process."""
    accum = GLOBAL // (world * MB)
    return ct.run(world, ct.sets(work, stage, MB, accum, STEPS, **group(S), **extra), expect_ok=False)


def why(p):
    """A failed run's error lines (the binary's), not mpirun's banner."""
    errs = [l for l in p.stderr.splitlines() if l.startswith("error")]
    return " | ".join(errs)[:300] or p.stderr.strip()[-300:]


def save_run(tmp, name, world, stage, S):
    """The uninterrupted run, saving at step SAVE; returns (its directory, the step's checkpoint)."""
    a = os.path.join(tmp, name)
    p = train(a, world, stage, S, checkpoint__dir=os.path.join(a, "ckpt"), checkpoint__every=SAVE)
    ok = p.returncode == 0 and sorted(ct.losses(a)) == list(range(1, STEPS + 1))
    ct.check(ok, f"{name}: {world} ranks stage {stage} shard_group {S or 'world'} trains {STEPS} steps, "
                 f"saving at {SAVE} (exit {p.returncode}{'' if ok else ': ' + why(p)})")
    return a, os.path.join(a, "ckpt", f"step_{SAVE:08d}")


def rel_l2(path, ref):
    w, r = ct.llmc_tensors(path), ct.llmc_tensors(ref)
    num = sum(float(np.sum((w[k].astype(np.float64) - r[k]) ** 2)) for k in r)
    den = sum(float(np.sum(r[k].astype(np.float64) ** 2)) for k in r)
    return (num / den) ** 0.5


def resume(tmp, name, ref, step_dir, world, stage, S, exact):
    """Resume from step_dir at this mesh and compare steps SAVE+1..STEPS and the final weights with
    the uninterrupted run ref: bit for bit (exact) or within TOL."""
    b = os.path.join(tmp, name)
    p = train(b, world, stage, S, checkpoint__resume=step_dir)
    what = f"({name}) resumed at {world} ranks stage {stage} shard_group {S or 'world'}"
    if p.returncode != 0:
        ct.check(False, f"{what}: exit {p.returncode}: {why(p)}")
        return
    la, lb = ct.losses(ref), ct.losses(b)
    steps_ok = sorted(lb) == list(range(SAVE + 1, STEPS + 1))
    ct.check("checkpoint: loaded" in p.stdout and steps_ok, f"{what}: loads step {SAVE}, trains steps {SAVE + 1}-{STEPS}")
    if not steps_ok:
        return
    fa, fb = os.path.join(ref, "final.bin"), os.path.join(b, "final.bin")
    if exact:
        ct.check(all(la[s] == lb[s] for s in lb) and ct.same_bytes(fa, fb),
                 f"{what}: losses of steps {SAVE + 1}-{STEPS} and final weights bit for bit")
        return
    worst = max(abs(lb[s] - la[s]) / abs(la[s]) for s in lb)
    w = rel_l2(fb, fa)
    ct.check(worst <= TOL and w <= TOL,
             f"{what}: losses within {TOL} relative (worst {worst:.2e}), final weights rel L2 {w:.2e} <= {TOL}")


def case_hybrid(tmp):
    a, step = save_run(tmp, "hybrid", 4, 3, 2)
    if not os.path.isdir(step):
        return
    for name, world, stage, S, exact in (("a", 4, 3, 2, True), ("b", 4, 3, 4, False),
                                         ("c", 1, 0, None, False), ("d", 2, 1, 1, False)):
        resume(tmp, name, a, step, world, stage, S, exact)


def case_world(tmp):
    a, step = save_run(tmp, "world", 4, 3, None)
    if os.path.isdir(step):
        resume(tmp, "e", a, step, 4, 2, 2, False)


if __name__ == "__main__":
    sys.exit(ct.run_case_script("hybrid_checkpoint", ["hybrid", "world"], globals(), True))
