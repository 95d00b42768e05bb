#!/usr/bin/env python3
"""Checkpoints across pipeline meshes (issue 54, deliverable 4; docs/checkpoints.md, docs/design.md §3.7):
a pipeline stage saves what it holds under the whole model's tensor names (its blocks by their global
layer, the embedding only on the first stage: the last stage's tied copy equals it), so a checkpoint
saved at any mesh.pipeline x mesh.tensor x data loads at any other through the same reader, and
model.h5 / `train export` give the whole model. Through the real binary under mpirun, on a tiny GPT
(n_layer 5: uneven stages, n_head 6, n_embd 48, seq_len 32), micro_batch 2, global batch 4 sequences
per step (micro_batch x grad_accum x world / (mesh.pipeline x mesh.tensor)), 6 steps, saving at 3:

  ref        1 rank, stage 0, grad_accum 2: the 6 steps straight (saves at 3 and 6)
  p2t2to1    mesh.pipeline 2 x mesh.tensor 2 (world 4), 1F1B, saves at step 3 in pieces of
             checkpoint.chunk_mb 0.01 -> 1 rank resumes to step 6
  1top3      ref's step 3 -> mesh.pipeline 3 (world 3: blocks 1, 2, 2) resumes to step 6
  p2d2top3   mesh.pipeline 2 x data 2 at zero.stage 1, GPipe (world 4), saves at step 3 -> mesh.pipeline
             3 resumes (every stage's blocks come from another stage's file)
  p2hto1     mesh.pipeline 2 x data 2 at stage 1 with zero.shard_group 1 (hybrid sharding inside the
             stages: two replicas of one-rank shard groups, each saving half of what it holds) -> 1 rank
  interleaved  mesh.pipeline 2 x mesh.chunks 2 (each stage two runs of layers) -> 1 rank, and ref's
             step 3 -> mesh.pipeline 2 x mesh.chunks 2
  p2offto1   mesh.pipeline 2 x data 2 at stage 1 with offload.optimizer nvme -> 1 rank
  files      at optim.lr ~0 (weights stay the initial ones), mesh.pipeline 2 and 1 rank each save step
             3: model.h5 of the two, weights bit for bit, AdamW moments within 1e-6 of each tensor's
             largest; the last stage's rank file holds no wte (saved once, by the first stage); the
             first stage's file no block of the last; `train export --format llmc` of the two equal; the
             run.final_weights of mesh.pipeline 2, of mesh.pipeline 2 x mesh.chunks 2 and of mesh.pipeline
             2 x mesh.tensor 2 equal one rank's; model.h5 of mesh.pipeline 2 x mesh.chunks 2 too
  init       model.init (ref's final weights): mesh.pipeline 3, mesh.pipeline 2 x mesh.tensor 2 and
             mesh.pipeline 2 x mesh.chunks 2 train 3 steps from it within 1e-5 of one rank

Resumed losses of steps 4-6 within 1e-5 relative of ref's (the tolerance of checkpoint_test.py's
reshard part): the state loads exactly, what differs is the order of the fp32 sums. A wrong mapping
(a stage's tensors read at the index of its own layout instead of the whole model's) moves step 4's
loss by percents.

  /usr/bin/python3 test/checkpoint/checkpoint_pipeline.py [CASE...] --train ./train [--mpirun mpirun] [--keep]
"""
import os
import subprocess
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_test as ct  # noqa: E402  (run, losses, check, llmc_tensors, run_case_script)
import checkpoint_tensor as tt  # noqa: E402  (why, step_dir, tensors)

STEPS, SAVE, MB, GLOBAL = 6, 3, 2, 4
TOL = 1e-5
LR0 = 1e-30  # optim.lr must be > 0: an update of ~1e-30 leaves every nonzero initial weight as it is
MODEL = {"model__n_layer": 5, "model__n_head": 6, "model__n_embd": 48, "model__seq_len": 32}
INTERLEAVED = {"mesh__schedule": "interleaved", "mesh__chunks": 2}  # at mesh.pipeline 2: layers 0, 2-3 | 1, 4


