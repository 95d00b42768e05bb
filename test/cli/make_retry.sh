#!/usr/bin/env bash
# `make` after a configure that failed (issue 23): the old Makefile keyed the configure step on
# build/CMakeCache.txt, which a failed CMake run leaves behind, so every later `make` skipped
# configuring and said "No rule to make target 'Makefile'" forever. Each `make` must run CMake again
# until it succeeds. A compiler that does not exist makes CMake fail in well under a second.
#   make_retry.sh [MAKEFILE]      (default: the repository's)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MAKEFILE=$(realpath "${1:-$ROOT/Makefile}")
cd "$ROOT"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fails=0
bad=(BUILD="$work/build" CMAKE_FLAGS=-DCMAKE_CXX_COMPILER=/nonexistent/c++)
for attempt in 1 2 3; do
  if make -f "$MAKEFILE" build "${bad[@]}" >"$work/make.log" 2>&1; then
    echo "FAIL attempt $attempt: make succeeded with a compiler that does not exist"; fails=$((fails+1)); break
  fi
  if grep -q "No rule to make target 'Makefile'" "$work/make.log" || ! grep -q 'Configuring incomplete' "$work/make.log"; then
    echo "FAIL attempt $attempt: CMake was not run again:"; tail -3 "$work/make.log"; fails=$((fails+1)); break
  fi
  [ -e "$work/build/.configured" ] && { echo "FAIL attempt $attempt: configure stamp written"; fails=$((fails+1)); break; }
  echo "ok   attempt $attempt: CMake ran and failed: $(grep -m1 'Configuring incomplete' "$work/make.log")"
done
[ $fails -eq 0 ] && echo "make retries a failed configure" || exit 1
