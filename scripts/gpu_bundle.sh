#!/usr/bin/env bash
# scripts/gpu_bundle.sh — what scripts/gpu_check.sh needs on a GPU machine that cannot build accel:
# one without network (no apt, no pip) and without Open MPI or accel's other libraries, but with a
# Python whose torch is the pinned version (the device machines lent to some sessions are such). It
# packs, from this machine's CUDA build (build/, as scripts/setup.sh makes it where the CUDA toolkit
# with NCCL is installed):
#   bin/   the programs gpu_check.sh runs (accel, accel-rank, accel_tests, cuda_tests, step_bench, gpt_lm,
#          comm_bench), stripped;
#   lib/   libaccel.so and every library they load that is neither torch's, CUDA's, nor the C/C++
#          runtime's (yaml-cpp, fmt, spdlog, liburing, protobuf-lite, Open MPI's and what those load);
#   root/  Open MPI's runtime (mpirun, its plugins, help texts and configuration, PMIx) under its
#          absolute paths, for gpu_check.sh --bundle to copy into / where nothing is there yet
#          (plugins for InfiniBand, UCX, libfabric and PSM are left out: they need libraries this
#          machine's Open MPI only suggests, and a single node does not use them);
#   py/    torchao's Python files, where the venv has torchao (for torch_anchor.py --precision fp8);
#   MANIFEST  the commit it was built from, the package versions and the sizes.
# Usage:
#   bash scripts/gpu_bundle.sh [DIR]     (DIR default: .gpu_bundle in the checkout, ignored by git)
# On the GPU machine (the checkout with DIR beside it): bash scripts/gpu_check.sh --bundle DIR
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${ACCEL_BUILD:-$ROOT/build}
OUT=${1:-$ROOT/.gpu_bundle}
PROGRAMS=(accel accel-rank accel_tests cuda_tests step_bench comm_bench gpt_lm)
MPI_PKGS=(openmpi-bin libopenmpi3 openmpi-common libpmix2 libmunge2 libhwloc15 libevent-core-2.1-7
          libevent-pthreads-2.1-7)
# Plugins whose libraries are not packed (see above), and Open MPI's Java, Fortran and OpenSHMEM
# bindings, which accel does not use.
SKIP_RE='mca_(btl_ofi|btl_openib|btl_uct|mtl_ofi|mtl_psm|mtl_psm2|pml_ucx|osc_ucx|spml_ucx|sshmem_ucx|atomic_ucx)\.so|libmca_common_(ofi|ucx|verbs)|libmpi_java|libmpi_mpifh|libmpi_usempi|liboshmem|/usr/share/(doc|man|lintian)/'
# Libraries every Linux machine with a C++ toolchain has (and torch's own needs).
SYSTEM_RE='/(ld-linux[^/]*|libc|libm|libdl|librt|libpthread|libutil|libgcc_s|libstdc\+\+|libz)\.so'

die() { echo "gpu_bundle.sh: $*" >&2; exit 1; }
for p in "${PROGRAMS[@]}"; do [ -x "$BUILD/bin/$p" ] || die "$BUILD/bin/$p is missing: build first (bash scripts/setup.sh --no-run)"; done
LIBACCEL=$BUILD/lib/libaccel.so
ldd "$LIBACCEL" | grep -q 'libnccl' ||
  die "$LIBACCEL has no NCCL backend: build where the CUDA toolkit with NCCL is installed (CMake found no NCCL)"
for p in "${MPI_PKGS[@]}"; do dpkg-query -W "$p" >/dev/null 2>&1 || die "package $p is not installed here (scripts/setup.sh installs Open MPI)"; done

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/root"
for p in "${PROGRAMS[@]}"; do strip --strip-unneeded -o "$OUT/bin/$p" "$BUILD/bin/$p"; done
strip --strip-unneeded -o "$OUT/lib/libaccel.so" "$LIBACCEL"

