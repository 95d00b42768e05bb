#!/usr/bin/env bash
# Bad input: each case must exit non-zero with exactly one line on stderr naming the problem,
# and write nothing (no log directory, no resolved plan).
set -uo pipefail
TRAIN=${1:?usage: bad_input.sh path/to/train ON|OFF}
# Whether the build has the CUDA backend, from CMake (ZT_HAVE_CUDA): the CUDA cases below must run
# exactly when it does, so this is checked against the binary instead of guessed from it.
HAVE_CUDA=${2:?usage: bad_input.sh path/to/train ON|OFF (ZT_HAVE_CUDA of the build)}
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
# The communication settings (src/comm/mpi_thread.h): switches 0 or 1, choices by name, nothing else,
# refused before anything runs.
ZT_COMM_COLLECTIVES=1 expect comm_collectives_env 'ZT_COMM_COLLECTIVES=1: expected "ring", "mpi" or "mpi_blocking"' "{$good_data}"
ZT_COMM_THREAD=2 expect comm_thread_switch 'ZT_COMM_THREAD=2: expected 0 (off) or 1 (on)' "{$good_data}"
expect bad_override  'zero.stage'           "{$good_data}" --set zero.stage=abc
expect unsupported   'offload.optimizer'    "{$good_data}" --set offload.optimizer=cpu
# bf16 on a CPU without AVX512-BF16 (oneDNN held below it: ONEDNN_MAX_CPU_ISA, the library's own cap).
ONEDNN_MAX_CPU_ISA=AVX512_CORE expect bf16_on_cpu_without_isa 'precision.compute: "bf16": this CPU has no AVX512-BF16' \
       "{$good_data}" --set device=cpu --set precision.compute=bf16
expect bad_recompute 'recompute.policy: must be "none", "selective" or "block", got "full"' "{$good_data}" \
       --set recompute.policy=full
expect every_without_block 'recompute.every: only applies to recompute.policy "block"' "{$good_data}" \
       --set recompute.policy=selective --set recompute.every=2
expect every_zero    'recompute.every: must be >= 1, got 0' "{$good_data}" --set recompute.policy=block --set recompute.every=0
# ---- startup robustness ----
# Each of these used to be found only after training (or never); now it is refused before anything
# is allocated or written. A small model and two steps, so that code without a check finishes fast.
small=(--set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=32
       --set batch.micro_batch=2 --set run.steps=2 --set optim.warmup_steps=1 --set run.eval_every=0
       --set run.eval_batches=1 --set run.sample_every=0 --set run.threads=1 --set data.tokenizer=)
mk() { /usr/bin/python3 "$ROOT/test/cli/make_inputs.py" "$@"; }
inp="$work/inputs"; mkdir -p "$inp"
# A character device like /dev/null (never /dev/null itself: a regression would replace it); a FIFO
# where mknod is not allowed. Either must still be there, untouched, afterwards.
mknod "$inp/chardev" c 1 3 2>/dev/null || mkfifo "$inp/chardev"
expect final_weights_device 'run.final_weights: '"$inp/chardev"' is not a regular file' "{$good_data}" "${small[@]}" \
  --set run.final_weights="$inp/chardev"
if [ -c "$inp/chardev" ] || [ -p "$inp/chardev" ]; then echo "ok   final_weights_device: the device is still a device"
else echo "FAIL final_weights_device: $inp/chardev was replaced"; fails=$((fails+1)); fi
expect final_weights_dir     'run.final_weights: '"$inp"' is a directory' "{$good_data}" "${small[@]}" --set run.final_weights="$inp"
expect final_weights_nowhere 'run.final_weights: cannot create files in /proc' "{$good_data}" "${small[@]}" \
  --set run.final_weights=/proc/zt_nowhere/final.bin
expect log_nowhere           'run.log: cannot create files in /proc' "{$good_data}" "${small[@]}" \
  --set run.log=/proc/zt_nowhere/metrics.jsonl
