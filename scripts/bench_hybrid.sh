#!/usr/bin/env bash
# Hybrid sharding (zero.shard_group "host") measured on the two-host test bed: how many bytes cross
# the link between hosts per step, and the step time, against DDP and full ZeRO-3 in the same
# invocation. A benchmark, not a test: it prints one table (docs/benchmarks.md says what it
# measures; the numbers: docs/zero.md / docs/multihost.md).
#
#   scripts/bench_hybrid.sh [--model ovl|deep|emb|mh|small|gpt2-124m|tiny] [--hosts H] [--per-host P]
#                           [--rate RATE] [--steps K] [--warmup W] [--repeat R] [--stages "1 2"]
#                           [--train PATH] [--set KEY=VALUE]...
#
# H namespace hosts (default 2, scripts/cluster, root) with P ranks each (default 2), mapped by slot
# (ranks 0..P-1 on host 0, ...), Open MPI's TCP transport between hosts and shared memory within
# one, every host's egress limited to RATE with tc tbf (default 1gbit; "off": unlimited veth). The
# cluster is named $ZT_CLUSTER (default ztb$$) and removed at exit whatever ends the script.
# Model: --model (default ovl; the list: scripts/bench_lib.sh); tiny checks the script in seconds.
# --set KEY=VALUE: a plan key for every run, repeatable. BENCH_KEEP=DIR keeps the runs' logs there.
# --repeat R (default 1): R rounds of the long runs, every configuration once per round, in the
# order below (the short runs once, in the first round): on a shared machine the load moves
# between runs, and rounds spread it over the configurations instead of giving each one a
# stretch of its own. Step times are the median over all rounds' timed steps, bytes per step
# the mean over rounds and hosts.
#
# Configurations, one after the other in this order:
#   ddp         stage 0 (zero.shard_group "world": every rank one ring over all W = H*P ranks)
#   zero3       stage 3, shard group world (full ZeRO-3)
#   zero3-host  stage 3, zero.shard_group "host" (shard within a host, replicate across hosts)
#   zeroS-host  for each S of --stages (1, 2): stage S hybrid (default: none)
# A binary without zero.shard_group (before issue 52) refuses the hybrid rows: each is printed as
# "refused" with the binary's own line, and the other rows are still measured.
#
# Columns, per configuration:
#   veth MiB/step   bytes that crossed the link per step, counted outside the program: each host's
#                   eth0 (the namespace end of its veth) TX byte counter, /sys/class/net/eth0/
#                   statistics/tx_bytes read in the host's namespace before and after each run.
#                   Start-up and shut-down traffic (Open MPI's wire-up, the plan agreement,
#                   the initial broadcasts, the final evaluation's reduction) is removed by
#                   running each configuration twice: W steps, then W+K steps, the same otherwise;
#                   per host (TX(long) - TX(short)) / K, the mean over the hosts and rounds (each
#                   host's and round's in the details below the table). It counts what the kernel sent: Ethernet, IP and
#                   TCP headers, ACKs for the other direction and Open MPI's own headers included,
#                   so measured/expected sits a few percent above 1.
#   expected        what one host's egress carries per step by the program's byte model
#                   (`train estimate --world W --json`, ring model, comm.h):
#                   - shard group world (ddp, zero3): every collective is a ring r -> r+1 over the
#                     W ranks (src/comm/ring.h), each rank sending bytes_per_step to its successor.
#                     With consecutive ranks on a host, the ring leaves host h once, from its last
#                     rank (h*P+P-1) to the next host's first, and enters it once: each host's egress
#                     carries exactly one rank's bytes_per_step (and receives another's). So
#                     expected = bytes_per_step (for DDP 2(W-1)/W*e*Psi + the lookup exchange;
#                     for ZeRO-3 (W-1)/W*e*(3Psi + Pe - Pl + Pc), docs/zero.md).
#                   - shard group host (S = P): the shard group's collectives stay on the host
#                     (shared memory); each of the host's P ranks is in a replicate group of R = H
#                     ranks, one per host, whose ring crosses the link on every hop, so each rank
#                     sends its whole replicate-group figure off the host: expected = P x the
#                     estimate's replicate-group bytes per rank (2(R-1)/R*e*Psi_S/S).
#                   Collectives under 256 KiB per rank run Open MPI's own algorithms, not the ring;
#                   they are a few KiB per step at ovl (the tiny model's blocks are below that, so
#                   its ratios are not the ring's).
#   program         the same figure from the run's own counters (metrics JSONL summary, rank 0):
#                   bytes_sent_per_step for shard group world, P x the replicate-group bytes for host
#   vs zero3/ddp    veth MiB/step over the zero3 / ddp row's
#   step ms         median wall time of the long runs' timed steps (rank 0's metrics JSONL, the
#                   first W steps of each run dropped)
#   states MiB      model states per rank (params + grads + optimizer), tracked (rank 0's summary,
#                   peak) / `train estimate`
#   load            the lowest and highest 1-minute load average at the starts and ends of the
#                   long runs
# The issue's aim, printed under the table: zero3-host's veth bytes <= 0.5x zero3's and <= 0.75x
# ddp's, and its step time below both.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/bench_lib.sh
. scripts/bench_lib.sh
MODEL=ovl; HOSTS=2; PER_HOST=2; RATE=1gbit; STEPS=4; WARM=2; REPEAT=1; STAGES=; TRAIN=./train; SETS=()
usage="usage: $0 [--model NAME] [--hosts H] [--per-host P] [--rate RATE] [--steps K] [--warmup W] [--repeat R] [--stages \"1 2\"] [--train PATH] [--set KEY=VALUE]..."
while [ $# -gt 0 ]; do
  case $1 in
    --model) MODEL=$2; shift 2 ;;
    --hosts) HOSTS=$2; shift 2 ;;
    --per-host) PER_HOST=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARM=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --stages) STAGES=$2; shift 2 ;;
    --train) TRAIN=$2; shift 2 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
