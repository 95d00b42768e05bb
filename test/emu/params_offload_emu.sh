#!/usr/bin/env bash
# offload.params "cpu" on the CUDA backend under the CUDA emulator (test/emu): at stage 3 my
# parameter and gradient shards live in pinned host memory; each unit's shard is copied to the
# device one unit ahead of its all-gather (zero/param_gatherer.h), each bucket's gradient shard is
# summed on the device and copied out (zero/grad_reducer.h), and the CPU AdamW (offload.optimizer
# "cpu") updates the shards in place. EMULATED: this is not a GPU run.
#   N = 1 (fp32, grad_accum 1; bf16, grad_accum 3) and N = 2 (fp32, grad_accum 3; bf16, grad_accum 1)
#   against no offload: bf16 bit for bit, fp32 within the bound of offload_emu.sh (the CPU AdamW's
#   fused multiply-adds); and against offload.optimizer "cpu" alone: bit for bit in both
#   precisions (the same arithmetic on the same values, only where the shards live differs).
#   The other optimizer placements (N = 1 bf16 grad_accum 3, N = 2 fp32 grad_accum 3): with the
#   AdamW on the device (offload.optimizer "none": the parameter shard alone pinned, each unit's
#   staged through a device slot for its update) bit for bit against no offload; with the state on
#   disk ("nvme") bit for bit against "nvme" alone, and its swap files gone at the end. offload.params
#   "nvme" (the shards in swap files, read into pinned buffers and copied on to the device, the
#   gradient sums copied back and written; the CPU AdamW streams them) with optimizer "cpu" and "nvme":
#   bit for bit against optimizer "nvme" alone (the same sub-group pipeline), the device peak down by
#   at least 80% of the shards' bytes; with optimizer "none" (the parameter shard alone on disk, each
#   unit's read, staged through a device slot for the device AdamW and written back) bit for bit
#   against no offload, the device peak down by at least 80% of the parameter shard's bytes.
#   `train estimate` equals the tracked peak in every tier; the tracked device peak falls by at
#   least 80% of the bytes moved to pinned memory: parameter and gradient shards against optimizer
#   offload alone, and those plus the optimizer state against no offload. A checkpoint resumes bit
#   for bit (N = 2, bf16).
# usage: params_offload_emu.sh path/to/zt_train_emu path/to/mpiexec
set -euo pipefail
EMU=${1:?usage: params_offload_emu.sh zt_train_emu mpiexec}
MPIRUN=${2:?}
source "$(dirname "$0")/common.sh"
common=(plans/default.json "${small[@]}" --set data.tokenizer=data/sample/gpt2_tokenizer.bin
  --set optim.lr=0.003 --set optim.warmup_steps=1 --set run.steps=3 --set zero.bucket_mb=0.05
  --set zero.stage=3 --set device=cuda --set comm.backend=mpi)

fail=0
run() {  # name np prec accum optimizer params [more --set ...]
  local name=$1 np=$2 prec=$3 accum=$4 opt=$5 par=$6
  shift 6
  local cmd=("$EMU" "${common[@]}" --set precision.compute=$prec --set batch.grad_accum=$accum
             --set offload.optimizer=$opt --set offload.params=$par "$@"
             --set run.log="$work/$name/metrics.jsonl" --set run.final_weights="$work/$name/weights.bin")
  if [ "$np" = 1 ]; then "${cmd[@]}" > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; exit 1; }
  else "$MPIRUN" -np "$np" "${cmd[@]}" > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; exit 1; }; fi
  "$EMU" estimate "${cmd[@]:1}" --world "$np" --json 2>/dev/null > "$work/$name.est"
}

ck_runs() {  # the checkpoint test's two runs, in order
  local ck=(--set checkpoint.dir="$work/ck")
  run ck_full 2 bf16 1 cpu cpu "${ck[@]}" --set checkpoint.every=2
  run ck_resume 2 bf16 1 cpu cpu "${ck[@]}" --set checkpoint.resume="$work/ck/step_00000002"
}
# Every run is independent of the others (each its own swap directory; the checkpoint pair in
# order): two at a time (bg, common.sh), the 2-rank ones first; each tag's checks after join.
cfgs=("2 fp32 3 all" "2 bf16 1 -" "1 bf16 3 all" "1 fp32 1 -")
for cfg in "${cfgs[@]}"; do
  set -- $cfg; np=$1; prec=$2; accum=$3; more=$4
  tag="n${np}_${prec}_a${accum}"
  bg run "${tag}_none" "$np" "$prec" "$accum" none none
  bg run "${tag}_opt" "$np" "$prec" "$accum" cpu none
  bg run "${tag}_params" "$np" "$prec" "$accum" cpu cpu
  if [ "$more" = all ]; then  # the other optimizer placements with the parameter shard in pinned memory
    bg run "${tag}_devopt" "$np" "$prec" "$accum" none cpu
    bg run "${tag}_nvme" "$np" "$prec" "$accum" nvme none --set offload.nvme_dir="$work/swap_${tag}_nvme"
    bg run "${tag}_nvmeparams" "$np" "$prec" "$accum" nvme cpu --set offload.nvme_dir="$work/swap_${tag}_nvmeparams"
    # offload.params "nvme": the shards in swap files, streamed by the CPU AdamW's pipeline
    bg run "${tag}_disk_cpu" "$np" "$prec" "$accum" cpu nvme --set offload.nvme_dir="$work/swap_${tag}_disk_cpu"
    bg run "${tag}_disk_nvme" "$np" "$prec" "$accum" nvme nvme --set offload.nvme_dir="$work/swap_${tag}_disk_nvme"
    # the parameter shard alone in its swap file, each unit's staged through a slot for the device AdamW
    bg run "${tag}_disk_dev" "$np" "$prec" "$accum" none nvme --set offload.nvme_dir="$work/swap_${tag}_disk_dev"
  fi
  if [ "$cfg" = "2 bf16 1 -" ]; then  # the checkpoint runs below (N = 2, bf16, grad_accum 1)
    bg ck_runs
  fi
