#!/usr/bin/env bash
# CPU training throughput of zerotrain next to PyTorch, same model, same batch, same threads,
# in the same run. Prints a table; numbers are medians over the timed steps (first steps untimed).
# Every benchmark: docs/benchmarks.md.
#   scripts/bench_cpu.sh [--threads N] [--steps N]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
THREADS=$(nproc); STEPS=8
while [ $# -gt 0 ]; do
  case $1 in
    --threads) THREADS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    *) echo "usage: $0 [--threads N] [--steps N]" >&2; exit 2 ;;
  esac
done
PY=/usr/bin/python3
[ -x ./train ] || { echo "bench_cpu: ./train missing; run make first" >&2; exit 1; }
[ -f data/brown/val.bin ] || { echo "bench_cpu: data/brown missing; run scripts/prepare_data first" >&2; exit 1; }
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
WARM=2

# name L NH C T B
configs=(
  "default 4 4 128 128 8"
  "gpt2-124M@T256 12 12 768 256 4"
)
printf '%-16s %12s %14s %14s %8s\n' config "tokens/step" "zerotrain t/s" "pytorch t/s" speedup > "$out/table"
for c in "${configs[@]}"; do
  read -r name L NH C T B <<<"$c"
  echo "== $name: L=$L NH=$NH C=$C T=$T B=$B, $THREADS threads" >&2
  ./train plans/default.json --set model.n_layer=$L --set model.n_head=$NH --set model.n_embd=$C \
      --set model.seq_len=$T --set batch.micro_batch=$B --set batch.grad_accum=1 --set run.steps=$((STEPS + WARM)) \
      --set run.eval_every=0 --set run.eval_batches=1 --set run.sample_every=0 --set data.tokenizer= \
      --set run.threads=$THREADS --set run.log="$out/$name/metrics.jsonl" > "$out/$name.log" 2>&1 \
      || { cat "$out/$name.log" >&2; exit 1; }
  ours=$($PY -c "
import json,statistics,sys
r=[json.loads(l) for l in open('$out/$name/metrics.jsonl')]
s=[x['tokens_per_s'] for x in r if 'tokens_per_s' in x and 'step' in x][$WARM:]
print(statistics.median(s))")
  theirs=$($PY bench/torch_bench.py --layers $L --heads $NH --embd $C --seq $T --batch $B \
      --steps $STEPS --warmup-steps $WARM --threads $THREADS | tail -n 1 | $PY -c "import json,sys; print(json.load(sys.stdin)['tokens_per_s'])")
  printf '%-16s %12d %14.0f %14.0f %7.2fx\n' "$name" $((B * T)) "$ours" "$theirs" "$($PY -c "print($ours/$theirs)")" >> "$out/table"
done
echo
cat "$out/table"