# lib/: what the programs load, transitively (ldd), but torch's, CUDA's (the GPU machine has its own,
# matching its driver) and the system's.
ldd "${PROGRAMS[@]/#/$BUILD/bin/}" "$LIBACCEL" 2>/dev/null | awk '/=> \// {print $1, $3}' | sort -u |
  while read -r soname path; do
    case "$path" in */torch/lib/*|/usr/local/cuda*|*/nvidia/*|"$BUILD"/*) continue ;; esac
    if [[ "$path" =~ $SYSTEM_RE ]]; then continue; fi
    [[ "$soname" =~ ^lib(cuda|cudart|nccl|cublas|cufft|curand|cusparse|cusolver|nvrtc|nvJitLink) ]] && continue
    cp -L "$path" "$OUT/lib/$soname"
  done
cp -L "$(ldconfig -p | awk '/libmunge.so.2 / {print $NF; exit}')" "$OUT/lib/libmunge.so.2"  # libpmix's, dlopened

# root/: Open MPI's runtime under its own paths.
for p in "${MPI_PKGS[@]}"; do dpkg -L "$p"; done | sort -u | while read -r f; do
  { [ -f "$f" ] || [ -L "$f" ]; } || continue
  [[ "$f" =~ $SKIP_RE ]] && continue
  mkdir -p "$OUT/root$(dirname "$f")"
  cp -a "$f" "$OUT/root$f"
done
# mpirun and mpiexec are Debian alternatives (links through /etc/alternatives), not the packages' files.
ln -sf mpirun.openmpi "$OUT/root/usr/bin/mpirun"
ln -sf mpiexec.openmpi "$OUT/root/usr/bin/mpiexec"

# py/: torchao's Python files where this machine's venv has torchao (its float8 training is Python over
# torch._scaled_mm; the compiled extensions are left out), for torch_anchor.py --precision fp8 on a GPU
# machine whose Python lacks it (gpu_check.sh --bundle puts py/ on PYTHONPATH then).
VENV_PY=$(sed -n 's/^ACCEL_PYTHON:FILEPATH=//p' "$BUILD/CMakeCache.txt")
"${VENV_PY:-python3}" - "$OUT/py" <<'PYEOF' || true
import os, shutil, sys
try:
    import torchao
except Exception:
    sys.exit(0)
shutil.copytree(os.path.dirname(torchao.__file__), os.path.join(sys.argv[1], "torchao"),
                ignore=shutil.ignore_patterns("*.so", "__pycache__"))
PYEOF

{
  echo "accel GPU bundle, made $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -m)"
  echo "commit $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  py=$(sed -n 's/^ACCEL_PYTHON:FILEPATH=//p' "$BUILD/CMakeCache.txt")
  echo "torch (built against) $("${py:-python3}" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo unknown)"
  need() { for f in "$OUT"/bin/* "$OUT"/lib/*; do objdump -T "$f" 2>/dev/null | grep -o "$1[0-9.]*"; done | sort -uV | tail -1; }
  echo "needs on the GPU machine: $(need 'GLIBC_2\.') and $(need 'GLIBCXX_3\.4\.') (ldd there says so if not)"
  echo "torchao (py/) $("${VENV_PY:-python3}" -c 'import torchao; print(torchao.__version__)' 2>/dev/null || echo 'none: torch_anchor.py --precision fp8 skips where the GPU machine has none')"
  echo "packages:"; for p in "${MPI_PKGS[@]}"; do echo "  $p $(dpkg-query -W -f='${Version}' "$p")"; done
  echo "lib/:"; (cd "$OUT/lib" && ls | sed 's/^/  /')
  echo "size: bin $(du -sh "$OUT/bin" | cut -f1), py $(du -sh "$OUT/py" 2>/dev/null | cut -f1), lib $(du -sh "$OUT/lib" | cut -f1), root $(du -sh "$OUT/root" | cut -f1), all $(du -sh "$OUT" | cut -f1)"
} > "$OUT/MANIFEST"
cat "$OUT/MANIFEST"
bytes=$(du -sb "$OUT" | cut -f1)
[ "$bytes" -lt $((56 << 20)) ] || echo "gpu_bundle.sh: warning: $((bytes >> 20)) MiB; the device tool carries 64 MiB with the checkout" >&2
