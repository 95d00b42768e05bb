#!/usr/bin/env bash
# Collective-timeout test: runs hang_probe (rank 1 skips a collective) on 3 ranks under `timeout 30`.
#   test/comm/hang_probe.sh PATH/TO/hang_probe [MPIEXEC]      (MPIEXEC defaults to mpirun)
# Passes when the job ends by itself (abort_all(3) after CommTimeout), non-zero, within timeout_s + 10 s,
# naming the op and sequence number, with the collective log.
set -u
probe=${1:?usage: hang_probe.sh PATH/TO/hang_probe [MPIEXEC]}
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
echo "--- hang_probe: exit code $rc after ${elapsed_ms} ms"

fail() { echo "hang_probe FAILED: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "the job exited 0; a skipped collective must end it with an error"
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "the job hung until 'timeout 30' killed it (exit $rc)"
[ "$elapsed_ms" -lt $(( (probe_timeout_s + 10) * 1000 )) ] || fail "took ${elapsed_ms} ms, expected < $((probe_timeout_s + 10)) s"
# Collectives are matched by sequence number (channels, see mpi_comm.cpp), so ranks 0 and 2 wait in
# #1, which rank 1 skipped, and rank 1 waits in #2: every rank times out.
grep -qE "rank [02]: collective all_reduce #1 \(" "$out" || fail "no waiting rank (0 or 2) names the skipped collective all_reduce #1"
grep -qE "rank 1: collective all_reduce #2 \(" "$out" || fail "rank 1 (the skipper) does not report waiting in all_reduce #2"
grep -q "did not complete within $probe_timeout_s s" "$out" || fail "the timeout message is missing"
grep -q "last collectives on this rank:" "$out" || fail "the log dump header is missing"
grep -qE "^  #1 all_reduce .* pending since .* TIMED OUT" "$out" || fail "the log dump has no pending, timed-out #1"
# Rank 1 says so the moment it skips (its log dump may not make it out before another rank's abort).
grep -qE "^note: rank 1: collective all_reduce #1 \([0-9]+ bytes, step [-0-9]+\) skipped \(fault injection" "$out" ||
  fail "rank 1 does not say that it skipped all_reduce #1"
if grep -qE "Segmentation fault|signal 11|free\(\)|MPI_ERR_TRUNCATE|NBC_Progress|double free|corrupted" "$out"; then
  fail "the job crashed instead of timing out"
fi
echo "hang_probe passed"
