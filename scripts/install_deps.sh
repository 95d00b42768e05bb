#!/usr/bin/env bash
# Installs the Debian packages that building ./train and preparing the data need; with --test,
# also those of the tests (GoogleTest, and PyTorch, h5py and matplotlib for the reference and
# checkpoint tests and scripts/compare; Slurm and munge for the Slurm jobs test).
# Idempotent: when everything is present it only checks and returns in about a second.
#   bash scripts/install_deps.sh [--test]
set -euo pipefail

PKGS=(build-essential cmake g++ make pkg-config git
      libopenblas-dev libopenblas-openmp-dev libcli11-dev nlohmann-json3-dev
      libopenmpi-dev openmpi-bin libhdf5-dev liburing-dev libdnnl-dev
      nodejs npm)
TEST_PKGS=(libgtest-dev hdf5-tools python3 python3-numpy python3-torch python3-h5py python3-matplotlib
           slurmctld slurmd slurm-client munge)  # a real Slurm for test/slurm (scripts/cluster slurm up)

case "${1:-}" in
  "") ;;
  --test) PKGS+=("${TEST_PKGS[@]}") ;;
  *) echo "usage: bash scripts/install_deps.sh [--test]" >&2; exit 2 ;;
esac

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A node/npm that did not come from Debian (e.g. a preinstalled one) is fine too.
if command -v node >/dev/null && command -v npm >/dev/null; then
  tmp=(); for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || tmp+=("$p"); done
  missing=("${tmp[@]+"${tmp[@]}"}")
fi

if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all Debian packages present"
fi
