#!/usr/bin/env bash
# Every file the program writes goes through one output-path check (src/runtime/output_path.h, and
# scripts/zt_paths.py for the scripts): a refused output exits 1 with one line on stderr, and
# nothing that is not the command's own output changes (device nodes stay devices, links stay
# links, the checkpoint and the other inputs byte-identical: a sha256 listing before and after).
#   - train export --out: a device, symlinks, the checkpoint's own rank / master file, a directory,
#     a new file inside the checkpoint; an unrelated OUT.tmp beside the output survives
#   - train: run.final_weights onto model.init, a data shard, run.log or a checkpoint file;
#     run.trace onto a device; a symlinked run.final_weights is written through, the link kept
#   - run.trace: a rerun moves the earlier run's traces aside with its log (a stale rank-1 trace
#     of a 2-rank run included); on a full disk the summary is still logged and the loss said
#   - train: a parent plan.json (of the extends chain) beside run.log, run.final_weights=dir/
#   - inputs checked by kind before they are opened: a FIFO as data.train / data.val / tokenizer /
#     model.init / the plan, a device as model.init, a dangling link as data.val (under a timeout)
#   - train plan: --out / its report / --calibration onto a data shard, data.val, model.init, the
#     plan or a plan it extends, each other, or dir/: refused before anything is measured; on a
#     full disk neither the plan nor its report is replaced, and the message says why
#   - scripts/trace_merge and scripts/compare: the same rules, one line "error: ...", exit 1;
#     compare refuses --set run.log / run.steps, a run folder that holds a plan it compares, and
#     keeps the results of the plans that finished
set -uo pipefail
TRAIN=${1:?usage: output_paths.sh path/to/train path/to/mpirun}
MPIRUN=${2:?usage: output_paths.sh path/to/train path/to/mpirun}
TRAIN=$(realpath "$TRAIN")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
work=$(mktemp -d)
cleanup() {
  for m in "$work/full" "$work/pfull"; do mountpoint -q "$m" 2>/dev/null && umount "$m"; done
  rm -rf "$work"
}
trap cleanup EXIT
cd "$ROOT"
fails=0
fail() { echo "FAIL $*"; fails=$((fails+1)); }
ok() { echo "ok   $*"; }
unset ZT_MEM_AVAILABLE_BYTES
export ZT_PROGRESS=plain

small=(--set data.train=data/sample/train_000.bin --set data.val=data/sample/val.bin --set data.tokenizer=
       --set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=32
       --set batch.micro_batch=2 --set run.steps=2 --set optim.warmup_steps=1 --set run.eval_every=0
       --set run.eval_batches=1 --set run.sample_every=0 --set run.threads=1)
listing() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum; find . -type l -printf '%p -> %l\n' | sort); }
is_dev() { [ -c "$1" ] || [ -p "$1" ]; }

# refused NAME WANT CMD...: exit 1, exactly one stderr line, containing WANT.
refused() {
  local name=$1 want=$2; shift 2
  "$@" >"$work/$name.out" 2>"$work/$name.err"
  local rc=$? lines; lines=$(wc -l <"$work/$name.err")
  if [ $rc -ne 1 ]; then fail "$name: exit $rc, expected 1:"; cat "$work/$name.err"; return 1; fi
  if [ "$lines" -ne 1 ]; then fail "$name: $lines lines on stderr:"; cat "$work/$name.err"; return 1; fi
  if ! grep -qF -- "$want" "$work/$name.err"; then fail "$name: stderr lacks '$want':"; cat "$work/$name.err"; return 1; fi
  return 0
}

inp="$work/inputs"; mkdir -p "$inp"
# A character device like /dev/null (never /dev/null itself: a regression would replace it); a FIFO
# where mknod is not allowed.
mknod "$inp/chardev" c 1 3 2>/dev/null || mkfifo "$inp/chardev"

