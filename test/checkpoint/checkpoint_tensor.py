#!/usr/bin/env python3
"""Checkpoints across tensor sizes (issue 53, deliverable 5; docs/checkpoints.md, docs/design.md §3.7):
a tensor-parallel rank saves its slices of each split matrix under the whole tensor's name, at its
global element offsets (2-D datasets for the input-column blocks of the row-parallel weights), so a
checkpoint saved at any mesh.tensor and ZeRO stage loads at any other through the same reader, and
model.h5 / `train export` give whole tensors. Through the real binary under mpirun, on a tiny GPT
(n_layer 2, n_head 6, n_embd 48, seq_len 32: heads split 2 and 3 ways), micro_batch 2, global batch
4 sequences per step (micro_batch x grad_accum x world / mesh.tensor), 6 steps, saving at step 3:

  ref      1 rank, stage 0, grad_accum 2: the 6 steps straight (saves at 3 and 6)
  t2to1    mesh.tensor 2 (world 2) saves at step 3 -> 1 rank resumes to step 6
  1to3     ref's step 3 -> mesh.tensor 3 (world 3, 2 heads a rank) resumes to step 6
  t2d2to1  mesh.tensor 2 x data 2 (world 4), zero.stage 3, grad_accum 1, saves at step 3 in pieces
           of checkpoint.chunk_mb 0.01 (2621 elements: column blocks cut mid-row, a partial row
           and whole rows each a dataset) -> 1 rank stage 0 resumes to step 6
  t2d2s1to3  mesh.tensor 2 x data 2 at stage 1 (parameters whole on each data rank: each saves its
           half, the replicated tensors a quarter) saves at step 3 -> mesh.tensor 3 resumes
  files    at optim.lr 0 (weights stay the initial ones: "step 0-equivalent"), mesh.tensor 2 and 1
           rank each save step 3: model.h5 (h5py, whole tensors by global name and shape) of the
           two, weights bit for bit, AdamW moments within 1e-6 of each tensor's largest; the rank
           files hold the row-parallel weights as one 2-D block per rank; `train export --format
           llmc` of the two within 1e-6, same header (trained weights cannot be compared at 1e-6: the key
           bias's gradient is rounding noise, which AdamW scales to steps of lr)

Resumed losses of steps 4-6 within 1e-5 relative of ref's (the tolerance of checkpoint_test.py's
reshard part): the state loads exactly, what differs is the order of the fp32 sums (a tensor
group's all-reduces, one rank's accumulation). A wrong mapping (two tensor ranks' pieces swapped,
a wrong offset) moves step 4's loss by percents and the checkpoint's tensors by far more than 1e-6.

  /usr/bin/python3 test/checkpoint/checkpoint_tensor.py [CASE...] --train ./train [--mpirun mpirun] [--keep]
"""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_test as ct  # noqa: E402  (run, losses, check, llmc_tensors, run_case_script)

STEPS, SAVE, MB, GLOBAL = 6, 3, 2, 4
TOL, TOL_W = 1e-5, 1e-6
LR0 = 1e-30  # optim.lr must be > 0: an update of ~1e-30 leaves every nonzero initial weight as it is
MODEL = {"model__n_layer": 2, "model__n_head": 6, "model__n_embd": 48, "model__seq_len": 32}


def sets(work, world, tensor, stage, steps, **extra):
    accum = GLOBAL * tensor // (world * MB)
    # (llm.c final weights are not written at mesh.tensor > 1 yet: the exports below stand in)
    mesh = {"mesh__tensor": tensor, "run__final_weights": ""} if tensor > 1 else {}
    return ct.sets(work, stage, MB, accum, steps, **MODEL, **mesh, **extra)


def why(p):
    errs = [l for l in p.stderr.splitlines() if l.startswith("error")]
    return " | ".join(errs)[:300] or p.stderr.strip()[-300:]


def step_dir(work, step):
    return os.path.join(work, "ckpt", f"step_{step:08d}")


def train(tmp, name, world, tensor, stage, steps, **extra):
    w = os.path.join(tmp, name)
    p = ct.run(world, sets(w, world, tensor, stage, steps, **extra), expect_ok=False)
    return w, p


