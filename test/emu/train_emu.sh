#!/usr/bin/env bash
# A short `--set device=cuda` training run under the CUDA emulator (test/emu), fp32 and bf16, against
# the same run on the CPU backend: 5 steps of a small model on the committed sample data.
#   fp32 (the parity mode): every step's loss within 1e-6 relative of the CPU's;
#   bf16: within 2e-2 relative (the bound test/gpu/model_gpu_test.cpp's TenTrainingSteps documents).
# usage: train_emu.sh path/to/train path/to/zt_train_emu
set -euo pipefail
TRAIN=${1:?usage: train_emu.sh path/to/train path/to/zt_train_emu}
EMU=${2:?usage: train_emu.sh path/to/train path/to/zt_train_emu}
source "$(dirname "$0")/common.sh"

common=(plans/default.json
  --set data.train='data/sample/train_*.bin' --set data.val=data/sample/val.bin
  --set data.tokenizer=data/sample/gpt2_tokenizer.bin
  --set model.n_layer=2 --set model.n_embd=64 --set model.n_head=2 --set model.seq_len=64
  --set batch.micro_batch=4 --set batch.grad_accum=2 --set optim.lr=0.003 --set optim.warmup_steps=2
  --set run.steps=5 --set run.eval_every=0 --set run.eval_batches=1 --set run.sample_every=0
  --set run.sample_tokens=4)

echo "== CPU backend (fp32)"
"$TRAIN" "${common[@]}" --set device=cpu --set run.log="$work/cpu/metrics.jsonl" > "$work/cpu.out"
echo "== CUDA backend ($WHERE), fp32"
"$EMU" "${common[@]}" --set device=cuda --set precision.compute=fp32 --set run.log="$work/fp32/metrics.jsonl" \
  | tee "$work/fp32.out" | grep -E "device|backend|step +[0-9]" || true
echo "== CUDA backend ($WHERE), bf16"
"$EMU" "${common[@]}" --set device=cuda --set precision.compute=bf16 --set run.log="$work/bf16/metrics.jsonl" \
  | tee "$work/bf16.out" | grep -E "device|backend|step +[0-9]" || true

"$PY" - "$work" <<'PY'
import json, os, sys
w = sys.argv[1]
def losses(name):
    return [r["loss"] for r in map(json.loads, open(f"{w}/{name}/metrics.jsonl")) if "loss" in r]
cpu, f32, b16 = losses("cpu"), losses("fp32"), losses("bf16")
assert len(cpu) == len(f32) == len(b16) == 5, (len(cpu), len(f32), len(b16))
ok = True
print("step  cpu (fp32)    emulated cuda-fp32  rel err    emulated cuda-bf16  rel err")
for s, (c, a, b) in enumerate(zip(cpu, f32, b16)):
    ea, eb = abs(a - c) / abs(c), abs(b - c) / abs(c)
    print(f"{s:4d}  {c:.8f}  {a:.8f}          {ea:.2e}   {b:.8f}          {eb:.2e}")
    ok &= ea <= 1e-6 and eb <= 2e-2
print("train_emu (" + os.environ["WHERE"] + "):", "ok" if ok else "FAILED (bounds: fp32 1e-6, bf16 2e-2 relative)")
sys.exit(0 if ok else 1)
PY
