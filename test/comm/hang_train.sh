#!/usr/bin/env bash
# A hung collective in a real training run must end the job by itself, with a diagnostic.
#
#   test/comm/hang_train.sh [PATH/TO/train] [MPIEXEC]     (defaults: ./train, mpirun)
#
# 3 ranks train a tiny model; at step 2 rank 1 skips its first model-state collective
# (comm.fault_skip_rank/fault_skip_step, see src/comm/comm.h). The other ranks must give up after
# comm.timeout_s = 3 s, print which collective (rank, op, sequence number) "did not complete" and
# a dump of their collective log, and take the whole job down (abort_all). Under
# `timeout 60` the job must exit non-zero, not by the outer timeout, within timeout_s + 10 s.
# Checked for every ZeRO stage, each in the collective that its step starts with (EXPECTED_OP):
#   stage 0  all_reduce      (DDP: the first gradient bucket, in backward)
#   stage 1  reduce_scatter  (the first gradient bucket, in backward: the parameter all-gathers
#                             and the prepared row lookup of step 2 were issued after step 1's
#                             optimizer step, EmbeddingExchange::prepare, docs/design.md §3.4)
#   stage 2  reduce_scatter  (the same)
#   stage 3  all_gather      (the embedding's parameters, gathered before the forward)
# The waiting ranks 0 and 2 must time out in that op at step 2, both in the same collective (one
# sequence number), and rank 1's note of the skip ("note: rank 1: collective OP #SEQ (...) skipped
# (fault injection ...", said when it skips) must name that same op and sequence number; where its
# log dump made it out before the abort, the dump's "skipped" record too. A skip that hit the wrong
# collective, or a diagnostic naming the wrong one, fails.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TRAIN=$(realpath "${1:-$ROOT/train}")
MPIEXEC=${2:-mpirun}
cd "$ROOT"
[ -x "$TRAIN" ] || { echo "hang_train: $TRAIN is not executable"; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=1

EXPECTED_OP=(all_reduce reduce_scatter reduce_scatter all_gather)
TIMEOUT_S=3
OUTER=60
SLACK=10
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

for stage in 0 1 2 3; do
  out="$work/stage$stage.txt"
  start_ns=$(date +%s%N)
  timeout -k 5 $OUTER "$MPIEXEC" --oversubscribe -np 3 "$TRAIN" plans/default.json \
    --set model.n_layer=2 --set model.n_head=5 --set model.n_embd=35 --set model.seq_len=31 \
    --set 'data.train=data/sample/train_*.bin' --set data.val=data/sample/val.bin --set data.tokenizer= \
    --set batch.micro_batch=2 --set run.steps=8 --set run.eval_every=0 --set run.eval_batches=1 \
    --set run.threads=1 --set run.log="$work/run$stage/metrics.jsonl" --set zero.stage=$stage \
    --set comm.timeout_s=$TIMEOUT_S --set comm.fault_skip_rank=1 --set comm.fault_skip_step=2 \
    >"$out" 2>&1
  rc=$?
  elapsed_ms=$(( ($(date +%s%N) - start_ns) / 1000000 ))

  why=()
  [ "$rc" -ne 0 ] || why+=("the job exited 0; a hung collective must end it with an error")
  { [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ]; } || why+=("the job hung until 'timeout $OUTER' killed it (exit $rc)")
  [ "$elapsed_ms" -lt $(( (TIMEOUT_S + SLACK) * 1000 )) ] ||
    why+=("took ${elapsed_ms} ms, expected < $((TIMEOUT_S + SLACK)) s")
  # The diagnostic of a rank that waited: "rank R: collective OP #SEQ (N bytes, step S) did not
  # complete within 3 s ..." (also repeated in its "error: rank R: ..." line), then its collective log.
  op=${EXPECTED_OP[$stage]}
  waits=$(grep -oE "rank [02]: collective [a-z_]+ #[0-9]+ \([0-9]+ bytes, step [0-9]+\) did not complete" "$out" | sort -u)
  if [ -z "$waits" ]; then
    why+=("no line names a waiting rank (0 or 2), the op, its sequence number and 'did not complete'")
  else
    wrong=$(grep -vE "collective $op #[0-9]+ \([0-9]+ bytes, step 2\)" <<<"$waits")
    [ -z "$wrong" ] || why+=("expected ranks 0 and 2 to time out in $op at step 2, got: $(tr '\n' ';' <<<"$wrong")")
    seqs=$(grep -oE "#[0-9]+" <<<"$waits" | sort -u)
    [ "$(wc -l <<<"$seqs")" -eq 1 ] || why+=("ranks 0 and 2 time out in different collectives: $(tr '\n' ' ' <<<"$seqs")")
    seq=$(head -1 <<<"$seqs")
    grep -qE "^ +$seq +$op .* step 2 pending .*TIMED OUT" "$out" ||
      why+=("the log dump shows no timed-out '$seq $op' at step 2")
    grep -qE "^note: rank 1: collective $op $seq \([0-9]+ bytes, step 2\) skipped \(fault injection" "$out" ||
      why+=("rank 1 does not say that it skipped $op $seq at step 2: $(grep -m1 '^note: rank 1:' "$out")")
    skip=$(grep -E "^ +#[0-9]+ +[a-z_]+ .* skipped \(fault injection\)" "$out" | sort -u)
    if [ -n "$skip" ] && ! grep -qE "^ +$seq +$op .* step 2 skipped" <<<"$skip"; then
      why+=("rank 1 skipped '$(head -1 <<<"$skip" | sed 's/^ *//')', not $seq $op at step 2")
    fi
  fi
  grep -q "did not complete within $TIMEOUT_S" "$out" || why+=("no 'did not complete within $TIMEOUT_S' message")
  # One "rank R:" per line: main's "error: rank R:" prefix, none inside the message (issue 23).
  ! grep -qE "rank [0-9]+: rank [0-9]+:" "$out" || why+=("a line repeats its rank prefix: $(grep -m1 -E "rank [0-9]+: rank [0-9]+:" "$out")")
  grep -q "last collectives on this rank:" "$out" || why+=("no log dump header ('last collectives on this rank:')")
  grep -qE "^ +#[0-9]+ +[a-z_]+ .* done" "$out" || why+=("the log dump shows no completed collective")
  if grep -qE "Segmentation fault|signal 11|free\(\)|MPI_ERR_TRUNCATE|double free|corrupted" "$out"; then
    why+=("the job crashed instead of timing out (mismatched collectives after the skip)")
  fi

  if [ ${#why[@]} -eq 0 ]; then
    printf 'hang_train stage %d: ok, exit %d after %d ms, hung in %s %s%s\n' "$stage" "$rc" "$elapsed_ms" "$op" "$seq" \
      "$([ -n "$skip" ] && echo " (rank 1's dump shows it skipped)")"
    grep -m1 "did not complete" "$out" | sed 's/^/    /'
  else
    failures=$((failures + 1))
    printf 'hang_train stage %d: FAILED, exit %d after %d ms\n' "$stage" "$rc" "$elapsed_ms"
    for w in "${why[@]}"; do echo "    - $w"; done
    echo "    --- output (last 40 lines, progress lines dropped) ---"
    grep -v -E 'step +[0-9]+/[0-9]+ \| loss' "$out" | tail -40 | sed 's/^/    | /'
  fi
done

if [ $failures -ne 0 ]; then
  echo "hang_train FAILED ($failures of 4 stages)"
  exit 1
fi
echo "hang_train passed"
