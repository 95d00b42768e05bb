#!/usr/bin/env bash
# Fetches, here (Debian 12 bookworm, amd64, with apt and network), the Debian packages that the
# build needs and the bare GPU machine lacks, and packs them so that they can travel with the repo.
#
#   scripts/device/fetch_deps.sh [--force] [--no-data]
#
# Packages: Open MPI (libopenmpi-dev, libopenmpi3, openmpi-bin, openmpi-common), CLI11,
# nlohmann-json, GoogleTest, OpenBLAS (OpenMP build), liburing (optimizer offload), serial HDF5
# (checkpoints; its libcurl brings most of the closure), and the run-time closure of their shared
# libraries minus BASE_SONAMES below (what every Ubuntu 24.04 image with a C++ compiler has).
# They are fetched with `apt-get download` into .deps/debs, unpacked with `dpkg -x` into
# .deps/root (a prefix: .deps/root/usr/...), pruned (docs, man pages, static libraries other than
# GoogleTest's, Fortran/Java/OpenSHMEM parts of Open MPI, Open MPI/PMIx plugins whose libraries we
# do not ship), checked (every NEEDED library of every ELF file resolves inside the prefix or to a
# base library), and packed into .deps/pack/deps-root.tar.gz with .deps/pack/MANIFEST.txt.
# Only .deps/pack travels to the GPU machine; scripts/device/run.sh unpacks it there.
#
# Also makes sure data/brown exists (scripts/prepare_data; needs node/npm, which the GPU machine
# lacks), since the default plan trains on it.
#
# Idempotent: .debs already downloaded at the candidate version are reused, and when the pack is
# up to date (same package versions, same script) only the checks and the size report run.
# --force rebuilds the prefix and the pack; --no-data skips the data/brown step.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEPS="$ROOT/.deps"
DEBS="$DEPS/debs"
TREE="$DEPS/root"
PACK="$DEPS/pack"
ARCH=x86_64-linux-gnu
LIB="usr/lib/$ARCH"

FORCE=0
DATA=1
while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --no-data) DATA=0 ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fetch_deps: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { echo "fetch_deps: $*"; }
die() { echo "fetch_deps: error: $*" >&2; exit 1; }

# What the build uses (see CMakeLists.txt): find_package(MPI CXX), nlohmann_json, CLI11, GTest,
# OpenBLAS by path (openblas-openmp), liburing by find_library / find_path. The -dev packages give headers, CMake configs and the
# unversioned .so links; their other dependencies (gfortran, libevent-dev, libhwloc-dev,
# libibverbs-dev, ...) are not needed to compile or link C++ and are not fetched.
DIRECT_PKGS=(
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common
  libcli11-dev nlohmann-json3-dev libgtest-dev
  libopenblas-openmp-dev libopenblas0-openmp
  liburing-dev liburing2
  libhdf5-dev libhdf5-103-1
)
# The shared-library closure of the above (found with readelf -d; checked again below), minus the
# base. libhwloc15 needs libudev1 (in Ubuntu base images, shipped anyway: run.sh prefers the
# system's copy of any library the GPU machine already has). libpmix2: Debian's Open MPI uses the
# external PMIx through its pmix_ext3x plugin. OpenBLAS needs libgfortran5 -> libquadmath0 (not in
# a machine without gfortran).
CLOSURE_PKGS=(
  libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2 libmunge2
  libgfortran5 libquadmath0 libudev1
  libsz2 libaec0 libcurl4 libssl3 libbrotli1 libzstd1 libldap-2.5-0 libgnutls30 libgmp10 libhogweed6
  libnettle8 libtasn1-6 libunistring2 libidn2-0 libp11-kit0 libffi8 libsasl2-2 libgssapi-krb5-2
  libkrb5support0 libcom-err2 libk5crypto3 libkrb5-3 libkeyutils1 libpsl5 libssh2-1 librtmp1 libnghttp2-14
)
PKGS=("${DIRECT_PKGS[@]}" "${CLOSURE_PKGS[@]}")

