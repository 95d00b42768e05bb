#!/usr/bin/env bash
# Ranks started with different plans must refuse to train: rank 1 gets a different seed (MPMD
# launch), and every rank must exit non-zero with a message naming the mismatch, writing no log.
#   plan_mismatch.sh path/to/train [mpiexec]
set -uo pipefail
TRAIN=$(realpath "${1:?usage: plan_mismatch.sh path/to/train [mpiexec]}")
MPIEXEC=${2:-mpirun}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
common=(plans/default.json --set 'data.train=data/sample/train_*.bin' --set data.val=data/sample/val.bin
        --set data.tokenizer= --set run.steps=2 --set run.log="$work/run/metrics.jsonl")
timeout -k 5 60 "$MPIEXEC" --oversubscribe -np 1 "$TRAIN" "${common[@]}" --set run.seed=1 : \
                           -np 1 "$TRAIN" "${common[@]}" --set run.seed=2 >"$work/out" 2>&1
rc=$?
fail=0
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] || { echo "FAIL: exit code $rc (expected a clean non-zero exit)"; fail=1; }
grep -q "runs a different plan or binary than rank 0" "$work/out" || { echo "FAIL: no mismatch message"; fail=1; }
[ ! -e "$work/run/metrics.jsonl" ] || { echo "FAIL: a metrics log was written"; fail=1; }
if [ $fail -ne 0 ]; then cat "$work/out"; exit 1; fi
echo "plan_mismatch ok: $(grep -m1 'runs a different plan' "$work/out")"
