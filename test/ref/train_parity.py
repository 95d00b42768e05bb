#!/usr/bin/python3
"""The real `train` binary against PyTorch, gradient accumulation and ranks included.

test/parity/ checks the model and one optimizer step against PyTorch with its own step loop, and
test/zero/zero_equivalence.py checks every distributed plan against single-rank training with the same
global batch. Neither checks how train() itself scales and accumulates gradients: an error that
depends only on world x grad_accum (say, micro-step gradients summed instead of averaged) would
pass both. Here PyTorch is the oracle for the whole loop:

  * the PyTorch reference model (test/ref/torch_gpt.py, the "tiny" config of gen_reference.py)
    is written as an llm.c .bin and loaded by the binary through model.init;
  * the tokens are written as llm.c token shards, data.shuffle = false, so the sequences of every
    micro-step are known (src/data/loader.h): rank r at micro-step m of step s reads global
    sequences s*G + (m*N + r)*B + [0, B), G = N*A*B, sequence g = tokens[g*T, g*T + T + 1);
  * PyTorch trains the same steps, accumulating A*N micro-batches the usual way (each micro-batch
    loss / (A*N) before backward; torch_gpt.train_step_accum), with the same warmup + cosine
    schedule, AdamW and global-norm clipping;
  * runs: (N ranks, grad_accum A) = (1, 2), (1, 3), (2, 3) (the last under mpirun), stage 0.

Checked against PyTorch, from the metrics JSONL at run.log:
  loss per step       relative error <= 1e-4   (as test/parity)
  grad_norm per step  relative error <= 1e-4   (pre-clip global norm)
  lr per step         relative error <= 1e-9   (same formula, written twice)
  final val loss      relative error <= 1e-4   (eval batches: sequences (i*N + r)*B + [0, B))
and that clipping triggered in some steps but not all of each run, so the clip factor matters.

  /usr/bin/python3 test/ref/train_parity.py --train ./train [--mpirun mpirun] [--keep]
Exit status 0 when every run matches.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt as tg  # noqa: E402

# The parity test's "tiny" model, with T = maxT: the trainer's seq_len is also the position table.
L, NH, C, T, V, B = 2, 2, 32, 16, 97, 2
STEPS = 8
OPTIM = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, warmup_steps=2,
             schedule="cosine", min_lr_ratio=0.1, steps=STEPS)
# (ranks N, grad_accum A, grad_clip). Larger batches have smaller gradient norms; each clip is
# chosen so that clipping triggers in some steps only (asserted below).
RUNS = [(1, 2, 1.15), (1, 3, 1.0), (2, 3, 0.85)]
EVAL_BATCHES = 2
N_TRAIN_SEQ = STEPS * max(n * a for n, a, _ in RUNS) * B  # every step reads fresh sequences
N_VAL_SEQ = 16
SEED = 1337

LOSS_TOL, NORM_TOL, LR_TOL, VAL_TOL = 1e-4, 1e-4, 1e-9, 1e-4


def make_stream(n, seed):
    """n tokens of a noisy bigram chain (next = perm[prev] with prob 0.75, else uniform), as
    gen_reference.make_tokens but one long stream: the loader's sequences overlap by one token."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(V, generator=g)
    follow = torch.rand(n, generator=g) < 0.75
    rnd = torch.randint(0, V, (n,), generator=g)
    out = np.empty(n, dtype=np.int64)
    out[0] = int(rnd[0])
    for i in range(1, n):
        out[i] = int(perm[out[i - 1]]) if follow[i] else int(rnd[i])
    return out


def seq(stream, g):
    """Global sequence g (no shuffle, no wrap-around needed here): (inputs, targets), each (T,)."""
    s = torch.from_numpy(stream[g * T: g * T + T + 1])
    assert s.numel() == T + 1, f"sequence {g} runs past the data"
    return s[:T], s[1:]


def batch_of(stream, first):
    xs, ys = zip(*(seq(stream, first + b) for b in range(B)))
    return torch.stack(xs), torch.stack(ys)


