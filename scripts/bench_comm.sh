#!/usr/bin/env bash
# Communication benchmark of the ZeRO engine on the CPU backend: 2 ranks under mpirun, one thread
# each, every stage with overlap_comm on and off. A benchmark, not a test: it prints a table
# (the numbers: docs/multihost.md; every benchmark: docs/benchmarks.md).
#
#   scripts/bench_comm.sh [--model gpt2-124m|small|mh|ovl|deep|emb|tiny] [--steps N] [--warmup N] [--np N] [--train PATH]
#                         [--hosts H --rate RATE] [--repeat R] [--trace] [--stages "0 1 2 3"]
#                         [--set KEY=VALUE]...
#
# --set KEY=VALUE: a plan key for every run (e.g. --set comm.collectives=mpi_blocking), repeatable.
# --hosts H: multi-host mode. H hosts in network namespaces (scripts/cluster, root), one rank each
# (--np is ignored), Open MPI's TCP transport between them, every host's egress limited to RATE
# with tc tbf (default 1gbit; "off" = unlimited veth). The cluster is removed at exit.
#
# Per configuration, over the timed steps (the first --warmup steps are dropped):
#   step ms     median wall time of an optimizer step (rank 0)
#   wait ms     median comm_wait_ms: time rank 0 spent blocked in Comm::wait (collectives,
#               blocking helpers included) -- the communication that was NOT hidden
#   bytes/step  model-state bytes rank 0 sent per step under the ring byte model (comm.h)
#   hidden      1 - wait_on / wait_off for the stage: with overlap off every collective is started
#               and waited on the spot, so wait_off is (about) all of the communication time, and
#               hidden is the fraction of it that no longer shows up as waiting
#   compute     (overlap off rows) step ms - wait ms: the step without its communication; with
#               comm/compute = wait_off / compute, how much there is to hide behind how much
# --trace: the overlap-on runs also write a timeline trace (run.trace), and after the table rank
# 0's remaining wait is broken down by the collective it waited for (op, unit or bucket, bytes),
# per timed step: where the communication that is not hidden comes from.
# --repeat R runs every configuration R times (on and off alternating) and takes the medians over
# all their timed steps: on a shared machine one slow run then moves the table less.
# Models (--model): scripts/bench_lib.sh, which holds what this script shares with bench_hybrid.sh.
# Ranks share the machine's cores: on a 2-core machine each rank has one core, and the MPI
# progress of a non-blocking collective competes with compute (Open MPI progresses only inside
# MPI calls, see src/zero/engine.h).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. scripts/bench_lib.sh
MODEL=; STEPS=8; WARM=2; NP=2; TRAIN=./train; MPIEXEC=${MPIEXEC:-mpirun}; HOSTS=0; RATE=1gbit; REPEAT=1; TRACE=0; STAGES="0 1 2 3"; SETS=()
while [ $# -gt 0 ]; do
  case $1 in
    --model) MODEL=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARM=$2; shift 2 ;;
    --np) NP=$2; shift 2 ;;
    --train) TRAIN=$2; shift 2 ;;
    --hosts) HOSTS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --trace) TRACE=1; shift ;;
    --stages) STAGES=$2; shift 2 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    *) echo "usage: $0 [--model gpt2-124m|small|mh|ovl|deep|emb|tiny] [--steps N] [--warmup N] [--np N] [--train PATH] [--hosts H --rate RATE] [--repeat R] [--trace] [--stages \"0 1 2 3\"] [--set KEY=VALUE]..." >&2; exit 2 ;;
  esac
done
[ -n "$MODEL" ] || { [ "$HOSTS" -gt 0 ] && MODEL=ovl || MODEL=gpt2-124m; }
bench_model "$MODEL" || exit 2
bench_train_sets
PY=/usr/bin/python3
[ -x "$TRAIN" ] || { echo "bench_comm: $TRAIN missing; build first (make)" >&2; exit 1; }
bench_env
bench_outdir  # BENCH_KEEP=DIR: the runs' logs, metrics and traces are copied there
LAUNCH=("$MPIEXEC" --oversubscribe -np "$NP")
WHERE="$NP ranks x 1 thread"
if [ "$HOSTS" -gt 0 ]; then
  bench_cluster ztb$$ "$HOSTS" 1 "$RATE"
fi

