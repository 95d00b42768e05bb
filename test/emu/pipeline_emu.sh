#!/usr/bin/env bash
# Pipeline parallelism (mesh.pipeline, docs/pipeline.md) on the CUDA backend under the CUDA emulator:
# each rank an MPI process with its own emulated device (ZT_EMU_DEVICES=4). The stages' activations,
# their gradients and the tied embedding's gradient cross through host memory on the pipeline group
# (the host MPI comm, train/engine_assembly.cpp); inside a stage the data and tensor axes run on the
# device comm (host-staged "mpi" or NCCL); on NCCL the boundaries cross between the devices on a
# device pipeline group of their own. EMULATED: this is not a GPU run.
#   fp32, against the CPU backend on one rank with the same global batch, 3 steps, every loss and
#         grad norm within 1e-5 relative: P 2 (3 blocks: uneven) under 1F1B on the host-staged comm,
#         P 2 GPipe on NCCL, P 2 x data 2 at ZeRO stage 1 (NCCL), P 2 x T 2 (NCCL tensor groups),
#         interleaved P 2 x 2 chunks (4 blocks), P 2 x data 2 at stage 1 with the optimizer state in
#         pinned host memory (offload.optimizer cpu).
#   bf16 (each boundary moves bf16 bits: 2 bytes an element), P 2 against one emulated rank in bf16
#         with the same global batch, within 2e-2 (test/gpu TenTrainingSteps' bound).
#   final weights (rank 0 writes, the last stage's blocks sent to it): P 2 against the CPU one-rank
#         file, rel L2 within 1e-5.
#   memory: each run's tracked peak on rank 0 == `train estimate`'s (the first stage's), tier by tier.
# usage: pipeline_emu.sh path/to/train path/to/zt_train_emu path/to/mpiexec
set -euo pipefail
TRAIN=${1:?usage: pipeline_emu.sh train zt_train_emu mpiexec}
EMU=${2:?}
MPIRUN=${3:?}
source "$(dirname "$0")/common.sh"
export ZT_EMU_DEVICES=4
# 6 heads of 16 (the emulated attention kernels' smallest head size), 3 blocks over 2 stages.
common=(plans/default.json "${small[@]}" --set model.n_layer=3 --set model.n_head=6 --set model.n_embd=96
  --set model.seq_len=32 --set batch.micro_batch=2 --set data.tokenizer= --set optim.lr=0.003 --set optim.warmup_steps=2
  --set run.steps=3 --set zero.bucket_mb=0.05)

run() {  # name np backend precision [extra --set ...]: zt_train_emu with stages
  local name=$1 np=$2 backend=$3 prec=$4; shift 4
  local cmd=("$EMU" "${common[@]}" --set device=cuda --set comm.backend="$backend" --set precision.compute="$prec"
             --set batch.grad_accum=2 --set run.log="$work/$name/metrics.jsonl"
             --set run.final_weights="$work/$name/final.bin" "$@")
  "$MPIRUN" -np "$np" -x ZT_EMU_DEVICES "${cmd[@]}" > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; exit 1; }
  "$EMU" estimate "${cmd[@]:1}" --world "$np" --json 2>/dev/null > "$work/$name.est"
  echo "ran $name: $(grep -c '^step ' "$work/$name.out") steps"
}

bg oracle_cpu cpu_a2 2
bg oracle_cpu cpu_a4 4
bg oracle_bf16 b16_a2 2
bg run f32_p2 2 mpi fp32 --set mesh.pipeline=2
bg run f32_p2_nccl_gpipe 2 nccl fp32 --set mesh.pipeline=2 --set mesh.schedule=gpipe
bg run f32_p2d2_s1 4 nccl fp32 --set mesh.pipeline=2 --set zero.stage=1
bg run f32_p2t2 4 nccl fp32 --set mesh.pipeline=2 --set mesh.tensor=2
bg run b16_p2 2 nccl bf16 --set mesh.pipeline=2
bg oracle_cpu cpu_a2_l4 2 --set model.n_layer=4
bg run f32_p2v2 2 nccl fp32 --set mesh.pipeline=2 --set mesh.schedule=interleaved --set mesh.chunks=2 \
  --set model.n_layer=4
bg run f32_p2d2_off 4 nccl fp32 --set mesh.pipeline=2 --set zero.stage=1 --set offload.optimizer=cpu
join

"$PY" - "$work" <<'PY'
import json, os, sys
sys.path.insert(0, "test/emu")
from emu_results import Runs
runs = Runs(sys.argv[1])
w, summary = runs.w, runs.summary
ok = True
def check(name, ref, bound):
    global ok
    good, line = runs.against(name, ref, bound)
    good &= summary(name)["pipeline"] == 2
    ok &= good
    print(line)
for name, ref in (("f32_p2", "cpu_a2"), ("f32_p2_nccl_gpipe", "cpu_a2"), ("f32_p2d2_s1", "cpu_a4"),
                  ("f32_p2t2", "cpu_a2"), ("f32_p2v2", "cpu_a2_l4"), ("f32_p2d2_off", "cpu_a4")):
    check(name, ref, 1e-5)
check("b16_p2", "b16_a2", 2e-2)
err = runs.weights_rel_l2("f32_p2", "cpu_a2")  # inf: the headers differ
good = err <= 1e-5
ok &= good
print(f"final weights, P 2 vs the CPU backend on one rank: rel L2 {err:.2e} (bound 1e-5) {'ok' if good else 'FAILED'}")
# On NCCL the boundaries cross between the devices in buffers of their own (pipeline/runner.h
# PipeBuffers): rank 0 holds 2 receive buffers and one per message it sends in a step, each (B, T, C)
# of the backend's element (B 2, T 32, C 96): 1F1B / GPipe m 2 send 2 activations; interleaved x 2
# chunks 2 per chunk forward and 2 gradients back (chunk 1's backward). The host-staged run has none.
msg = 2 * 32 * 96
want = {"f32_p2": 0, "f32_p2_nccl_gpipe": 4 * msg * 4, "f32_p2d2_s1": 4 * msg * 4, "f32_p2t2": 4 * msg * 4,
        "f32_p2v2": 8 * msg * 4, "f32_p2d2_off": 4 * msg * 4, "b16_p2": 4 * msg * 2}
for name, bytes_ in want.items():
    est = json.load(open(f"{w}/{name}.est"))
    got = sum(b["bytes"] for b in est["buffers"] if b["name"].startswith("pipeline messages") and b["tier"] == "device")
    good = got == bytes_
    ok &= good
    print(f"{name:18s} pipeline message buffers on the device {got} bytes (want {bytes_}): {'ok' if good else 'FAILED'}")
for name in sorted(os.path.basename(p)[:-4] for p in os.listdir(w) if p.endswith(".est")):
    sm, est = summary(name), json.load(open(f"{w}/{name}.est"))
    good = est["memory"] == sm["peak_memory_bytes"] and sm["bytes_pipeline_group_per_step"] > 0
    ok &= good
    print(f"{name:18s} estimate {'==' if est['memory'] == sm['peak_memory_bytes'] else '!='} tracked on rank 0, "
          f"{sm['bytes_pipeline_group_per_step']} bytes/step between the stages: {'ok' if good else 'FAILED'}")
print("pipeline_emu (" + os.environ["WHERE"] + "):", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
