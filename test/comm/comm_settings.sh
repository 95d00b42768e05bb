#!/usr/bin/env bash
# The communication settings are plan keys (comm.thread, comm.collectives, comm.inflight,
# comm.poll_us; defaults in plans/base.json) that reach the comm layer, with ZT_COMM_* as overrides:
#   - 2 ranks with comm.collectives "mpi" and comm.inflight 0 (MPI's non-blocking collectives, no
#     limit), and with "mpi_blocking" (MPI's blocking ones on worker threads), train the same losses
#     as the defaults (two ranks: a sum of two is the same in any order), and plan.json records
#     what ran;
#   - ZT_COMM_THREAD=0 / ZT_COMM_POLL_US=10 are printed at start and recorded in plan.json;
#   - a rank whose override differs from rank 0's is refused (the plan hash covers them).
#   comm_settings.sh path/to/train [mpiexec]
set -uo pipefail
TRAIN=$(realpath "${1:?usage: comm_settings.sh path/to/train [mpiexec]}")
MPIEXEC=${2:-mpirun}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL $*"; fails=$((fails+1)); }
common=(plans/default.json --set 'data.train=data/sample/train_*.bin' --set data.val=data/sample/val.bin
        --set data.tokenizer= --set model.n_layer=2 --set model.n_embd=64 --set model.n_head=2
        --set model.seq_len=32 --set batch.micro_batch=2 --set run.steps=3 --set optim.warmup_steps=1
        --set run.eval_every=0 --set run.eval_batches=1 --set run.sample_every=0 --set run.threads=1)

# run NAME [env...] -- [extra args...]: 2 ranks; stdout+stderr in $work/NAME.out
run() {
  local name=$1; shift
  local env=()
  while [ "$1" != "--" ]; do env+=("$1"); shift; done; shift
  env "${env[@]}" timeout -k 5 120 "$MPIEXEC" --oversubscribe -np 2 "$TRAIN" "${common[@]}" \
    --set run.log="$work/$name/metrics.jsonl" "$@" >"$work/$name.out" 2>&1 || { fail "$name: exit $?"; cat "$work/$name.out"; }
}
# field PLAN_JSON KEY: comm.KEY as JSON
field() { /usr/bin/python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["comm"][sys.argv[2]]))' "$1" "$2"; }
losses() { /usr/bin/python3 -c '
import json, sys
print([r["loss"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r and "val_loss" not in r])' "$1"; }

run defaults --
run mpi_collectives -- --set comm.collectives=mpi --set comm.inflight=0
run mpi_blocking -- --set comm.collectives=mpi_blocking
run thread_off ZT_COMM_THREAD=0 ZT_COMM_POLL_US=10 --

for k in thread collectives inflight poll_us; do printf '%s ' "$k=$(field "$work/defaults/plan.json" $k)"; done; echo "(defaults)"
[ "$(field "$work/mpi_collectives/plan.json" collectives)" = '"mpi"' ] || fail "plan.json does not record comm.collectives mpi"
[ "$(field "$work/mpi_blocking/plan.json" collectives)" = '"mpi_blocking"' ] || fail "plan.json does not record comm.collectives mpi_blocking"
[ "$(field "$work/mpi_collectives/plan.json" inflight)" = 0 ] || fail "plan.json does not record comm.inflight 0"
[ "$(field "$work/thread_off/plan.json" thread)" = false ] || fail "plan.json does not record the ZT_COMM_THREAD=0 override"
[ "$(field "$work/thread_off/plan.json" poll_us)" = 10 ] || fail "plan.json does not record the ZT_COMM_POLL_US=10 override"
grep -qF 'environment: ZT_COMM_THREAD=0 overrides comm.thread (plan: true)' "$work/thread_off.out" \
  || fail "the ZT_COMM_THREAD override is not printed: $(head -3 "$work/thread_off.out")"
grep -qF 'environment: ZT_COMM_POLL_US=10 overrides comm.poll_us (plan: 50)' "$work/thread_off.out" \
  || fail "the ZT_COMM_POLL_US override is not printed"
grep -q 'environment:' "$work/defaults.out" && fail "an override printed without one set"
ref=$(losses "$work/defaults/metrics.jsonl")
[ "$ref" != "[]" ] || fail "no losses logged"
for name in mpi_collectives mpi_blocking thread_off; do
  got=$(losses "$work/$name/metrics.jsonl")
  [ "$got" = "$ref" ] && echo "ok   $name: losses $got" || fail "$name: losses $got vs defaults $ref"
done

# Rank 1 alone with ZT_COMM_COLLECTIVES=mpi: refused before training, as a different plan.
timeout -k 5 60 "$MPIEXEC" --oversubscribe -np 1 "$TRAIN" "${common[@]}" --set run.log="$work/mix/metrics.jsonl" : \
  -np 1 -x ZT_COMM_COLLECTIVES=mpi "$TRAIN" "${common[@]}" --set run.log="$work/mix/metrics.jsonl" >"$work/mix.out" 2>&1
rc=$?
if [ $rc -eq 0 ] || ! grep -q "runs a different plan or binary than rank 0" "$work/mix.out" || [ -e "$work/mix/metrics.jsonl" ]; then
  fail "mixed ZT_COMM_COLLECTIVES: rc $rc"; cat "$work/mix.out"
else echo "ok   mixed ZT_COMM_COLLECTIVES refused: $(grep -m1 'runs a different plan' "$work/mix.out")"; fi

[ $fails -eq 0 ] && echo "comm settings: all cases passed" || { echo "$fails case(s) failed"; exit 1; }