# ---- train export --out -------------------------------------------------------------------------
ck="$work/ck"
"$TRAIN" plans/default.json "${small[@]}" --set run.log="$work/ckrun/metrics.jsonl" --set checkpoint.dir="$ck" \
  --set checkpoint.every=2 >"$work/ckrun.out" 2>&1 || { fail "export: the run that saves a checkpoint failed:"; cat "$work/ckrun.out"; }
step="$ck/$(cat "$ck/latest" 2>/dev/null)"
before=$(listing "$ck")
export_refused() {  # NAME WANT OUT
  refused "$1" "$2" "$TRAIN" export "$ck" --format llmc --out "$3" || return
  if [ "$(listing "$ck")" != "$before" ]; then fail "$1: the checkpoint changed"; return; fi
  ok "$1: $(cat "$work/$1.err")"
}
export_refused export_to_device 'export --out: '"$inp/chardev"' is not a regular file' "$inp/chardev"
is_dev "$inp/chardev" && ok "export_to_device: the device is still a device" || fail "export_to_device: $inp/chardev was replaced"
ln -s "$inp/chardev" "$inp/link_to_dev"
export_refused export_to_link_to_device 'is not a regular file (a' "$inp/link_to_dev"
[ -L "$inp/link_to_dev" ] && is_dev "$inp/chardev" && ok "export_to_link_to_device: link and device unchanged" \
  || fail "export_to_link_to_device: the link or the device was replaced"
ln -s "$inp/nowhere.bin" "$inp/dangling"
export_refused export_to_dangling_link 'is a symlink to '"$inp/nowhere.bin"' which cannot be reached' "$inp/dangling"
[ -L "$inp/dangling" ] && [ ! -e "$inp/nowhere.bin" ] && ok "export_to_dangling_link: the link is still a link" \
  || fail "export_to_dangling_link: the link was replaced or followed"
export_refused export_to_rank_file 'one of this command'"'"'s inputs (the checkpoint being exported' "$step/rank_00000.h5"
export_refused export_to_master_file 'one of this command'"'"'s inputs (the checkpoint being exported' "$step/model.h5"
export_refused export_to_latest 'is inside one of this command'"'"'s inputs (the checkpoint directory given' "$ck/latest"
export_refused export_into_checkpoint 'is inside one of this command'"'"'s inputs' "$step/export.bin"
export_refused export_to_directory 'export --out: '"$inp"' is a directory' "$inp"
# A symlink to a regular file is written through: the link stays a link, its target gets the weights.
echo old > "$inp/target.bin"; ln -s "$inp/target.bin" "$inp/link.bin"
if ! "$TRAIN" export "$ck" --format llmc --out "$inp/direct.bin" >"$work/exp1.out" 2>&1 ||
   ! "$TRAIN" export "$ck" --format llmc --out "$inp/link.bin" >"$work/exp2.out" 2>&1; then
  fail "export_through_link: export failed:"; cat "$work/exp1.out" "$work/exp2.out"
elif [ -L "$inp/link.bin" ] && cmp -s "$inp/target.bin" "$inp/direct.bin"; then
  ok "export_through_link: the link is still a link, its target holds the export"
else fail "export_through_link: link $(stat -c %F "$inp/link.bin"), target $(stat -c %s "$inp/target.bin") bytes"; fi
# The temporary file is ours alone: an OUT.tmp that was already there is not touched.
echo "someone else's" > "$inp/out.bin.tmp"
"$TRAIN" export "$ck" --format hdf5 --out "$inp/out.bin" >"$work/exp3.out" 2>&1 || { fail "export_tmp: failed:"; cat "$work/exp3.out"; }
if [ "$(cat "$inp/out.bin.tmp")" = "someone else's" ] && [ -s "$inp/out.bin" ] && [ -z "$(ls "$inp" | grep 'out.bin.tmp.')" ]; then
  ok "export_tmp: an existing out.bin.tmp is left alone, no temporary file left"