echo "bench_comm: $MODEL (L=$L NH=$NH C=$C T=$T B=$B), $WHERE, $STEPS timed steps after $WARM warm-up, x$REPEAT ${SETS[*]}" >&2
for stage in $STAGES; do
  for rep in $(seq 1 "$REPEAT"); do
    for ov in true false; do
      name="s${stage}_${ov}_$rep"
      echo "== stage $stage, overlap_comm $ov (run $rep)" >&2
      t0=$(date +%s)
      tr=(); [ "$TRACE" = 1 ] && [ "$ov" = true ] && tr=(--set run.trace="$out/$name/trace.json")
      "${LAUNCH[@]}" "$TRAIN" plans/default.json "${tr[@]}" "${SETS[@]}" \
        "${TRAIN_SETS[@]}" --set run.steps=$((STEPS + WARM)) \
        --set zero.stage=$stage --set zero.overlap_comm=$ov --set run.log="$out/$name/metrics.jsonl" \
        > "$out/$name.log" 2>&1 || { tail -30 "$out/$name.log" >&2; exit 1; }
      echo "   $(( $(date +%s) - t0 )) s" >&2
    done
  done
done

$PY - "$out" "$WARM" "$WHERE" "$MODEL" "$REPEAT" "$TRACE" "$STAGES" <<'PY'
import collections, json, os, statistics, sys
out, warm, where, model, repeat, trace = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6] == "1"
stages = [int(x) for x in sys.argv[7].split()]
def load(stage, ov):
    steps = []
    for rep in range(1, repeat + 1):
        rows = [json.loads(l) for l in open(f"{out}/s{stage}_{ov}_{rep}/metrics.jsonl")]
        steps += [r for r in rows if "ms" in r][warm:]
    return (statistics.median(r["ms"] for r in steps), statistics.median(r["comm_wait_ms"] for r in steps),
            steps[-1]["comm_bytes"])
print(f"\ncommunication benchmark: {model}, {where}, medians over the timed steps of {repeat} run(s) each\n")
print(f"{'stage':>5} {'overlap':>7} {'step ms':>9} {'wait ms':>9} {'wait %':>7} {'MiB/step':>9} {'hidden':>7} "
      f"{'compute':>8} {'comm/compute':>12}")
for s in stages:
    on, off = load(s, "true"), load(s, "false")
    for ov, (ms, wait, b) in (("on", on), ("off", off)):
        hidden = f"{1 - on[1] / off[1]:7.0%}" if ov == "on" and off[1] > 0 else f"{'':>7}"
        extra = f"{ms - wait:8.0f} {wait / (ms - wait):12.2f}" if ov == "off" else ""
        print(f"{s:>5} {ov:>7} {ms:9.1f} {wait:9.1f} {wait / ms:7.0%} {b / 2**20:9.1f} {hidden} {extra}")
if trace:
    print("\nwhere rank 0 still waits, overlap on (ms per timed step, by the collective waited for):")
    for s in stages:
        per, n_steps = collections.Counter(), 0
        for rep in range(1, repeat + 1):
            path = f"{out}/s{s}_true_{rep}/trace.rank0.json"
            if not os.path.exists(path):
                continue
            ev = json.load(open(path))["traceEvents"]
            steps = [e for e in ev if e.get("ph") == "X" and e.get("name", "").startswith("step ")]
            steps = sorted(steps, key=lambda e: e["ts"])[warm:]
            n_steps += len(steps)
            colls = {e["args"]["seq"]: e for e in ev if e.get("ph") == "X" and "bytes" in e.get("args", {})}
            for w in ev:
                if w.get("ph") != "X" or not w.get("name", "").startswith("wait #"):
                    continue
                if not any(st["ts"] <= w["ts"] <= st["ts"] + st["dur"] for st in steps):
                    continue
                c = colls.get(w["args"]["seq"], {})
                a = c.get("args", {})
                tag = ",".join(f"{k} {a[k]}" for k in ("unit", "bucket") if k in a)
                per[f"{c.get('name', '?')} {a.get('bytes', 0) / 2**20:.1f} MiB" + (f" ({tag})" if tag else "")] += w["dur"] / 1e3
        if n_steps:
            top = ", ".join(f"{k}: {v / n_steps:.0f}" for k, v in per.most_common(6))
            print(f"  stage {s}: {sum(per.values()) / n_steps:.0f} ms: {top}")
PY
