#!/usr/bin/env bash
# Tensor parallelism (mesh.tensor, docs/tensor.md) on the CUDA backend under the CUDA emulator: each
# rank an MPI process with its own emulated device (ZT_EMU_DEVICES=4), the tensor group's collectives
# on an NCCL sub-communicator (ncclCommSplit) exchanged between the processes by test/emu/nccl.cpp,
# in stream order, under the emulator's stream and memory checks. EMULATED: this is not a GPU run.
#   fp32, against the CPU backend on one rank with the same global batch, 3 steps, every loss and
#         grad norm within 1e-5 relative: T 2 (world 2), T 3 (world 3: 6 heads), T 2 with sequence
#         parallelism and the classifier in chunks, T 2 x data 2 at stages 1 and 3 (with the classifier
#         in chunks over the split embedding), and at stage 3 with offload.optimizer and
#         offload.params "cpu" (the gradient shard in pinned memory: the norm from per-unit sums of
#         squares, split and replicated tensors apart).
#   bf16 (activations summed in bf16 by NCCL, the loss's statistics moved as fp32 bytes), against one
#         emulated rank in bf16 with the same global batch, within 2e-2 (test/gpu TenTrainingSteps'
#         bound): T 2, and T 2 x data 2 at stage 2 with sequence parallelism.
#   final weights (run.final_weights: an llm.c file of whole tensors from every tensor rank's slices):
#         T 2 x data 2 at stage 3 against the CPU one-rank file, rel L2 within 1e-5.
#   bytes and memory: each run's bytes on the tensor group per step == the summary's theory == `train
#         estimate`'s (2 bytes per bf16 element), its total == the estimate's bytes_per_step, and the
#         tracked peak == the estimate, tier by tier.
#   refusal: comm.backend "mpi" with mesh.tensor 2 (the host-staged comm mirrors only the engine's
#         buffers): one line, before anything is written.
#   hang: tensor rank 1 skips its first collective of step 1: every rank exits non-zero within
#         timeout_s + 15 s, naming the group "tensor".
# usage: tensor_emu.sh path/to/train path/to/zt_train_emu path/to/mpiexec
set -euo pipefail
TRAIN=${1:?usage: tensor_emu.sh train zt_train_emu mpiexec}
EMU=${2:?}
MPIRUN=${3:?}
source "$(dirname "$0")/common.sh"
export ZT_EMU_DEVICES=4
# 6 heads of 16 (the emulated attention kernels' smallest head size): T 2 and 3 both divide them.
common=(plans/default.json "${small[@]}" --set model.n_head=6 --set model.n_embd=96 --set model.seq_len=32
  --set batch.micro_batch=2 --set data.tokenizer= --set optim.lr=0.003 --set optim.warmup_steps=2 --set run.steps=3
  --set zero.bucket_mb=0.05)

run() {  # name np precision [extra --set ...]: zt_train_emu on the NCCL path
  local name=$1 np=$2 prec=$3; shift 3
  local cmd=("$EMU" "${common[@]}" --set device=cuda --set comm.backend=nccl --set precision.compute="$prec"
             --set run.log="$work/$name/metrics.jsonl" --set run.final_weights="$work/$name/final.bin" "$@")
  "$MPIRUN" -np "$np" -x ZT_EMU_DEVICES "${cmd[@]}" > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; exit 1; }
  "$EMU" estimate "${cmd[@]:1}" --world "$np" --json 2>/dev/null > "$work/$name.est"
  echo "ran $name: $(grep -c '^step ' "$work/$name.out") steps"
}

bg oracle_cpu cpu_a1 1
bg oracle_cpu cpu_a2 2
bg oracle_bf16 b16_a1 1
bg oracle_bf16 b16_a2 2
bg run f32_t2 2 fp32 --set mesh.tensor=2
bg run f32_t3 3 fp32 --set mesh.tensor=3
bg run f32_t2_sp 2 fp32 --set mesh.tensor=2 --set mesh.sequence_parallel=true --set recompute.classifier_chunk=16
bg run f32_t2d2_s1 4 fp32 --set mesh.tensor=2 --set zero.stage=1
bg run f32_t2d2_s3 4 fp32 --set mesh.tensor=2 --set zero.stage=3 --set recompute.classifier_chunk=16
bg run f32_t2d2_s3_offload 4 fp32 --set mesh.tensor=2 --set zero.stage=3 --set offload.optimizer=cpu --set offload.params=cpu
bg run b16_t2 2 bf16 --set mesh.tensor=2
bg run b16_t2d2_s2_sp 4 bf16 --set mesh.tensor=2 --set zero.stage=2 --set mesh.sequence_parallel=true
join