else fail "export_tmp: out.bin.tmp now: $(head -c 40 "$inp/out.bin.tmp" | tr -dc '[:print:]'); $(ls "$inp" | tr '\n' ' ')"; fi

# ---- train: the run's outputs against its inputs and each other ------------------------------
/usr/bin/python3 test/cli/make_inputs.py checkpoint "$inp/init.bin" 1 2 32 32
cp data/sample/train_000.bin "$inp/train.bin"
ins_before=$(listing "$inp")
run_refused() {  # NAME WANT ARGS...
  local name=$1 want=$2; shift 2
  refused "$name" "$want" "$TRAIN" plans/default.json "${small[@]}" --set run.log="$work/$name/metrics.jsonl" "$@" || return
  if [ "$(listing "$inp")" != "$ins_before" ]; then fail "$name: the inputs changed"; return; fi
  if [ -e "$work/$name" ]; then fail "$name: files were written: $(find "$work/$name")"; return; fi
  ok "$name: $(cat "$work/$name.err")"
}
run_refused final_weights_onto_init 'run.final_weights: '"$inp/init.bin"' is one of this command'"'"'s inputs (model.init' \
  --set model.init="$inp/init.bin" --set run.final_weights="$inp/init.bin"
run_refused final_weights_onto_data 'run.final_weights: '"$inp/train.bin"' is one of this command'"'"'s inputs (data.train' \
  --set data.train="$inp/train.bin" --set run.final_weights="$inp/train.bin"
# Neither exists yet: the same file by its canonical parent and name, however spelled.
run_refused final_weights_onto_log 'is also where run.log goes' \
  --set run.final_weights="$work/final_weights_onto_log/./new/../metrics.jsonl"
mknod "$inp/t.rank0.json" c 1 3 2>/dev/null || mkfifo "$inp/t.rank0.json"; ins_before=$(listing "$inp")
run_refused trace_onto_device 'run.trace: '"$inp/t.rank0.json"' is not a regular file' --set run.trace="$inp/t.json"
is_dev "$inp/t.rank0.json" && ok "trace_onto_device: the device is still a device" || fail "trace_onto_device: replaced"
before=$(listing "$ck")
refused final_weights_onto_checkpoint 'one of this command'"'"'s inputs (checkpoint.dir' "$TRAIN" plans/default.json "${small[@]}" \
  --set run.log="$work/fwck/metrics.jsonl" --set checkpoint.dir="$ck" --set checkpoint.resume=auto --set run.steps=4 \
  --set run.final_weights="$step/rank_00000.h5" &&
  { [ "$(listing "$ck")" = "$before" ] && ok "final_weights_onto_checkpoint: $(cat "$work/final_weights_onto_checkpoint.err")" \
    || fail "final_weights_onto_checkpoint: the checkpoint changed"; }
echo old > "$inp/fw_target.bin"; ln -s "$inp/fw_target.bin" "$inp/fw_link.bin"
if "$TRAIN" plans/default.json "${small[@]}" --set run.log="$work/fwlink/metrics.jsonl" --set run.final_weights="$inp/fw_link.bin" \
     >"$work/fwlink.out" 2>&1 && [ -L "$inp/fw_link.bin" ] && [ "$(stat -c %s "$inp/fw_target.bin")" -gt 1024 ]; then
  ok "final_weights_through_link: the link is still a link, its target holds the weights"
else fail "final_weights_through_link:"; tail -3 "$work/fwlink.out"; ls -l "$inp"; fi

