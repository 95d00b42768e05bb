# Sourced by the emulator scripts (test/emu/*_emu.sh) after `set -euo pipefail` and EMU (zt_train_emu,
# or ./train where scripts/device/run.sh runs them on a GPU): the set-up they all share.
# Leaves: the repository root as working directory; PY; WHERE (exported); work, a temporary directory
# removed at exit; Open MPI allowed as root and oversubscribed; small, the model and data every script trains.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
# numpy/h5py: Debian's /usr/bin/python3 here; scripts/device/run.sh sets ZT_PYTHON on the GPU machine.
PY=${ZT_PYTHON:-/usr/bin/python3}
# What ran: the emulator (zt_train_emu, version "...-emu"), or the real CUDA build on a GPU.
case "$("$EMU" --version 2>/dev/null)" in *-emu*) WHERE="EMULATED CUDA, not a GPU" ;; *) WHERE="CUDA on a GPU" ;; esac
export WHERE
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# A small model (2 layers, 64 wide, 64 tokens, one sequence per micro-batch: emulation is slow) on the
# committed sample data. The end-of-run evaluation and sample still run (their code stays covered),
# on one batch and one token: no script checks them, and at the plan's defaults (20 batches, 63
# tokens) they took three quarters of each emulated run.
small=(--set data.train='data/sample/train_*.bin' --set data.val=data/sample/val.bin
  --set model.n_layer=2 --set model.n_embd=64 --set model.n_head=2 --set model.seq_len=64
  --set batch.micro_batch=1 --set run.eval_every=0 --set run.eval_batches=1
  --set run.sample_every=0 --set run.sample_tokens=1)
# The oracles of the scripts that compare a mesh with one rank (tensor_emu, pipeline_emu), over the
# caller's `common` plan arguments: `oracle_cpu NAME ACCUM` the CPU backend on one rank (with final
# weights), `oracle_bf16 NAME ACCUM` one emulated rank in bf16; each logs to $work/NAME/metrics.jsonl.
oracle_cpu() {  # name grad_accum [extra --set ...]
  local name=$1 accum=$2; shift 2
  "$TRAIN" "${common[@]}" --set device=cpu --set batch.grad_accum="$accum" --set run.log="$work/$name/metrics.jsonl" \
    --set run.final_weights="$work/$name/final.bin" "$@" > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; exit 1; }
}
oracle_bf16() {
  "$EMU" "${common[@]}" --set device=cuda --set precision.compute=bf16 --set batch.grad_accum="$2" \
    --set run.log="$work/$1/metrics.jsonl" > "$work/$1.out" 2>&1 || { cat "$work/$1.out"; exit 1; }
}
# Independent runs two at a time under the emulator (each emulated rank is one thread, the CI
# machine has 2 cores, and a script runs alone: RUN_SERIAL): `bg CMD ARGS...` starts CMD (a function
# of the script, which prints its own failure and exits non-zero) in the background once fewer than
# two are running; `join` waits for every one started and exits 1 if any failed. Only runs whose
# checks do not measure time go through bg. On a GPU (scripts/device/run.sh) one at a time.
if [ "$WHERE" = "CUDA on a GPU" ]; then emu_jobs=1; else emu_jobs=${ZT_EMU_JOBS:-2}; fi
bg_pids=()
bg() {
  while [ "$(jobs -rp | wc -l)" -ge "$emu_jobs" ]; do sleep 0.1; done
  "$@" &
  bg_pids+=($!)
}
join() {
  local failed=0 p
  for p in "${bg_pids[@]}"; do wait "$p" || failed=1; done
  bg_pids=()
  [ "$failed" = 0 ] || { echo "FAILED: a run above failed (its output is printed above)"; exit 1; }
}
