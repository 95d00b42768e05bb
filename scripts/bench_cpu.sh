#!/usr/bin/env bash
# CPU training throughput of zerotrain next to llm.c and PyTorch, same model, same batch, same
# threads, in the same run, and against the machine's sgemm: for each model, our run (traced),
# where its step goes op by op and its FLOP rate as a share of numpy/OpenBLAS sgemm at the step's
# GEMM shapes (bench/cpu_step.py), then llm.c (bench/llmc_cpu.sh) and PyTorch
# (bench/torch_bench.py). Numbers are medians over the timed steps (first steps untimed).
# Every benchmark: docs/benchmarks.md.
#   scripts/bench_cpu.sh [--threads N] [--steps N] [--llmc DIR] [--only NAME,...] [--avx2]
# --llmc: a checkout of github.com/karpathy/llm.c (without it, no llm.c column).
# --only: these configs (names below) only.
# --avx2: everything as on a CPU with AVX2 and FMA but no AVX-512 (Haswell to Zen 3), on this one:
#   OpenBLAS's Haswell kernels (numpy's sgemm, our GEMMs, PyTorch's), llm.c built -march=haswell,
#   PyTorch's AVX2 kernels, and TRAIN a binary built with cmake -DZT_CPU_ARCH=haswell (refused
#   if it holds an AVX-512 instruction).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
THREADS=$(nproc); STEPS=8; LLMC=""; ONLY=""; AVX2=0
while [ $# -gt 0 ]; do
  case $1 in
    --threads) THREADS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --llmc) LLMC=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --avx2) AVX2=1; shift ;;
    *) echo "usage: $0 [--threads N] [--steps N] [--llmc DIR] [--only NAME] [--avx2]" >&2; exit 2 ;;
  esac
done
PY=/usr/bin/python3
TRAIN=${TRAIN:-./train}
[ -x "$TRAIN" ] || { echo "bench_cpu: $TRAIN missing; run make first" >&2; exit 1; }
if [ $AVX2 = 1 ]; then
  # (grep -c reads it all: grep -q would stop objdump early, and pipefail would read the SIGPIPE as no match)
  if [ "$(objdump -d "$TRAIN" | grep -c zmm)" != 0 ]; then
    echo "bench_cpu: --avx2: $TRAIN uses AVX-512; build one with cmake -DZT_CPU_ARCH=haswell and pass it as TRAIN=" >&2
    exit 1
  fi
  export OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 LLMC_MARCH=haswell
fi
[ -f data/brown/val.bin ] || { echo "bench_cpu: data/brown missing; run scripts/prepare_data first" >&2; exit 1; }
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
WARM=2

# name L NH C T B [--set ...]   (default: plans/default.json's model and batch, whose LM head runs in
# chunks, its gradients taken in forward (docs/design.md §3.11); default-whole: the same without chunks;
# gpt2-124M@T64: llm.c's train_gpt2.c)
configs=(
  "default 4 4 128 128 8"
  "default-whole 4 4 128 128 8 --set recompute.classifier_chunk=0"
  "gpt2-124M@T64 12 12 768 64 4"
  "gpt2-124M@T256 12 12 768 256 4"
)
printf '%-16s %7s %10s %9s %9s %9s %9s %8s %8s\n' config tokens "ours t/s" "% sgemm" "sgemm GF" \
  "llm.c t/s" "torch t/s" "/llm.c" "/torch" > "$out/table"
for c in "${configs[@]}"; do
  read -r name L NH C T B extra <<<"$c"
  [ -z "$ONLY" ] || [[ ",$ONLY," == *",$name,"* ]] || continue
  echo "== $name: L=$L NH=$NH C=$C T=$T B=$B, $THREADS threads" >&2
  "$TRAIN" plans/default.json --set model.n_layer=$L --set model.n_head=$NH --set model.n_embd=$C \
      --set model.seq_len=$T --set batch.micro_batch=$B --set batch.grad_accum=1 --set run.steps=$((STEPS + WARM)) \
      --set run.eval_every=0 --set run.eval_batches=1 --set run.sample_every=0 --set data.tokenizer= \
      --set run.threads=$THREADS --set run.log="$out/$name/metrics.jsonl" --set run.trace="$out/$name/trace.json" \
      --set run.final_weights="$out/$name/weights.bin" $extra > "$out/$name.log" 2>&1 \
      || { cat "$out/$name.log" >&2; exit 1; }
  $PY bench/cpu_step.py --trace "$out/$name/trace.rank0.json" --log "$out/$name/metrics.jsonl" --warm $WARM \
      --layers $L --embd $C --seq $T --batch $B --threads $THREADS > "$out/$name.step"
  head -n -1 "$out/$name.step" >&2
  read -r ours frac sgemm < <(tail -n 1 "$out/$name.step" | $PY -c "
import json,sys; r=json.load(sys.stdin); print(r['tokens_per_s'], r['of_sgemm'], r['sgemm_gflops'])")
  llmc=nan
  [ -z "$LLMC" ] || llmc=$(bench/llmc_cpu.sh "$LLMC" "$out/$name/weights.bin" $B $T $STEPS $WARM $THREADS)
  theirs=$($PY bench/torch_bench.py --layers $L --heads $NH --embd $C --seq $T --batch $B \
      --steps $STEPS --warmup-steps $WARM --threads $THREADS | tail -n 1 | $PY -c "import json,sys; print(json.load(sys.stdin)['tokens_per_s'])")
  echo "   llm.c $llmc tokens/s, PyTorch $theirs tokens/s" >&2
  $PY -c "
n,ours,frac,sgemm,llmc,torch = '$name',$ours,$frac,$sgemm,float('$llmc'),$theirs
print(f'{n:<16} {$((B * T)):7d} {ours:10.1f} {100*frac:8.1f}% {sgemm:9.1f} {llmc:9.1f} {torch:9.1f} {ours/llmc:7.2f}x {ours/torch:7.2f}x')
" >> "$out/table"
done
echo
cat "$out/table"
