#!/usr/bin/env bash
# Missing-recv test: runs p2p_hang_probe (a send nobody receives, in the group "ring") on 3 ranks
# under `timeout 30`.   test/comm/p2p_hang_probe.sh PATH/TO/zt_p2p_hang_probe [MPIEXEC]
# Passes when the job ends by itself, non-zero, within timeout_s + 20 s, the sender's diagnosis
# naming the op, the peer (group and world rank) and the group, the others' naming the group's barrier.
set -u
probe=${1:?usage: p2p_hang_probe.sh PATH/TO/zt_p2p_hang_probe [MPIEXEC]}
mpiexec=${2:-mpirun}
probe_timeout_s=3   # opts.timeout_s in p2p_hang_probe.cpp
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
SECONDS=0
timeout -k 5 30 "$mpiexec" --oversubscribe -np 3 "$probe" >"$log" 2>&1
rc=$? took=$SECONDS
cat "$log"
echo "--- p2p_hang_probe: exit code $rc after about $took s"

problems=()
expect() {  # grep mode (F fixed, E regex), pattern, what is wrong without it
  grep -q"$1" -- "$2" "$log" || problems+=("$3")
}
[ "$rc" -ne 0 ] || problems+=("the job exited 0; a missing recv must end it with an error")
case $rc in 124 | 137) problems+=("the job hung until 'timeout 30' killed it (exit $rc)") ;; esac
# The bound includes start-up: the group's 256 duplicate communicators take seconds on a loaded machine.
[ "$took" -le $((probe_timeout_s + 20)) ] || problems+=("took $took s, expected at most $((probe_timeout_s + 20)) s")
expect F 'rank 2 (rank 0 of group "ring"): send #1 to rank 2 (rank 0 of the world) in group "ring" (4000 bytes, step 0) did not complete within 3 s' \
  "the sender (world rank 2) does not name the send, its peer and the group"
expect F 'probably did not post the matching recv' "the diagnosis does not say what is missing"
expect E 'rank [01] \(rank [12] of group "ring"\): collective barrier #[0-9]+ in group "ring" \(0 bytes' \
  "no waiting rank (0 or 1) names the group's barrier"
expect F 'last collectives of group "ring" on this rank:' "the group's log dump header is missing"
expect E '^  #1 send 3\.91 KiB to rank 2 step 0 pending since .* TIMED OUT' "the log dump has no pending, timed-out send"
if grep -qE "Segmentation fault|signal 11|free\(\)|MPI_ERR_TRUNCATE|double free|corrupted" "$log"; then
  problems+=("the job crashed instead of timing out")
fi
if [ ${#problems[@]} -gt 0 ]; then
  printf 'p2p_hang_probe FAILED: %s\n' "${problems[@]}"
  exit 1
fi
echo "p2p_hang_probe passed"
