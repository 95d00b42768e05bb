#!/usr/bin/env bash
# The offloaded step at the disk's speed (docs/offload.md): one run of a stage-3 plan with the
# parameter, gradient and optimizer shards on disk, its bytes per second (scripts/offload_rate.py:
# /proc/PID/io over the steps after the first) next to two io_uring probes (O_DIRECT, 1 MiB pieces,
# queue depth 32) on the same directory just before and just after it:
#   mixed (the anchor): build/zt_bench_offload mixed reads and writes at once, as the step does, in
#     the step's read:write proportion (3:2: six reads and four writes of a shard per step; the
#     printout shows the step's own); the ratio is the time the probe would take for the step's
#     bytes (read + written over its combined rate, the two probes' mean) over the step's time.
#   sequential: build/zt_bench_offload io reads 1 GiB, then writes 1 GiB; printed beside, with the
#     ratio on those rates (read / read rate + written / write rate), which flatters the step on a
#     disk that serves reads and writes together.
#   scripts/bench_offload_rate.sh [--dir DIR] [--threads N] [--steps N] [--plan PLAN] [--train BIN] [--set K=V ...]
# The default model: L 8, C 768, T 64, B 1 (95M parameters: 4 swap files of 0.38 GB); --plan
# plans/largest_cpu_nvme.json measures that plan (its own model and directory unless --dir); --train
# another build's binary (to set two versions side by side).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DIR=runs/bench_offload_rate; THREADS=$(nproc); STEPS=5; PLAN=; TRAIN=./train; SETS=()
while [ $# -gt 0 ]; do
  case $1 in
    --dir) DIR=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --plan) PLAN=$2; shift 2 ;;
    --train) TRAIN=$2; shift 2 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    *) echo "usage: $0 [--dir DIR] [--threads N] [--steps N] [--plan PLAN] [--train BIN] [--set K=V ...]" >&2; exit 2 ;;
  esac
done
PY=/usr/bin/python3
BENCH=build/zt_bench_offload
[ -x "$BENCH" ] && [ -x "$TRAIN" ] || { echo "bench_offload_rate: run make first" >&2; exit 1; }
mkdir -p "$DIR"
out=$(mktemp -d); trap 'rm -rf "$out"; rmdir "$DIR" 2>/dev/null || true' EXIT

model=()
if [ -z "$PLAN" ]; then
  PLAN=plans/default.json
  model=(--set model.n_layer=8 --set model.n_head=12 --set model.n_embd=768 --set model.seq_len=64
         --set batch.micro_batch=1 --set batch.grad_accum=1 --set zero.stage=3
         --set offload.params=nvme --set offload.optimizer=nvme)
fi
probe() { "$BENCH" mixed "$DIR" 1536 1024 32 > "$out/mixed_$1.json"; "$BENCH" io "$DIR" 1024 32 > "$out/$1.json"; }
probe before
$PY scripts/offload_rate.py "$out/rate.json" "$TRAIN" "$PLAN" "${model[@]}" --set offload.nvme_dir="$DIR" \
    --set run.steps="$STEPS" --set run.eval_every=0 --set run.eval_batches=1 --set run.sample_every=0 \
    --set data.tokenizer= --set data.train='data/sample/train_*.bin' --set data.val=data/sample/val.bin \
    --set run.threads="$THREADS" --set run.log="$out/metrics.jsonl" "${SETS[@]}"
probe after

$PY - "$out" "$PLAN" <<'EOF'
import json, sys
out, plan = sys.argv[1], sys.argv[2]
a, b, r, ma, mb = (json.load(open(f"{out}/{n}.json")) for n in ("before", "after", "rate", "mixed_before", "mixed_after"))
mixed = (ma["gb_per_s"] + mb["gb_per_s"]) / 2
rd, wr = (a["read_gb_per_s"] + b["read_gb_per_s"]) / 2, (a["write_gb_per_s"] + b["write_gb_per_s"]) / 2
n, s = len(r["steps"]), r["s"]
ideal = r["read"] / 1e9 / rd + r["write"] / 1e9 / wr
print(f"offloaded step ({plan}), {n} steps after the first: {s / n:.2f} s/step, start-up {r['startup_s']:.1f} s")
print(f"  moved  read {r['read'] / n / 1e9:6.2f} GB/step at {r['read'] / s / 1e9:5.2f} GB/s   "
      f"write {r['write'] / n / 1e9:6.2f} GB/step at {r['write'] / s / 1e9:5.2f} GB/s")
print(f"  read:write {r['read'] / r['write']:.2f} (the mixed probe's: {ma['read_mib'] / ma['write_mib']:.2f}), "
      f"together {(r['read'] + r['write']) / s / 1e9:.2f} GB/s")
fair = (r["read"] + r["write"]) / 1e9 / mixed
print(f"  mixed probe (reads and writes at once), same directory: {ma['gb_per_s']:.2f} / {mb['gb_per_s']:.2f} GB/s "
      f"(before / after)")
print(f"  step at {fair / s:.0%} of the mixed probe's speed (its bytes at the probe's rate: {fair / n:.2f} s/step)")
print(f"  sequential probe (read, then write), same directory: read {a['read_gb_per_s']:.2f} / {b['read_gb_per_s']:.2f} GB/s, "
      f"write {a['write_gb_per_s']:.2f} / {b['write_gb_per_s']:.2f} GB/s (before / after)")
print(f"  step at {ideal / s:.0%} of the sequential probe's speed (its bytes at those rates: {ideal / n:.2f} s/step)")
EOF