for v in HOSTS PER_HOST STEPS WARM REPEAT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench_hybrid: --$(tr 'A-Z_' 'a-z-' <<<"$v") must be a positive integer, got '${!v}'" >&2; exit 2; }
done
[ "$HOSTS" -ge 2 ] || { echo "bench_hybrid: --hosts must be at least 2 (nothing crosses a link otherwise)" >&2; exit 2; }
for s in $STAGES; do
  case $s in 1|2) ;; *) echo "bench_hybrid: --stages takes 1 and/or 2 (stages 0 and 3 are always run), got '$s'" >&2; exit 2 ;; esac
done
bench_model "$MODEL" || exit 2
bench_train_sets
[ -x "$TRAIN" ] || { echo "bench_hybrid: $TRAIN missing; build first (make) or give --train" >&2; exit 1; }
TRAIN=$(realpath "$TRAIN")
W=$((HOSTS * PER_HOST))
bench_env
bench_outdir

# name stage shard_group
CONFIGS=("ddp 0 world" "zero3 3 world" "zero3-host 3 host")
for s in $STAGES; do CONFIGS+=("zero$s-host $s host"); done

# The estimate of each configuration (before any host is made: a refusal costs nothing). For the
# estimate, "host" is the integer P: estimate has no launcher to ask, and by-slot mapping makes
# the ranks of a host consecutive, P of them.
for cfg in "${CONFIGS[@]}"; do
  read -r name stage group <<<"$cfg"
  g=(); [ "$group" = world ] || g=(--set zero.shard_group="$PER_HOST")
  if ! "$TRAIN" estimate plans/default.json "${SETS[@]}" "${TRAIN_SETS[@]}" --set zero.stage="$stage" "${g[@]}" \
      --world "$W" --json >"$out/$name.estimate.json" 2>"$out/$name.estimate.err"; then
    [ "$group" != world ] || { cat "$out/$name.estimate.err" >&2; exit 1; }
    { grep -m1 . "$out/$name.estimate.err" || echo "train estimate failed"; } >"$out/$name.refused"
    echo "bench_hybrid: $name refused by $TRAIN: $(cat "$out/$name.refused")" >&2
  fi
