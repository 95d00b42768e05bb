#!/usr/bin/env bash
# ZT_EXPECT_GPU=1 must turn "no GPU" from a skip into a failure (test/gpu/gpu_test_util.h), so that a
# broken driver on the GPU machine cannot pass `make test-gpu` as all-Skipped.
#
#   test/gpu/expect_gpu.sh PATH/TO/zt_gpu_tests
#
# CUDA_VISIBLE_DEVICES=-1 hides every device, so the check means the same on a machine with a GPU
# (where scripts/device/run.sh runs it under `ctest -L gpu`) as on one without. One GPU test case:
#   ZT_EXPECT_GPU unset  -> exit 0, the case reported SKIPPED     (the ordinary no-GPU behaviour)
#   ZT_EXPECT_GPU=0      -> the same
#   ZT_EXPECT_GPU=1      -> exit non-zero, the case FAILED, the message names ZT_EXPECT_GPU
set -u
BIN=${1:?usage: expect_gpu.sh path/to/zt_gpu_tests}
[ -x "$BIN" ] || { echo "expect_gpu: $BIN is not executable"; exit 1; }
CASE=GpuModel.Fp32MatchesCpu
export CUDA_VISIBLE_DEVICES=-1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
# bad RUN_PREFIX MESSAGE: report, with the tail of that run's output.
bad() { echo "expect_gpu: FAILED: $2"; sed 's/^/    | /' "$1.out" | tail -15; failures=$((failures + 1)); }

# run NAME [VAR=VALUE]: the case with ZT_EXPECT_GPU removed from the environment, then VAR set.
run() {
  local name=$1; shift
  env -u ZT_EXPECT_GPU "$@" "$BIN" --gtest_filter=$CASE > "$work/$name.out" 2>&1
  echo $? > "$work/$name.rc"
}

run unset
run zero ZT_EXPECT_GPU=0
run one ZT_EXPECT_GPU=1

for name in unset zero; do
  f="$work/$name"
  grep -q "Running 1 test" "$f.out" || bad "$f" "ZT_EXPECT_GPU $name: $CASE did not run (renamed? update CASE)"
  [ "$(cat "$f.rc")" = 0 ] || bad "$f" "ZT_EXPECT_GPU $name: exit $(cat "$f.rc"), expected 0 (skipped)"
  grep -q "^\[  SKIPPED \] $CASE" "$f.out" || bad "$f" "ZT_EXPECT_GPU $name: $CASE not reported SKIPPED"
done
f="$work/one"
grep -q "Running 1 test" "$f.out" || bad "$f" "ZT_EXPECT_GPU=1: $CASE did not run"
[ "$(cat "$f.rc")" != 0 ] || bad "$f" "ZT_EXPECT_GPU=1 with no visible device: exit 0, expected a failure"
grep -q "^\[  FAILED  \] $CASE" "$f.out" || bad "$f" "ZT_EXPECT_GPU=1: $CASE not reported FAILED"
grep -q "but ZT_EXPECT_GPU is set" "$f.out" || bad "$f" "ZT_EXPECT_GPU=1: the failure does not name ZT_EXPECT_GPU"
if grep -q "SKIPPED \] $CASE" "$f.out"; then bad "$f" "ZT_EXPECT_GPU=1: $CASE still reported SKIPPED"; fi

if [ $failures -ne 0 ]; then echo "expect_gpu FAILED ($failures)"; exit 1; fi
echo "expect_gpu passed: without ZT_EXPECT_GPU $CASE is skipped; with ZT_EXPECT_GPU=1 it fails:"
grep -m1 "ZT_EXPECT_GPU is set" "$work/one.out" | sed 's/^/    /'