# A plan that extends another, whose plan.json sits where the run's resolved plan goes: an input,
# refused (it was moved aside to plan.json.1 as "an earlier run's files").
mkdir -p "$work/ext"
printf '{"extends": "%s"}\n' "$ROOT/plans/default.json" > "$work/ext/plan.json"
printf '{"extends": "ext/plan.json"}\n' > "$work/ext_child.json"
parent_sum=$(sha256sum <"$work/ext/plan.json")
refused parent_plan_beside_log 'run.log (the resolved plan beside it): '"$work/ext/plan.json"' is one of this command'"'"'s inputs (a plan it extends' \
  "$TRAIN" "$work/ext_child.json" "${small[@]}" --set run.log="$work/ext/metrics.jsonl" &&
  { [ "$(sha256sum <"$work/ext/plan.json")" = "$parent_sum" ] && [ ! -e "$work/ext/plan.json.1" ] &&
    ok "parent_plan_beside_log: $(cat "$work/parent_plan_beside_log.err")" || fail "parent_plan_beside_log: the parent moved: $(ls "$work/ext")"; }
# A path spelled as a directory: refused before the first step (the weights were lost after the last).
refused final_weights_trailing_slash 'run.final_weights: '"$work/fwdir/"' ends in "/": it names a directory' \
  "$TRAIN" plans/default.json "${small[@]}" --set run.log="$work/fwslash/metrics.jsonl" --set run.final_weights="$work/fwdir/" &&
  { [ ! -e "$work/fwdir" ] && [ ! -e "$work/fwslash" ] && ok "final_weights_trailing_slash: $(cat "$work/final_weights_trailing_slash.err")" \
    || fail "final_weights_trailing_slash: files were written: $(ls "$work/fwdir" "$work/fwslash" 2>&1)"; }

# ---- inputs that are not regular files: refused by kind before they are opened -------------------
# (a FIFO as data.train / data.val hung the run forever; as tokenizer or model.init it was "not found")
mkfifo "$inp/fifo"
ln -s "$inp/nowhere.bin" "$inp/dangling_in"
fifo_refused() {  # NAME WANT ARGS...: under a timeout, so that a regression fails instead of hanging
  local name=$1 want=$2; shift 2
  refused "$name" "$want" timeout 30 "$TRAIN" "$@" || return
  if [ -e "$work/$name" ]; then fail "$name: files were written: $(find "$work/$name")"; return; fi
  ok "$name: $(cat "$work/$name.err")"
}
fifo_refused fifo_as_data_train 'data file '"$inp/fifo"' is a FIFO, not a regular file' plans/default.json "${small[@]}" \
  --set run.log="$work/fifo_as_data_train/m.jsonl" --set data.train="$inp/fifo"
fifo_refused fifo_as_data_val 'data file '"$inp/fifo"' is a FIFO, not a regular file' plans/default.json "${small[@]}" \
  --set run.log="$work/fifo_as_data_val/m.jsonl" --set data.val="$inp/fifo"
fifo_refused fifo_as_tokenizer 'plan: data.tokenizer: "'"$inp/fifo"'" is a FIFO, not a regular file' plans/default.json "${small[@]}" \
  --set run.log="$work/fifo_as_tokenizer/m.jsonl" --set data.tokenizer="$inp/fifo"
fifo_refused fifo_as_init 'plan: model.init: "'"$inp/fifo"'" is a FIFO, not a regular file' plans/default.json "${small[@]}" \
  --set run.log="$work/fifo_as_init/m.jsonl" --set model.init="$inp/fifo"
fifo_refused fifo_as_plan 'plan '"$inp/fifo"' is a FIFO, not a regular file' "$inp/fifo" "${small[@]}" \
  --set run.log="$work/fifo_as_plan/m.jsonl"
fifo_refused device_as_init 'plan: model.init: "'"$inp/chardev"'" is a' plans/default.json "${small[@]}" \
  --set run.log="$work/device_as_init/m.jsonl" --set model.init="$inp/chardev"
fifo_refused dangling_as_data_val 'data file '"$inp/dangling_in"' is a symlink to '"$inp/nowhere.bin"', which does not exist' \
  plans/default.json "${small[@]}" --set run.log="$work/dangling_as_data_val/m.jsonl" --set data.val="$inp/dangling_in"

