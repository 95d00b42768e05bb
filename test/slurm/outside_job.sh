#!/usr/bin/env bash
# scripts/slurm/train.sbatch run by hand, outside a job: one line saying so, exit 1, nothing started
# (it printed "job  (restart 0) on :  rank(s)" and srun's or DNS errors).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# A stand-in srun that records being started: nothing may get that far.
mkdir -p "$work/bin"
printf '#!/bin/sh\ntouch "%s/srun_ran"\n' "$work" > "$work/bin/srun"
chmod +x "$work/bin/srun"
cd "$work"
env -u SLURM_JOB_ID PATH="$work/bin:$PATH" CKPT="$work/ckpt" timeout 30 bash "$ROOT/scripts/slurm/train.sbatch" >"$work/out" 2>&1
rc=$?
lines=$(wc -l < "$work/out")
if [ $rc -eq 1 ] && [ "$lines" -eq 1 ] && grep -q 'not inside a Slurm job (SLURM_JOB_ID unset); submit it with sbatch' "$work/out" \
   && [ ! -e "$work/srun_ran" ]; then
  echo "ok   train.sbatch outside a job: $(cat "$work/out")"
  exit 0
fi
echo "FAIL train.sbatch outside a job: exit $rc, $lines line(s), srun $([ -e "$work/srun_ran" ] && echo started || echo not started):"
cat "$work/out"
exit 1