expect log_is_dir            'run.log: '"$inp"' is a directory' "{$good_data}" "${small[@]}" --set run.log="$inp"
expect init_dir              'model.init: "'"$inp"'" is a directory' "{$good_data}" "${small[@]}" --set model.init="$inp"
mk checkpoint "$inp/nan.bin" 1 2 32 32 1
expect init_nan              'model.init: '"$inp/nan.bin"' holds NaN/Inf weights (tensor h.0.attn.c_attn.weight' \
  "{$good_data}" "${small[@]}" --set model.init="$inp/nan.bin"
mk shard "$inp/val_1seq.bin" 40        # 1 sequence of 33 tokens; an evaluation batch needs 2
expect val_too_small         'data.val: '"$inp/val_1seq.bin"' holds 1 sequence(s) of 33 tokens' "{$good_data}" "${small[@]}" \
  --set data.val="$inp/val_1seq.bin"
mk shard "$inp/train_3seq.bin" 97      # 3 sequences; a step needs micro_batch 2 x grad_accum 2 = 4
expect train_too_small       'data.train: '"$inp/train_3seq.bin"' holds 3 sequence(s) of 33 tokens, fewer than one optimizer step uses (4' \
  "{$good_data}" "${small[@]}" --set data.train="$inp/train_3seq.bin" --set batch.grad_accum=2
mk shard "$inp/train_bad_token.bin" 20000 17777 60000
expect token_train           'data.train: '"$inp/train_bad_token.bin"' holds token id 60000 at token 17777' "{$good_data}" \
  "${small[@]}" --set data.train="$inp/train_bad_token.bin"
mk shard "$inp/val_bad_token.bin" 2000 5 50257
expect token_val             'data.val: '"$inp/val_bad_token.bin"' holds token id 50257 at token 5' "{$good_data}" "${small[@]}" \
  --set data.val="$inp/val_bad_token.bin"
# offload.nvme_dir (docs/design.md §3.6): a directory that cannot take the swap files is refused
# before anything is allocated or written. Root passes permission bits, so "unwritable" is /proc.
nvme=("${small[@]}" --set zero.stage=1 --set offload.optimizer=nvme)
: > "$inp/plain_file"
expect nvme_not_a_dir        'offload.nvme_dir: "'"$inp/plain_file"'" is not a directory' "{$good_data}" "${nvme[@]}" \
  --set offload.nvme_dir="$inp/plain_file"
expect nvme_parent_not_dir   'offload.nvme_dir: "'"$inp/plain_file/swap"'" cannot be created: "'"$inp/plain_file"'" is not a directory' \
  "{$good_data}" "${nvme[@]}" --set offload.nvme_dir="$inp/plain_file/swap"
expect nvme_unwritable       'offload.nvme_dir: "/proc" is not writable: cannot create a file in "/proc"' "{$good_data}" \
  "${nvme[@]}" --set offload.nvme_dir=/proc
expect nvme_not_creatable    'offload.nvme_dir: "/proc/zt_swap/a" is not writable (nor creatable): cannot create a file in "/proc"' \
  "{$good_data}" "${nvme[@]}" --set offload.nvme_dir=/proc/zt_swap/a
ZT_NVME_FREE_BYTES=65536 expect nvme_too_small 'offload.nvme_dir: the swap files need 12.39 MiB (12.39 MiB per rank in 2 files x 1 rank(s) on this host, as ./train estimate reports) but "'"$inp"'" has 64.00 KiB free (ZT_NVME_FREE_BYTES)' \
  "{$good_data}" "${nvme[@]}" --set offload.nvme_dir="$inp/swap"
# offload.params (stage 3): refused below stage 3 and as "cpu" on the CPU backend; with both offloaded
# the free-space check counts all four files (parameter and gradient shards, m, v: twice the 2 files
# of the stage-1 case above, the same Ψ).
expect params_stage2         'offload.params: "nvme" requires zero.stage 3 (only sharded parameters can be offloaded), got zero.stage 2' \
  "{$good_data}" "${small[@]}" --set zero.stage=2 --set offload.params=nvme
