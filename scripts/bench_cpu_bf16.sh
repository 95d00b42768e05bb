#!/usr/bin/env bash
# Backend cpu-bf16 against cpu-fp32 in the same run (docs/benchmarks.md, "bf16 on the CPU"): for each
# model both precisions trained from the same seed on the same data, traced; bench/cpu_step.py gives
# each run's step op by op and its FLOP rate against numpy/OpenBLAS sgemm (fp32) at the step's GEMM
# shapes; then PyTorch on the same model and batch (bench/torch_bench.py), fp32 and under CPU autocast
# bf16 (its linear layers in bf16 through oneDNN, fp32 parameters and AdamW: the anchor); the table:
# tokens/s of all four, our speed-up, the matmul ops' GFLOP/s, and the largest relative difference
# between our two loss curves (the CUDA bf16 backend is held to 2e-2).
#   scripts/bench_cpu_bf16.sh [--threads N] [--steps N] [--only NAME,...]
# Data: data/brown when prepared (scripts/prepare_data), else the committed data/sample.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
THREADS=$(nproc); STEPS=8; ONLY=""
while [ $# -gt 0 ]; do
  case $1 in
    --threads) THREADS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    *) echo "usage: $0 [--threads N] [--steps N] [--only NAME,...]" >&2; exit 2 ;;
  esac
done
PY=/usr/bin/python3
TRAIN=${TRAIN:-./train}
[ -x "$TRAIN" ] || { echo "bench_cpu_bf16: $TRAIN missing; run make first" >&2; exit 1; }
DATA=data/brown; [ -f $DATA/val.bin ] || DATA=data/sample
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
WARM=2

# name L NH C T B (the default plan's model; GPT-2 124M at llm.c's T 64 and at T 256; GPT-2 medium's width)
configs=(
  "default 4 4 128 128 8"
  "gpt2-124M@T64 12 12 768 64 4"
  "gpt2-124M@T256 12 12 768 256 4"
  "gpt2-medium-L6@T128 6 16 1024 128 4"
)
printf '%-20s %7s %10s %10s %8s %11s %11s %12s %11s %11s\n' config tokens "fp32 t/s" "bf16 t/s" speedup \
  "fp32 mm GF" "bf16 mm GF" "loss diff" "torch fp32" "torch bf16" > "$out/table"
for c in "${configs[@]}"; do
  read -r name L NH C T B <<<"$c"
  [ -z "$ONLY" ] || [[ ",$ONLY," == *",$name,"* ]] || continue
  for prec in fp32 bf16; do
    echo "== $name $prec: L=$L NH=$NH C=$C T=$T B=$B, $THREADS threads, data $DATA" >&2
    "$TRAIN" plans/default.json --set device=cpu --set precision.compute=$prec --set model.n_layer=$L \
        --set model.n_head=$NH --set model.n_embd=$C --set model.seq_len=$T --set batch.micro_batch=$B \
        --set batch.grad_accum=1 --set run.steps=$((STEPS + WARM)) --set run.eval_every=0 --set run.sample_every=0 \
        --set data.train="$DATA/train_*.bin" --set data.val=$DATA/val.bin --set data.tokenizer= \
        --set run.threads=$THREADS --set run.log="$out/$name.$prec/metrics.jsonl" \
        --set run.trace="$out/$name.$prec/trace.json" > "$out/$name.$prec.log" 2>&1 \
      || { cat "$out/$name.$prec.log" >&2; exit 1; }
    $PY bench/cpu_step.py --trace "$out/$name.$prec/trace.rank0.json" --log "$out/$name.$prec/metrics.jsonl" \
        --warm $WARM --layers $L --embd $C --seq $T --batch $B --threads $THREADS > "$out/$name.$prec.step"
    head -n -1 "$out/$name.$prec.step" >&2
  done
  for prec in fp32 bf16; do
    $PY bench/torch_bench.py --layers $L --heads $NH --embd $C --seq $T --batch $B --steps $STEPS \
        --warmup-steps $WARM --threads $THREADS --precision $prec 2> "$out/$name.torch-$prec.log" | tail -n 1 \
        > "$out/$name.torch-$prec.json" || { cat "$out/$name.torch-$prec.log" >&2; exit 1; }
    echo "   PyTorch $prec: $($PY -c "import json,sys; print(json.load(sys.stdin)['tokens_per_s'])" \
        < "$out/$name.torch-$prec.json") tokens/s" >&2
  done
  $PY - "$out" "$name" $((B * T)) >> "$out/table" <<'PY'
import json, sys
out, name, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch = {p: json.load(open(f"{out}/{name}.torch-{p}.json"))["tokens_per_s"] for p in ("fp32", "bf16")}
step = {p: json.loads(open(f"{out}/{name}.{p}.step").read().splitlines()[-1]) for p in ("fp32", "bf16")}
loss = {p: [json.loads(l)["loss"] for l in open(f"{out}/{name}.{p}/metrics.jsonl") if '"loss"' in l] for p in step}
diff = max(abs(b - f) / abs(f) for f, b in zip(loss["fp32"], loss["bf16"]))
f, b = step["fp32"], step["bf16"]
print(f"{name:<20} {tokens:7d} {f['tokens_per_s']:10.1f} {b['tokens_per_s']:10.1f} "
      f"{b['tokens_per_s'] / f['tokens_per_s']:7.2f}x {f['matmul_gflops']:11.1f} {b['matmul_gflops']:11.1f} {diff:12.2e} "
      f"{torch['fp32']:11.1f} {torch['bf16']:11.1f}")
PY
done
echo
cat "$out/table"
