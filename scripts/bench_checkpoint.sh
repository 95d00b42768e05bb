#!/usr/bin/env bash
# Checkpoint benchmark (docs/design.md §3.7; the numbers: docs/checkpoints.md): save, load and
# export of a GPT-2 124M-shaped model (L12 H12 C768, vocabulary 50257; seq_len 64 as in
# bench_comm.sh, so the position table has 64 rows instead of 1024: 123.7M parameters instead of
# 124.4M) at world 1 (stage 0) and world 4 (stage 3), against dd on the same disk. A benchmark,
# not a test: it prints a table.
#
#   scripts/bench_checkpoint.sh [--dir DIR] [--train PATH] [--np "1 4"]
#
# Per world size: one training step that saves a checkpoint (fp32 parameters + AdamW moments:
# 12 bytes per parameter in all, each rank writing its share and fsyncing it), then a run that
# only resumes from it (every rank reading the ranges its store holds, checksums verified), then
# `train export --format llmc`. Times and GB/s are the binary's own summary lines ("checkpoint:
# saved/loaded/exported ..."): wall time of the whole operation on rank 0 (save: from the first
# file created to `latest` renamed; load: the slowest rank). dd writes the same number of bytes
# with conv=fsync (one stream) and reads them back. The load reads files that were just written,
# so it is served from the page cache unless it could be dropped (root: /proc/sys/vm/drop_caches);
# the dd read is measured under the same condition. "dd cp" copies rank 0's file with conv=fsync
# (its source in the page cache, as the save's is in memory): the closest dd can come to the save.
# Where a save's time goes on the 2-core reference VM (perf record of a whole world-1 run, init +
# one step + an 8 s save): 38% of all samples are the kernel copying the store's buffers into the
# page cache (pwrite -> copy_folio_from_iter_atomic), CRC-32C 2.5%, HDF5 and fsync under 1% each.
# dd copies through a 1 MiB buffer that stays in the CPU caches; the save reads 1.5 GB of memory.
# Filling the page cache is as slow as the disk there (~0.4 GB/s for 1.4 GB of fresh pages), and
# below the kernel's dirty thresholds nothing was written until the final fsync: the two ran one
# after the other. The save now starts each file's writeback as pieces are added, so they overlap.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DIR=${TMPDIR:-/tmp}/zt_bench_checkpoint; TRAIN=./train; NPS="1 4"; MPIEXEC=${MPIEXEC:-mpirun}
while [ $# -gt 0 ]; do
  case $1 in
    --dir) DIR=$2; shift 2 ;;
    --train) TRAIN=$2; shift 2 ;;
    --np) NPS=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "bench_checkpoint: unknown argument $1" >&2; exit 2 ;;
  esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
rm -rf "$DIR"; mkdir -p "$DIR"
trap 'rm -rf "$DIR"' EXIT

drop_caches() { sync; if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then echo cold; else echo "page cache"; fi; }
# "checkpoint: saved DIR: 1.38 GiB in 1.234 s (1.20 GB/s)" -> "1.234 1.20"
secs_rate() { grep -m1 "^checkpoint: $1" | sed -E 's/.* in ([0-9.]+) s \(([0-9.]+) GB\/s\).*/\1 \2/'; }

SETS=(--set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 --set model.seq_len=64
      --set data.train=data/sample/train_*.bin --set data.val=data/sample/val.bin --set data.tokenizer=
      --set batch.micro_batch=1 --set batch.grad_accum=1 --set run.steps=1 --set run.eval_every=0
      --set run.eval_batches=1 --set run.sample_every=0 --set run.threads=1)

echo "disk: $(df -h "$DIR" | awk 'NR==2 {print $1" ("$2", "$4" free)"}'), $(nproc) cores"
printf "%-6s %-6s %10s | %9s %8s | %9s %8s %-10s | %9s %8s | %8s %10s %-10s %10s\n" world stage size "save s" "GB/s" \
  "load s" "GB/s" "(cache)" "export s" "GB/s" "dd w GB/s" "dd r GB/s" "(cache)" "dd cp GB/s"
for np in $NPS; do
  stage=$([ "$np" -gt 1 ] && echo 3 || echo 0)
  run() { if [ "$np" -gt 1 ]; then "$MPIEXEC" --oversubscribe -np "$np" "$TRAIN" plans/base.json "$@"; else "$TRAIN" plans/base.json "$@"; fi; }
  ck=$DIR/ck$np
  out=$(run "${SETS[@]}" --set zero.stage=$stage --set checkpoint.dir="$ck" --set checkpoint.every=1 \
        --set run.log="$DIR/run$np/save.jsonl" 2>&1) || { echo "$out" | tail -5; exit 1; }
  read -r save_s save_r < <(echo "$out" | secs_rate saved)
  bytes=$(du -sb "$ck/step_00000001" | cut -f1)
  cache=$(drop_caches)
  out=$(run "${SETS[@]}" --set zero.stage=$stage --set checkpoint.dir="$ck" --set checkpoint.resume=auto \
        --set run.log="$DIR/run$np/load.jsonl" 2>&1) || { echo "$out" | tail -5; exit 1; }
  read -r load_s load_r < <(echo "$out" | secs_rate loaded)
  out=$("$TRAIN" export "$ck" --format llmc --out "$DIR/export$np.bin" 2>&1) || { echo "$out"; exit 1; }
  read -r exp_s exp_r < <(echo "$out" | secs_rate exported)
  # dd: the same bytes, one stream, synced at the end; then read back. And dd copying rank 0's
  # file (1/world of the checkpoint; its source in memory like the save's), synced.
  mb=$(( (bytes + 1048575) / 1048576 ))
  ddw=$(dd if=/dev/zero of="$DIR/dd.bin" bs=1M count=$mb conv=fsync 2>&1 | tail -1)
  ddw_s=$(echo "$ddw" | sed -E 's/.*, ([0-9.]+) s, .*/\1/')
  ddcache=$(drop_caches)
  ddr=$(dd if="$DIR/dd.bin" of=/dev/null bs=1M 2>&1 | tail -1)
  ddr_s=$(echo "$ddr" | sed -E 's/.*, ([0-9.]+) s, .*/\1/')
  rm -f "$DIR/dd.bin"
  cat "$ck/step_00000001/rank_00000.h5" > /dev/null
  ddc=$(dd if="$ck/step_00000001/rank_00000.h5" of="$DIR/dd.bin" bs=1M conv=fsync 2>&1 | tail -1)
  ddc_rate=$(echo "$ddc" | awk -F', ' '{ split($1, a, " "); split($3, t, " "); printf "%.2f", a[1] / t[1] / 1e9 }')
  rm -f "$DIR/dd.bin"
  rate() { awk -v b="$bytes" -v s="$1" 'BEGIN { printf "%.2f", b / s / 1e9 }'; }
  printf "%-6s %-6s %10s | %9s %8s | %9s %8s %-10s | %9s %8s | %8s %10s %-10s %10s\n" "$np" "$stage" \
    "$(awk -v b="$bytes" 'BEGIN { printf "%.2f GB", b / 1e9 }')" "$save_s" "$save_r" "$load_s" "$load_r" "($cache)" \
    "$exp_s" "$exp_r" "$(rate "$ddw_s")" "$(rate "$ddr_s")" "($ddcache)" "$ddc_rate"
  rm -rf "$ck" "$DIR/export$np.bin"
done