done
join
for cfg in "${cfgs[@]}"; do
  set -- $cfg; np=$1; prec=$2; accum=$3; more=$4
  tag="n${np}_${prec}_a${accum}"
  "$PY" - "$work" "$tag" "$prec" <<'PY' || fail=1
import json, os, sys
import numpy as np
w, tag, prec = sys.argv[1:]
ok = True
def check(cond, what):
    global ok
    print(("ok    " if cond else "FAIL  ") + f"{tag}: {what}")
    ok &= bool(cond)
def losses(name):
    return [r["loss"] for r in map(json.loads, open(f"{w}/{name}/metrics.jsonl")) if "loss" in r and "step" in r]
def peak(name):
    return next(json.loads(l)["summary"] for l in open(f"{w}/{name}/metrics.jsonl") if '"summary"' in l)["peak_memory_bytes"]
def weights(name):
    return open(f"{w}/{name}/weights.bin", "rb").read()
def pinned(name, names):  # bytes of these buffers on the pinned tier, as the estimate lists them
    return sum(b["bytes"] for b in json.load(open(f"{w}/{name}.est"))["buffers"] if b["tier"] == "pinned" and b["name"] in names)
def have(name):
    return os.path.exists(f"{w}/{name}.est")
n, o, p = f"{tag}_none", f"{tag}_opt", f"{tag}_params"
d, v, vp = f"{tag}_devopt", f"{tag}_nvme", f"{tag}_nvmeparams"
dc, dn, dd = f"{tag}_disk_cpu", f"{tag}_disk_nvme", f"{tag}_disk_dev"
def on_disk(name, names):  # bytes of these buffers on the nvme tier, as the estimate lists them
    return sum(b["bytes"] for b in json.load(open(f"{w}/{name}.est"))["buffers"] if b["tier"] == "nvme" and b["name"] in names)
for name in (p, d, vp, dc, dn, dd):
    if have(name):
        check(len(losses(name)) == 3, f"{name}: 3 steps {losses(name)}")
# Bit for bit where the same optimizer does the same arithmetic and only where the shards live differs.
# The shards on disk go through the optimizer's sub-group pipeline, as the state of "nvme" alone does:
# against that, bit for bit.
for run_, ref in ((p, o), (d, n), (vp, v), (dc, v), (dn, v), (dd, n)):
    if have(run_):
        check(losses(run_) == losses(ref) and weights(run_) == weights(ref),
              f"{run_} against {ref}: losses and weights bit for bit")
if prec == "bf16":
    check(losses(p) == losses(n) and weights(p) == weights(n), f"{p} against {n}: bit for bit")
    # The stochastic rounding draws by global element index: the default sub-groups (4 MiB), which
    # cut the shard into slices, round as the unit-by-unit update does.
    if have(v):
        check(losses(v) == losses(n) and weights(v) == weights(n), f"{v} against {n}: bit for bit")
else:  # the bound of offload_emu.sh: the CPU AdamW against the kernel (FMA contraction)
    fa = np.frombuffer(weights(p), dtype=np.float32)[256:]
    fb = np.frombuffer(weights(n), dtype=np.float32)[256:]
    lerr = max(abs(a - b) / abs(b) for a, b in zip(losses(p), losses(n)))
    werr = float(np.max(np.abs(fa - fb)) / np.max(np.abs(fb)))
    check(lerr <= 1e-7 and werr <= 2e-5, f"{p} against {n}: loss rel err {lerr:.1e} (1e-7), weights {werr:.1e} (2e-5)")
for name in (n, o, p, d, v, vp, dc, dn, dd):
    if have(name):
        est = json.load(open(f"{w}/{name}.est"))["memory"]
        check(est == peak(name), f"{name}: estimate == tracked (device total {est['device']['total']})")