expect params_cpu            'offload.params: "cpu" changes nothing on the CPU backend' "{$good_data}" "${small[@]}" \
  --set device=cpu --set zero.stage=3 --set offload.params=cpu
pnvme=("${small[@]}" --set zero.stage=3 --set offload.optimizer=nvme --set offload.params=nvme)
expect params_nvme_unwritable 'offload.nvme_dir: "/proc" is not writable: cannot create a file in "/proc"' "{$good_data}" \
  "${pnvme[@]}" --set offload.nvme_dir=/proc
expect params_nvme_missing_parent 'offload.nvme_dir: "'"$inp/plain_file/swap"'" cannot be created: "'"$inp/plain_file"'" is not a directory' \
  "{$good_data}" "${pnvme[@]}" --set offload.nvme_dir="$inp/plain_file/swap"
ZT_NVME_FREE_BYTES=20000000 expect params_nvme_too_small 'offload.nvme_dir: the swap files need 24.78 MiB (24.78 MiB per rank in 4 files x 1 rank(s) on this host, as ./train estimate reports) but "'"$inp"'" has 19.07 MiB free (ZT_NVME_FREE_BYTES)' \
  "{$good_data}" "${pnvme[@]}" --set offload.nvme_dir="$inp/swap"
# A path that cannot be looked up at all (a symlink loop) is refused naming the key and the cause,
# not later by mkdir.
ln -s loop_b "$inp/loop_a"; ln -s loop_a "$inp/loop_b"
expect nvme_symlink_loop     'offload.nvme_dir: "'"$inp/loop_a/swap"'" cannot be used: Too many levels of symbolic links' \
  "{$good_data}" "${nvme[@]}" --set offload.nvme_dir="$inp/loop_a/swap"
mk junk "$inp/junk.bin" 4096
expect val_not_a_shard       'data.val: data file '"$inp/junk.bin"': bad magic' "{$good_data}" "${small[@]}" \
  --set data.val="$inp/junk.bin"
ZT_MEM_AVAILABLE_BYTES=1000000 \
expect memory_small_machine  'next step: halve batch.micro_batch (2 -> 1)' "{$good_data}" "${small[@]}"
ZT_MEM_AVAILABLE_BYTES=1000000 \
expect memory_names_numbers  'but 976.56 KiB is available (ZT_MEM_AVAILABLE_BYTES)' "{$good_data}" "${small[@]}"
# Beyond any one machine's memory (80.5G parameters, 1.3 TB of model state): refused against what
# the machine has. Where that much is available, this would train, so it is skipped there.
if [ "$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)" -lt 1200000000 ]; then
  expect memory_real         'is available (' "{$good_data}" "${small[@]}" \
    --set model.n_layer=400 --set model.n_embd=4096 --set model.n_head=32
else echo "SKIP memory_real: this machine has more than 1.2 TB available"; fi
# An allocation that fails although the up-front check was told it fits (the check is bypassed by
# claiming 1 EB available): still one line, naming the buffer, with the next rung of the ladder.
ZT_MEM_AVAILABLE_BYTES=1000000000000000000 \
expect allocation_fails      'out of host memory allocating' "{$good_data}" "${small[@]}" \
  --set model.n_layer=400 --set model.n_embd=4096 --set model.n_head=32
ZT_PROGRESS=fancy \
expect progress_mode         'ZT_PROGRESS: "fancy"' "{$good_data}" "${small[@]}"
# The CUDA path's limits are refused on any machine, GPU or not, before anything is allocated or written.
version=$("$TRAIN" --version 2>&1) || { echo "FAIL cuda_cases: $TRAIN --version failed: $version"; exit 1; }
case "$version" in
  *"CUDA backend: built"*) built=ON ;;
  *"CUDA backend: not built"*) built=OFF ;;
  *) echo "FAIL cuda_cases: $TRAIN --version does not say whether the CUDA backend is built: $version"; exit 1 ;;