def reference(tmp):
    """ref: 1 rank straight through STEPS, saving at SAVE and STEPS (once for all cases: beside them)."""
    tmp = os.path.dirname(tmp)
    w = os.path.join(tmp, "ref")
    if not os.path.exists(os.path.join(w, "metrics.jsonl")):
        w, p = train(tmp, "ref", 1, 1, 0, STEPS, checkpoint__dir=os.path.join(w, "ckpt"), checkpoint__every=SAVE)
        ct.check(p.returncode == 0 and sorted(ct.losses(w)) == list(range(1, STEPS + 1)),
                 f"ref: 1 rank trains {STEPS} steps, saving at {SAVE} (exit {p.returncode}{'' if p.returncode == 0 else ': ' + why(p)})")
    return w


def save_at(tmp, name, world, tensor, stage, **extra):
    """A run at this mesh that trains SAVE steps and saves; returns its directory."""
    w = os.path.join(tmp, name)
    w, p = train(tmp, name, world, tensor, stage, SAVE, checkpoint__dir=os.path.join(w, "ckpt"), checkpoint__every=SAVE,
                 **extra)
    ct.check(p.returncode == 0 and os.path.isdir(step_dir(w, SAVE)),
             f"{name}: world {world} mesh.tensor {tensor} stage {stage} saves step {SAVE} "
             f"(exit {p.returncode}{'' if p.returncode == 0 else ': ' + why(p)})")
    return w


def resume(tmp, name, ref, ckpt, world, tensor, stage, saved_at):
    b, p = train(tmp, name, world, tensor, stage, STEPS, checkpoint__resume=ckpt)
    what = f"({name}) saved at {saved_at}, resumed at world {world} mesh.tensor {tensor} stage {stage}"
    if p.returncode != 0:
        ct.check(False, f"{what}: exit {p.returncode}: {why(p)}")
        return
    la, lb = ct.losses(ref), ct.losses(b)
    ok = sorted(lb) == list(range(SAVE + 1, STEPS + 1)) and "checkpoint: loaded" in p.stdout
    worst = max(abs(lb[s] - la[s]) / abs(la[s]) for s in lb) if ok else float("inf")
    ct.check(ok and worst <= TOL, f"{what}: losses of steps {SAVE + 1}-{STEPS} within {TOL} relative of ref's "
                                  f"(worst {worst:.2e})")
    return p


def case_t2to1(tmp):
    ref = reference(tmp)
    a = save_at(tmp, "t2", 2, 2, 0)
    p = resume(tmp, "t2to1", ref, step_dir(a, SAVE), 1, 1, 0, "world 2 mesh.tensor 2")
    if p is not None:
        ct.check("mesh.tensor 2;" in p.stdout, "the load line names the tensor size it was saved at: " +
                 next((l for l in p.stdout.splitlines() if "checkpoint: loaded" in l), "")[-120:])


def case_1to3(tmp):
    ref = reference(tmp)
    resume(tmp, "1to3", ref, step_dir(ref, SAVE), 3, 3, 0, "1 rank")


def case_t2d2to1(tmp):
    ref = reference(tmp)
    a = save_at(tmp, "t2d2", 4, 2, 3, checkpoint__chunk_mb=0.01)
    resume(tmp, "t2d2to1", ref, step_dir(a, SAVE), 1, 1, 0, "world 4 mesh.tensor 2 stage 3")


def case_t2d2s1to3(tmp):
    ref = reference(tmp)
    a = save_at(tmp, "t2d2s1", 4, 2, 1)
    resume(tmp, "t2d2s1to3", ref, step_dir(a, SAVE), 3, 3, 0, "world 4 mesh.tensor 2 stage 1")


def tensors(path):
    """Every dataset of an HDF5 file by name (model.h5: whole tensors through the virtual datasets)."""
    import h5py
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[...]) if isinstance(o, h5py.Dataset) else None)
    return out


def same_at_lr0(got, want):
    """Weights of two runs at optim.lr ~0 (name -> array): bit for bit, but the zero-initialized
    biases, which move by ~lr, within 1e-25."""
    return sorted(got) == sorted(want) and all(
        got[n].shape == want[n].shape
        and np.array_equal(np.where(np.abs(want[n]) < 1e-20, 0, got[n]), np.where(np.abs(want[n]) < 1e-20, 0, want[n]))
        and np.all(np.abs(got[n].astype(np.float64) - want[n]) <= 1e-25) for n in want)


