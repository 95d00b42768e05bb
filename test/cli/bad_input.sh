#!/usr/bin/env bash
# Bad input: each case must exit non-zero with exactly one line on stderr naming the problem,
# and write nothing (no log directory, no resolved plan).
set -uo pipefail
TRAIN=${1:?usage: bad_input.sh path/to/train}
TRAIN=$(realpath "$TRAIN")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$ROOT"
fails=0

good_data='"data": {"train": "data/sample/train_*.bin", "val": "data/sample/val.bin", "tokenizer": "data/sample/gpt2_tokenizer.bin"}'

# expect NAME EXPECTED_SUBSTRING PLAN_TEXT [extra args...]
expect() {
  local name=$1 want=$2 text=$3; shift 3
  local dir="$work/$name"; mkdir -p "$dir"
  printf '%s\n' "$text" > "$dir/plan.json"
  local before; before=$(find "$work" | sort)
  "$TRAIN" "$dir/plan.json" --set run.log="$dir/out/metrics.jsonl" "$@" >"$dir/stdout" 2>"$dir/stderr"
  local rc=$?
  local lines; lines=$(wc -l < "$dir/stderr")
  local after; after=$(find "$work" -not -path "$dir/stdout" -not -path "$dir/stderr" | sort)
  if [ $rc -eq 0 ]; then echo "FAIL $name: exit code 0"; fails=$((fails+1)); return; fi
  if [ "$lines" -ne 1 ]; then echo "FAIL $name: $lines lines on stderr:"; cat "$dir/stderr"; fails=$((fails+1)); return; fi
  if ! grep -qF -- "$want" "$dir/stderr"; then echo "FAIL $name: stderr lacks '$want':"; cat "$dir/stderr"; fails=$((fails+1)); return; fi
  if [ "$before" != "$after" ]; then echo "FAIL $name: files were written:"; diff <(echo "$before") <(echo "$after"); fails=$((fails+1)); return; fi
  echo "ok   $name: $(cat "$dir/stderr")"
}

expect unknown_key   'optim.lrr'            "{\"optim\": {\"lrr\": 0.001}, $good_data}"
expect unknown_key_suggestion 'did you mean "optim.lr"' "{\"optim\": {\"lrr\": 0.001}, $good_data}"
expect wrong_type    'batch.micro_batch'    "{\"batch\": {\"micro_batch\": \"8\"}, $good_data}"
expect missing_data  'data/nowhere/train_*.bin' '{"data": {"train": "data/nowhere/train_*.bin"}}'
expect missing_val   'data/sample/nope.bin' "{\"data\": {\"train\": \"data/sample/train_*.bin\", \"val\": \"data/sample/nope.bin\", \"tokenizer\": \"\"}}"
expect negative_lr   'optim.lr'             "{\"optim\": {\"lr\": -0.001}, $good_data}"
expect malformed     'malformed JSON'       "{\"optim\": {\"lr\": 0.001,, $good_data}"
expect bad_override  'zero.stage'           "{$good_data}" --set zero.stage=abc
expect unsupported   'offload.optimizer'    "{$good_data}" --set offload.optimizer=cpu
expect bf16_on_cpu   'needs device "cuda"'  "{$good_data}" --set device=cpu --set precision.compute=bf16
# The CUDA path's limits are refused on any machine, GPU or not, before anything is allocated or written.
if "$TRAIN" --help 2>/dev/null | grep -q 'trains on one GPU'; then  # a build with the CUDA backend
  expect cuda_head_size 'head size n_embd/n_head = 8' "{$good_data}" --set device=cuda --set model.n_head=16
  expect cuda_stage     'zero.stage: 2 on device "cuda"' "{$good_data}" --set device=cuda --set zero.stage=2
  if ! nvidia-smi -L >/dev/null 2>&1; then
    expect cuda_no_gpu  'no CUDA device is visible' "{$good_data}" --set device=cuda
  fi
fi
# A plan file that does not exist at all.
if "$TRAIN" "$work/does_not_exist.json" >/dev/null 2>"$work/err"; then echo "FAIL nonexistent plan: exit 0"; fails=$((fails+1));
elif ! grep -q 'cannot open' "$work/err"; then echo "FAIL nonexistent plan:"; cat "$work/err"; fails=$((fails+1));
else echo "ok   nonexistent plan: $(cat "$work/err")"; fi

[ $fails -eq 0 ] && echo "all bad-input cases rejected cleanly" || { echo "$fails case(s) failed"; exit 1; }
