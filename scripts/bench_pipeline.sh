#!/usr/bin/env bash
# Pipeline parallelism across two hosts (issue 54): one stage per host (mesh.pipeline 2, ZeRO-1 on
# each host's data axis, 1F1B) against DDP and full ZeRO-3 over all ranks, the same model and global
# batch, in one invocation on the namespace test bed: bytes that cross the link per step and the
# step time. A benchmark, not a test: it prints one table (numbers: docs/benchmarks.md).
#
#   scripts/bench_pipeline.sh [--model ovl|deep|emb|mh|small|tiny] [--per-host P] [--rate RATE]
#                             [--accum A] [--steps K] [--warmup W] [--train PATH] [--set KEY=VALUE]...
#
# 2 namespace hosts (scripts/cluster, root) with P ranks each (default 2), by slot (ranks 0..P-1 on
# host 0), Open MPI's TCP between hosts, shared memory within one, every host's egress limited to
# RATE with tc tbf (default 1gbit). The same global batch everywhere: ddp and zero3 run grad_accum A
# (default 2) over 2P ranks, pipe2 runs m = 2A micro-batches over its P data ranks per stage.
#
# Columns, per configuration:
#   veth MiB/step  what crossed the link per step, counted outside the program: each host's eth0
#                  TX bytes before and after each run; every configuration runs W and W + K steps
#                  and (TX(long) - TX(short)) / K per host removes start-up and shut-down traffic
#                  (mean over the two hosts: for the pipeline host 0 sends activations, host 1
#                  their gradients, both the tied embedding's gradient shards)
#   expected       one host's egress by the byte model: ddp / zero3 the estimate's bytes_per_step
#                  (a ring over all ranks leaves each host once per hop round, docs/benchmarks.md
#                  "hybrid sharding"); pipe2 P x (m x B x T x C x 4, the (B, T, C) boundary of each
#                  micro-batch one way, + (Vp + T) x C x 4 / P, this rank's shard of the embedding
#                  unit's gradient, summed between the first and the last stage)
#   program        the run's own count: bytes_sent_per_step (ddp, zero3); pipe2 P x bytes_pipeline_group_per_step,
#                  what rank 0 sent to the other stage (the data axis stays on the host)
#   step ms        median of the long run's timed steps (rank 0's metrics, the first W dropped)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/bench_lib.sh
. scripts/bench_lib.sh
MODEL=ovl; PER_HOST=2; RATE=1gbit; ACCUM=2; STEPS=4; WARM=2; TRAIN=./train; SETS=()
usage="usage: $0 [--model NAME] [--per-host P] [--rate RATE] [--accum A] [--steps K] [--warmup W] [--train PATH] [--set KEY=VALUE]..."
while [ $# -gt 0 ]; do
  case $1 in
    --model) MODEL=$2; shift 2 ;;
    --per-host) PER_HOST=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --accum) ACCUM=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARM=$2; shift 2 ;;
    --train) TRAIN=$2; shift 2 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
for v in PER_HOST ACCUM STEPS WARM; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench_pipeline: --$(tr 'A-Z_' 'a-z-' <<<"$v") must be a positive integer, got '${!v}'" >&2; exit 2; }
done
bench_model "$MODEL" || exit 2
bench_train_sets
[ -x "$TRAIN" ] || { echo "bench_pipeline: $TRAIN missing; build first (make) or give --train" >&2; exit 1; }
TRAIN=$(realpath "$TRAIN")
W=$((2 * PER_HOST))
bench_env
bench_outdir

# name | plan keys (after TRAIN_SETS, which set grad_accum 1)
CONFIGS=("ddp|--set zero.stage=0 --set batch.grad_accum=$ACCUM"
         "zero3|--set zero.stage=3 --set batch.grad_accum=$ACCUM"
         "pipe2|--set zero.stage=1 --set batch.grad_accum=$((2 * ACCUM)) --set mesh.pipeline=2 --set mesh.schedule=1f1b")
for cfg in "${CONFIGS[@]}"; do
  name=${cfg%%|*}; read -ra keys <<<"${cfg#*|}"
  "$TRAIN" estimate plans/default.json "${TRAIN_SETS[@]}" "${SETS[@]}" "${keys[@]}" --world "$W" --json >"$out/$name.estimate.json"