fail=0
# The host-staged comm has no mirror of the activations the tensor group moves.
if "$MPIRUN" -np 2 -x ZT_EMU_DEVICES "$EMU" "${common[@]}" --set device=cuda --set mesh.tensor=2 --set comm.backend=mpi \
     --set run.log="$work/refused/metrics.jsonl" > "$work/refused.out" 2> "$work/refused.err"; then
  echo "refusal: comm.backend mpi with mesh.tensor 2 ran"; fail=1
fi
want='comm.backend: "mpi" with mesh.tensor 2 on the CUDA backend'
if [ "$(grep -c '^error' "$work/refused.err")" != 1 ] || ! grep -qF "$want" "$work/refused.err" \
   || [ -e "$work/refused/metrics.jsonl" ]; then
  echo "refusal: FAILED"; cat "$work/refused.err"; fail=1
else echo "refusal: $(grep '^error' "$work/refused.err")"; fi

# A tensor rank that skips a collective: the waiting rank times out naming the group; the job ends.
t0=$(date +%s)
if "$MPIRUN" -np 2 -x ZT_EMU_DEVICES "$EMU" "${common[@]}" --set device=cuda --set comm.backend=nccl --set mesh.tensor=2 \
     --set comm.timeout_s=5 --set comm.fault_skip_rank=1 --set comm.fault_skip_step=1 \
     --set run.log="$work/hang/metrics.jsonl" > "$work/hang.out" 2> "$work/hang.err"; then
  echo "hang: a skipped collective did not end the run"; fail=1
fi
took=$(( $(date +%s) - t0 ))
if grep -qE 'collective [a-z_]+ #[0-9]+ in group "tensor" .*did not complete within 5 s' "$work/hang.err" \
   && [ "$took" -le 20 ]; then
  echo "hang: every rank ended in ${took} s (timeout 5 s): $(grep -m1 '^error' "$work/hang.err")"
else echo "hang: FAILED (${took} s)"; grep -vE '^\[vm|EMULATED on the CPU' "$work/hang.err" | head -30; fail=1; fi

FAIL=$fail "$PY" - "$work" <<'PY'
import json, os, sys
sys.path.insert(0, "test/emu")
from emu_results import Runs
runs = Runs(sys.argv[1])
w, summary = runs.w, runs.summary
ok = os.environ["FAIL"] == "0"
def check(name, ref, bound):
    global ok
    good, line = runs.against(name, ref, bound)
    ok &= good
    print(line)
for name, ref in (("f32_t2", "cpu_a1"), ("f32_t3", "cpu_a1"), ("f32_t2_sp", "cpu_a1"), ("f32_t2d2_s1", "cpu_a2"),
                  ("f32_t2d2_s3", "cpu_a2"), ("f32_t2d2_s3_offload", "cpu_a2")):
    check(name, ref, 1e-5)
check("b16_t2", "b16_a1", 2e-2)
check("b16_t2d2_s2_sp", "b16_a2", 2e-2)
err = runs.weights_rel_l2("f32_t2d2_s3", "cpu_a2")  # inf: the headers differ
good = err <= 1e-5
ok &= good
print(f"final weights, T 2 x data 2 stage 3 vs the CPU backend on one rank: rel L2 {err:.2e} (bound 1e-5) "
      f"{'ok' if good else 'FAILED'}")
for name in sorted(os.path.basename(p)[:-4] for p in os.listdir(w) if p.endswith(".est")):
    sm, est = summary(name), json.load(open(f"{w}/{name}.est"))
    t = (sm["bytes_tensor_group_per_step"], sm["bytes_tensor_group_per_step_theory"], est["bytes_per_step_tensor_group"])
    total = (sm["bytes_sent_per_step"], est["bytes_per_step"])
    good = t[0] > 0 and len(set(t)) == 1 and len(set(total)) == 1 and est["memory"] == sm["peak_memory_bytes"] \
        and sm["tensor"] == est["tensor"] > 1
    ok &= good
    print(f"{name:20s} tensor group bytes/step {t[0]} (theory {t[1]}, estimate {t[2]}), total {total[0]} (estimate "
          f"{total[1]}), estimate {'==' if est['memory'] == sm['peak_memory_bytes'] else '!='} tracked: "
          f"{'ok' if good else 'FAILED'}")
print("tensor_emu (" + os.environ["WHERE"] + "):", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
