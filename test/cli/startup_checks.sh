#!/usr/bin/env bash
# Start-up checks that need state before and after a run, several ranks, or a terminal:
#   - a run with the same run.log as an earlier one: a refused run leaves the earlier files as they
#     were; a run that starts moves them aside (metrics.jsonl -> metrics.jsonl.1, plan.json -> .1)
#   - run.final_weights in a directory that does not exist yet (created; no .tmp left), on a disk
#     too small for it (refused before training; needs root to mount a small tmpfs, else skipped loudly)
#   - under mpirun -np 3: train data smaller than one global batch, val data smaller than one
#     evaluation batch across the ranks, memory counted for every rank on the host
#   - progress decorations (\r, erase-line, ETA) only when the user's stdout is a terminal
set -uo pipefail
TRAIN=${1:?usage: startup_checks.sh path/to/train path/to/mpirun}
MPIRUN=${2:?usage: startup_checks.sh path/to/train path/to/mpirun}
TRAIN=$(realpath "$TRAIN")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
cleanup() { mountpoint -q "$work/tiny" 2>/dev/null && umount "$work/tiny"; rm -rf "$work"; }
trap cleanup EXIT
cd "$ROOT"
fails=0
fail() { echo "FAIL $*"; fails=$((fails+1)); }
ok() { echo "ok   $*"; }
mk() { /usr/bin/python3 "$ROOT/test/cli/make_inputs.py" "$@"; }
export ZT_PROGRESS=auto  # the tests below decide decorations from the terminal, whatever the caller set
unset ZT_MEM_AVAILABLE_BYTES

small=(--set data.train=data/sample/train_000.bin --set data.val=data/sample/val.bin --set data.tokenizer=
       --set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=32
       --set batch.micro_batch=2 --set run.steps=2 --set optim.warmup_steps=1 --set run.eval_every=0 --set run.eval_batches=1
       --set run.sample_every=0 --set run.threads=1)
mpi() { "$MPIRUN" --oversubscribe -np "$1" "${@:2}"; }

# ---- an earlier run's files survive a refused run, and are moved aside by a run that starts -----
run="$work/run"
"$TRAIN" plans/default.json "${small[@]}" --set run.log="$run/metrics.jsonl" >"$work/first.out" 2>&1 \
  || { fail "previous_run: first run failed:"; cat "$work/first.out"; }
cp "$run/metrics.jsonl" "$work/metrics.orig"; cp "$run/plan.json" "$work/plan.orig"
mk junk "$work/junk.bin" 4096
if "$TRAIN" plans/default.json "${small[@]}" --set run.log="$run/metrics.jsonl" --set data.val="$work/junk.bin" \
     >"$work/refused.out" 2>&1; then fail "previous_run: a run on a junk val file exited 0"
elif ! cmp -s "$run/metrics.jsonl" "$work/metrics.orig" || ! cmp -s "$run/plan.json" "$work/plan.orig"; then
  fail "previous_run: a refused run changed the earlier run's metrics.jsonl or plan.json"
elif [ "$(ls "$run")" != "$(printf 'metrics.jsonl\nplan.json')" ]; then
  fail "previous_run: a refused run left files: $(ls "$run" | tr '\n' ' ')"
else ok "previous_run: a refused run leaves the earlier run's files as they were"; fi
"$TRAIN" plans/default.json "${small[@]}" --set run.log="$run/metrics.jsonl" --set run.steps=3 >"$work/second.out" 2>&1 \
  || { fail "previous_run: second run failed:"; cat "$work/second.out"; }
said=$(grep -c 'metrics.jsonl.1' "$work/second.out")
if ! cmp -s "$run/metrics.jsonl.1" "$work/metrics.orig" || ! cmp -s "$run/plan.json.1" "$work/plan.orig"; then
  fail "previous_run: the earlier metrics.jsonl / plan.json are not at metrics.jsonl.1 / plan.json.1: $(ls "$run" | tr '\n' ' ')"
