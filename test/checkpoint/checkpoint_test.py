#!/usr/bin/env python3
"""Sharded checkpoints end to end (docs/design.md §3.7), through the real binary under mpirun.

  resume   train 20 steps (saving at 10 and 20) vs resume from step 10 and train 10 more: the
           losses of steps 11-20 and the final weights (run.final_weights) are identical bit for
           bit, zero stages 0-3 x world 1 and 3; saved in 0.01 MiB pieces (checkpoint.chunk_mb) and
           resumed with 64 MiB ones, and the other way.
  reshard  saved at world 4 stage 3; resumed at world 2 stage 1, world 3 stage 0 and world 1
           stage 2 (same global batch through grad_accum): every continued loss within 1e-5
           relative of the uninterrupted world-4 run.
  files    h5py reads model.h5 (virtual datasets over the rank files, also from another working
           directory) and `train export --format hdf5`: every full tensor equals the same run's
           run.final_weights; `--format llmc` is byte-identical to it. Rank-file attributes,
           checkpoint.keep, resume "auto" with nothing saved yet, and a checkpoint of another
           model shape refused naming both shapes.
  faults   a bit flipped in a dataset and a truncated rank file: one line naming the file (and the
           dataset); a rank killed (SIGKILL) in the middle of a save leaves the previous checkpoint
           as `latest` and resume "auto" continues from it to the uninterrupted run's weights;
           SIGTERM to one rank (world 3), SIGUSR1 to mpirun, SIGTERM to a world-1 run: exit 0
           with a checkpoint that resumes bit for bit.

  /usr/bin/python3 test/checkpoint/checkpoint_test.py PART --train ./train [--mpirun mpirun] [--keep]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
L, NH, C, T, V = 2, 5, 35, 31, 50257   # a tiny GPT whose units split unevenly over 3 and 4 ranks
ARGS = None
FAILS = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def env():
    e = dict(os.environ)
    e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    return e


def sets(work, stage=0, mb=2, accum=1, steps=20, **extra):
    s = {"model.n_layer": L, "model.n_head": NH, "model.n_embd": C, "model.seq_len": T, "model.vocab_size": V,
         "data.train": "data/sample/train_*.bin", "data.val": "data/sample/val.bin", "data.tokenizer": "",
         "batch.micro_batch": mb, "batch.grad_accum": accum, "optim.lr": 3e-3, "optim.warmup_steps": 3,
         "zero.stage": stage, "run.steps": steps, "run.eval_every": 0, "run.eval_batches": 1,
         "run.sample_every": 0, "run.threads": 1, "run.log": os.path.join(work, "metrics.jsonl"),
         "run.final_weights": os.path.join(work, "final.bin")}
    s.update({k.replace("__", "."): v for k, v in extra.items()})
    out = []
    for k, v in s.items():
        out += ["--set", f"{k}={v}"]
    return out


def command(world, args):
    base = [ARGS.train, os.path.join(ROOT, "plans/base.json")] + args
    return base if world == 1 else [ARGS.mpirun, "--oversubscribe", "-np", str(world)] + base


def run(world, args, expect_ok=True, extra_env=None):
    e = env()
    e.update(extra_env or {})
    p = subprocess.run(command(world, args), cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    if expect_ok and p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        raise SystemExit(f"run failed (exit {p.returncode}): {' '.join(command(world, args))}")
    return p


def losses(work):
    out = {}
    with open(os.path.join(work, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j:
                out[j["step"]] = j["loss"]
    return out


def same_bytes(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def llmc_tensors(path):
    """name -> array from an llm.c fp32 model file, in the order and shapes of src/model/layout.h."""
    raw = np.fromfile(path, dtype=np.int32, count=256)
    maxT, Vv, Ll, Cc, Vp = raw[2], raw[3], raw[4], raw[6], raw[7]
    w = np.fromfile(path, dtype=np.float32, offset=1024)
    blocks = [("ln_1.weight", (Cc,)), ("ln_1.bias", (Cc,)), ("attn.c_attn.weight", (3 * Cc, Cc)),
              ("attn.c_attn.bias", (3 * Cc,)), ("attn.c_proj.weight", (Cc, Cc)), ("attn.c_proj.bias", (Cc,)),
              ("ln_2.weight", (Cc,)), ("ln_2.bias", (Cc,)), ("mlp.c_fc.weight", (4 * Cc, Cc)),
              ("mlp.c_fc.bias", (4 * Cc,)), ("mlp.c_proj.weight", (Cc, 4 * Cc)), ("mlp.c_proj.bias", (Cc,))]
    out, at = {}, 0

    def take(name, shape):
        nonlocal at
        n = int(np.prod(shape))
        out[name] = w[at:at + n].reshape(shape)
        at += n
    take("wte.weight", (Vp, Cc))
    take("wpe.weight", (maxT, Cc))
    for name, shape in blocks:
        for l in range(Ll):
            take(f"h.{l}.{name}", shape)
    take("ln_f.weight", (Cc,))
    take("ln_f.bias", (Cc,))
    assert at == w.size
    return out


def part_resume(tmp):
    for world in (1, 3):
        for stage in range(4):
            a, b = os.path.join(tmp, f"a{world}{stage}"), os.path.join(tmp, f"b{world}{stage}")
            run(world, sets(a, stage, checkpoint__dir=os.path.join(a, "ckpt"), checkpoint__every=10))
            run(world, sets(b, stage, checkpoint__resume=os.path.join(a, "ckpt", "step_00000010")))
            la, lb = losses(a), losses(b)
            check(sorted(lb) == list(range(11, 21)) and all(la[s] == lb[s] for s in lb),
                  f"world {world} stage {stage}: resumed losses of steps 11-20 equal the uninterrupted run's bit for bit")
            check(same_bytes(os.path.join(a, "final.bin"), os.path.join(b, "final.bin")),
                  f"world {world} stage {stage}: final weights identical bit for bit")
    # checkpoint.chunk_mb: ranges saved in pieces of 0.01 MiB (2621 fp32 elements: the embedding's
    # shard in ~220 datasets) resume bit for bit with the default 64 MiB, and the default-sized
    # pieces of a33 load bit for bit through 0.01 MiB reads (each piece read and verified once).
    a, b, c = (os.path.join(tmp, n) for n in ("ca33", "cb33", "cc33"))
    run(3, sets(a, 3, checkpoint__dir=os.path.join(a, "ckpt"), checkpoint__every=10, checkpoint__chunk_mb=0.01))
    run(3, sets(b, 3, checkpoint__resume=os.path.join(a, "ckpt", "step_00000010")))
    run(3, sets(c, 3, checkpoint__resume=os.path.join(tmp, "a33", "ckpt", "step_00000010"), checkpoint__chunk_mb=0.01))
    import h5py
    with h5py.File(os.path.join(a, "ckpt", "step_00000010", "rank_00001.h5"), "r") as f:
        pieces = len(f["param/wte/weight"])
    check(pieces >= 200, f"checkpoint.chunk_mb 0.01: rank 1's embedding shard saved in {pieces} datasets")
    for name, x, ref in (("saved in 0.01 MiB pieces, resumed with 64 MiB", b, a),
                         ("saved in 64 MiB pieces, resumed with 0.01 MiB", c, os.path.join(tmp, "a33"))):
        la, lb = losses(ref), losses(x)
        check(sorted(lb) == list(range(11, 21)) and all(la[s] == lb[s] for s in lb)
              and same_bytes(os.path.join(ref, "final.bin"), os.path.join(x, "final.bin")),
              f"world 3 stage 3, {name}: losses of steps 11-20 and final weights bit for bit")
    # Optimizer state offloaded to swap files (docs/design.md §3.6) is saved and loaded like any other:
    # a run with offload saves, and runs with and without offload continue it bit for bit.
    for world, stage in ((1, 1), (3, 3)):
        a = os.path.join(tmp, f"oa{world}{stage}")
        swap = {"offload__optimizer": "nvme", "offload__nvme_dir": os.path.join(tmp, "swap")}
        run(world, sets(a, stage, checkpoint__dir=os.path.join(a, "ckpt"), checkpoint__every=10, **swap))
        for name, extra in (("with offload", swap), ("without offload", {})):
            b = os.path.join(tmp, f"ob{world}{stage}{len(extra)}")
            run(world, sets(b, stage, checkpoint__resume=os.path.join(a, "ckpt", "step_00000010"), **extra))
            la, lb = losses(a), losses(b)
            check(sorted(lb) == list(range(11, 21)) and all(la[s] == lb[s] for s in lb),
                  f"world {world} stage {stage}: offloaded run's checkpoint resumed {name}: losses bit for bit")
            check(same_bytes(os.path.join(a, "final.bin"), os.path.join(b, "final.bin")),
                  f"world {world} stage {stage}: offloaded run's checkpoint resumed {name}: final weights bit for bit")


def part_reshard(tmp):
    # Global batch 24 sequences: world 4 x accum 3 = world 3 x accum 4 = world 2 x accum 6 = world 1 x accum 12.
    a = os.path.join(tmp, "a")
    run(4, sets(a, 3, accum=3, checkpoint__dir=os.path.join(a, "ckpt"), checkpoint__every=10))
    ref = losses(a)
    for world, stage, accum in ((2, 1, 6), (3, 0, 4), (1, 2, 12)):
        b = os.path.join(tmp, f"b{world}{stage}")
        p = run(world, sets(b, stage, accum=accum, checkpoint__resume=os.path.join(a, "ckpt", "step_00000010")))
        lb = losses(b)
        worst = max(abs(lb[s] - ref[s]) / abs(ref[s]) for s in lb)
        check(sorted(lb) == list(range(11, 21)) and worst <= 1e-5,
              f"saved at world 4 stage 3, resumed at world {world} stage {stage}: losses of steps 11-20 within 1e-5 "
              f"relative of the world-4 run (worst {worst:.2e})")
        check("checkpoint: loaded" in p.stdout and "GB/s" in p.stdout, f"world {world}: one load summary line")
    bad = run(2, sets(os.path.join(tmp, "c"), 1, accum=3, checkpoint__resume=os.path.join(a, "ckpt")),
              expect_ok=False)
    err = [l for l in bad.stderr.splitlines() if l.startswith("error")]
    check(bad.returncode != 0 and len(err) == 1 and "keep the global batch" in err[0],
          "a different global batch is refused in one line: " + (err[0][:200] if err else bad.stderr[-300:]))


def part_files(tmp):
    import h5py
    a = os.path.join(tmp, "a")
    ck = os.path.join(a, "ckpt")
    # (in 0.01 MiB pieces: model.h5 and export stitch many datasets per tensor and rank)
    p = run(3, sets(a, 3, checkpoint__dir=ck, checkpoint__every=5, checkpoint__keep=2, checkpoint__chunk_mb=0.01))
    check(sorted(d for d in os.listdir(ck)) == ["latest", "step_00000015", "step_00000020"],
          f"checkpoint.keep 2: only the two newest remain ({sorted(os.listdir(ck))})")
    check(open(os.path.join(ck, "latest")).read() == "step_00000020\n", "latest names step_00000020")
    check(p.stdout.count("checkpoint: saved") == 4 and "GB/s" in p.stdout, "one save summary line per save")
    step = os.path.join(ck, "step_00000020")
    final = llmc_tensors(os.path.join(a, "final.bin"))
    # model.h5 read from another working directory: the virtual datasets find the rank files beside it.
    code = ("import h5py, numpy as np, sys\n"
            "f = h5py.File(sys.argv[1], 'r')\n"
            "np.savez(sys.argv[2], **{n.replace('/', '.'): f[n][...] for n in sys.argv[3:]})\n")
    names = [n.replace(".", "/") for n in final]
    out = os.path.join(tmp, "vds.npz")
    subprocess.run([sys.executable, "-c", code, os.path.join(step, "model.h5"), out] + names, cwd="/", check=True)
    got = np.load(out)
    check(all(np.array_equal(got[n], final[n]) for n in final),
          f"model.h5: all {len(final)} tensors, read whole by name, equal run.final_weights")
    with h5py.File(os.path.join(step, "model.h5"), "r") as f:
        check(f["h/1/attn/c_attn/weight"].shape == (3 * C, C) and f["h/1/attn/c_attn/weight"].is_virtual,
              "model.h5 /h/1/attn/c_attn/weight is a (105, 35) virtual dataset")
        check("adam_m" in f and "adam_v" in f and f["adam_v/wte/weight"].shape == final["wte.weight"].shape,
              "model.h5 also stitches the AdamW moments")
        check(all(np.all(f[f"adam_v/{n}"][...] >= 0) for n in names), "AdamW second moments are >= 0 everywhere")
    with h5py.File(os.path.join(step, "rank_00001.h5"), "r") as f:
        meta = {k: f.attrs[k] for k in ("format_version", "step", "world", "rank", "zero_stage", "seed",
                                        "next_sequence", "plan_hash", "model_shape")}
        check(meta["step"] == 20 and meta["world"] == 3 and meta["rank"] == 1 and meta["zero_stage"] == 3 and
              meta["next_sequence"] == 20 * 2 * 3 and list(meta["model_shape"]) == [L, NH, C, T, V],
              f"rank file attributes: {meta}")
        grp = f["param/h/0/mlp/c_fc/weight"]
        d = grp[list(grp)[0]]
        check(d.attrs["tensor"] == "h.0.mlp.c_fc.weight" and list(d.attrs["shape"]) == [4 * C, C]
              and int(d.attrs["offset"]) == int(list(grp)[0]) and "crc32c" in d.attrs,
              "shard datasets carry tensor, shape, offset and crc32c")
    # Saving a step that exists (resumed from step 15 into the same dir): replaced in one atomic swap.
    p = run(3, sets(os.path.join(tmp, "again"), 3, checkpoint__dir=ck, checkpoint__every=5,
                    checkpoint__resume=os.path.join(ck, "step_00000015")))
    with h5py.File(os.path.join(step, "model.h5"), "r") as f:
        same = all(np.array_equal(f[n.replace(".", "/")][...], final[n]) for n in final)
    check(same and sorted(os.listdir(ck)) == ["latest", "step_00000015", "step_00000020"]
          and "resuming at step 15" in p.stdout, "step 20 saved again over itself: complete, same weights, nothing left over")
    # A fresh run (resume "none") into a directory holding another run's checkpoints: refused before
    # training, nothing in the directory changed.
    before = {d: os.stat(os.path.join(ck, d)).st_mtime_ns for d in os.listdir(ck)}
    bad = run(1, sets(os.path.join(tmp, "fresh"), 0, checkpoint__dir=ck, checkpoint__every=5), expect_ok=False)
    err = [l for l in bad.stderr.splitlines() if l.startswith("error")]
    check(bad.returncode != 0 and len(err) == 1 and "already holds checkpoints" in err[0]
          and {d: os.stat(os.path.join(ck, d)).st_mtime_ns for d in os.listdir(ck)} == before
          and not os.path.exists(os.path.join(tmp, "fresh", "metrics.jsonl")),
          "a fresh run into another run's checkpoint.dir is refused, nothing written: " + " ".join(err)[:200])
    # Export: hdf5 and llmc, from the checkpoint.dir (its latest).
    for fmt, name in (("hdf5", "export.h5"), ("llmc", "export.bin")):
        q = subprocess.run([ARGS.train, "export", ck, "--format", fmt, "--out", os.path.join(tmp, name)],
                           capture_output=True, text=True)
        check(q.returncode == 0 and "checkpoint: exported" in q.stdout, f"export --format {fmt}: {q.stdout.strip()}")
    with h5py.File(os.path.join(tmp, "export.h5"), "r") as f:
        check(all(np.array_equal(f[n.replace(".", "/")][...], final[n]) for n in final),
              "export --format hdf5: every tensor equals run.final_weights")
    check(same_bytes(os.path.join(tmp, "export.bin"), os.path.join(a, "final.bin")),
          "export --format llmc is byte-identical to run.final_weights")
    # resume "auto" with no checkpoint yet: a fresh start; another model shape: refused, naming both.
    c = os.path.join(tmp, "c")
    p = run(1, sets(c, 0, steps=3, checkpoint__dir=os.path.join(c, "ckpt"), checkpoint__resume="auto"))
    check("checkpoint: loaded" not in p.stdout and len(losses(c)) == 3, "resume auto without a checkpoint starts fresh")
    for resume, expect in ((os.path.join(tmp, "nowhere"), "checkpoint.resume: no checkpoint directory at"),
                           (c, "is neither a checkpoint")):
        bad = run(1, sets(c, 0, checkpoint__resume=resume), expect_ok=False)
        err = bad.stderr.strip().splitlines()
        check(bad.returncode != 0 and len(err) == 1 and expect in err[0], "resume from a wrong path: " + " ".join(err)[:160])
    # On a terminal (ZT_PROGRESS=tty), the save shows its progress on one line that the summary replaces.
    p = run(1, sets(c, 0, steps=2, checkpoint__dir=os.path.join(c, "ck2"), checkpoint__every=2),
            extra_env={"ZT_PROGRESS": "tty"})
    # (text mode reads the \r as a line end)
    check("\033[Kcheckpoint: saving step 2: 100%" in p.stdout and "\033[Kcheckpoint: saved" in p.stdout,
          "tty: save progress, then the summary")
    bad = run(1, sets(c, 0, checkpoint__resume=ck, model__n_embd=40), expect_ok=False)
    last = bad.stderr.strip().splitlines()[-1] if bad.stderr.strip() else ""
    check(bad.returncode != 0 and "n_embd 35" in last and "n_embd 40" in last and len(bad.stderr.strip().splitlines()) == 1,
          "another model shape is refused in one line naming both: " + last[:200])


def flip_byte_in_dataset(path, dataset):
    import h5py
    with h5py.File(path, "r") as f:
        off = f[dataset].id.get_offset()
    with open(path, "r+b") as f:
        f.seek(off + 10)
        b = f.read(1)
        f.seek(off + 10)
        f.write(bytes([b[0] ^ 0x10]))


def part_faults(tmp):
    import h5py
    # Corruption.
    a = os.path.join(tmp, "a")
    ck = os.path.join(a, "ckpt")
    run(3, sets(a, 2, steps=10, checkpoint__dir=ck, checkpoint__every=10))
    step = os.path.join(ck, "step_00000010")
    for name in ("flip", "trunc", "flipw"):
        shutil.copytree(step, os.path.join(tmp, name))
    rank1 = os.path.join(tmp, "flip", "rank_00001.h5")
    with h5py.File(rank1, "r") as f:  # rank 1's last AdamW first-moment dataset
        found = []
        f["adam_m"].visititems(lambda n, o: found.append(o.name) if isinstance(o, h5py.Dataset) else None)
        ds = found[-1]
    flip_byte_in_dataset(rank1, ds)
    bad = run(3, sets(os.path.join(tmp, "b"), 2, steps=20, checkpoint__resume=os.path.join(tmp, "flip")), expect_ok=False)
    err = [l for l in bad.stderr.strip().splitlines() if l.startswith("error")]
    check(bad.returncode != 0 and len(err) == 1 and rank1 in err[0] and ds in err[0] and "checksum" in err[0],
          "bit flip: one line naming the file and dataset: " + (err[0][:220] if err else bad.stderr[-300:]))
    rank2 = os.path.join(tmp, "trunc", "rank_00002.h5")
    os.truncate(rank2, os.path.getsize(rank2) // 2)
    bad = run(3, sets(os.path.join(tmp, "b"), 2, steps=20, checkpoint__resume=os.path.join(tmp, "trunc")), expect_ok=False)
    err = [l for l in bad.stderr.strip().splitlines() if l.startswith("error")]
    check(bad.returncode != 0 and len(err) == 1 and rank2 in err[0] and "truncated" in err[0],
          "truncated rank file: one line naming the file: " + (err[0][:220] if err else bad.stderr[-300:]))
    # export reads the weights only: damage one of those.
    rank0 = os.path.join(tmp, "flipw", "rank_00000.h5")
    with h5py.File(rank0, "r") as f:
        wds = f["param/h/0/mlp/c_fc/weight"].name + "/" + list(f["param/h/0/mlp/c_fc/weight"])[0]
    flip_byte_in_dataset(rank0, wds)
    q = subprocess.run([ARGS.train, "export", os.path.join(tmp, "flipw"), "--format", "llmc", "--out",
                        os.path.join(tmp, "x.bin")], capture_output=True, text=True)
    check(q.returncode != 0 and rank0 in q.stderr and wds in q.stderr and len(q.stderr.strip().splitlines()) == 1
          and not any(n.startswith("x.bin") for n in os.listdir(tmp)),
          "export of a damaged checkpoint: one line naming file and dataset, nothing written: " + q.stderr.strip()[:200])

    # kill -9 of rank 1 in the middle of the step-10 save: step 5 stays latest; resume auto from it.
    ref = os.path.join(tmp, "ref")
    run(3, sets(ref, 1))
    k = os.path.join(tmp, "k")
    kck = os.path.join(k, "ckpt")
    p = run(3, sets(k, 1, checkpoint__dir=kck, checkpoint__every=5), expect_ok=False,
            extra_env={"ZT_FAULT_KILL_IN_SAVE": "1@10"})
    check(p.returncode != 0 and open(os.path.join(kck, "latest")).read() == "step_00000005\n"
          and not os.path.exists(os.path.join(kck, "step_00000010")),
          f"rank killed mid-save (exit {p.returncode}): latest still names step_00000005, no step_00000010")
    p = run(3, sets(k, 1, checkpoint__dir=kck, checkpoint__every=5, checkpoint__resume="auto"))
    check("resuming at step 5" in p.stdout and same_bytes(os.path.join(k, "final.bin"), os.path.join(ref, "final.bin")),
          "resume auto continues from step 5 to the uninterrupted run's final weights bit for bit")
    check(not any(n.startswith(".tmp") for n in os.listdir(kck)), "the dead save's temporary directory is gone")

    # SIGTERM to one rank of three, SIGUSR1 to mpirun (which forwards it to every rank), SIGTERM to a
    # world-1 run.
    steps = 60
    for world, sig, to_launcher in ((3, signal.SIGTERM, False), (3, signal.SIGUSR1, True), (1, signal.SIGTERM, False)):
        name = f"{world}{sig.name}"
        r0, s0 = os.path.join(tmp, f"sref{world}"), os.path.join(tmp, f"sig{name}")
        if not os.path.exists(r0):
            run(world, sets(r0, 0, steps=steps))
        sck = os.path.join(s0, "ckpt")
        proc = subprocess.Popen(command(world, sets(s0, 0, steps=steps, checkpoint__dir=sck)), cwd=ROOT, env=env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        log = os.path.join(s0, "metrics.jsonl")
        t0 = time.time()
        while time.time() - t0 < 120 and (not os.path.exists(log) or len(losses(s0)) < 3):
            time.sleep(0.05)
        target = proc.pid
        if world > 1 and not to_launcher:  # one rank: a child of mpirun
            kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            target = int(kids[1]) if len(kids) > 1 else proc.pid
        os.kill(target, sig)
        out, errs = proc.communicate(timeout=120)
        stopped = [l for l in out.splitlines() if l.startswith(f"stopped by {sig.name} on rank ")]
        latest = open(os.path.join(sck, "latest")).read().strip() if os.path.exists(os.path.join(sck, "latest")) else ""
        who = "mpirun" if to_launcher else "one rank" if world > 1 else "the process"
        check(proc.returncode == 0 and stopped and latest.startswith("step_") and int(latest[5:]) < steps,
              f"world {world}: {sig.name} to {who} mid-run: exit {proc.returncode}, "
              f"{stopped[0] if stopped else 'no stop line'}, latest {latest}")
        run(world, sets(s0, 0, steps=steps, checkpoint__dir=sck, checkpoint__resume="auto"))
        check(same_bytes(os.path.join(s0, "final.bin"), os.path.join(r0, "final.bin")),
              f"world {world}: resumed after {sig.name}, final weights equal the uninterrupted run's bit for bit")



def run_case_script(name, cases, scope, with_mpirun):
    """The main() of a script of named cases (checkpoint_dir_test.py, signals_test.py): runs the ones
    named on the command line (default all), each case_NAME(dir) in its own directory; 1 on a failure."""
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*", help="some of " + " ".join(cases) + " (default: all)")
    ap.add_argument("--train", default=os.path.join(ROOT, "train"))
    if with_mpirun:
        ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    args.train = os.path.abspath(args.train)
    if not with_mpirun:
        args.mpirun = "mpirun"
    for c in args.cases:
        if c not in cases:
            ap.error(f"unknown case {c}; cases: {' '.join(cases)}")
    global ARGS
    ARGS = args
    tmp = tempfile.mkdtemp(prefix=f"zt_{name}_")
    t0 = time.time()
    try:
        for case in args.cases or cases:
            os.makedirs(os.path.join(tmp, case))
            scope["case_" + case](os.path.join(tmp, case))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{name}: {len(FAILS)} failure(s), {time.time() - t0:.0f} s")
    return 1 if FAILS else 0

def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["resume", "reshard", "files", "faults"])
    ap.add_argument("--train", default=os.path.join(ROOT, "train"))
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--keep", action="store_true")
    ARGS = ap.parse_args()
    ARGS.train = os.path.abspath(ARGS.train)
    tmp = tempfile.mkdtemp(prefix=f"zt_ckpt_{ARGS.part}_")
    t0 = time.time()
    try:
        globals()["part_" + ARGS.part](tmp)
    finally:
        if not ARGS.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"checkpoint {ARGS.part}: {len(FAILS)} failure(s), {time.time() - t0:.0f} s")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