esac
case "$HAVE_CUDA" in ON|on|TRUE|true|1) want_cuda=ON ;; *) want_cuda=OFF ;; esac
if [ "$built" != "$want_cuda" ]; then
  echo "FAIL cuda_cases: CMake says ZT_HAVE_CUDA=$HAVE_CUDA but the binary says: $version"; exit 1
fi
echo "ok   cuda_cases: ZT_HAVE_CUDA=$HAVE_CUDA agrees with: $version"
if [ "$built" = ON ]; then
  expect cuda_head_size 'head size n_embd/n_head = 8' "{$good_data}" --set device=cuda --set model.n_head=16
  # every zero.stage runs on the CUDA backend now (host-staged collectives); offload "cpu" still needs a shard
  expect cuda_offload_stage0 'offload.optimizer: "cpu" requires zero.stage 1, 2 or 3' "{$good_data}" --set device=cuda \
    --set offload.optimizer=cpu --set zero.stage=0
  if ! nvidia-smi -L >/dev/null 2>&1; then
    expect cuda_no_gpu  'no CUDA device is visible' "{$good_data}" --set device=cuda
  fi
fi
# ---- plan robustness ----
# Cases that could train if a check regressed run a tiny model for one step.
small_plan="--set model.n_layer=1 --set model.n_embd=32 --set model.seq_len=32 --set batch.micro_batch=2 --set run.steps=1
       --set optim.warmup_steps=0 --set run.eval_every=0 --set run.eval_batches=1 --set run.sample_every=0"
repeat() { awk -v s="$1" -v n="$2" 'BEGIN { for (i = 0; i < n; i++) printf "%s", s }'; }
expect deep_arrays   'JSON nested deeper than 64 levels' "{\"optim\": {\"betas\": $(repeat '[' 100000)$(repeat ']' 100000)}, $good_data}"
expect deep_objects  'JSON nested deeper than 64 levels' "{\"model\": {\"init\": $(repeat '{"a": ' 100000)1$(repeat '}' 100000)}, $good_data}"
expect deep_override 'value nested deeper than 64 levels' "{$good_data}" --set "optim.betas=$(repeat '[' 50000)$(repeat ']' 50000)"
expect long_value    'got "xxxxxxxx' "{$good_data}" --set "device=$(repeat x 100000)"
if [ "$(wc -c < "$work/long_value/stderr")" -gt 300 ]; then echo "FAIL long_value: $(wc -c < "$work/long_value/stderr") bytes on stderr"; fails=$((fails+1)); fi
# A number past a double: nlohmann's raw exception named no file or key.
expect number_overflow 'plan.json: "optim.lr": 1e400 is out of the range of a number' "{\"optim\": {\"lr\": 1e400}, $good_data}"
expect number_overflow_nested '"optim.betas[1]": -1e999 is out of the range' "{\"optim\": {\"betas\": [0.9, -1e999]}, $good_data}"
expect number_overflow_set '--set optim.lr=1e400: 1e400 is out of the range of a number' "{$good_data}" --set optim.lr=1e400
# A key with an invisible character: it read 'unknown key "optim.lr"', the very key it was mistaken for.
zwsp=$(printf '\xe2\x80\x8b')
expect invisible_key 'unknown key "optim.lr\u200b" (did you mean "optim.lr"? the key holds characters that cannot be seen)' "{\"optim\": {\"lr$zwsp\": 0.001}, $good_data}"
expect invisible_key_set 'unknown key "optim.lr\u200b" (did you mean "optim.lr"?' "{$good_data}" --set "optim.lr$zwsp=0.001"
# A 1 MB "extends" value: the error line quoted it whole (a 50 MB one made a 52 MB line).
expect long_extends 'File name too long' "{\"extends\": \"$(repeat x 1000000)\", $good_data}"
if [ "$(wc -c < "$work/long_extends/stderr")" -gt 1000 ]; then echo "FAIL long_extends: $(wc -c < "$work/long_extends/stderr") bytes on stderr"; fails=$((fails+1)); fi
# Any error line is cut to about 2 KiB (train.cu, error_line): a 1 MB run.final_weights quoted whole by the
# output-path check, its head and tail kept.
expect long_output_path 'bytes not shown ...]' "{\"run\": {\"final_weights\": \"$(repeat x 1000000)\"}, $good_data}" $small_plan
if [ "$(wc -c < "$work/long_output_path/stderr")" -gt 2200 ]; then echo "FAIL long_output_path: $(wc -c < "$work/long_output_path/stderr") bytes on stderr"; fails=$((fails+1)); fi
expect duplicate_key 'duplicate key "optim.lr"' "{\"optim\": {\"lr\": 0.1, \"lr\": 0.2}, $good_data}" $small_plan
expect master_weights_false 'precision.master_weights: false is not supported' "{$good_data}" --set precision.master_weights=false $small_plan
expect threads_above_cores 'cores this process may use' "{$good_data}" --set run.threads=100000 $small_plan
# Slurm's grant is held to the same rule (it ran 100000 threads where run.threads=100000 is refused).
SLURM_CPUS_PER_TASK=100000 expect slurm_cpus_above_cores 'SLURM_CPUS_PER_TASK=100000 is more than 4 x the' "{$good_data}" \
       --set run.threads=0 $small_plan
