#!/usr/bin/env bash
# End to end: a small real run on the committed sample data. Checks exit code, that the loss
# goes down, the metrics JSONL contents (per-step keys, val_loss, summary with memory), the
# resolved plan written beside the log, and a decoded sample in the output.
set -euo pipefail
TRAIN=${1:?usage: train_sample.sh path/to/train}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

"$TRAIN" plans/default.json \
  --set data.train='data/sample/train_*.bin' --set data.val=data/sample/val.bin \
  --set data.tokenizer=data/sample/gpt2_tokenizer.bin \
  --set model.n_layer=2 --set model.n_embd=64 --set model.n_head=2 --set model.seq_len=64 \
  --set batch.micro_batch=4 --set batch.grad_accum=2 --set optim.lr=0.003 --set optim.warmup_steps=5 \
  --set run.steps=40 --set run.eval_every=20 --set run.eval_batches=4 --set run.sample_every=0 \
  --set run.sample_tokens=20 --set run.log="$work/run/metrics.jsonl" | tee "$work/stdout"

grep -q -- '---- sample at step 40 ----' "$work/stdout"
test -s "$work/run/plan.json"

/usr/bin/python3 - "$work/run/metrics.jsonl" "$work/run/plan.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "loss" in r]
vals = [r for r in rows if "val_loss" in r]
summ = [r["summary"] for r in rows if "summary" in r]
assert len(steps) == 40, len(steps)
for r in steps:
    for k in ("step", "loss", "lr", "grad_norm", "ms", "tokens_per_s"):
        assert k in r, (k, r)
assert [r["step"] for r in vals] == [20, 40], vals  # numbered from 1, as the console prints them
assert len(summ) == 1 and summ[0]["steps"] == 40
assert summ[0]["peak_memory_bytes"]["host"]["params"] > 0
first = sum(r["loss"] for r in steps[:5]) / 5
last = sum(r["loss"] for r in steps[-5:]) / 5
assert last < first - 0.5, (first, last)
plan = json.load(open(sys.argv[2]))
assert plan["run"]["steps"] == 40 and plan["model"]["n_embd"] == 64
print(f"train_sample ok: loss {first:.3f} -> {last:.3f}, val {vals[-1]['val_loss']:.3f}")
PY