elif [ "$said" -ne 1 ]; then fail "previous_run: the move was not said in one line:"; cat "$work/second.out"
elif [ "$(grep -c '"loss"' "$run/metrics.jsonl")" -ne 3 ]; then fail "previous_run: the new metrics.jsonl lacks its 3 steps"
else ok "previous_run: $(grep 'metrics.jsonl.1' "$work/second.out")"; fi
"$TRAIN" plans/default.json "${small[@]}" --set run.log="$run/metrics.jsonl" >/dev/null 2>&1
if [ -f "$run/metrics.jsonl.2" ] && cmp -s "$run/metrics.jsonl.1" "$work/metrics.orig"; then
  ok "previous_run: a third run moves the second aside to .2, .1 untouched"
else fail "previous_run: after a third run: $(ls "$run" | tr '\n' ' ')"; fi

# ---- run.final_weights in a directory that does not exist yet ---------------------------------
fw="$work/new/sub/final.bin"
if ! "$TRAIN" plans/default.json "${small[@]}" --set run.log="$work/fw/metrics.jsonl" --set run.final_weights="$fw" \
     >"$work/fw.out" 2>&1; then fail "final_weights_new_dir: run failed:"; cat "$work/fw.out"
else
  # 1024-byte header + the fp32 parameters: wte (50304 x 32) + wpe (32 x 32) + one block + ln_f.
  want=$((1024 + 4 * (50304 * 32 + 32 * 32 + 12 * 32 * 32 + 13 * 32 + 2 * 32)))
  got=$(stat -c %s "$fw" 2>/dev/null || echo missing)
  left=$(find "$work/new" -name '*.tmp*' -o -name '.zt_probe*' | wc -l)
  if [ "$got" != "$want" ]; then fail "final_weights_new_dir: $fw has $got bytes, expected $want"
  elif [ "$left" -ne 0 ]; then fail "final_weights_new_dir: temporary files left: $(find "$work/new")"
  else ok "final_weights_new_dir: $got bytes written to a new directory, nothing else left"; fi
fi

# ---- run.final_weights on a disk too small for it ---------------------------------------------
mkdir -p "$work/tiny"
if mount -t tmpfs -o size=1m tmpfs "$work/tiny" 2>/dev/null; then
  if "$TRAIN" plans/default.json "${small[@]}" --set run.log="$work/tiny_run/metrics.jsonl" \
       --set run.final_weights="$work/tiny/final.bin" >"$work/tiny.out" 2>"$work/tiny.err"; then
    fail "final_weights_disk_full: exit 0"
  elif ! grep -q 'run.final_weights: .* needs 6.19 MiB but .* has only' "$work/tiny.err" || [ "$(wc -l <"$work/tiny.err")" -ne 1 ]; then
    fail "final_weights_disk_full: stderr:"; cat "$work/tiny.err"
  elif [ -n "$(ls -A "$work/tiny")" ] || [ -e "$work/tiny_run" ] || grep -q '^step' "$work/tiny.out"; then
    fail "final_weights_disk_full: trained or wrote files: $(ls -A "$work/tiny") $(ls "$work" | tr '\n' ' ')"
  else ok "final_weights_disk_full: $(cat "$work/tiny.err")"; fi
  umount "$work/tiny"
else
  echo "SKIP final_weights_disk_full: cannot mount a 1 MiB tmpfs here (needs root); the check is not exercised"
fi

# ---- several ranks: data per global batch, memory per host --------------------------------------
# expect_mpi NAME NP WANT ARGS...: refused (exit != 0), WANT on stderr, nothing written.
expect_mpi() {
  local name=$1 np=$2 want=$3; shift 3
  local dir="$work/$name"
  mpi "$np" "$TRAIN" plans/default.json "${small[@]}" --set run.log="$dir/metrics.jsonl" "$@" >"$work/$name.out" 2>"$work/$name.err"
  local rc=$?
  if [ $rc -eq 0 ]; then fail "$name: exit 0"
  elif ! grep -qF -- "$want" "$work/$name.err"; then fail "$name: stderr lacks '$want':"; cat "$work/$name.err"
  elif [ -e "$dir" ]; then fail "$name: files were written: $(find "$dir")"
  elif grep -q '^step' "$work/$name.out"; then fail "$name: it trained"
  else ok "$name: $(grep -F -- "$want" "$work/$name.err" | head -1)"; fi
}
mk shard "$work/train_5seq.bin" 161   # 5 sequences of 33 tokens; a global step at np 3 needs 6
expect_mpi train_smaller_than_global_batch 3 \
  "data.train: $work/train_5seq.bin holds 5 sequence(s) of 33 tokens, fewer than one optimizer step uses (6 = micro_batch 2 x grad_accum 1 x 3 ranks)" \
  --set data.train="$work/train_5seq.bin"