# ---- train plan: --out, its report and --calibration against the planner's inputs ---------------
# Refused before anything is measured (under a timeout: the old planner measured for a minute, then
# wrote over the input).
cp data/sample/val.bin "$inp/val.bin"
printf '{"extends": "%s"}\n' "$ROOT/plans/default.json" > "$inp/parent.json"
printf '{"extends": "parent.json"}\n' > "$inp/child.json"
echo '{"keep": 1}' > "$inp/cal.json"
ins_before=$(listing "$inp")
plan_refused() {  # NAME WANT ARGS...
  local name=$1 want=$2; shift 2
  refused "$name" "$want" timeout 60 "$TRAIN" plan "$inp/child.json" "${small[@]}" --set data.train="$inp/train.bin" \
    --set data.val="$inp/val.bin" --set model.init="$inp/init.bin" "$@" || return
  if [ "$(listing "$inp")" != "$ins_before" ]; then fail "$name: the inputs changed"; return; fi
  ok "$name: $(cat "$work/$name.err")"
}
inputs_of="is one of this command's inputs"
plan_refused plan_out_onto_data_train "--out: $inp/train.bin $inputs_of (data.train" --out "$inp/train.bin" --calibration "$work/pcal.json"
plan_refused plan_out_onto_data_val "--out: $inp/val.bin $inputs_of (data.val" --out "$inp/val.bin" --calibration "$work/pcal.json"
plan_refused plan_out_onto_init "--out: $inp/init.bin $inputs_of (model.init" --out "$inp/init.bin" --calibration "$work/pcal.json"
plan_refused plan_out_onto_parent "--out: $inp/parent.json $inputs_of (a plan it extends: $inp/parent.json)" \
  --out "$inp/parent.json" --calibration "$work/pcal.json"
plan_refused plan_out_onto_base "--out: $inp/child.json $inputs_of (the plan" --out "$inp/child.json" --calibration "$work/pcal.json"
cp "$inp/val.bin" "$inp/v.report.json"; ins_before=$(listing "$inp")  # --out v.json: its report is v.report.json
plan_refused plan_report_onto_data_val "--out (its report): $inp/v.report.json $inputs_of (data.val" --out "$inp/v.json" \
  --calibration "$work/pcal.json" --set data.val="$inp/v.report.json"
plan_refused plan_calibration_onto_data "--calibration: $inp/train.bin $inputs_of (data.train" --out "$work/pout/best.json" \
  --calibration "$inp/train.bin"
plan_refused plan_out_trailing_slash "--out: $work/pdir/ ends in \"/\": it names a directory" --out "$work/pdir/" --calibration "$work/pcal.json"
[ -e "$work/pdir" ] && fail "plan_out_trailing_slash: $work/pdir was made: $(ls -a "$work/pdir")"
[ -e "$work/pcal.json" ] && fail "train plan refusals: the calibration cache was written"