expect tokens_past_int32 'micro_batch x model.seq_len = 65536000000' "{$good_data}" --set model.seq_len=65536 --set batch.micro_batch=1000000
expect n_embd_past_int32 'model.n_embd: must be <= 536870911' "{$good_data}" --set model.n_embd=2147483646 --set model.n_head=2
if ! nvidia-smi -L >/dev/null 2>&1; then  # without a GPU nor a bf16 CPU, bf16 cannot run: refused, never silently fp32
  ONEDNN_MAX_CPU_ISA=AVX512_CORE expect bf16_auto_no_gpu 'precision.compute: "bf16": device "auto" found no GPU, and' \
       "{$good_data}" --set precision.compute=bf16 $small_plan
fi
# A legal plan with warmup longer than the run: trains, with one warning line; the written plan
# records the device and precision that ran, not "auto".
dir="$work/warmup_warning"; mkdir -p "$dir"; printf '%s\n' "{$good_data}" > "$dir/plan.json"
if ! "$TRAIN" "$dir/plan.json" $small_plan --set optim.warmup_steps=5 --set run.log="$dir/out/m.jsonl" >"$dir/stdout" 2>"$dir/stderr"; then
  echo "FAIL warmup_warning: exit non-zero:"; cat "$dir/stderr"; fails=$((fails+1))
elif [ "$(wc -l < "$dir/stderr")" -ne 1 ] || ! grep -qF 'warning: plan: optim.warmup_steps (5) is larger than run.steps (1)' "$dir/stderr"; then
  echo "FAIL warmup_warning: expected one warning line, got:"; cat "$dir/stderr"; fails=$((fails+1))
elif ! nvidia-smi -L >/dev/null 2>&1 && ! grep -q '"device": "cpu"' "$dir/out/plan.json"; then
  echo "FAIL resolved_plan: plan.json does not record device \"cpu\":"; grep -A2 -E 'device|precision' "$dir/out/plan.json"; fails=$((fails+1))
elif ! nvidia-smi -L >/dev/null 2>&1 && ! grep -q '"compute": "fp32"' "$dir/out/plan.json"; then
  echo "FAIL resolved_plan: plan.json does not record precision.compute \"fp32\""; fails=$((fails+1))