done

bench_cluster "${ZT_CLUSTER:-ztb$$}" "$HOSTS" "$PER_HOST" "$RATE"
mapfile -t HOSTNAMES < <(scripts/cluster hosts)
tx() { local h; for h in "${HOSTNAMES[@]}"; do echo "$h $(ip netns exec "$h" cat /sys/class/net/eth0/statistics/tx_bytes)"; done; }

echo "bench_hybrid: $MODEL (L=$L NH=$NH C=$C T=$T B=$B), $WHERE, per configuration $WARM and $REPEAT x $((WARM + STEPS)) steps ${SETS[*]}" >&2
for round in $(seq 1 "$REPEAT"); do
  for cfg in "${CONFIGS[@]}"; do
    read -r name stage group <<<"$cfg"
    [ ! -e "$out/$name.refused" ] || continue
    g=(); [ "$group" = world ] || g=(--set zero.shard_group="$group")
    lens=("long$round"); [ "$round" != 1 ] || lens=(short long1)
    for len in "${lens[@]}"; do
      steps=$WARM; [ "$len" = short ] || steps=$((WARM + STEPS))
      run=$name.$len
      echo "== $name: stage $stage, shard group $group, $steps steps (round $round)" >&2
      t0=$(date +%s)
      cut -d' ' -f1 /proc/loadavg >"$out/$run.load"
      tx >"$out/$run.tx0"
      if ! "${LAUNCH[@]}" "$TRAIN" plans/default.json "${SETS[@]}" "${TRAIN_SETS[@]}" --set run.steps="$steps" \
          --set zero.stage="$stage" "${g[@]}" --set run.log="$out/$run/metrics.jsonl" >"$out/$run.log" 2>&1; then
        if [ "$group" != world ] && grep -q 'shard_group' "$out/$run.log"; then  # the binary refused the key
          grep -m1 'shard_group' "$out/$run.log" >"$out/$name.refused"
          echo "   refused: $(cat "$out/$name.refused")" >&2
          break
        fi
        tail -30 "$out/$run.log" >&2; exit 1
      fi
      tx >"$out/$run.tx1"
      cut -d' ' -f1 /proc/loadavg >>"$out/$run.load"
      echo "   $(($(date +%s) - t0)) s, load average $(paste -sd' ' "$out/$run.load" | sed 's/ / -> /')" >&2
    done
  done
done

/usr/bin/python3 - "$out" "$WARM" "$STEPS" "$PER_HOST" "$REPEAT" "$MODEL" "$WHERE" "$TRAIN" "${CONFIGS[@]}" <<'PY'
import json, os, statistics, sys
out, warm, k, per_host, repeat = sys.argv[1], *(int(x) for x in sys.argv[2:6])
model, where, train = sys.argv[6:9]
configs = [c.split() for c in sys.argv[9:]]
longs = [f"long{r}" for r in range(1, repeat + 1)]
MiB = 2**20
def states(mem):
    return sum(mem[c] for c in ("params", "grads", "optimizer"))
def tx(run, which):
    return {h: int(v) for h, v in (l.split() for l in open(f"{out}/{run}.tx{which}"))}
def replicate_key(d):
    keys = [x for x in d if "replicate" in x and "bytes" in x and "theory" not in x]  # the names moved once
    if len(keys) != 1:
        sys.exit(f"bench_hybrid: expected one replicate-group bytes figure in {sorted(d)}")
    return keys[0]
