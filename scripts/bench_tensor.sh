#!/usr/bin/env bash
# Tensor parallelism against ZeRO-3 at world 2 on one host (issue 53; docs/benchmarks.md "Tensor
# parallelism"): the same global batch trained
#   one rank      stage 0, micro_batch 2B          (the compute anchor: one rank doing all of it)
#   zero3         2 ranks, stage 3, micro_batch B  (data parallel: each rank half the batch, the
#                                                   parameters gathered and gradients scattered)
#   tensor        2 ranks, mesh.tensor 2, micro_batch 2B  (each rank half of every matrix and of the
#                                                   vocabulary, the whole batch; activations all-reduced)
#   tensor+sp     the same with mesh.sequence_parallel
# and prints per row the median step time (steps 2..N), the time ranks waited on communication, the
# bytes each rank sent per step, and for the tensor rows the wait per layer (the tensor group's
# collectives are blocking: their wait is their time). One thread per rank, ranks over Open MPI's
# shared memory.
#
#   scripts/bench_tensor.sh [--model wide|wide2|tiny] [--steps N]
set -euo pipefail
cd "$(dirname "$0")/.."
model=wide
steps=6
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "usage: $0 [--model wide|wide2|tiny] [--steps N]" >&2; exit 2 ;;
  esac
done
case $model in
  wide) L=2 NH=16 C=1024 T=64 B=2 ;;    # blocks 25M parameters, 12.6M each: the matrices dominate compute
  wide2) L=4 NH=12 C=768 T=64 B=2 ;;    # GPT-2 124M's width, 4 layers
  tiny) L=2 NH=2 C=64 T=32 B=2 ;;       # seconds: for checking the script
  *) echo "unknown --model $model (wide, wide2, tiny)" >&2; exit 2 ;;
esac
[ -x build/train ] || { echo "build/train missing: make build first" >&2; exit 1; }
[ -e data/sample/val.bin ] || { echo "data/sample missing: scripts/prepare_data first" >&2; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--set model.n_layer=$L --set model.n_head=$NH --set model.n_embd=$C --set model.seq_len=$T
  --set 'data.train=data/sample/train_*.bin' --set data.val=data/sample/val.bin --set data.tokenizer=
  --set run.steps=$steps --set run.eval_every=0 --set run.eval_batches=1 --set run.sample_every=0
  --set run.threads=1 --set optim.warmup_steps=2)

run() {  # name ranks sets...
  local name=$1 np=$2; shift 2
  mpirun --oversubscribe -np "$np" build/train plans/default.json "${common[@]}" --set run.log="$out/$name.jsonl" "$@" \
    >"$out/$name.txt" 2>&1 || { echo "$name failed:"; tail -5 "$out/$name.txt"; exit 1; }
}
echo "model L=$L NH=$NH C=$C seq_len=$T, global batch $((2 * B)) sequences, $steps steps, $(getconf _NPROCESSORS_ONLN) cores, $(date -u +%F)"
run one 1 --set batch.micro_batch=$((2 * B))
run zero3 2 --set batch.micro_batch=$B --set zero.stage=3
run tensor 2 --set batch.micro_batch=$((2 * B)) --set mesh.tensor=2
run tensor_sp 2 --set batch.micro_batch=$((2 * B)) --set mesh.tensor=2 --set mesh.sequence_parallel=true
/usr/bin/python3 - "$out" "$L" <<'PY'
import json, statistics, sys
out, L = sys.argv[1], int(sys.argv[2])
def load(name):
    rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    steps = [r for r in rows if "loss" in r][1:]
    summ = [r["summary"] for r in rows if "summary" in r][0]
    return steps, summ
one_ms = None
print(f"{'run':>10} {'step ms':>8} {'vs one':>6} {'comm wait ms':>12} {'MiB/step':>9} {'tensor MiB':>10} "
      f"{'wait/layer ms':>13} {'tracked MiB':>11} {'VmHWM MiB':>9} {'loss':>8}")
for name in ("one", "zero3", "tensor", "tensor_sp"):
    steps, s = load(name)
    ms = statistics.median(r["ms"] for r in steps)
    wait = statistics.median(r.get("comm_wait_ms", 0.0) for r in steps)
    one_ms = one_ms or ms
    tb = s.get("bytes_tensor_group_per_step", 0)
    per_layer = f"{wait / L:13.1f}" if tb else f"{'-':>13}"
    peak = s["peak_memory_bytes"]["host"]["total"] / 2**20  # tracked peak (== train estimate)
    rss = max(s["peak_rss_bytes_per_rank"]) / 2**20          # the largest rank's VmHWM
    print(f"{name:>10} {ms:8.1f} {one_ms / ms:6.2f} {wait:12.1f} {s['bytes_sent_per_step'] / 2**20:9.2f} "
          f"{tb / 2**20:10.2f} {per_layer} {peak:11.1f} {rss:9.1f} {steps[-1]['loss']:8.4f}")
PY
