#!/usr/bin/env bash
# What a run reports is what this process did (docs/design.md §3.7):
#   - a run of 8 steps (checkpoints at 6 and 8, evaluation every 4): console and metrics JSONL
#     number steps alike, 1-based (the step a line is about, as checkpoints step_N count them):
#     "step     4/8" and "step     4 | val loss" are {"step": 4} in the JSONL;
#   - resumed at step 6: "done: 2 steps", the summary's tokens_per_s over those 2 steps' time,
#     "steps": 8 and "steps_run": 2;
#   - resumed at step 8 = run.steps: one line "nothing to do: checkpoint is at step 8 = run.steps",
#     exit 0, and a summary with "steps_run": 0 and null final_loss / final_val_loss / tokens_per_s.
set -euo pipefail
TRAIN=${1:?usage: resume_report.sh path/to/train}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

run() {  # run NAME [--set ...]: stdout+stderr to $work/NAME.out
  local name=$1; shift
  "$TRAIN" plans/default.json \
    --set data.train='data/sample/train_*.bin' --set data.val=data/sample/val.bin --set data.tokenizer= \
    --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 --set model.seq_len=32 \
    --set batch.micro_batch=2 --set batch.grad_accum=1 --set run.steps=8 --set run.eval_every=4 \
    --set run.eval_batches=1 --set run.sample_every=0 --set run.final_weights= --set run.threads=1 \
    --set run.log="$work/$name/metrics.jsonl" "$@" >"$work/$name.out" 2>&1
}
fail() { echo "resume_report FAILED: $*"; for f in "$work"/*.out; do echo "--- $f"; cat "$f"; done; exit 1; }

run full --set checkpoint.dir="$work/ckpt" --set checkpoint.every=6 || fail "the 8-step run failed"
run part --set checkpoint.resume="$work/ckpt/step_00000006" || fail "the run resumed at step 6 failed"
rc=0; run none --set checkpoint.resume="$work/ckpt/step_00000008" || rc=$?
[ "$rc" -eq 0 ] || fail "the run resumed at its last step exited $rc"

grep -q '^step     4/8 |' "$work/full.out" || fail "no console line 'step     4/8 |'"
grep -q '^step     4 | val loss' "$work/full.out" || fail "no console line 'step     4 | val loss'"
grep -q '^done: 8 steps in ' "$work/full.out" || fail "the full run does not say 'done: 8 steps'"
grep -q '^done: 2 steps (resumed at step 6) in ' "$work/part.out" || fail "the resumed run does not say 'done: 2 steps (resumed at step 6)'"
grep -q 'nothing to do' "$work/part.out" && fail "the resumed run says 'nothing to do'"
[ "$(grep -c '^nothing to do: checkpoint is at step 8 = run.steps$' "$work/none.out")" -eq 1 ] ||
  fail "the finished run does not say 'nothing to do: checkpoint is at step 8 = run.steps' once"
grep -qE '^done:|inf tokens|final loss' "$work/none.out" && fail "the finished run reports a throughput or loss"

/usr/bin/python3 - "$work" <<'PY'
import json, math, sys
w = sys.argv[1]
def rows(name):
    return [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl")]
def summary(name):
    s = [r["summary"] for r in rows(name) if "summary" in r]
    assert len(s) == 1, (name, s)
    return s[0]
full, part, none = rows("full"), rows("part"), rows("none")
train = [r["step"] for r in full if "loss" in r]
val = [r["step"] for r in full if "val_loss" in r]
assert train == list(range(1, 9)), f"train lines numbered {train}, expected 1..8"
assert val == [4, 8], f"val lines numbered {val}, expected [4, 8] as the console prints them"
steps = [r for r in part if "loss" in r]
assert [r["step"] for r in steps] == [7, 8], [r["step"] for r in steps]
s = summary("part")
tokens = 2 * 32  # micro_batch x seq_len x grad_accum x world
want = tokens * len(steps) / (sum(r["ms"] for r in steps) / 1e3)
assert s["steps"] == 8 and s["steps_run"] == 2, s
assert math.isclose(s["tokens_per_s"], want, rel_tol=1e-9), f"summary tokens_per_s {s['tokens_per_s']} != {want} (2 steps)"
assert s["final_loss"] == steps[-1]["loss"], s
n = summary("none")
assert not [r for r in none if "loss" in r or "val_loss" in r], none
assert n["steps"] == 8 and n["steps_run"] == 0, n
for k in ("final_loss", "final_val_loss", "tokens_per_s"):
    assert n[k] is None, f"{k} = {n[k]!r} for a run that ran no step (expected null)"
print(f"resume_report ok: 8 steps numbered 1..8, val at {val}; resumed: 2 steps, {s['tokens_per_s']:.0f} tokens/s; "
      "finished: nothing to do, no losses")
PY