def sets(work, world, pipeline, tensor, stage, steps, **extra):
    accum = GLOBAL * tensor * pipeline // (world * MB)
    mesh = {"mesh__pipeline": pipeline, "mesh__tensor": tensor}
    return ct.sets(work, stage, MB, accum, steps, **MODEL, **mesh, **extra)


def train(tmp, name, world, pipeline, tensor, stage, steps, **extra):
    w = os.path.join(tmp, name)
    p = ct.run(world, sets(w, world, pipeline, tensor, stage, steps, **extra), expect_ok=False)
    return w, p


def reference(tmp):
    """ref: 1 rank straight through STEPS, saving at SAVE and STEPS (once for all cases: beside them)."""
    tmp = os.path.dirname(tmp)
    w = os.path.join(tmp, "ref")
    if not os.path.exists(os.path.join(w, "metrics.jsonl")):
        w, p = train(tmp, "ref", 1, 1, 1, 0, STEPS, checkpoint__dir=os.path.join(w, "ckpt"), checkpoint__every=SAVE)
        ct.check(p.returncode == 0 and sorted(ct.losses(w)) == list(range(1, STEPS + 1)),
                 f"ref: 1 rank trains {STEPS} steps, saving at {SAVE} (exit {p.returncode}"
                 f"{'' if p.returncode == 0 else ': ' + tt.why(p)})")
    return w


def save_at(tmp, name, world, pipeline, tensor, stage, **extra):
    """A run at this mesh that trains SAVE steps and saves; returns its directory."""
    w, p = train(tmp, name, world, pipeline, tensor, stage, SAVE, checkpoint__dir=os.path.join(tmp, name, "ckpt"),
                 checkpoint__every=SAVE, **extra)
    ct.check(p.returncode == 0 and os.path.isdir(tt.step_dir(w, SAVE)),
             f"{name}: world {world} mesh.pipeline {pipeline} mesh.tensor {tensor} stage {stage} saves step {SAVE} "
             f"(exit {p.returncode}{'' if p.returncode == 0 else ': ' + tt.why(p)})")
    return w


def resume(tmp, name, ref, ckpt, world, pipeline, tensor, stage, saved_at, **extra):
    b, p = train(tmp, name, world, pipeline, tensor, stage, STEPS, checkpoint__resume=ckpt, **extra)
    what = f"({name}) saved at {saved_at}, resumed at world {world} mesh.pipeline {pipeline} mesh.tensor {tensor}"
    if p.returncode != 0:
        ct.check(False, f"{what}: exit {p.returncode}: {tt.why(p)}")
        return None
    la, lb = ct.losses(ref), ct.losses(b)
    ok = sorted(lb) == list(range(SAVE + 1, STEPS + 1)) and "checkpoint: loaded" in p.stdout
    worst = max(abs(lb[s] - la[s]) / abs(la[s]) for s in lb) if ok else float("inf")
    ct.check(ok and worst <= TOL, f"{what}: losses of steps {SAVE + 1}-{STEPS} within {TOL} relative of ref's "
                                  f"(worst {worst:.2e})")
    return p


def case_p2t2to1(tmp):
    ref = reference(tmp)
    a = save_at(tmp, "p2t2", 4, 2, 2, 0, checkpoint__chunk_mb=0.01)
    p = resume(tmp, "p2t2to1", ref, tt.step_dir(a, SAVE), 1, 1, 1, 0, "world 4 mesh.pipeline 2 mesh.tensor 2")
    if p is not None:
        line = next((l for l in p.stdout.splitlines() if "checkpoint: loaded" in l), "")
        ct.check("mesh.pipeline 2, mesh.tensor 2;" in line, "the load line names the mesh it was saved at: " + line[-120:])


