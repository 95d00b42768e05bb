#!/usr/bin/env bash
# `train estimate --set device=cuda` sizes a GPU run on a machine without one (issue 23: it used to
# fail in CUB's size query, cudaErrorInvalidDevice, before the plan was even validated). With every
# device hidden (so it means the same with and without a GPU): every stage, fp32 and bf16, exit 0
# with the CUDA backend's device memory; and a plan the CUDA backend cannot run gets the run's own
# message, from the same checks (choose_backend), in one line.
set -uo pipefail
TRAIN=$(realpath "${1:?usage: estimate_cuda.sh path/to/train}")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$ROOT"
export CUDA_VISIBLE_DEVICES=
fails=0
fail() { echo "FAIL $*"; fails=$((fails+1)); }

for stage in 0 1 2 3; do
  for prec in fp32 bf16; do
    name="stage $stage $prec"
    if ! "$TRAIN" estimate plans/base.json --world 2 --json --set device=cuda --set precision.compute=$prec \
         --set zero.stage=$stage >"$work/est.json" 2>"$work/err"; then
      fail "$name: exit non-zero: $(cat "$work/err")"; continue
    fi
    [ -s "$work/err" ] && { fail "$name: stderr: $(cat "$work/err")"; continue; }
    # Device memory, activations (with the encoder's sort scratch) included; no host tier but pinned.
    if ! /usr/bin/python3 - "$work/est.json" "$prec" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))
dev = e["memory"]["device"]
assert dev["total"] > 0 and dev["activations"] > 0 and dev["params"] > 0, dev
assert "host" not in e["memory"], e["memory"].keys()
print(f"  device total {dev['total']} bytes, activations {dev['activations']}")
EOF
    then fail "$name: unexpected estimate"; continue; fi
    echo "ok   $name"
  done
done
# 8192 positions: past CUB's single-tile sort (its scratch then depends on the architecture's policy).
"$TRAIN" estimate plans/base.json --set device=cuda --set batch.micro_batch=64 >/dev/null 2>"$work/err" \
  && echo "ok   8192 positions" || fail "8192 positions: $(cat "$work/err")"
"$TRAIN" estimate plans/base.json --set device=cuda >"$work/table" 2>"$work/err" && grep -q 'backend cuda-bf16 (device "cuda")' "$work/table" \
  && echo "ok   table names the CUDA backend" || fail "table: $(head -3 "$work/table") $(cat "$work/err")"
# comm.backend "nccl" planned for 8 GPUs (no GPU, no driver needed): no pinned mirrors, NCCL's own
# buffers on a labelled line, the NCCL path's bytes per step (test/cli/estimate_nccl_test.cpp: the numbers).
"$TRAIN" estimate plans/base.json --set device=cuda --set comm.backend=nccl --world 8 >"$work/nccl" 2>"$work/err" \
  && grep -q '^comm: nccl (device buffers, no host copies): pinned host staging 0 B' "$work/nccl" \
  && grep -q "NCCL's own device buffers (not allocated or tracked by zerotrain" "$work/nccl" \
  && grep -q '^sent per rank per optimizer step (nccl): ' "$work/nccl" \
  && echo "ok   comm.backend nccl, world 8" || fail "nccl: $(cat "$work/err") $(sed -n '/^comm/,$p' "$work/nccl")"

# Same validation, same message as a run: a head size the CUDA attention kernels do not have.
data=(--set 'data.train=data/sample/train_*.bin' --set data.val=data/sample/val.bin --set data.tokenizer=)
bad=(--set device=cuda --set model.n_embd=96 --set model.n_head=2)
want='model: head size n_embd/n_head = 48 is not supported by the CUDA attention kernels'
"$TRAIN" estimate plans/base.json "${bad[@]}" >"$work/out" 2>"$work/est_err"; rc=$?
"$TRAIN" plans/base.json "${data[@]}" "${bad[@]}" --set run.log="$work/run/metrics.jsonl" >/dev/null 2>"$work/run_err"
if [ $rc -ne 1 ] || [ "$(wc -l < "$work/est_err")" -ne 1 ] || ! grep -qF "$want" "$work/est_err" || [ -s "$work/out" ]; then
  fail "head size: estimate rc $rc: $(cat "$work/est_err")"
elif ! cmp -s "$work/est_err" "$work/run_err"; then
  fail "head size: estimate and run differ: '$(cat "$work/est_err")' vs '$(cat "$work/run_err")'"
else echo "ok   head size 48: $(cat "$work/est_err")"; fi
# A plan error comes first, as in a run (it used to be the CUDA error).
"$TRAIN" estimate plans/base.json --set device=cuda --set model.n_head=3 >/dev/null 2>"$work/err"
grep -qF 'plan: model.n_embd: must be divisible by model.n_head (3)' "$work/err" && echo "ok   plan error first" \
  || fail "plan error first: $(cat "$work/err")"

[ $fails -eq 0 ] && echo "estimate with device cuda: all cases passed" || { echo "$fails case(s) failed"; exit 1; }