# Sonames that are NOT shipped: present on any Ubuntu 24.04 (glibc 2.39, GCC 13/14) image that can
# compile C++ with OpenMP -- libc6, libgcc-s1, libstdc++6, libgomp1 (a dependency of gcc's
# libgcc-13-dev, which nvcc's host compiler needs), zlib1g (Essential in Ubuntu). Debian 12
# builds need glibc >= 2.36 and GLIBCXX <= 3.4.30, which Ubuntu 24.04 satisfies.
BASE_SONAMES=(
  libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libutil.so.1 libresolv.so.2
  ld-linux-x86-64.so.2 libgcc_s.so.1 libstdc++.so.6 libgomp.so.1 libz.so.1
)
# Plugins (and Open MPI's libmca_common_* helpers) may be dropped when a library they need is
# not shipped: Open MPI / PMIx then simply do not offer that transport (InfiniBand verbs, UCX,
# libfabric, PSM/PSM2 -- none of which a single GPU machine has).
is_plugin() {
  case "$1" in
    */openmpi/lib/openmpi3/mca_*.so | */pmix2/lib/pmix/*.so | "$LIB"/libmca_common_*) return 0 ;;
  esac
  return 1
}

command -v apt-get >/dev/null || die "apt-get not found: run this on the Debian development machine"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
command -v readelf >/dev/null || die "readelf not found (apt-get install binutils)"
[ "$(dpkg --print-architecture)" = amd64 ] ||
  die "this machine is $(dpkg --print-architecture); the GPU machine is amd64 (see /work/.library/device/README.md for apt -oAPT::Architecture=amd64)"

mkdir -p "$DEBS" "$PACK"

# ---- 1. resolve candidate versions, download missing .debs ---------------------------------------
candidate() { apt-cache policy "$1" 2>/dev/null | sed -n 's/^  Candidate: //p'; }
if [ -z "$(candidate libopenmpi3)" ] || [ "$(candidate libopenmpi3)" = "(none)" ]; then
  say "no apt candidate for libopenmpi3; running apt-get update"
  apt-get update -q || say "apt-get update failed; using the .debs already in $DEBS"
fi

declare -A WANT=()
for p in "${PKGS[@]}"; do
  v="$(candidate "$p")"
  [ -n "$v" ] && [ "$v" != "(none)" ] && WANT[$p]="$v"
done

for p in "${PKGS[@]}"; do
  have=""
  for f in "$DEBS/${p}"_*.deb; do
    [ -e "$f" ] || continue
    [ "$(dpkg-deb -f "$f" Package)" = "$p" ] || continue
    fv="$(dpkg-deb -f "$f" Version)"
    if [ -z "${WANT[$p]:-}" ] || [ "$fv" = "${WANT[$p]}" ]; then have="$f"; else rm -f "$f"; fi
  done
  if [ -z "$have" ]; then
    [ -n "${WANT[$p]:-}" ] || die "package $p: no apt candidate and no downloaded .deb"
    say "downloading $p=${WANT[$p]}"
    # apt-get download writes into the current directory. As root it warns that the _apt user
    # cannot write there (unsandboxed download); harmless, so that one line is filtered out.
    (cd "$DEBS" && { apt-get download -q "$p=${WANT[$p]}" 2>&1 | grep -v "unsandboxed as root"; true; })
    ls "$DEBS/${p}"_*.deb >/dev/null 2>&1 || die "apt-get download $p failed"
  fi
done

# One .deb per package, in a stable order.
DEB_FILES=()
for p in "${PKGS[@]}"; do
  for f in "$DEBS/${p}"_*.deb; do
    [ "$(dpkg-deb -f "$f" Package)" = "$p" ] && DEB_FILES+=("$f")
  done
done

# ---- 2. unpack and prune (skipped when the pack is up to date) --------------------------------------
STAMP="$( { sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1
            for f in "${DEB_FILES[@]}"; do basename "$f"; done; } | sha256sum | cut -d' ' -f1)"
TARBALL="$PACK/deps-root.tar.gz"
MANIFEST="$PACK/MANIFEST.txt"
up_to_date=0
if [ "$FORCE" = 0 ] && [ -f "$TARBALL" ] && [ -d "$TREE/usr" ] && [ -f "$PACK/STAMP" ] &&
   [ "$(cat "$PACK/STAMP")" = "$STAMP" ]; then
  up_to_date=1
  say "pack is up to date ($TARBALL)"
fi

removed=()
if [ "$up_to_date" = 0 ]; then
  rm -rf "$TREE" "$TARBALL" "$PACK/STAMP"
  mkdir -p "$TREE"
  for f in "${DEB_FILES[@]}"; do dpkg -x "$f" "$TREE"; done
  say "unpacked ${#DEB_FILES[@]} packages: $(du -sh "$TREE" | cut -f1)"

  cd "$TREE"
  rm_path() {  # remove paths (relative to $TREE) if present, remembering them for the manifest
    local x
    for x in "$@"; do
      if [ -e "$x" ] || [ -L "$x" ]; then rm -rf "$x"; removed+=("$x"); fi
    done
  }
  # Documentation.
  rm_path usr/share/doc usr/share/man usr/share/info usr/share/lintian usr/share/bug usr/src
  # Static libraries where shared ones exist (GoogleTest is static-only in Debian: kept).
  while IFS= read -r -d '' a; do
    case "$(basename "$a")" in libgtest*.a | libgmock*.a) ;; *) rm_path "$a" ;; esac
  done < <(find . \( -type f -o -type l \) -name '*.a' -print0 | sed -z 's|^\./||')
  # OpenBLAS: the reference-interface copies (libblas.so.3, liblapack.so.3, used through Debian's
  # alternatives, which dpkg -x does not set up) are not linked; libopenblas.so has BLAS and LAPACK.
  rm_path "$LIB"/openblas-openmp/libblas.so "$LIB"/openblas-openmp/libblas.so.3 \
          "$LIB"/openblas-openmp/liblapack.so "$LIB"/openblas-openmp/liblapack.so.3
  # Open MPI: Fortran, Java and OpenSHMEM parts (the build uses the C and C++ bindings only).
  rm_path "$LIB"/fortran
  for x in "$LIB"/libmpi_mpifh* "$LIB"/libmpi_usempi* "$LIB"/libmpi_java* "$LIB"/liboshmem* \
           "$LIB"/openmpi/lib/libmpi_mpifh* "$LIB"/openmpi/lib/libmpi_usempi* \
           "$LIB"/openmpi/lib/libmpi_java* "$LIB"/openmpi/lib/liboshmem* "$LIB"/openmpi/lib/mpi.jar \
           "$LIB"/openmpi/lib/openmpi3/mca_{atomic,memheap,scoll,spml,sshmem}_* \
           usr/bin/osh* usr/bin/shmem* usr/bin/mpif77* usr/bin/mpif90* usr/bin/mpifort* usr/bin/mpijavac* \
           usr/share/openmpi/osh* usr/share/openmpi/shmem* usr/share/openmpi/mpif* usr/share/java; do
    rm_path "$x"
  done
  # Debian selects mpicxx/mpiexec/... through update-alternatives, which dpkg -x does not run.
  for w in mpicxx mpicc mpic++ mpiCC mpiexec mpirun; do
    [ -e "usr/bin/$w.openmpi" ] && [ ! -e "usr/bin/$w" ] && ln -s "$w.openmpi" "usr/bin/$w"
  done

  # Drop plugins whose libraries are not shipped (and the links to them), until nothing else goes.
  changed=1
  while [ "$changed" = 1 ]; do
    changed=0
    declare -A have_so=()
    for b in "${BASE_SONAMES[@]}"; do have_so[$b]=1; done
    while IFS= read -r -d '' x; do have_so[$(basename "$x")]=1; done < <(find . \( -type f -o -type l \) -name '*.so*' -print0)
    while IFS= read -r -d '' x; do
      x="${x#./}"
      is_plugin "$x" || continue
      for n in $(readelf -d "$x" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        if [ -z "${have_so[$n]:-}" ]; then rm_path "$x"; changed=1; break; fi
      done
    done < <(find . -type f -name '*.so*' -print0)
    unset have_so
    while IFS= read -r -d '' l; do rm_path "${l#./}"; changed=1; done < <(find . -xtype l -print0)
  done
  cd "$ROOT"
fi

# ---- 3. check: every NEEDED of every ELF resolves in the prefix or the base ------------------------
declare -A provided=()
for b in "${BASE_SONAMES[@]}"; do provided[$b]=base; done
while IFS= read -r -d '' x; do provided[$(basename "$x")]=deps; done < <(find "$TREE" \( -type f -o -type l \) -name '*.so*' -print0)
missing=()
n_elf=0
while IFS= read -r -d '' f; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  n_elf=$((n_elf + 1))
  for n in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    [ -n "${provided[$n]:-}" ] || missing+=("${f#"$TREE"/} needs $n")
  done
done < <(find "$TREE" -type f -print0)
if [ "${#missing[@]}" -gt 0 ]; then
  printf '  %s\n' "${missing[@]}" >&2
  die "${#missing[@]} unresolved library dependencies (add their packages to CLOSURE_PKGS)"
fi
say "closure ok: $n_elf ELF files, every NEEDED library is in .deps/root or in the base set"

# Absolute symlinks would point into the GPU machine's /, not into the prefix.
abs_links="$(find "$TREE" -type l -lname '/*' -print -quit)"
[ -z "$abs_links" ] || die "absolute symlinks in the prefix: $abs_links"

# ---- 4. pack + manifest -------------------------------------------------------------------------------
if [ "$up_to_date" = 0 ]; then
  {
    echo "# zerotrain GPU-machine dependencies (scripts/device/fetch_deps.sh), made $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# on $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"'), for an Ubuntu 24.04-based GPU image."
    echo "# Unpacked on the GPU machine into .deps/root by scripts/device/run.sh."
    echo
    echo "## packages (name version .deb-bytes sha256)"
    for f in "${DEB_FILES[@]}"; do
      printf '%s %s %s %s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" \
        "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)"
    done
    echo
    echo "## not shipped: base sonames assumed on the GPU machine"
    printf '%s\n' "${BASE_SONAMES[@]}"
    echo
    echo "## removed after unpacking (docs, static libs, Fortran/Java/OpenSHMEM, unusable plugins)"
    printf '%s\n' "${removed[@]}"
    echo
    echo "## shared libraries in the prefix"
    (cd "$TREE" && find . \( -type f -o -type l \) -name '*.so*' | sed 's|^\./||' | sort)
  } > "$MANIFEST"
  tar -C "$DEPS" --owner=0 --group=0 --numeric-owner -czf "$TARBALL" root
  echo "$STAMP" > "$PACK/STAMP"
  say "packed $TARBALL"
fi

# ---- 5. data/brown (the default plan's data; the GPU machine has no node/npm) -----------------------
if [ "$DATA" = 1 ]; then
  if [ -f "$ROOT/data/brown/train_000.bin" ] && [ -f "$ROOT/data/brown/val.bin" ] &&
     [ -f "$ROOT/data/brown/gpt2_tokenizer.bin" ]; then
    say "data/brown present"
  else
    say "data/brown missing: running scripts/prepare_data"
    "$ROOT/scripts/prepare_data"
  fi
fi

# ---- 6. sizes: what a device call carries -------------------------------------------------------------
bytes() { du -sb "$1" 2>/dev/null | cut -f1 || true; }  # empty for a missing path (set -e, pipefail)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
repo_bytes=0
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
  repo_bytes="$(cd "$ROOT" && git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null |
                awk '{ s += $1 } END { print s + 0 }')"
fi
pack_bytes="$(bytes "$PACK")"
data_bytes="$(bytes "$ROOT/data/brown")"; data_bytes="${data_bytes:-0}"
total=$((repo_bytes + pack_bytes + data_bytes))
say "sizes: unpacked prefix $(mib "$(bytes "$TREE")") (stays here); carried: .deps/pack $(mib "$pack_bytes")," \
    "data/brown $(mib "$data_bytes"), repo files $(mib "$repo_bytes") -> $(mib "$total") of the 64 MiB limit"
[ "$total" -lt $((48 * 1048576)) ] || die "what travels is over 48 MiB; drop more from the pack"
say "device call: carry [\".deps/pack\", \"data/brown\"], command 'bash scripts/device/run.sh'"