mk shard "$work/val_4seq.bin" 129     # 4 sequences: enough for one rank's batch of 2, not for 3 ranks
expect_mpi val_smaller_than_eval_batch 3 \
  "data.val: $work/val_4seq.bin holds 4 sequence(s) of 33 tokens, fewer than one evaluation batch (6 = micro_batch 2 x 3 ranks)" \
  --set data.val="$work/val_4seq.bin"
per_rank=$("$TRAIN" estimate plans/default.json --world 3 --json "${small[@]}" |
           /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["memory"]["host"]["total"])')
# Room for two ranks' estimate but not three: only counting every rank on the host refuses it.
ZT_MEM_AVAILABLE_BYTES=$((per_rank * 2)) expect_mpi memory_counts_every_rank 3 "x 3 rank(s)"
if ZT_MEM_AVAILABLE_BYTES=$((per_rank * 2)) "$TRAIN" plans/default.json "${small[@]}" \
     --set run.log="$work/mem1/metrics.jsonl" >"$work/mem1.out" 2>&1; then
  ok "memory_counts_every_rank: the same memory is enough for one rank"
else fail "memory_counts_every_rank: one rank refused too:"; cat "$work/mem1.out"; fi

# ---- progress decorations: only for a person at a terminal --------------------------------------
decorated() { grep -q $'[\r\033]' "$1"; }
erases() { grep -q $'\033\\[K' "$1"; }  # through script(1) the pty itself turns \n into \r\n
prog=("${small[@]}" --set run.steps=4 --set run.log_every=2)
"$TRAIN" plans/default.json "${prog[@]}" --set run.log="$work/p1/metrics.jsonl" >"$work/p1.out" 2>&1
decorated "$work/p1.out" && fail "progress_file: decorations in a redirected single-process run" \
  || ok "progress_file: none in a redirected single-process run"
mpi 2 "$TRAIN" plans/default.json "${prog[@]}" --set run.log="$work/p2/metrics.jsonl" >"$work/p2.out" 2>&1
if ! grep -q '^step' "$work/p2.out"; then fail "progress_mpirun: the run failed:"; cat "$work/p2.out"
elif decorated "$work/p2.out"; then fail "progress_mpirun: decorations in mpirun's redirected output:"; grep -c $'\r' "$work/p2.out"
else ok "progress_mpirun: none in mpirun's redirected output (the ranks' stdout is a pty there)"; fi
cmd="$TRAIN plans/default.json ${prog[*]} --set run.log=$work/p3/metrics.jsonl"
script -qec "$cmd" /dev/null >"$work/p3.out" 2>&1
erases "$work/p3.out" && grep -q 'eta' "$work/p3.out" && ok "progress_terminal: decorations and ETA on a terminal" \
  || { fail "progress_terminal: no decorations on a terminal:"; cat -A "$work/p3.out" | head; }
ZT_PROGRESS=plain script -qec "$cmd" /dev/null >"$work/p4.out" 2>&1
erases "$work/p4.out" && fail "progress_plain: ZT_PROGRESS=plain still decorates" || ok "progress_plain: ZT_PROGRESS=plain on a terminal"
ZT_PROGRESS=tty "$TRAIN" plans/default.json "${prog[@]}" --set run.log="$work/p5/metrics.jsonl" >"$work/p5.out" 2>&1
decorated "$work/p5.out" && ok "progress_forced: ZT_PROGRESS=tty decorates a file" || fail "progress_forced: ZT_PROGRESS=tty did not decorate"

[ $fails -eq 0 ] && echo "all start-up checks passed" || { echo "$fails check(s) failed"; exit 1; }