else echo "ok   warmup_warning + resolved_plan: $(cat "$dir/stderr")"; fi
# estimate: non-zero exit, one line on stderr, nothing on stdout (no wrapped or 309-digit numbers).
expect_estimate() {
  local name=$1 want=$2; shift 2
  local dir="$work/$name"; mkdir -p "$dir"
  "$TRAIN" estimate "$@" >"$dir/stdout" 2>"$dir/stderr"
  local rc=$? lines; lines=$(wc -l < "$dir/stderr")
  if [ $rc -eq 0 ]; then echo "FAIL $name: exit code 0"; fails=$((fails+1)); return; fi
  if [ "$lines" -ne 1 ]; then echo "FAIL $name: $lines lines on stderr:"; cat "$dir/stderr"; fails=$((fails+1)); return; fi
  if ! grep -qF -- "$want" "$dir/stderr"; then echo "FAIL $name: stderr lacks '$want':"; cat "$dir/stderr"; fails=$((fails+1)); return; fi
  if [ -s "$dir/stdout" ]; then echo "FAIL $name: printed on stdout:"; head -5 "$dir/stdout"; fails=$((fails+1)); return; fi
  echo "ok   $name: $(cat "$dir/stderr")"
}
expect_estimate world_0     '--world must be an integer between 1 and 65536, got "0"' plans/base.json --world 0
expect_estimate world_65537 'between 1 and 65536, got "65537"' plans/base.json --world 65537
expect_estimate world_huge  'between 1 and 65536, got "3000000000"' plans/base.json --world 3000000000
expect_estimate estimate_tokens_past_int32 'micro_batch x model.seq_len = 65536000000' plans/base.json \
  --set model.n_layer=1000 --set model.n_embd=16384 --set model.seq_len=65536 --set batch.micro_batch=1000000
expect_estimate estimate_n_embd_past_int32 'model.n_embd: must be <= 536870911' plans/base.json \
  --set model.n_embd=2147483646 --set model.n_head=2
expect_estimate estimate_activations_past_64_bits 'does not fit in 64 bits' plans/base.json \
  --set model.n_layer=65536 --set model.n_embd=16384 --set model.seq_len=65536 --set batch.micro_batch=32767
expect_estimate estimate_params_past_64_bits 'does not fit in 64 bits' plans/base.json \
  --set model.n_layer=65536 --set model.n_embd=536870908
# A plan file that does not exist at all.
if "$TRAIN" "$work/does_not_exist.json" >/dev/null 2>"$work/err"; then echo "FAIL nonexistent plan: exit 0"; fails=$((fails+1));
elif ! grep -q 'cannot open' "$work/err"; then echo "FAIL nonexistent plan:"; cat "$work/err"; fails=$((fails+1));
else echo "ok   nonexistent plan: $(cat "$work/err")"; fi

# ---- issue 23: recompute.every past int, communication settings, JSON null, the command line ----
expect every_int64_max 'recompute.every: must be <= 2147483647, got 9223372036854775807' "{$good_data}" \
  --set recompute.policy=block --set recompute.every=9223372036854775807
# comm.* are plan keys (plans/base.json); ZT_COMM_* override them, strictly parsed (abc once meant "no limit").
ZT_COMM_INFLIGHT=abc expect comm_inflight_abc 'ZT_COMM_INFLIGHT=abc: expected an integer from 0 (no limit) to 1024' "{$good_data}"
ZT_COMM_INFLIGHT=-1 expect comm_inflight_negative 'ZT_COMM_INFLIGHT=-1: expected an integer' "{$good_data}"
ZT_COMM_INFLIGHT=99999999999 expect comm_inflight_huge 'ZT_COMM_INFLIGHT=99999999999: expected an integer' "{$good_data}"
ZT_COMM_POLL_US=abc expect comm_poll_abc 'ZT_COMM_POLL_US=abc: expected an integer from 0 (yield between polls) to 100000' "{$good_data}"
ZT_COMM_POLL_US=-1 expect comm_poll_negative 'ZT_COMM_POLL_US=-1: expected an integer' "{$good_data}"
expect comm_inflight_plan 'plan: comm.inflight: must be >= 0, got -1' "{$good_data}" --set comm.inflight=-1
expect comm_poll_plan     'plan: comm.poll_us: must be <= 100000, got 99999999999' "{$good_data}" --set comm.poll_us=99999999999
expect comm_collectives_plan 'plan: comm.collectives: must be "ring", "mpi" or "mpi_blocking", got "tuned"' "{\"comm\": {\"collectives\": \"tuned\"}, $good_data}"
expect comm_collectives_type 'plan: comm.collectives: expected a string, got boolean true' "{\"comm\": {\"collectives\": true}, $good_data}"
expect comm_ring_gone 'unknown key "comm.ring"' "{\"comm\": {\"ring\": false}, $good_data}"
# null unsets a key that is off by default (""); elsewhere it is refused naming the key.
expect null_run_log 'run.log=null: null (unset) is accepted only by keys that are off by default' "{$good_data}" --set run.log=null
expect null_in_file 'plan: zero.stage: null (unset) is accepted only by keys that are off by default' \
  "{\"zero\": {\"stage\": null}, $good_data}"
