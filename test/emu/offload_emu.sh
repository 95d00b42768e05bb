#!/usr/bin/env bash
# The CUDA backend's optimizer offload under the CUDA emulator (test/emu): offload.optimizer "cpu"
# (AdamW moments and master weights in pinned host memory, the CPU AdamW updating them) and "nvme"
# (the same state in swap files, through offload::SwapPipeline) against the same plan without
# offload (src/zero/host_optimizer.cpp). EMULATED: this is not a GPU run.
#   bf16: every step's loss and the final weights (run.final_weights, an llm.c file) bit for bit:
#   the CPU AdamW is the CUDA kernel's arithmetic with the same stochastic-rounding bits, drawn by
#   each element's global index: the "nvme" sub-groups (offload.subgroup_mb 0.05, 48 KiB of fp32
#   per state, which cut the large tensors into many slices) round as the whole update does. fp32: the
#   same formula, but the compiler contracts a*b+c into fused
#   multiply-adds differently in the CPU loop and the kernel (measured here ~1e-9 relative on the
#   loss; AdamW turns the last-bit differences into up to ~3e-6 of the largest weight in 3 steps for
#   elements whose gradient is near eps): losses within 1e-7 relative, weights within 2e-5 of the largest.
#   N = 1 stage 1 and N = 2 stage 3.
#   The swap files are gone after each run, and `train estimate` (the CUDA backend's buffers) equals
#   the tracked peak of every run in every tier (device, pinned, host, nvme).
# usage: offload_emu.sh path/to/zt_train_emu path/to/mpiexec
set -euo pipefail
EMU=${1:?usage: offload_emu.sh zt_train_emu mpiexec}
MPIRUN=${2:?}
source "$(dirname "$0")/common.sh"
common=(plans/default.json "${small[@]}" --set data.tokenizer=data/sample/gpt2_tokenizer.bin
  --set batch.grad_accum=1 --set optim.lr=0.003 --set optim.warmup_steps=1 --set run.steps=3
  --set zero.bucket_mb=0.05 --set device=cuda --set offload.subgroup_mb=0.05 --set offload.nvme_dir="$work/swap"
  --set comm.backend=mpi)  # N = 2 shares the one emulated device: host-staged, as auto picks there

fail=0
# Every run below is independent of the others (each its own swap directory): two at a time (bg,
# common.sh); one() records a failed check in $work/failed_NAME, the comparisons run after join.
one() {  # NP STAGE PREC OFF: one run of the grid, its estimate against what it tracked, its swap files
  local np=$1 stage=$2 prec=$3 off=$4
  local name="n${np}_s${stage}_${prec}_${off}" bad=0
  local cmd=("$EMU" "${common[@]}" --set zero.stage=$stage --set precision.compute=$prec --set offload.optimizer=$off
             --set offload.nvme_dir="$work/swap_$name"
             --set run.log="$work/$name/metrics.jsonl" --set run.final_weights="$work/$name/weights.bin")
  [ "$off" = cpu ] && cmd+=(--set run.trace="$work/$name/trace.json")
  if [ "$np" = 1 ]; then "${cmd[@]}" > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; exit 1; }
  else "$MPIRUN" -np "$np" "${cmd[@]}" > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; exit 1; }; fi
  # train estimate (the CUDA backend's list) against what the run tracked, tier by tier, exactly.
  "$EMU" estimate "${cmd[@]:1}" --world "$np" --json 2>/dev/null > "$work/$name.est"
  "$PY" - "$work/$name.est" "$work/$name/metrics.jsonl" "$name" <<'PY' || bad=1
import json, sys
est = json.load(open(sys.argv[1]))["memory"]
got = next(json.loads(l)["summary"] for l in open(sys.argv[2]) if '"summary"' in l)["peak_memory_bytes"]
ok = est == got
print(f"{sys.argv[3]}: estimate {'==' if ok else '!='} tracked: {est}" + ("" if ok else f" vs tracked {got}: FAILED"))
sys.exit(0 if ok else 1)
PY
  grep -h '"loss"' "$work/$name/metrics.jsonl" | "$PY" -c \
    'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in sys.stdin if "step" in json.loads(l)))' \
    > "$work/$name.losses"
  if [ -n "$(ls -A "$work/swap_$name" 2>/dev/null)" ]; then echo "FAILED: swap files left after $name"; bad=1; fi
  [ "$bad" = 0 ] || touch "$work/failed_$name"
}
# The CPU AdamW beside backward (zero/host_optimizer.cpp). With gradient clipping (the runs of the
# grid, optim.grad_clip 1.0) no unit may be updated before backward ends: the scale needs the global
# norm. Without it (grad_clip 0) the blocks' updates run while backward continues: stage 3, N = 2,
# bf16, grad_accum 3 against the same plan without offload, bit for bit, and in every step some
# units' updates end before "finish gradients" (scripts/host_optimizer_overlap.py reads the trace).
# These two run after the grid, one at a time: the overlap they show must not depend on a neighbour.
clip0() {  # OFF
  local name="clip0_$1"
  local cmd=("$EMU" "${common[@]}" --set zero.stage=3 --set precision.compute=bf16 --set offload.optimizer=$1
             --set optim.grad_clip=0 --set batch.grad_accum=3
             --set run.log="$work/$name/metrics.jsonl" --set run.final_weights="$work/$name/weights.bin"
             --set run.trace="$work/$name/trace.json")
  "$MPIRUN" -np 2 "${cmd[@]}" > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; exit 1; }
}
grid=()
for cfg in "2 3" "1 1"; do
  set -- $cfg; np=$1; stage=$2
  for prec in fp32 bf16; do
    for off in none cpu nvme; do
      [ "$np/$prec/$off" = "2/bf16/nvme" ] && continue  # keeps the test short; N = 1 covers bf16 nvme
      bg one $np $stage $prec $off
      grid+=("n${np}_s${stage}_${prec}_${off}")
    done
  done
