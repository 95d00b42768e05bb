#!/usr/bin/env bash
# Checkpoints of the CUDA backend's optimizer offload (offload.optimizer "cpu": AdamW moments and
# master weights in pinned host memory; "nvme": the same state in swap files), under the CUDA
# emulator (test/emu; EMULATED, not a GPU). The pinned state is written and read in place, the
# swapped state through its files, the parameters through device memory (src/checkpoint/state_io.h).
#   1. bf16, 6 steps saving at 3 and 6, against a resume from step 3 with the same plan: losses of
#      steps 4-6 and the final weights bit for bit. N = 1 stage 1 (cpu); N = 1 stage 3, the optimizer
#      on the device and offload.params "cpu" (the parameter shard pinned), and "nvme" (the parameter
#      shard alone in its swap file); N = 2 stage 3, nvme with
#      offload.params "cpu" (the CPU AdamW streaming its state, the parameter and gradient shards pinned);
#      N = 2 stage 3, cpu with offload.params "nvme" (the bf16 shards in swap files), also continued
#      on the CPU backend.
#   2. The N = 2 nvme + params cpu checkpoint continued elsewhere (losses of steps 4-6 against it):
#      N = 1, stage 1, offload none (reshard, another stage, no offload) within 2e-2 relative, the bf16
#      bound of train_emu.sh (stochastic rounding draws per global element, but the reduction order
#      changes with N); the CPU backend in fp32 within 2e-2 (bf16 vs fp32, as checkpoint_emu.sh).
#   3. No swap file is left after any run.
# usage: offload_checkpoint_emu.sh path/to/train path/to/zt_train_emu path/to/mpiexec
set -euo pipefail
TRAIN=${1:?usage: offload_checkpoint_emu.sh train zt_train_emu mpiexec}
EMU=${2:?}
MPIRUN=${3:?}
source "$(dirname "$0")/common.sh"
common=(plans/default.json "${small[@]}" --set data.tokenizer= --set optim.lr=0.003 --set optim.warmup_steps=1
  --set run.steps=6 --set zero.bucket_mb=0.05 --set offload.subgroup_mb=16 --set offload.nvme_dir="$work/swap")
gpu=(--set device=cuda --set precision.compute=bf16)

launch() {  # launch NP NAME ARGS...: one run, its output in $work/NAME.out, stopped on failure
  local np=$1 name=$2; shift 2
  if [ "$np" = 1 ]; then "$@" > "$work/$name.out" 2>&1 || { tail -5 "$work/$name.out"; exit 1; }
  else "$MPIRUN" -np "$np" "$@" > "$work/$name.out" 2>&1 || { tail -5 "$work/$name.out"; exit 1; }; fi
  if [ -n "$(ls -A "${swap:-$work/swap}" 2>/dev/null)" ]; then echo "FAIL  swap files left after $name"; exit 1; fi
}
ga() { echo $(( 2 / $1 )); }  # grad_accum keeping the global batch at 2 sequences

# Each configuration's pair of runs (saved, then resumed) in order, in a swap directory of its own;
# the pairs are independent: two at a time (bg, common.sh), the 2-rank ones first.
pair() {  # NP STAGE OPTIMIZER PARAMS
  local np=$1 stage=$2 off=$3 par=$4; local n=n${np}_${off}_${par}; local swap="$work/swap_$n"
  local plan=(--set zero.stage=$stage --set offload.optimizer=$off --set offload.params=$par --set batch.grad_accum=$(ga $np)
              --set offload.nvme_dir="$swap")
  launch $np $n "$EMU" "${common[@]}" "${gpu[@]}" "${plan[@]}" --set checkpoint.dir="$work/$n/ckpt" \
    --set checkpoint.every=3 --set run.log="$work/$n/metrics.jsonl" --set run.final_weights="$work/$n/final.bin"
  launch $np ${n}_resumed "$EMU" "${common[@]}" "${gpu[@]}" "${plan[@]}" \
    --set checkpoint.resume="$work/$n/ckpt/step_00000003" \
    --set run.log="$work/${n}_resumed/metrics.jsonl" --set run.final_weights="$work/${n}_resumed/final.bin"
}
for cfg in "2 3 nvme cpu" "2 3 cpu nvme" "1 1 cpu none" "1 3 none cpu" "1 3 none nvme"; do
  bg pair $cfg
done
join
# The N = 2 stage-3 nvme checkpoint, continued at N = 1 stage 1 without offload, and on the CPU backend.
bg launch 1 n1_from_nvme "$EMU" "${common[@]}" "${gpu[@]}" --set zero.stage=1 --set batch.grad_accum=2 \
  --set checkpoint.resume="$work/n2_nvme_cpu/ckpt/step_00000003" --set run.log="$work/n1_from_nvme/metrics.jsonl"
bg launch 1 cpu_from_nvme "$TRAIN" "${common[@]}" --set device=cpu --set zero.stage=1 --set batch.grad_accum=2 \
  --set checkpoint.resume="$work/n2_nvme_cpu/ckpt/step_00000003" --set run.log="$work/cpu_from_nvme/metrics.jsonl"
# The N = 2 checkpoint with the shards on disk (offload.params "nvme"), continued on the CPU backend.
bg launch 1 cpu_from_disk "$TRAIN" "${common[@]}" --set device=cpu --set zero.stage=1 --set batch.grad_accum=2 \
  --set checkpoint.resume="$work/n2_cpu_nvme/ckpt/step_00000003" --set run.log="$work/cpu_from_disk/metrics.jsonl"
join

WHERE="$WHERE" "$PY" - "$work" <<'PY'
import json, os, sys
w = sys.argv[1]
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{w}/{name}/metrics.jsonl")) if "loss" in r}
ok = True
def check(cond, what):
    global ok
    print(("ok    " if cond else "FAIL  ") + what)
    ok &= bool(cond)
for n in ("n1_cpu_none", "n1_none_cpu", "n1_none_nvme", "n2_nvme_cpu", "n2_cpu_nvme"):
    a, b = losses(n), losses(n + "_resumed")
    same = open(f"{w}/{n}/final.bin", "rb").read() == open(f"{w}/{n}_resumed/final.bin", "rb").read()
    check(sorted(b) == [4, 5, 6] and all(a[s] == b[s] for s in b) and same,
          f"{n}: resumed from step 3, losses {[b.get(s) for s in (4, 5, 6)]} and final weights bit for bit")
for n, ref_name in (("n1_from_nvme", "n2_nvme_cpu"), ("cpu_from_nvme", "n2_nvme_cpu"), ("cpu_from_disk", "n2_cpu_nvme")):
    ref, got = losses(ref_name), losses(n)
    err = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in (4, 5, 6)) if sorted(got) == [4, 5, 6] else 1.0
    check(err <= 2e-2, f"{n}: steps 4-6 against {ref_name}, max relative error {err:.2e} (bound 2e-2)")
print(f"offload_checkpoint_emu ({os.environ['WHERE']}): " + ("ok" if ok else "FAILED"))
sys.exit(0 if ok else 1)
PY