# The command line: every parse error one line on stderr, exit 1, nothing on stdout.
expect_cli() {
  local name=$1 want=$2; shift 2
  local dir="$work/$name"; mkdir -p "$dir"
  "$TRAIN" "$@" >"$dir/stdout" 2>"$dir/stderr"
  local rc=$? lines; lines=$(wc -l < "$dir/stderr")
  if [ $rc -ne 1 ]; then echo "FAIL $name: exit code $rc, not 1"; cat "$dir/stderr"; fails=$((fails+1)); return; fi
  if [ "$lines" -ne 1 ]; then echo "FAIL $name: $lines lines on stderr:"; cat "$dir/stderr"; fails=$((fails+1)); return; fi
  if ! grep -qF -- "$want" "$dir/stderr"; then echo "FAIL $name: stderr lacks '$want':"; cat "$dir/stderr"; fails=$((fails+1)); return; fi
  if [ -s "$dir/stdout" ]; then echo "FAIL $name: printed on stdout:"; head -5 "$dir/stdout"; fails=$((fails+1)); return; fi
  echo "ok   $name: $(cat "$dir/stderr")"
}
expect_cli cli_plan_before_estimate 'the plan goes after "estimate"' plans/base.json estimate
expect_cli cli_plan_before_estimate2 'the plan goes after "estimate"' plans/base.json estimate plans/base.json
expect_cli cli_plan_before_export 'export takes no plan or --set' plans/base.json export "$work/ck" --format llmc --out "$work/x.bin"
expect_cli cli_set_with_export 'export takes no plan or --set' --set zero.stage=1 export "$work/ck" --format llmc --out "$work/x.bin"
expect_cli cli_unknown_option 'command line: ' --bogus
expect_cli cli_estimate_no_plan 'no plan given' estimate
expect_cli cli_export_no_format '--format is required' export "$work/ck" --out "$work/x.bin"
expect_cli cli_two_plans 'command line: ' plans/base.json plans/base.json
expect_cli cli_set_no_value 'command line: ' plans/base.json --set
[ -e "$work/x.bin" ] && { echo "FAIL cli: export wrote $work/x.bin"; fails=$((fails+1)); }
for flag in --help --version; do
  if ! "$TRAIN" $flag >"$work/out" 2>"$work/err" || [ -s "$work/err" ]; then echo "FAIL cli $flag: non-zero or stderr"; fails=$((fails+1))
  else echo "ok   cli $flag: exit 0"; fi
done
# The usage line shows the real forms (it once suggested ./train PLAN estimate).
if "$TRAIN" --help | grep -qF 'Usage: ./train PLAN.json' && "$TRAIN" --help | grep -qF './train estimate PLAN.json' \
   && ! "$TRAIN" --help | grep -qF '[plan] [SUBCOMMAND]'; then echo "ok   cli usage line"
else echo "FAIL cli usage line:"; "$TRAIN" --help | head -4; fails=$((fails+1)); fi

[ $fails -eq 0 ] && echo "all bad-input cases rejected cleanly" || { echo "$fails case(s) failed"; exit 1; }