# On a full disk the plan and its report are both kept as they were (the plan was replaced, then the
# report failed: "--out (its report): --out (its report) TMP: write failed", no strerror).
mkdir -p "$work/pfull"
if mount -t tmpfs -o size=16k tmpfs "$work/pfull" 2>/dev/null; then
  echo "old plan" > "$work/pfull/best.json"; echo "old report" > "$work/pfull/best.report.json"
  head -c 4096 /dev/zero > "$work/pfull/filler"  # one page left: room for the plan (~1.6 KB), not its report (~11 KB)
  timeout 120 "$TRAIN" plan plans/default.json "${small[@]}" --set offload.nvme_dir=/proc/zt_nowhere \
    --out "$work/pfull/best.json" --calibration "$work/pcal.json" >"$work/pfull.out" 2>"$work/pfull.err"
  rc=$?
  if [ $rc -ne 1 ] || [ "$(wc -l <"$work/pfull.err")" -ne 1 ]; then fail "plan_disk_full: exit $rc, stderr:"; cat "$work/pfull.err"; tail -3 "$work/pfull.out"
  elif ! grep -q 'No space left on device' "$work/pfull.err"; then fail "plan_disk_full: no strerror:"; cat "$work/pfull.err"
  elif [ "$(grep -o -- '--out' "$work/pfull.err" | wc -l)" -ne 1 ]; then fail "plan_disk_full: --out named more than once:"; cat "$work/pfull.err"
  elif [ "$(cat "$work/pfull/best.json")" != "old plan" ] || [ "$(cat "$work/pfull/best.report.json")" != "old report" ]; then
    fail "plan_disk_full: replaced: plan $(head -c 20 "$work/pfull/best.json" | tr -d '\n'), report $(head -c 20 "$work/pfull/best.report.json" | tr -d '\n')"
  elif [ "$(ls -A "$work/pfull" | tr '\n' ' ')" != "best.json best.report.json filler " ]; then
    fail "plan_disk_full: left behind: $(ls -A "$work/pfull" | tr '\n' ' ')"
  else ok "plan_disk_full: neither replaced; $(cat "$work/pfull.err")"; fi
  umount "$work/pfull"
else
  echo "SKIP plan_disk_full: cannot mount a small tmpfs here (needs root); the check is not exercised"
fi
# --out at the calibration cache (a real one: the planner reused it, then wrote the plan over it).
[ -s "$work/pcal.json" ] || timeout 120 "$TRAIN" plan plans/default.json "${small[@]}" --set offload.nvme_dir=/proc/zt_nowhere \
  --out "$work/pfirst/best.json" --calibration "$work/pcal.json" >"$work/pfirst.out" 2>&1
cal_sum=$(sha256sum <"$work/pcal.json")
refused plan_out_is_calibration "--out: $work/pcal.json is also where --calibration goes" timeout 60 "$TRAIN" plan plans/default.json \
  "${small[@]}" --set offload.nvme_dir=/proc/zt_nowhere --out "$work/pcal.json" --calibration "$work/pcal.json" &&
  { [ "$(sha256sum <"$work/pcal.json")" = "$cal_sum" ] && ok "plan_out_is_calibration: $(cat "$work/plan_out_is_calibration.err")" \
    || fail "plan_out_is_calibration: the cache changed"; }

# ---- run.trace: a rerun moves the earlier traces aside; a full disk loses the trace, not the run --
tr="$work/tr"
"$MPIRUN" --oversubscribe -np 2 "$TRAIN" plans/default.json "${small[@]}" --set run.log="$tr/metrics.jsonl" \
  --set run.trace="$tr/trace.json" >"$work/tr1.out" 2>&1 || { fail "trace_rerun: the 2-rank run failed:"; tail -5 "$work/tr1.out"; }
sha0=$(sha256sum <"$tr/trace.rank0.json"); sha1=$(sha256sum <"$tr/trace.rank1.json")
"$TRAIN" plans/default.json "${small[@]}" --set run.log="$tr/metrics.jsonl" --set run.trace="$tr/trace.json" >"$work/tr2.out" 2>&1 \
  || { fail "trace_rerun: the 1-rank rerun failed:"; tail -5 "$work/tr2.out"; }
globbed=$(cd "$tr" && ls trace.rank*.json | tr '\n' ' ')
if [ "$(sha256sum <"$tr/trace.rank0.json.1")" != "$sha0" ] || [ "$(sha256sum <"$tr/trace.rank1.json.1")" != "$sha1" ]; then
  fail "trace_rerun: the earlier traces are not at .1: $(ls "$tr" | tr '\n' ' ')"
elif [ "$globbed" != "trace.rank0.json " ] || [ ! -f "$tr/metrics.jsonl.1" ]; then
  fail "trace_rerun: after the rerun, trace.rank*.json = $globbed; $(ls "$tr" | tr '\n' ' ')"