def case_1top3(tmp):
    ref = reference(tmp)
    resume(tmp, "1top3", ref, tt.step_dir(ref, SAVE), 3, 3, 1, 0, "1 rank")


def case_p2d2top3(tmp):
    ref = reference(tmp)
    a = save_at(tmp, "p2d2", 4, 2, 1, 1, mesh__schedule="gpipe")
    resume(tmp, "p2d2top3", ref, tt.step_dir(a, SAVE), 3, 3, 1, 0, "world 4 mesh.pipeline 2 stage 1")


def case_p2hto1(tmp):
    ref = reference(tmp)
    a = save_at(tmp, "p2h", 4, 2, 1, 1, zero__shard_group=1)
    resume(tmp, "p2hto1", ref, tt.step_dir(a, SAVE), 1, 1, 1, 0, "world 4 mesh.pipeline 2 stage 1 zero.shard_group 1")


def case_interleaved(tmp):
    """Interleaved chunks: stage 0 of mesh.pipeline 2 x mesh.chunks 2 holds layers 0 and 2, stage 1
    layers 1, 3-4 (runs, not one range): its checkpoint -> 1 rank, and ref's -> the same mesh."""
    ref = reference(tmp)
    il = INTERLEAVED
    a = save_at(tmp, "p2v2", 2, 2, 1, 0, **il)
    resume(tmp, "p2v2to1", ref, tt.step_dir(a, SAVE), 1, 1, 1, 0, "world 2 mesh.pipeline 2 mesh.chunks 2")
    resume(tmp, "1top2v2", ref, tt.step_dir(ref, SAVE), 2, 2, 1, 0, "1 rank", **il)


def case_p2offto1(tmp):
    """The optimizer state offloaded to disk inside the stages (offload.optimizer nvme, P 2 x data 2 at
    stage 1): its checkpoint -> 1 rank."""
    ref = reference(tmp)
    a = save_at(tmp, "p2off", 4, 2, 1, 1, offload__optimizer="nvme", offload__nvme_dir=os.path.join(tmp, "nvme"))
    resume(tmp, "p2offto1", ref, tt.step_dir(a, SAVE), 1, 1, 1, 0, "world 4 mesh.pipeline 2 stage 1 offload nvme")


