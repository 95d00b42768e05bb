#!/usr/bin/env bash
# The CUDA backend's multi-rank paths under the CUDA emulator (test/emu): collectives on device
# buffers host-staged through the MPI comm (src/comm/host_mirror_comm.h). Several ranks share the one
# emulated device, as they would share one GPU. EMULATED: this is not a GPU run.
#   fp32: `mpirun -np 2` (and -np 3 at stages 1 and 3) of zt_train_emu at zero.stage 0-3 against
#         zt_train_emu at N = 1 with the same global batch (grad_accum x N): every step's loss within
#         1e-5 relative; and the CPU backend's single-rank curve, same bound.
#   bf16: -np 2, stages 0-3, against the single-rank bf16 run: within 2e-2 relative (the bf16 bound
#         of test/gpu/model_gpu_test.cpp's TenTrainingSteps; reductions are summed in fp32, one rounding).
#   memory: the pinned "comm" tier each multi-rank run tracked equals the bytes of the buffers its
#         collectives touch, fp32 mirrors (the store's host_mirrors, 4 bytes per element); and
#         `train estimate --set device=cuda` equals every run's tracked peak, tier by tier.
# usage: multirank_emu.sh path/to/train path/to/zt_train_emu path/to/mpiexec
set -euo pipefail
TRAIN=${1:?usage: multirank_emu.sh train zt_train_emu mpiexec}
EMU=${2:?}
MPIRUN=${3:?}
source "$(dirname "$0")/common.sh"
common=(plans/default.json "${small[@]}" --set data.tokenizer=data/sample/gpt2_tokenizer.bin
  --set optim.lr=0.003 --set optim.warmup_steps=2 --set run.steps=3 --set run.final_weights=""
  --set zero.bucket_mb=0.05 --set zero.prefetch_units=2 --set device=cuda
  --set comm.backend=mpi)  # the host-staged path (what auto picks for ranks sharing a GPU); nccl: nccl_emu.sh

run() {  # name np precision stage grad_accum [extra --set ...]
  local name=$1 np=$2 prec=$3 stage=$4 accum=$5; shift 5
  local cmd=("$EMU" "${common[@]}" --set precision.compute="$prec" --set zero.stage="$stage"
             --set batch.grad_accum="$accum" --set run.log="$work/$name/metrics.jsonl" "$@")
  if [ "$np" = 1 ]; then "${cmd[@]}" > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; exit 1; }
  else "$MPIRUN" -np "$np" "${cmd[@]}" > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; exit 1; }
  fi
  "$EMU" estimate "${cmd[@]:1}" --world "$np" --json 2>/dev/null > "$work/$name.est"
  echo "ran $name: $(grep -c '^step ' "$work/$name.out") steps"
}

# The same global batch, 6 sequences per step: N x grad_accum = 6 (micro_batch 1: emulation is slow).
# The runs are independent: two at a time (bg, common.sh), all checked after join.
cpu() { "$TRAIN" "${common[@]}" --set device=cpu --set batch.grad_accum=6 --set run.log="$work/cpu/metrics.jsonl" > "$work/cpu.out"; }
bg run f32_n3_s1 3 fp32 1 2
bg run f32_n3_s3 3 fp32 3 2
for s in 0 1 2 3; do
  bg run f32_n2_s$s 2 fp32 $s 3
  bg run b16_n2_s$s 2 bf16 $s 3
done
bg run f32_n1 1 fp32 0 6
bg run b16_n1 1 bf16 0 6
bg cpu
join

"$PY" - "$work" <<'PY'
import json, sys
w = sys.argv[1]
def rows(name):
    return [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl")]
def losses(name):
    return [r["loss"] for r in rows(name) if "loss" in r and "step" in r]
def summary(name):
    return next(r["summary"] for r in rows(name) if "summary" in r)
ok = True
def check(name, ref, bound):
    global ok
    a, b = losses(name), losses(ref)
    err = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if len(a) == len(b) == 3 else float("inf")
    good = err <= bound
    ok &= good
    print(f"{name:12s} vs {ref:7s}: {' '.join(f'{x:.6f}' for x in a)}  max rel err {err:.2e} (bound {bound:g}) "
          f"{'ok' if good else 'FAILED'}")
check("f32_n1", "cpu", 1e-5)
for s in range(4):
    check(f"f32_n2_s{s}", "f32_n1", 1e-5)
    check(f"f32_n2_s{s}", "cpu", 1e-5)
for s in (1, 3):
    check(f"f32_n3_s{s}", "f32_n1", 1e-5)
for s in range(4):
    check(f"b16_n2_s{s}", "b16_n1", 2e-2)
# The pinned tier holds exactly the host mirrors: fp32 elements of the buffers collectives touch,
# from the device table of the same run (stage 0: gradients; 1: parameters + gradients + gradient
# shard; 2-3: the communication slots + parameters (stage 2) or parameter shard (stage 3)).
for name in [f"f32_n2_s{s}" for s in range(4)] + [f"b16_n2_s{s}" for s in range(4)]:
    mem = summary(name)["peak_memory_bytes"]
    dev, pin = mem["device"], mem.get("pinned", {})
    elem = 2 if name.startswith("b16") else 4
    s = int(name[-1])
    # device bytes of what collectives touch: stage 0 the gradients; 1 parameters, gradients and the
    # gradient shard (both "grads"); 2-3 parameters or their shard plus every communication slot
    staged = {0: dev["grads"], 1: dev["params"] + dev["grads"]}.get(s, dev["params"] + dev.get("comm", 0))
    want, got = staged // elem * 4, pin.get("comm", 0)
    good = got == want and staged % elem == 0
    ok &= good
    print(f"{name:12s} pinned comm {got} bytes, expected {want}: {'ok' if good else 'FAILED'}")
# train estimate for the CUDA backend equals the tracked peak of every run, tier by tier.
import glob, os
for est in sorted(glob.glob(f"{w}/*.est")):
    name = os.path.basename(est)[:-4]
    e, t = json.load(open(est))["memory"], summary(name)["peak_memory_bytes"]
    ok &= e == t
    print(f"{name:12s} estimate {'==' if e == t else '!='} tracked {'ok' if e == t else f'FAILED: {e} vs {t}'}")
print("multirank_emu (" + os.environ["WHERE"] + "):", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