else ok "trace_rerun: $(grep 'moved aside' "$work/tr2.out")"; fi

mkdir -p "$work/full"
if mount -t tmpfs -o size=16k tmpfs "$work/full" 2>/dev/null; then
  head -c 12288 /dev/zero > "$work/full/filler"  # a few KiB left: the trace's first write fails
  "$TRAIN" plans/default.json "${small[@]}" --set run.steps=6 --set run.log="$work/fullrun/metrics.jsonl" \
    --set run.trace="$work/full/trace.json" >"$work/full.out" 2>"$work/full.err"
  rc=$?
  if [ $rc -ne 1 ] || [ "$(wc -l <"$work/full.err")" -ne 1 ]; then fail "trace_disk_full: exit $rc, stderr:"; cat "$work/full.err"
  elif ! grep -q 'run.trace: writing .*trace.rank0.json failed (No space left on device): this rank.s trace ([0-9]* events) is lost' "$work/full.err"; then
    fail "trace_disk_full: stderr does not say what was lost:"; cat "$work/full.err"
  elif ! grep -q '"summary"' "$work/fullrun/metrics.jsonl"; then fail "trace_disk_full: no summary line in metrics.jsonl"
  elif [ -e "$work/full/trace.rank0.json" ]; then fail "trace_disk_full: a partial trace is left: $(stat -c %s "$work/full/trace.rank0.json") bytes"
  else ok "trace_disk_full: summary logged; $(cat "$work/full.err")"; fi
  umount "$work/full"
else
  echo "SKIP trace_disk_full: cannot mount a small tmpfs here (needs root); the check is not exercised"
fi

# ---- scripts/trace_merge ------------------------------------------------------------------------
merge() { "$PY" scripts/trace_merge "$@"; }
tr_before=$(listing "$tr")
cp "$tr/trace.rank1.json.1" "$work/r1.json"
merge_refused() {  # NAME WANT ARGS...
  local name=$1 want=$2; shift 2
  refused "$name" "$want" merge "$@" || return
  if [ "$(listing "$tr")" != "$tr_before" ]; then fail "$name: the traces changed"; return; fi
  ok "$name: $(cat "$work/$name.err")"
}
(cd "$tr" && cp trace.rank1.json.1 trace.rank1.json)   # two ranks' files, as the glob in docs/traces.md finds them
tr_before=$(listing "$tr")
merge_refused merge_output_forgotten "named like one rank's trace" "$tr/trace.rank0.json" "$tr/trace.rank1.json"
merge_refused merge_output_is_input "is one of this command's inputs" "$work/r1.json" "$tr/trace.rank0.json" "$work/./r1.json"
merge_refused merge_output_dir "OUT: $tr is a directory" "$tr" "$tr/trace.rank0.json"
merge_refused merge_output_device "is not a regular file" "$inp/chardev" "$tr/trace.rank0.json"
is_dev "$inp/chardev" || fail "merge_output_device: the device was replaced"
merge_refused merge_output_unwritable "OUT: cannot create files in /proc" /proc/zt_nowhere/merged.json "$tr/trace.rank0.json"
echo old > "$work/merged.json"
if merge "$work/merged.json" "$tr/trace.rank0.json" "$tr/trace.rank1.json" >"$work/merge.out" 2>&1 &&
   "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["otherData"]["ranks"]==[0,1]' "$work/merged.json"; then
  ok "merge_existing_output: an existing regular file is replaced by the merge"
else fail "merge_existing_output:"; cat "$work/merge.out"; fi

# ---- scripts/compare ----------------------------------------------------------------------------
csets=(--set data.train=data/sample/train_000.bin --set data.val=data/sample/val.bin --set data.tokenizer=
       --set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=32 --set batch.micro_batch=2
       --set optim.warmup_steps=1 --set run.eval_batches=1 --set run.threads=1)