def torch_reference(model_bin, train, val, n_ranks, accum, clip):
    """PyTorch's losses, norms and lrs per step and final val loss for (N, A)."""
    cfg = dict(OPTIM, grad_clip=clip)
    model = tg.load_llmc(model_bin)
    opt = tg.make_optimizer(model, OPTIM["lr"], OPTIM["beta1"], OPTIM["beta2"], OPTIM["eps"],
                            OPTIM["weight_decay"])
    G = n_ranks * accum * B
    losses, norms, lrs = [], [], []
    for s in range(STEPS):
        micro = [batch_of(train, s * G + (m * n_ranks + r) * B)
                 for m in range(accum) for r in range(n_ranks)]
        loss, norm, lr = tg.train_step_accum(model, opt, micro, s, cfg)
        losses.append(loss)
        norms.append(norm)
        lrs.append(lr)
    # Evaluation: min(eval_batches, sequences / (N*B)) batches per rank, each batch's mean loss,
    # averaged over batches and ranks.
    n_eval = min(EVAL_BATCHES, N_VAL_SEQ // (n_ranks * B))
    with torch.no_grad():
        vals = [model(*batch_of(val, (i * n_ranks + r) * B))[1].item()
                for i in range(n_eval) for r in range(n_ranks)]
    return {"losses": losses, "norms": norms, "lrs": lrs, "val": sum(vals) / len(vals)}


def run_binary(train_bin, mpirun, n_ranks, accum, clip, work, model_bin, timeout_s):
    d = os.path.join(work, f"N{n_ranks}_A{accum}")
    os.makedirs(d, exist_ok=True)
    plan = {
        "model": {"n_layer": L, "n_head": NH, "n_embd": C, "seq_len": T, "vocab_size": V, "init": model_bin},
        "data": {"train": os.path.join(work, "train_000.bin"), "val": os.path.join(work, "val.bin"),
                 "tokenizer": "", "shuffle": False},
        "batch": {"micro_batch": B, "grad_accum": accum},
        "optim": {"lr": OPTIM["lr"], "betas": [OPTIM["beta1"], OPTIM["beta2"]], "eps": OPTIM["eps"],
                  "weight_decay": OPTIM["weight_decay"], "grad_clip": clip,
                  "warmup_steps": OPTIM["warmup_steps"], "schedule": OPTIM["schedule"],
                  "min_lr_ratio": OPTIM["min_lr_ratio"]},
        "zero": {"stage": 0},
        "run": {"steps": STEPS, "eval_every": 0, "eval_batches": EVAL_BATCHES, "sample_every": 0,
                "threads": 1, "seed": SEED, "log": os.path.join(d, "metrics.jsonl")},
        "device": "cpu",
    }
    plan_path = os.path.join(d, "plan_in.json")
    with open(plan_path, "w") as f:
        json.dump(plan, f, indent=1)
    cmd = [train_bin, plan_path]
    if n_ranks > 1:
        cmd = [mpirun, "--oversubscribe", "-np", str(n_ranks)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s)
    out = p.stdout.decode(errors="replace")
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n" + "\n".join(out.splitlines()[-15:]))
    rows = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
    steps = [r for r in rows if "loss" in r]
    vals = [r for r in rows if "val_loss" in r]
    summ = [r["summary"] for r in rows if "summary" in r]
    if len(steps) != STEPS or len(vals) != 1 or len(summ) != 1:
        raise RuntimeError(f"metrics log: {len(steps)} step lines, {len(vals)} val lines, {len(summ)} summaries")
    if summ[0]["world"] != n_ranks:
        raise RuntimeError(f"summary world {summ[0]['world']} != {n_ranks}")
    return steps, vals[0]["val_loss"]


def rel(a, b):
    return abs(a - b) / abs(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", default="./train")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (printed)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per run")
    args = ap.parse_args()
    train_bin = os.path.abspath(args.train)
    if not os.access(train_bin, os.X_OK):
        sys.exit(f"train_parity: {train_bin} is not executable")

    torch.set_num_threads(2)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    work = tempfile.mkdtemp(prefix="train_parity.")
    t0 = time.monotonic()

    model = tg.GPT(L, NH, C, T, V).float()
    tg.init_weights(model, SEED)
    model_bin = os.path.join(work, "model.bin")
    tg.save_llmc(model, model_bin)
    train = make_stream(N_TRAIN_SEQ * T + 1, SEED + 1)
    val = make_stream(N_VAL_SEQ * T + 1, SEED + 2)
    tg.save_token_shard(os.path.join(work, "train_000.bin"), train)
    tg.save_token_shard(os.path.join(work, "val.bin"), val)

    failures = []
    print(f"model L={L} NH={NH} C={C} T={T} V={V}, micro_batch {B}, {STEPS} steps")
    for n, a, clip in RUNS:
        name = f"N={n} A={a}"
        ref = torch_reference(model_bin, train, val, n, a, clip)
        t_run = time.monotonic()
        try:
            steps, val_loss = run_binary(train_bin, args.mpirun, n, a, clip, work, model_bin, args.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            failures.append(f"{name}: {e}")
            continue
        secs = time.monotonic() - t_run
        worst = {"loss": 0.0, "norm": 0.0, "lr": 0.0}
        for s, row in enumerate(steps):
            for key, mine, theirs, tol in (("loss", row["loss"], ref["losses"][s], LOSS_TOL),
                                           ("norm", row["grad_norm"], ref["norms"][s], NORM_TOL),
                                           ("lr", row["lr"], ref["lrs"][s], LR_TOL)):
                e = rel(mine, theirs)
                worst[key] = max(worst[key], e)
                if e > tol:
                    failures.append(f"{name} step {s}: {key} {mine!r} vs torch {theirs!r} (rel {e:.2e} > {tol})")
        e_val = rel(val_loss, ref["val"])
        if e_val > VAL_TOL:
            failures.append(f"{name}: final val loss {val_loss!r} vs torch {ref['val']!r} (rel {e_val:.2e} > {VAL_TOL})")
        clipped = sum(1 for x in ref["norms"] if x > clip)
        if not 0 < clipped < STEPS:
            failures.append(f"{name}: clipping triggered in {clipped}/{STEPS} steps in the reference; "
                            f"pick its grad_clip so that it does in some steps only (norms {ref['norms']})")
        print(f"  {name}: loss {ref['losses'][0]:.4f} -> {ref['losses'][-1]:.4f}, clipped {clipped}/{STEPS} at {clip}; "
              f"worst rel err loss {worst['loss']:.1e} norm {worst['norm']:.1e} lr {worst['lr']:.1e} "
              f"val {e_val:.1e}; {secs:.1f} s", flush=True)

    print(f"{len(RUNS)} runs in {time.monotonic() - t0:.1f} s; work directory {work}"
          + ("" if args.keep or failures else " (removed)"))
    if not args.keep and not failures:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"train_parity FAILED ({len(failures)}):")
        for f in failures[:40]:
            print("  - " + f)
        sys.exit(1)
    print("train_parity passed")


if __name__ == "__main__":
    main()
