#!/usr/bin/env bash
# Checkpoints through the CUDA backend, EMULATED on the CPU (test/emu): device memory crosses through
# Ops::d2h / h2d, parameters are bf16 with fp32 master weights (docs/design.md §3.7).
#   1. bf16: 6 steps (saving at 3 and 6) vs resume from step 3: final weights identical bit for bit;
#      the checkpoint holds bf16 parameters (/bf16 in model.h5) and fp32 master weights (/h/...).
#   2. the CPU backend continues the bf16 checkpoint (fp32 parameters from the master weights) and
#      the bf16 run continues the CPU one (parameters rounded to bf16): losses of steps 4-6 within
#      2e-2 relative of the run they continue (the bf16 vs fp32 bound of train_emu.sh).
# usage: checkpoint_emu.sh path/to/train path/to/zt_train_emu
set -euo pipefail
TRAIN=${1:?usage: checkpoint_emu.sh path/to/train path/to/zt_train_emu}
EMU=${2:?usage: checkpoint_emu.sh path/to/train path/to/zt_train_emu}
source "$(dirname "$0")/common.sh"

common=(plans/default.json
  --set data.train='data/sample/train_*.bin' --set data.val=data/sample/val.bin --set data.tokenizer=
  --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 --set model.seq_len=32
  --set batch.micro_batch=2 --set batch.grad_accum=1 --set optim.lr=0.003 --set optim.warmup_steps=2
  --set run.steps=6 --set run.eval_every=0 --set run.eval_batches=1 --set run.sample_every=0 --set run.threads=1)
gpu=(--set device=cuda --set precision.compute=bf16)

run() { local log=$1; shift; "$@" > "$log" 2>&1 || { tail -5 "$log"; exit 1; }; }
run "$work/g.out" "$EMU" "${common[@]}" "${gpu[@]}" --set checkpoint.dir="$work/g/ckpt" --set checkpoint.every=3 \
  --set run.log="$work/g/metrics.jsonl" --set run.final_weights="$work/g/final.bin"
run "$work/g2.out" "$EMU" "${common[@]}" "${gpu[@]}" --set checkpoint.resume="$work/g/ckpt/step_00000003" \
  --set run.log="$work/g2/metrics.jsonl" --set run.final_weights="$work/g2/final.bin"
run "$work/c.out" "$TRAIN" "${common[@]}" --set device=cpu --set checkpoint.dir="$work/c/ckpt" --set checkpoint.every=3 \
  --set run.log="$work/c/metrics.jsonl"
run "$work/gc.out" "$TRAIN" "${common[@]}" --set device=cpu --set checkpoint.resume="$work/g/ckpt/step_00000003" \
  --set run.log="$work/gc/metrics.jsonl"
run "$work/cg.out" "$EMU" "${common[@]}" "${gpu[@]}" --set checkpoint.resume="$work/c/ckpt/step_00000003" \
  --set run.log="$work/cg/metrics.jsonl"

"$PY" - "$work" <<'PY'
import json, os, sys
import h5py
w = sys.argv[1]
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{w}/{name}/metrics.jsonl")) if "loss" in r}
ok = True
def check(cond, what):
    global ok
    print(("ok    " if cond else "FAIL  ") + what)
    ok &= bool(cond)
g, g2, c, gc, cg = (losses(n) for n in ("g", "g2", "c", "gc", "cg"))
check(open(f"{w}/g/final.bin", "rb").read() == open(f"{w}/g2/final.bin", "rb").read()
      and all(g[s] == g2[s] for s in g2) and sorted(g2) == [4, 5, 6],
      "emulated bf16: resumed from step 3, losses and final weights identical bit for bit")
with h5py.File(f"{w}/g/ckpt/step_00000006/model.h5", "r") as f:
    check(f.attrs["param_dtype"] == "bf16" and f["bf16/h/0/attn/c_attn/weight"].dtype == "uint16"
          and f["h/0/attn/c_attn/weight"].dtype == "float32" and "master" in
          h5py.File(f"{w}/g/ckpt/step_00000006/rank_00000.h5", "r"),
          "bf16 checkpoint: bf16 parameters (as uint16) and fp32 master weights")
for name, got, ref in (("CPU continues the bf16 checkpoint", gc, g), ("bf16 continues the CPU checkpoint", cg, c)):
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in got)
    check(sorted(got) == [4, 5, 6] and worst <= 2e-2, f"{name}: steps 4-6 within 2e-2 (worst {worst:.2e})")
print("checkpoint_emu (" + os.environ["WHERE"] + "):", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
