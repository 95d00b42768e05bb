#!/usr/bin/env bash
# usage: scripts/bit_identical.sh TRAIN EMU OUTDIR  (from the repo root; OUTDIR must not exist). Trains
# a fixed matrix of short runs and prints, per run, a hash of its losses (train and val) and of its
# final weights (run.final_weights): two builds that print the same lines train bit for bit alike.
# Rows: the default plan at N = 1, 2; stages 1-3 at N = 2, 3; the naive path; NVMe offload (optimizer,
# both, the update inside backward); traced stage 3; the CUDA backend under the emulator (fp32, bf16
# over the host mirror, host AdamW, pinned parameters). EMU: build/zt_train_emu. ONLY=glob: some rows.
# Used for the restructure of issue 51 (docs/design.md §2); about 4 minutes on 2 cores. Prints
# one line per run: name, losses sha, final-weights sha, first/last loss.
set -uo pipefail
TRAIN=$1; EMU=$2; OUT=$3
if [ -e "$OUT" ]; then echo "bit_identical.sh: $OUT exists; give a new directory" >&2; exit 2; fi
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
small=(--set data.train='data/sample/train_*.bin' --set data.val=data/sample/val.bin --set data.tokenizer=data/sample/gpt2_tokenizer.bin
  --set model.n_layer=2 --set model.n_embd=64 --set model.n_head=2 --set model.seq_len=64 --set model.vocab_size=50257
  --set batch.micro_batch=4 --set batch.grad_accum=2 --set optim.lr=0.003 --set optim.warmup_steps=2
  --set run.steps=8 --set run.eval_every=4 --set run.eval_batches=1 --set run.sample_every=0 --set run.threads=1
  --set zero.bucket_mb=0.05)
run() { # name np extra...
  local name=$1 np=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ "$name" != $ONLY ]]; then return; fi
  local d="$OUT/$name"; mkdir -p "$d"
  local cmd=("$TRAIN" "$@" --set run.log="$d/metrics.jsonl" --set run.final_weights="$d/final.bin")
  if [ "$np" -gt 1 ]; then cmd=(mpirun --oversubscribe -np "$np" "${cmd[@]}"); fi
  if ! "${cmd[@]}" > "$d/out.txt" 2>&1; then echo "$name FAILED"; tail -3 "$d/out.txt"; return; fi
  python3 - "$d" "$name" <<'PY'
import json,hashlib,sys
d,name=sys.argv[1:]
rows=[json.loads(l) for l in open(d+"/metrics.jsonl")]
L=[r["loss"] for r in rows if "loss" in r]
V=[r["val_loss"] for r in rows if "val_loss" in r]
h=hashlib.sha256(json.dumps([L,V]).encode()).hexdigest()[:12]
w=hashlib.sha256(open(d+"/final.bin","rb").read()).hexdigest()[:12]
print(f"{name:28s} losses {h} weights {w} steps {len(L)} first {L[0]!r} last {L[-1]!r}")
PY
}
run default_n1 1 plans/default.json --set data.train='data/sample/train_*.bin' --set data.val=data/sample/val.bin --set data.tokenizer=data/sample/gpt2_tokenizer.bin --set run.steps=6 --set run.eval_every=3 --set run.eval_batches=2 --set run.sample_every=0 --set run.threads=1
run default_n2 2 plans/default.json --set data.train='data/sample/train_*.bin' --set data.val=data/sample/val.bin --set data.tokenizer=data/sample/gpt2_tokenizer.bin --set run.steps=6 --set run.eval_every=3 --set run.eval_batches=2 --set run.sample_every=0 --set run.threads=1
for n in 2 3; do for s in 1 2 3; do
  run "stage${s}_n${n}" $n plans/default.json "${small[@]}" --set zero.stage=$s
done; done
run stage2_n3_naive 3 plans/default.json "${small[@]}" --set zero.stage=2 --set zero.overlap_comm=false
run offload_opt_nvme_s2_n2 2 plans/default.json "${small[@]}" --set zero.stage=2 --set offload.optimizer=nvme --set offload.nvme_dir="$OUT/swap"
run offload_both_nvme_s3_n2 2 plans/default.json "${small[@]}" --set zero.stage=3 --set offload.optimizer=nvme --set offload.params=nvme --set offload.nvme_dir="$OUT/swap"
run offload_both_nvme_s3_n3_clip0 3 plans/default.json "${small[@]}" --set zero.stage=3 --set offload.optimizer=nvme --set offload.params=nvme --set offload.nvme_dir="$OUT/swap" --set optim.grad_clip=0
TRAIN=$EMU run emu_offload_cpu_s2_n2_clip0 2 plans/default.json "${small[@]}" --set device=cuda --set precision.compute=fp32 --set zero.stage=2 --set offload.optimizer=cpu --set optim.grad_clip=0
TRAIN=$EMU run emu_offload_params_cpu_s3_n2 2 plans/default.json "${small[@]}" --set device=cuda --set precision.compute=bf16 --set zero.stage=3 --set offload.optimizer=cpu --set offload.params=cpu
run traced_stage3_n2 2 plans/default.json "${small[@]}" --set zero.stage=3 --set run.trace="$OUT/traced_stage3_n2/run.trace"
TRAIN=$EMU run emu_cuda_fp32_n1 1 plans/default.json "${small[@]}" --set device=cuda --set precision.compute=fp32
TRAIN=$EMU run emu_cuda_bf16_n2 2 plans/default.json "${small[@]}" --set device=cuda --set precision.compute=bf16 --set zero.stage=2
