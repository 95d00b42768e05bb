#!/usr/bin/env bash
# Collective-timeout test: runs hang_probe (rank 1 skips a collective) on 3 ranks under `timeout 30`.
#   test/mpi/hang_test.sh PATH/TO/hang_probe [MPIEXEC]      (MPIEXEC defaults to mpirun)
# Passes when the job ends by itself, non-zero, within timeout_s + 10 s, naming the op and the ring.
set -u
probe=${1:?usage: hang_test.sh PATH/TO/hang_probe [MPIEXEC]}
mpiexec=${2:-mpirun}
np=3
probe_timeout_s=3   # opts.timeout_s in hang_probe.cpp
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
start_ns=$(date +%s%N)
timeout -k 5 30 "$mpiexec" --oversubscribe -np $np "$probe" >"$out" 2>&1
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start_ns) / 1000000 ))
cat "$out"
echo "--- hang_test: exit code $rc after ${elapsed_ms} ms"

fail() { echo "hang_test FAILED: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "the job exited 0; a skipped collective must end it with an error"
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "the job hung until 'timeout 30' killed it (exit $rc)"
[ "$elapsed_ms" -lt $(( (probe_timeout_s + 10) * 1000 )) ] || fail "took ${elapsed_ms} ms, expected < $((probe_timeout_s + 10)) s"
grep -q "collective all_reduce #2 (" "$out" || fail "no line names the stuck collective (all_reduce #2)"
grep -q "did not complete within $probe_timeout_s s" "$out" || fail "the timeout message is missing"
grep -q "last collectives on this rank:" "$out" || fail "the ring dump header is missing"
grep -qE "^  #2 all_reduce .* pending since .* TIMED OUT" "$out" || fail "the ring dump has no pending, timed-out #2"
grep -qE "^  #1 all_reduce .* done " "$out" || fail "the ring dump has no completed #1"
grep -q "skipped (fault injection)" "$out" || fail "rank 1's skipped collective is not reported"
echo "hang_test passed"
