#!/usr/bin/env bash
# Packs a commit's tree for run.sh's ab phase, which builds its train on the GPU machine and runs it
# against this tree's, alternating, on the same machine (the anchor of a speed change in one call):
#
#   scripts/device/ab_base.sh COMMIT      # writes .deps/ab/{base.tar.gz,base_commit,this_commit}
#
# Then carry ".deps/ab" with the device call. Remove .deps/ab to get run.sh's other A/B back.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
commit="${1:?usage: scripts/device/ab_base.sh COMMIT}"
out="$ROOT/.deps/ab"
# Resolved before anything is written: a bad name leaves an earlier pack whole.
sha="$(git -C "$ROOT" rev-parse --verify --quiet "$commit^{commit}")" ||
  { echo "ab_base: '$commit' is not a commit here" >&2; exit 1; }
mkdir -p "$out"
git -C "$ROOT" archive --format=tar.gz -o "$out/base.tar.gz.tmp" "$sha"
mv "$out/base.tar.gz.tmp" "$out/base.tar.gz"
git -C "$ROOT" rev-parse --short "$sha" > "$out/base_commit"
{ git -C "$ROOT" rev-parse --short HEAD; git -C "$ROOT" diff --quiet HEAD || echo "+uncommitted changes"; } |
  paste -sd' ' > "$out/this_commit"
echo "ab_base: $(cat "$out/base_commit") packed ($(du -h "$out/base.tar.gz" | cut -f1)); this tree: $(cat "$out/this_commit")"
echo "ab_base: carry \".deps/ab\" with the device call; run.sh's ab phase builds and runs it"