done

bench_cluster "${ZT_CLUSTER:-ztp$$}" 2 "$PER_HOST" "$RATE"
mapfile -t HOSTNAMES < <(scripts/cluster hosts)
tx() { local h; for h in "${HOSTNAMES[@]}"; do echo "$h $(ip netns exec "$h" cat /sys/class/net/eth0/statistics/tx_bytes)"; done; }

echo "bench_pipeline: $MODEL (L=$L NH=$NH C=$C T=$T B=$B), $WHERE, $WARM and $((WARM + STEPS)) steps ${SETS[*]}" >&2
for cfg in "${CONFIGS[@]}"; do
  name=${cfg%%|*}; read -ra keys <<<"${cfg#*|}"
  for len in short long; do
    steps=$WARM; [ "$len" = short ] || steps=$((WARM + STEPS))
    run=$name.$len
    echo "== $name ${keys[*]}: $steps steps" >&2
    tx >"$out/$run.tx0"
    "${LAUNCH[@]}" "$TRAIN" plans/default.json "${TRAIN_SETS[@]}" "${SETS[@]}" "${keys[@]}" --set run.steps="$steps" \
      --set run.log="$out/$run/metrics.jsonl" >"$out/$run.log" 2>&1 || { tail -30 "$out/$run.log" >&2; exit 1; }
    tx >"$out/$run.tx1"
  done
done

/usr/bin/python3 - "$out" "$WARM" "$STEPS" "$PER_HOST" "$ACCUM" "$MODEL" "$WHERE" "$TRAIN" "$B" "$T" "$C" <<'PY'
import json, statistics, sys
out = sys.argv[1]
warm, k, per_host, accum = (int(x) for x in sys.argv[2:6])
model, where, train = sys.argv[6:9]
B, T, C = (int(x) for x in sys.argv[9:12])
MiB, Vp = 2**20, (50257 + 127) // 128 * 128
def tx(run, which):
    return {h: int(v) for h, v in (l.split() for l in open(f"{out}/{run}.tx{which}"))}
rows = {}
for name in ("ddp", "zero3", "pipe2"):
    est = json.load(open(f"{out}/{name}.estimate.json"))
    lines = [json.loads(l) for l in open(f"{out}/{name}.long/metrics.jsonl")]
    summary = next(l["summary"] for l in lines if "summary" in l)
    per_host_tx = []
    for h, t1 in tx(f"{name}.long", 1).items():
        long_b = t1 - tx(f"{name}.long", 0)[h]
        short_b = tx(f"{name}.short", 1)[h] - tx(f"{name}.short", 0)[h]
        per_host_tx.append((long_b - short_b) / k / MiB)
    if name == "pipe2":
        m = 2 * accum
        expected = per_host * (m * B * T * C * 4 + (Vp + T) * C * 4 / per_host)
        program = per_host * summary["bytes_pipeline_group_per_step"]
    else:
        expected, program = est["bytes_per_step"], summary["bytes_sent_per_step"]
    ms = statistics.median(l["ms"] for l in [l for l in lines if "ms" in l][warm:])
    rows[name] = dict(veth=statistics.mean(per_host_tx), hosts=per_host_tx, expected=expected / MiB,
                      program=program / MiB, ms=ms, loss=[l["loss"] for l in lines if "loss" in l][-1])
print(f"\npipeline benchmark: {model} (B {B}, T {T}, C {C}), {where}; global batch {B * accum * 2 * per_host} "
      f"sequences per step; bytes per step = (TX({warm + k}) - TX({warm})) / {k} per host, mean of the 2 hosts; {train}\n")
print(f"{'config':<7} {'veth MiB/step':>13} {'(host0, host1)':>16} {'expected':>9} {'program':>8} {'vs ddp':>7} "
      f"{'vs zero3':>8} {'step ms':>8} {'last loss':>10}")
for name, r in rows.items():
    print(f"{name:<7} {r['veth']:13.2f} {'(%.1f, %.1f)' % tuple(r['hosts']):>16} {r['expected']:9.2f} {r['program']:8.2f} "
          f"{r['veth'] / rows['ddp']['veth']:7.3f} {r['veth'] / rows['zero3']['veth']:8.3f} {r['ms']:8.0f} {r['loss']:10.4f}")
PY
