#!/usr/bin/env bash
# The MPI backend's float collectives, ring against Open MPI's own (non-blocking libnbc, and the
# blocking coll/tuned called on a thread as the communication thread would), at the sizes training
# moves (bench/bench_collectives.cpp says what each way is). Two settings, as issue 28 asks:
#   shm    NP ranks on this machine (shared memory, Open MPI's vader)
#   link   H namespace hosts x 1 rank (scripts/cluster, root), TCP, every host's egress limited to
#          RATE with tc tbf (default 1gbit); the cluster is removed at exit
# A benchmark, not a test; the table: docs/multihost.md, every benchmark: docs/benchmarks.md.
#
#   scripts/bench_collectives.sh [--np N] [--hosts H] [--rate RATE] [--repeat R] [--sizes-kib LIST]
#                                [--only shm|link] [--bench PATH]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
NP=2; HOSTS=2; RATE=1gbit; REPEAT=5; SIZES=256,1024,4096,16384,65536; ONLY=; BENCH=build/zt_bench_collectives
while [ $# -gt 0 ]; do
  case $1 in
    --np) NP=$2; shift 2 ;;
    --hosts) HOSTS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --sizes-kib) SIZES=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --bench) BENCH=$2; shift 2 ;;
    *) echo "usage: $0 [--np N] [--hosts H] [--rate RATE] [--repeat R] [--sizes-kib LIST] [--only shm|link] [--bench PATH]" >&2; exit 2 ;;
  esac
done
[ -x "$BENCH" ] || { echo "bench_collectives: $BENCH missing (cmake --build build --target zt_bench_collectives)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args=(--repeat "$REPEAT" --sizes-kib "$SIZES")
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

if [ "$ONLY" != link ]; then
  echo "== shm: $NP ranks on this host"
  mpirun --oversubscribe -np "$NP" "$BENCH" "${args[@]}" | sed -n '/^[0-9]* ranks;/,$p'
fi
if [ "$ONLY" != shm ]; then
  echo "== link: $HOSTS hosts x 1 rank, TCP, egress $RATE"
  export ZT_CLUSTER=ztcb$$
  trap 'scripts/cluster down' EXIT
  scripts/cluster up "$HOSTS" >/dev/null
  [ "$RATE" = off ] || scripts/cluster shape "$RATE"
  hl=$(scripts/cluster hosts | sed 's/$/:1/' | paste -sd,)
  scripts/cluster mpirun --oversubscribe -np "$HOSTS" -H "$hl" "$ROOT/$BENCH" "${args[@]}" | sed -n '/^[0-9]* ranks;/,$p'
fi
