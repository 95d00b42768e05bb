#!/usr/bin/env bash
# Missing-recv test: runs p2p_hang_probe (a send nobody receives, in the group "ring") on 3 ranks
# under `timeout 30`.   test/comm/p2p_hang_probe.sh PATH/TO/zt_p2p_hang_probe [MPIEXEC]
# Passes when the job ends by itself, non-zero, within timeout_s + 10 s, the sender's diagnosis
# naming the op, the peer (group and world rank) and the group, the others' naming the group's barrier.
set -u
probe=${1:?usage: p2p_hang_probe.sh PATH/TO/zt_p2p_hang_probe [MPIEXEC]}
mpiexec=${2:-mpirun}
probe_timeout_s=3   # opts.timeout_s in p2p_hang_probe.cpp
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
start_ns=$(date +%s%N)
timeout -k 5 30 "$mpiexec" --oversubscribe -np 3 "$probe" >"$out" 2>&1
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start_ns) / 1000000 ))
cat "$out"
echo "--- p2p_hang_probe: exit code $rc after ${elapsed_ms} ms"

fail() { echo "p2p_hang_probe FAILED: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "the job exited 0; a missing recv must end it with an error"
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "the job hung until 'timeout 30' killed it (exit $rc)"
[ "$elapsed_ms" -lt $(( (probe_timeout_s + 10) * 1000 )) ] || fail "took ${elapsed_ms} ms, expected < $((probe_timeout_s + 10)) s"
grep -qF 'rank 2 (rank 0 of group "ring"): send #1 to rank 2 (rank 0 of the world) in group "ring" (4000 bytes, step 0) did not complete within 3 s' "$out" \
  || fail "the sender (world rank 2) does not name the send, its peer and the group"
grep -qF 'probably did not post the matching recv' "$out" || fail "the diagnosis does not say what is missing"
grep -qE 'rank [01] \(rank [12] of group "ring"\): collective barrier #[0-9]+ in group "ring" \(0 bytes' "$out" \
  || fail "no waiting rank (0 or 1) names the group's barrier"
grep -q 'last collectives of group "ring" on this rank:' "$out" || fail "the group's log dump header is missing"
grep -qE '^  #1 send 3\.91 KiB to rank 2 step 0 pending since .* TIMED OUT' "$out" || fail "the log dump has no pending, timed-out send"
if grep -qE "Segmentation fault|signal 11|free\(\)|MPI_ERR_TRUNCATE|double free|corrupted" "$out"; then
  fail "the job crashed instead of timing out"
fi
echo "p2p_hang_probe passed"