done
join
for f in "$work"/failed_*; do [ -e "$f" ] && fail=1; done
for name in "${grid[@]}"; do
  case "$name" in *_none) continue ;; esac
  ref="${name%_*}_none"; prec=$(cut -d_ -f3 <<<"$name")
  "$PY" - "$work" "$name" "$ref" "$prec" <<'PY' || fail=1
import numpy as np, sys
w, name, ref, prec = sys.argv[1:]
la = [float(x) for x in open(f"{w}/{name}.losses").read().split()]
lb = [float(x) for x in open(f"{w}/{ref}.losses").read().split()]
wa = np.fromfile(f"{w}/{name}/weights.bin", dtype=np.uint8)
wb = np.fromfile(f"{w}/{ref}/weights.bin", dtype=np.uint8)
if prec == "bf16":  # the kernel's arithmetic and rounding bits, exactly
    good = la == lb and len(la) == 3 and np.array_equal(wa, wb)
    what = "bit for bit"
else:  # fp32: the same formula; GCC contracts a*b+c into fma differently in the two loops
    fa = np.fromfile(f"{w}/{name}/weights.bin", dtype=np.float32)[256:]  # llm.c header: 256 ints
    fb = np.fromfile(f"{w}/{ref}/weights.bin", dtype=np.float32)[256:]
    lerr = max(abs(a - b) / abs(b) for a, b in zip(la, lb)) if len(la) == len(lb) == 3 else 1.0
    werr = float(np.max(np.abs(fa - fb)) / np.max(np.abs(fb))) if fa.shape == fb.shape else 1.0
    good = lerr <= 1e-7 and werr <= 2e-5 and wa[:1024].tobytes() == wb[:1024].tobytes()
    what = f"loss rel err {lerr:.1e} (bound 1e-7), weights max abs err / max abs {werr:.1e} (bound 2e-5)"
print(f"{name}: against {ref}: {what}: {'ok' if good else 'FAILED'}  {la}")
sys.exit(0 if good else 1)
PY
done
for off in none cpu; do clip0 $off; done
"$PY" - "$work" "$ROOT/scripts/host_optimizer_overlap.py" <<'PY' || fail=1
import json, runpy, sys
w, tool = sys.argv[1:]
overlap = runpy.run_path(tool)["overlap"]
ok = True
def check(cond, what):
    global ok
    print(("ok    " if cond else "FAIL  ") + what)
    ok &= bool(cond)
def losses(name):
    return [r["loss"] for r in map(json.loads, open(f"{w}/{name}/metrics.jsonl")) if "loss" in r and "step" in r]
same = open(f"{w}/clip0_cpu/weights.bin", "rb").read() == open(f"{w}/clip0_none/weights.bin", "rb").read()
check(same and losses("clip0_cpu") == losses("clip0_none") and len(losses("clip0_none")) == 3,
      "grad_clip 0, stage 3, N = 2, grad_accum 3: offload cpu against none, losses and weights bit for bit")
for rank in (0, 1):
    rows = overlap(f"{w}/clip0_cpu/trace.rank{rank}.json")
    check(len(rows) == 3 and all(r["units_hidden"] >= 1 for r in rows),
          f"grad_clip 0, rank {rank}: units updated before backward ended per step {[r['units_hidden'] for r in rows]}")
    for name in ("n1_s1_bf16_cpu", "n2_s3_bf16_cpu", "n2_s3_fp32_cpu"):
        if rank == 1 and name.startswith("n1"):
            continue
        rows = overlap(f"{w}/{name}/trace.rank{rank}.json")
        check(len(rows) == 3 and all(r["units_hidden"] == 0 for r in rows),
              f"{name} (grad_clip 1), rank {rank}: no unit updated before the norm {[r['units_hidden'] for r in rows]}")
sys.exit(0 if ok else 1)
PY
echo "offload_emu ($WHERE): $([ $fail = 0 ] && echo ok || echo FAILED)"
exit $fail