rows, refused, details = {}, {}, []
for name, stage, group in configs:
    if os.path.exists(f"{out}/{name}.refused"):
        refused[name] = open(f"{out}/{name}.refused").read().strip()
        continue
    est = json.load(open(f"{out}/{name}.estimate.json"))
    steps, per_step, load = [], [], []
    for run in longs:
        lines = [json.loads(l) for l in open(f"{out}/{name}.{run}/metrics.jsonl")]
        summary = next(l["summary"] for l in lines if "summary" in l)
        steps += [l for l in lines if "ms" in l][warm:]
        load += [float(x) for x in open(f"{out}/{name}.{run}.load").read().split()]
        for h, t1 in tx(f"{name}.{run}", 1).items():
            long_b, short_b = t1 - tx(f"{name}.{run}", 0)[h], tx(f"{name}.short", 1)[h] - tx(f"{name}.short", 0)[h]
            per_step.append((long_b - short_b) / k / MiB)
            details.append(f"  {name:<11} {h}: TX {short_b / MiB:9.1f} MiB in {warm} steps, {long_b / MiB:9.1f} MiB in {warm + k}"
                           f" ({run}) -> {per_step[-1]:8.2f} MiB/step")
    if group == "world":
        expected, program = est["bytes_per_step"], summary["bytes_sent_per_step"]
    else:
        expected, program = per_host * est[replicate_key(est)], per_host * summary[replicate_key(summary)]
    rows[name] = dict(veth=statistics.mean(per_step), expected=expected / MiB, program=program / MiB,
                      ms=statistics.median(s["ms"] for s in steps), tracked=states(summary["peak_memory_bytes"]["host"]) / MiB,
                      est_states=states(est["memory"]["host"]) / MiB, load=f"{min(load):.1f}-{max(load):.1f}")
print(f"\nhybrid sharding benchmark: {model}, {where}; bytes per step = (TX({warm + k} steps) - TX({warm} steps)) / {k}"
      f" per host, mean over hosts and {repeat} round(s); step ms = median of {repeat} x {k} timed steps after {warm}; {train}\n")
hdr = (f"{'config':<11} {'veth MiB/step':>13} {'expected':>9} {'program':>8} {'veth/exp':>8} {'vs zero3':>8} {'vs ddp':>7}"
       f" {'step ms':>8} {'states MiB tracked/est':>22} {'load':>9}")
print(hdr)
def ratio(name, ref):
    return f"{rows[name]['veth'] / rows[ref]['veth']:.3f}" if ref in rows and rows[ref]["veth"] > 0 else "-"
for name, _, _ in configs:
    if name in refused:
        print(f"{name:<11} refused by this binary: {refused[name]}")
        continue
    r = rows[name]
    print(f"{name:<11} {r['veth']:13.2f} {r['expected']:9.2f} {r['program']:8.2f} {r['veth'] / r['expected']:8.3f}"
          f" {ratio(name, 'zero3'):>8} {ratio(name, 'ddp'):>7} {r['ms']:8.0f}"
          f" {r['tracked']:11.2f}/{r['est_states']:<10.2f} {r['load']:>9}")
print(f"\nper host (each long run minus the short one, over the {k} steps between them):")
print("\n".join(details))
h = rows.get("zero3-host")
if h and "zero3" in rows and "ddp" in rows:
    z, d = rows["zero3"], rows["ddp"]
    def met(ok):
        return "met" if ok else "NOT met"
    print(f"\naim (issue 52): zero3-host cross-host bytes <= 0.5x zero3's: {h['veth'] / z['veth']:.3f} {met(h['veth'] <= 0.5 * z['veth'])};"
          f" <= 0.75x ddp's: {h['veth'] / d['veth']:.3f} {met(h['veth'] <= 0.75 * d['veth'])};"
          f" step time below both: {h['ms']:.0f} ms against {z['ms']:.0f} / {d['ms']:.0f} {met(h['ms'] < min(z['ms'], d['ms']))}")
else:
    print("\naim (issue 52): not checked, the zero3-host row is missing")
PY
