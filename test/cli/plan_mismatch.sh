#!/usr/bin/env bash
# Ranks started with different plans must refuse to train: rank 1 gets a different seed (MPMD
# launch), and every rank must exit non-zero with a message naming the mismatch, writing no log.
# Refusals every rank reaches together are said once, by one rank, and end without MPI_Abort (whose
# banner repeated them): the seed mismatch, a ZT_COMM_* variable set for one rank only (the hint
# names the environment), a plan every rank refuses before the communicator exists, and
# comm.fault_skip_rank past the world (accepted silently before).
#   plan_mismatch.sh path/to/train [mpiexec]
set -uo pipefail
TRAIN=$(realpath "${1:?usage: plan_mismatch.sh path/to/train [mpiexec]}")
MPIEXEC=${2:-mpirun}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
common=(plans/default.json --set 'data.train=data/sample/train_*.bin' --set data.val=data/sample/val.bin
        --set data.tokenizer= --set run.steps=2 --set run.log="$work/run/metrics.jsonl"
        --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 --set model.seq_len=32 --set run.threads=1)
fail=0

# check NAME WANT: the run in $work/out exited non-zero (not by timeout), said WANT in exactly one
# "error:" line, printed no MPI_Abort banner and wrote no log.
check() {
  local name=$1 want=$2 rc=$3
  local errors; errors=$(grep -c '^error' "$work/out")
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "FAIL $name: exit code $rc (expected a clean non-zero exit)"; fail=1
  elif ! grep -qF -- "$want" "$work/out"; then echo "FAIL $name: no line with '$want'"; fail=1
  elif [ "$errors" -ne 1 ]; then echo "FAIL $name: $errors error lines (one rank says it)"; fail=1
  elif grep -q 'MPI_ABORT' "$work/out"; then echo "FAIL $name: MPI_Abort's banner"; fail=1
  elif [ -e "$work/run/metrics.jsonl" ]; then echo "FAIL $name: a metrics log was written"; fail=1
  else echo "ok   $name: $(grep -m1 '^error' "$work/out")"; return; fi
  cat "$work/out"
}

timeout -k 5 60 "$MPIEXEC" --oversubscribe -np 1 "$TRAIN" "${common[@]}" --set run.seed=1 : \
                           -np 1 "$TRAIN" "${common[@]}" --set run.seed=2 >"$work/out" 2>&1
check seed_mismatch "runs a different plan or binary than rank 0" $?
grep -q "ZT_COMM_\* environment" "$work/out" || { echo "FAIL seed_mismatch: the hint does not name the ZT_COMM_* environment"; fail=1; }

timeout -k 5 60 "$MPIEXEC" --oversubscribe -np 1 "$TRAIN" "${common[@]}" : \
                           -np 1 env ZT_COMM_COLLECTIVES=mpi "$TRAIN" "${common[@]}" >"$work/out" 2>&1
# The comm settings are compared first: the line names both ranks' and the variables behind them.
check env_mismatch "its comm settings (collectives mpi, " $?
grep -q "most likely from the environment: ZT_COMM_THREAD, ZT_COMM_COLLECTIVES" "$work/out" \
  || { echo "FAIL env_mismatch: the line does not name the ZT_COMM_* variables"; fail=1; }

timeout -k 5 60 "$MPIEXEC" --oversubscribe -np 2 "$TRAIN" "${common[@]}" --set optim.lr=-1 >"$work/out" 2>&1
check bad_plan_every_rank "optim.lr: must be > 0" $?

timeout -k 5 60 "$MPIEXEC" --oversubscribe -np 2 "$TRAIN" "${common[@]}" --set comm.fault_skip_rank=5 >"$work/out" 2>&1
check fault_skip_rank_past_world "comm.fault_skip_rank: 5 is not a rank of this run (world 2" $?

[ $fail -eq 0 ] && echo "plan_mismatch ok"
exit $fail
