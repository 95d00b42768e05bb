#!/usr/bin/env bash
# llm.c's CPU trainer (train_gpt2.c, fp32, OpenMP) on the same model, batch and threads, for
# scripts/bench_cpu.sh. llm.c hard-codes its checkpoint, data, B = 4, T = 64 and 40 steps with
# evaluation and sampling: a copy of the source gets ours (the weights from a zerotrain run's
# run.final_weights, an llm.c .bin; data/brown, llm.c's shard format), no sampling, one evaluation
# before step 0 (untimed). Prints the median tokens/s over the steps after `warm`.
#   bench/llmc_cpu.sh LLMC_DIR WEIGHTS.bin B T STEPS WARM THREADS
# LLMC_DIR: a checkout of github.com/karpathy/llm.c (measured: f1e2ace).
set -euo pipefail
[ $# -eq 7 ] || { echo "usage: $0 LLMC_DIR WEIGHTS.bin B T STEPS WARM THREADS" >&2; exit 2; }
LLMC=$1; WEIGHTS=$(realpath "$2"); B=$3; T=$4; STEPS=$5; WARM=$6; THREADS=$7
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$LLMC/train_gpt2.c" ] || { echo "llmc_cpu: $LLMC/train_gpt2.c missing" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
sed -e "s|\"gpt2_124M.bin\"|\"$WEIGHTS\"|" \
    -e "s|\"dev/data/tinyshakespeare/tiny_shakespeare_train.bin\"|\"$ROOT/data/brown/train_000.bin\"|" \
    -e "s|\"dev/data/tinyshakespeare/tiny_shakespeare_val.bin\"|\"$ROOT/data/brown/val.bin\"|" \
    -e "s|int B = 4;|int B = $B;|" -e "s|int T = 64;|int T = $T;|" \
    -e "s|step <= 40;|step < $((STEPS + WARM));|" -e "s|step % 10 == 0|step == 0|" \
    -e "s|step > 0 \&\& step % 20 == 0|0|" "$LLMC/train_gpt2.c" > "$work/train_gpt2.c"
for pat in "$WEIGHTS" "int B = $B;" "int T = $T;" "step < $((STEPS + WARM));" "step == 0"; do
  grep -qF "$pat" "$work/train_gpt2.c" || { echo "llmc_cpu: could not patch train_gpt2.c ($pat)" >&2; exit 1; }
done
# llm.c's Makefile flags for its CPU build (LLMC_MARCH: another CPU kind, scripts/bench_cpu.sh --avx2)
gcc -Ofast -march=${LLMC_MARCH:-native} -fopenmp -DOMP -Wno-unused-result -I"$LLMC" "$work/train_gpt2.c" -lm -o "$work/train_gpt2"
(cd "$work" && OMP_NUM_THREADS=$THREADS ./train_gpt2 > log 2>&1) || { cat "$work/log" >&2; exit 1; }
/usr/bin/python3 - "$work/log" "$WARM" "$B" "$T" <<'EOF'
import re, statistics, sys
log, warm, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ms = [float(m) for m in re.findall(r"^step \d+: train loss \S+ \(took (\S+) ms\)", open(log).read(), re.M)][warm:]
if not ms:
    sys.exit(f"llmc_cpu: no timed steps in {log}")
print(B * T / (statistics.median(ms) / 1e3))
EOF