def case_files(tmp):
    """At optim.lr ~0: model.h5 of a mesh.pipeline 2 checkpoint against a 1-rank one of the same step
    (weights bit for bit, moments within 1e-6), what each stage's file holds, the llm.c exports."""
    import h5py
    a = save_at(tmp, "p2lr0", 2, 2, 1, 0, optim__lr=LR0)
    r = save_at(tmp, "p1lr0", 1, 1, 1, 0, optim__lr=LR0)
    t = save_at(tmp, "p2t2lr0", 4, 2, 2, 0, optim__lr=LR0)
    v = save_at(tmp, "p2v2lr0", 2, 2, 1, 0, optim__lr=LR0, **INTERLEAVED)
    finals = [os.path.join(w, "final.bin") for w in (a, t, r, v)]
    ok = all(os.path.exists(f) for f in finals) and ct.same_bytes(finals[0], finals[2]) and \
        ct.same_bytes(finals[3], finals[2])
    if ok:  # the tensor group's sums in another order: the zero-initialized biases' ~lr steps differ
        ok = tt.same_at_lr0(ct.llmc_tensors(finals[1]), ct.llmc_tensors(finals[2]))
    ct.check(ok, "run.final_weights (later stages' blocks sent to rank 0): mesh.pipeline 2's and mesh.pipeline 2 x "
                 "mesh.chunks 2's equal the 1-rank run's byte for byte, mesh.pipeline 2 x mesh.tensor 2's bit for bit "
                 "(zero-initialized biases within 1e-25)")
    if not all(os.path.isdir(tt.step_dir(w, SAVE)) for w in (a, r, v)):
        return
    tt.same_model_h5(tt.step_dir(a, SAVE), tt.step_dir(r, SAVE), "mesh.pipeline 2")
    tt.same_model_h5(tt.step_dir(v, SAVE), tt.step_dir(r, SAVE), "mesh.pipeline 2 x mesh.chunks 2")
    held = []
    for r_ in (0, 1):
        with h5py.File(os.path.join(tt.step_dir(a, SAVE), f"rank_{r_:05d}.h5"), "r") as f:
            held.append(sorted(set(k for k in f["param"]) | set(f"h/{k}" for k in f["param/h"])
                               if "h" in f["param"] else set(f["param"])))
            ct.check(int(f.attrs["pipeline"]) == 2, f"rank {r_}'s file records mesh.pipeline 2")
    # 5 blocks over 2 stages with the head (V 50257 x C 48) on the last: 4 + 1 (the banner's split)
    ct.check("wte" in held[0] and "wte" not in held[1] and "ln_f" in held[1] and "ln_f" not in held[0]
             and "h/0" in held[0] and "h/4" in held[1] and not set(held[0]) & set(h for h in held[1] if h.startswith("h/")),
             f"stage 0 saved wte and its blocks, stage 1 its blocks and ln_f, no wte (the tied copy): {held}")
    outs = {}
    for name, ck in (("p2", tt.step_dir(a, SAVE)), ("p1", tt.step_dir(r, SAVE))):
        outs[name] = os.path.join(tmp, f"{name}.bin")
        q = subprocess.run([ct.ARGS.train, "export", ck, "--format", "llmc", "--out", outs[name]],
                           capture_output=True, text=True)
        ct.check(q.returncode == 0 and "checkpoint: exported" in q.stdout, f"export --format llmc of {name}: "
                                                                           f"{(q.stdout + q.stderr).strip()[:200]}")
    if all(os.path.exists(o) for o in outs.values()):
        ct.check(ct.same_bytes(outs["p2"], outs["p1"]),
                 "export llmc of the mesh.pipeline 2 checkpoint equals the 1-rank one's byte for byte")


def case_init(tmp):
    """model.init with stages: every stage keeps its layers of the llm.c file (ref's final weights);
    mesh.pipeline 3 and mesh.pipeline 2 x mesh.tensor 2 train 3 steps from it as one rank does."""
    ref = reference(tmp)
    init = os.path.join(ref, "final.bin")
    one, p = train(tmp, "init1", 1, 1, 1, 0, SAVE, model__init=init)
    ct.check(p.returncode == 0, f"1 rank trains from ref's final weights (exit {p.returncode}: {tt.why(p)})")
    for name, world, pipeline, tensor, extra in (("initp3", 3, 3, 1, {}), ("initp2t2", 4, 2, 2, {}),
                                                 ("initp2v2", 2, 2, 1, INTERLEAVED)):
        w, q = train(tmp, name, world, pipeline, tensor, 0, SAVE, model__init=init, **extra)
        la, lb = ct.losses(one) if p.returncode == 0 else {}, ct.losses(w) if q.returncode == 0 else {}
        ok = sorted(lb) == list(range(1, SAVE + 1)) and sorted(la) == sorted(lb)
        worst = max(abs(lb[s] - la[s]) / abs(la[s]) for s in lb) if ok else float("inf")
        ct.check(ok and worst <= TOL, f"{name}: mesh.pipeline {pipeline} mesh.tensor {tensor} from model.init: losses of "
                                      f"steps 1-{SAVE} within {TOL} of one rank's (worst {worst:.2e}"
                                      f"{'' if q.returncode == 0 else '; exit ' + str(q.returncode) + ': ' + tt.why(q)})")


if __name__ == "__main__":
    sys.exit(ct.run_case_script("checkpoint_pipeline", ["p2t2to1", "1top3", "p2d2top3", "p2hto1", "interleaved", "p2offto1", "files", "init"], globals(), True))
