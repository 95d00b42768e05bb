#!/usr/bin/env bash
# The unit binary under one OpenBLAS kernel (ctest unit_openblas_haswell, test/tests.cmake):
#   openblas_kernel.sh CORETYPE CPU_FLAGS ZT_TESTS [gtest arguments]
# CPU_FLAGS: the /proc/cpuinfo flags the kernel needs, comma-separated. Skipped (exit 77, with the
# reason) where the CPU lacks one (the kernel would die of SIGILL) or where OpenBLAS ignores
# OPENBLAS_CORETYPE; never Passed without having run that kernel. Temporary files go to a short
# directory of its own (TMPDIR; some tests write fixed names there, and ctest may run the same tests
# beside this one), removed at the end.
set -u
core=$1 flags=$2 bin=$3
shift 3
for f in ${flags//,/ }; do
  grep -qw "$f" /proc/cpuinfo || { echo "Skipped: this CPU has no $f, which OpenBLAS's $core kernels need"; exit 77; }
done
export OPENBLAS_CORETYPE=$core
TMPDIR=$(mktemp -d /tmp/zt_blas.XXXXXX) || exit 1
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
if ! out=$("$bin" --gtest_filter=OpenBlas.RunsTheKernelAsked 2>&1); then
  if grep -q "but OpenBLAS runs" <<<"$out"; then
    echo "Skipped: $(grep -o "OPENBLAS_CORETYPE=.*" <<<"$out" | head -1)"
    exit 77
  fi
  echo "$out"
  exit 1
fi
"$bin" "$@"