compare() { "$PY" scripts/compare --train "$TRAIN" --no-plots --steps 2 "${csets[@]}" "$@"; }
compare_refused() {  # NAME WANT ARGS...: nothing run either
  local name=$1 want=$2; shift 2
  refused "$name" "$want" compare "$@" || return
  if grep -q 'step\|plan(s)' "$work/$name.out"; then fail "$name: it ran plans:"; head -3 "$work/$name.out"; return; fi
  ok "$name: $(cat "$work/$name.err")"
}
echo keep > "$work/a_file"
compare_refused compare_out_is_file "--out: $work/a_file is a regular file, not a directory" plans/default.json --out "$work/a_file"
[ "$(cat "$work/a_file")" = keep ] || fail "compare_out_is_file: the file changed"
compare_refused compare_out_unwritable "--out: cannot create files in /proc" plans/default.json --out /proc/zt_nowhere
compare_refused compare_out_device ", not a directory" plans/default.json --out "$inp/chardev"
mkdir -p "$work/cmp_foreign/default"; echo mine > "$work/cmp_foreign/default/notes.txt"
compare_refused compare_run_dir_foreign "holds files an earlier compare did not write (notes.txt)" plans/default.json \
  --out "$work/cmp_foreign"
[ "$(cat "$work/cmp_foreign/default/notes.txt" 2>/dev/null)" = mine ] || fail "compare_run_dir_foreign: notes.txt is gone"
mkdir -p "$work/cmp_csv/compare.csv"
compare_refused compare_csv_is_dir "--out: $work/cmp_csv/compare.csv is a directory" plans/default.json --out "$work/cmp_csv"
compare_refused compare_set_log "--set run.log=$work/x.jsonl: compare sets run.log itself" plans/default.json \
  --out "$work/cmp" --set run.log="$work/x.jsonl"
compare_refused compare_set_steps "--set run.steps=3: compare sets run.steps itself (use --steps N)" plans/default.json \
  --out "$work/cmp" --set run.steps=3
# A run folder compare would replace that holds a plan it compares (an earlier compare's resolved
# plan.json): refused (the folder was removed, the plan with it, before that plan ran).
mkdir -p "$work/cmp_in/default"; touch "$work/cmp_in/default/.compare_run"
printf '{"extends": "%s"}\n' "$ROOT/plans/default.json" > "$work/cmp_in/default/plan.json"
compare_refused compare_input_in_run_dir "--out: $work/cmp_in/default would be replaced, and it holds one of this command's inputs (a plan: $work/cmp_in/default/plan.json)" \
  plans/default.json "$work/cmp_in/default/plan.json" --out "$work/cmp_in"
[ -f "$work/cmp_in/default/plan.json" ] || fail "compare_input_in_run_dir: the plan is gone"
# A plan that fails after another finished: the finished plan's table and CSV are kept.
printf '{"optim": {"lr": 0.001,,}}\n' > "$work/broken.json"
compare plans/default.json "$work/broken.json" --out "$work/cmp" >"$work/cmp.out" 2>"$work/cmp.err"
rc=$?
if [ $rc -ne 1 ] || [ "$(wc -l <"$work/cmp.err")" -ne 1 ]; then fail "compare_partial: exit $rc, stderr:"; cat "$work/cmp.err"
elif ! grep -q '^error: compare: plan broken failed (exit 1): error: .*malformed JSON' "$work/cmp.err"; then
  fail "compare_partial: the failure line:"; cat "$work/cmp.err"
elif [ "$(cut -d, -f1 "$work/cmp/compare.csv" 2>/dev/null | tr '\n' ' ')" != "plan default " ] || ! grep -q '^default ' "$work/cmp.out"; then
  fail "compare_partial: no table / CSV for the plan that finished:"; cat "$work/cmp.out"
else ok "compare_partial: default's row kept; $(cat "$work/cmp.err")"; fi

[ $fails -eq 0 ] && echo "all output-path checks passed" || { echo "$fails check(s) failed"; exit 1; }