def same_model_h5(ckpt, ref_ckpt, what):
    """model.h5 of a checkpoint against a 1-rank one of the same step, both at optim.lr ~0: every
    weight tensor by global name and shape (same_at_lr0), the AdamW moments (sums in another order)
    within TOL_W of each tensor's largest."""
    got, want = tensors(os.path.join(ckpt, "model.h5")), tensors(os.path.join(ref_ckpt, "model.h5"))
    same_shapes = sorted(got) == sorted(want) and all(got[n].shape == want[n].shape for n in want)
    weights = [n for n in want if not n.startswith("adam_")]
    ct.check(same_shapes and same_at_lr0({n: got[n] for n in weights}, {n: want[n] for n in weights}),
             f"model.h5 of the {what} checkpoint: all {len(weights)} weight tensors, by global name and shape, equal "
             f"the 1-rank checkpoint's bit for bit (zero-initialized biases within 1e-25)")
    worst, at = 0.0, ""
    for n in (set(want) - set(weights)) if same_shapes else []:
        scale = float(np.max(np.abs(want[n]))) or 1.0
        d = float(np.max(np.abs(got[n].astype(np.float64) - want[n]))) / scale
        if d > worst:
            worst, at = d, n
    ct.check(same_shapes and len(want) > len(weights) and worst <= TOL_W,
             f"model.h5 AdamW moments ({len(want) - len(weights)} tensors) within {TOL_W} of each tensor's largest "
             f"(worst {worst:.2e} at {at or '-'})")


def case_files(tmp):
    """At optim.lr 0 (the weights stay the initial ones, "step 0-equivalent"): model.h5 of a
    mesh.tensor 2 checkpoint against a 1-rank one of the same step: weights bit for bit, AdamW
    moments (sums in another order) within 1e-6 of each tensor's largest; the llm.c exports bit for
    bit; the row-parallel weight stored as one 2-D block per rank."""
    import h5py
    a = save_at(tmp, "t2lr0", 2, 2, 0, optim__lr=LR0)
    r = save_at(tmp, "t1lr0", 1, 1, 0, optim__lr=LR0)
    if not (os.path.isdir(step_dir(a, SAVE)) and os.path.isdir(step_dir(r, SAVE))):
        return
    same_model_h5(step_dir(a, SAVE), step_dir(r, SAVE), "mesh.tensor 2")
    with h5py.File(os.path.join(step_dir(a, SAVE), "rank_00001.h5"), "r") as f:
        grp = f["param/h/0/mlp/c_proj/weight"]
        ds = [grp[k] for k in grp]
        ct.check(len(ds) == 1 and ds[0].shape == (48, 96) and int(ds[0].attrs["offset"]) == 96
                 and list(ds[0].attrs["shape"]) == [48, 192] and int(f.attrs["tensor"]) == 2,
                 "tensor rank 1's mlp c_proj weight: one 2-D dataset, its (48, 96) input-column block at column 96 of "
                 f"the (48, 192) tensor ({[(d.shape, int(d.attrs['offset'])) for d in ds]})")
    outs = {}
    for name, ck in (("t2", step_dir(a, SAVE)), ("t1", step_dir(r, SAVE))):
        outs[name] = os.path.join(tmp, f"{name}.bin")
        q = subprocess.run([ct.ARGS.train, "export", ck, "--format", "llmc", "--out", outs[name]],
                           capture_output=True, text=True)
        ct.check(q.returncode == 0 and "checkpoint: exported" in q.stdout, f"export --format llmc of {name}: "
                                                                           f"{(q.stdout + q.stderr).strip()[:200]}")
    if all(os.path.exists(o) for o in outs.values()):
        g, w = ct.llmc_tensors(outs["t2"]), ct.llmc_tensors(outs["t1"])
        head = [np.fromfile(outs[n], dtype=np.int32, count=256) for n in ("t2", "t1")]
        worst = max(float(np.max(np.abs(g[n].astype(np.float64) - w[n]))) for n in w)
        ct.check(np.array_equal(*head) and os.path.getsize(outs["t2"]) == os.path.getsize(outs["t1"]) and worst <= TOL_W,
                 f"export llmc of the mesh.tensor 2 checkpoint equals the 1-rank one's within {TOL_W} (worst "
                 f"{worst:.2e}), same header and size")


if __name__ == "__main__":
    sys.exit(ct.run_case_script("checkpoint_tensor", ["t2to1", "1to3", "t2d2to1", "t2d2s1to3", "files"], globals(), True))