shards = ("parameter shard", "gradient shard")
states = ("AdamW first moment", "AdamW second moment", "master weights")
for run_, ref, names in ((p, o, shards), (p, n, shards + states), (d, n, ("parameter shard",)), (vp, v, shards)):
    if not have(run_):
        continue
    moved = pinned(run_, names)
    fall = peak(ref)["device"]["total"] - peak(run_)["device"]["total"]
    check(moved > 0 and fall >= 0.8 * moved, f"device peak of {run_} against {ref} falls by {fall} B, >= 80% of the {moved} B moved")
for run_, ref, names in ((dn, v, shards), (dd, n, ("parameter shard",))):  # from the device to disk
    if not have(run_):
        continue
    moved = on_disk(run_, names)
    fall = peak(ref)["device"]["total"] - peak(run_)["device"]["total"]
    check(moved > 0 and fall >= 0.8 * moved, f"device peak of {run_} against {ref} falls by {fall} B, >= 80% of the {moved} B moved to disk")
for name in (v, vp, dc, dn, dd):  # swap files gone after a normal end
    if have(name):
        left = os.listdir(f"{w}/swap_{name}") if os.path.isdir(f"{w}/swap_{name}") else []
        check(not left, f"{name}: no swap file left ({left})")
sys.exit(0 if ok else 1)
PY
done
# A checkpoint of such a run (N = 2, bf16; the pinned shards saved and loaded in place) resumed
# from step 2 gives step 3 and the final weights bit for bit (the two runs: ck_runs, started above).
"$PY" - "$work" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
def losses(name):
    return [r["loss"] for r in map(json.loads, open(f"{w}/{name}/metrics.jsonl")) if "loss" in r and "step" in r]
a, b = losses("ck_full"), losses("ck_resume")
same = open(f"{w}/ck_full/weights.bin", "rb").read() == open(f"{w}/ck_resume/weights.bin", "rb").read()
ok = len(a) == 3 and b == a[2:] and same
print(("ok    " if ok else "FAIL  ") + f"resume from step 2: step 3 {b} against {a[2:]}, final weights {'equal' if same else 'differ'}")
sys.exit(0 if ok else 1)
PY
# Swap files (offload.optimizer "nvme" beside the pinned parameter shard) are unnamed while the run
# holds them, and nothing is left after a SIGTERM mid-run (N = 1) or an error mid-run (N = 2 on NCCL,
# rank 1's link lost at its 1000th collective, a few steps in: ZT_EMU_NCCL_ASYNC_ERROR): the exit is non-zero.
ended() {  # ended NAME NP [env ...] -- [--set ...]: a long run, ended by SIGTERM (np 1) or by its own error
  local name=$1 np=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  local swap="$work/swap_$name"
  local cmd=("$EMU" "${common[@]}" --set precision.compute=bf16 --set offload.optimizer=nvme --set offload.params=cpu
             --set offload.nvme_dir="$swap" --set run.steps=100000 --set run.log="$work/$name/metrics.jsonl" "$@")
  if [ "$np" = 1 ]; then env "${envs[@]}" "${cmd[@]}" > "$work/$name.out" 2>&1 &
  else env "${envs[@]}" "$MPIRUN" -np "$np" -x ZT_EMU_DEVICES -x ZT_EMU_NCCL_ASYNC_ERROR "${cmd[@]}" > "$work/$name.out" 2>&1 & fi
  local pid=$! held=0 t=0
  while [ $t -lt 600 ] && kill -0 $pid 2>/dev/null; do  # until a step is logged (the swap files are open)
    held=$(find /proc/[0-9]*/fd -lname "$swap/*" 2>/dev/null | wc -l || true)
    grep -q '"loss"' "$work/$name/metrics.jsonl" 2>/dev/null && [ "$held" -gt 0 ] && break
    sleep 0.1; t=$((t + 1))
  done
  local named; named=$(ls -A "$swap" 2>/dev/null | wc -l)
  [ "$np" = 1 ] && kill -TERM $pid
  local rc=0; wait $pid || rc=$?
  local left; left=$(ls -A "$swap" 2>/dev/null | wc -l)
  if [ "$held" -gt 0 ] && [ "$named" = 0 ] && [ "$left" = 0 ] && [ "$rc" != 0 ]; then
    echo "ok    $name: $held swap files held unnamed during the run, none left after (exit $rc)"
  else
    echo "FAIL  $name: $held swap files held, $named named during the run, $left left after, exit $rc"; tail -5 "$work/$name.out"; fail=1
  fi
}
ended sigterm 1 ZT_EMU_DEVICES=1 --
if [ "$WHERE" = "CUDA on a GPU" ]; then  # the lost link is the emulator's, and NCCL needs a GPU per rank
  echo "skip  error: the injected NCCL error runs under the emulator only"
else
  ended error 2 ZT_EMU_DEVICES=3 ZT_EMU_NCCL_ASYNC_ERROR=1:1000 -- --set comm.backend=nccl --set comm.timeout_s=30
fi
echo "params_offload_emu ($WHERE): $([ $fail = 0 ] && echo ok || echo FAILED)"
exit $fail
