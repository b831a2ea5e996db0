#!/usr/bin/env bash
# accel setup: system packages, the pinned torch wheel in a reusable venv, configure and build.
# Idempotent: each stage checks what is already there and skips it.
#   scripts/setup.sh            everything, then the main job (accel env, accel config explain, and the
#                               GPT example started by accel launch on 2 ranks)
#   scripts/setup.sh --no-run   everything but the main job (what the test command uses)
# Environment: ACCEL_CACHE (default ~/.cache/accel) holds the venv; ACCEL_BUILD_TYPE (default Release).
set -euo pipefail

TORCH_VERSION=2.11.0
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${ACCEL_CACHE:-$HOME/.cache/accel}
VENV=$CACHE/venv-torch-$TORCH_VERSION
BUILD=$ROOT/build
RUN_MAIN=1
for a in "$@"; do
  case "$a" in
    --no-run) RUN_MAIN=0 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$a' (allowed: --no-run, --help)" >&2; exit 2 ;;
  esac
done

say() { printf '\n== %s\n' "$*"; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi

# --- 1. system packages ------------------------------------------------------------------------
APT_PKGS=(build-essential cmake ninja-build ccache pkg-config git python3-venv
          libopenmpi-dev openmpi-bin libyaml-cpp-dev nlohmann-json3-dev libcli11-dev zlib1g-dev
          libspdlog-dev libfmt-dev googletest libgtest-dev
          liburing-dev libprotobuf-dev protobuf-compiler
          iproute2)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "apt: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  say "apt: all ${#APT_PKGS[@]} packages present"
fi

# Let `mpirun -np N` start more ranks than this machine has cores (tests and examples use 4 ranks on
# small machines): Open MPI's per-user parameter file, one line, added once.
MCA_FILE=$HOME/.openmpi/mca-params.conf
if ! grep -qs '^rmaps_base_oversubscribe' "$MCA_FILE"; then
  mkdir -p "$(dirname "$MCA_FILE")"
  echo "rmaps_base_oversubscribe = 1" >> "$MCA_FILE"
  say "mpi: allowed oversubscription in $MCA_FILE"
fi

# --- 2. python venv with the pinned torch wheel ----------------------------------------------
# Kept outside the checkout so fresh clones (and CI) reuse it. '.complete' is written last, so an
# interrupted install is redone, never trusted. Besides torch: the readers the tests check accel's
# files with (safetensors, tensorboard), transformers for the Llama interop tests, matplotlib for
# `accel bench`'s plots, torchao for the fp8 anchor (benchmarks/torch_anchor.py --precision fp8). A venv
# made before a package joined the list gets the missing ones added.
PY_PKGS=(safetensors tensorboard numpy "matplotlib==3.11.2" "transformers==5.24.0" "torchao==0.18.0")
PY_MODULES=(safetensors tensorboard numpy matplotlib transformers torchao)
if [ -f "$VENV/.complete" ] && "$VENV/bin/python" -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  say "venv: reusing $VENV (torch $TORCH_VERSION)"
  absent=()
  for i in "${!PY_MODULES[@]}"; do
    "$VENV/bin/python" -c "import ${PY_MODULES[$i]}" 2>/dev/null || absent+=("${PY_PKGS[$i]}")
  done
  if [ ${#absent[@]} -gt 0 ]; then
    say "venv: adding ${absent[*]}"
    "$VENV/bin/pip" install --progress-bar on "torch==$TORCH_VERSION" "${absent[@]}"
  fi
else
  say "venv: creating $VENV with torch==$TORCH_VERSION (a few GB; progress below)"
  PY=${ACCEL_PYTHON:-python3}
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  if ! "$PY" -m venv "$VENV"; then
    # Debian's python3 needs python3-venv (installed above); a pyenv python has venv built in.
    /usr/bin/python3 -m venv "$VENV"
  fi
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install --progress-bar on "torch==$TORCH_VERSION" "${PY_PKGS[@]}"
  touch "$VENV/.complete"
fi

# --- 3. configure and build ----------------------------------------------------------------------
TORCH_PREFIX=$("$VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  say "cmake: configuring $BUILD"
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE="${ACCEL_BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
    -DACCEL_PYTHON="$VENV/bin/python"
fi
say "cmake: building (ccache: $(command -v ccache || echo none))"
start=$(date +%s)
cmake --build "$BUILD" -j "$(nproc)"
say "build done in $(( $(date +%s) - start )) s"

# --- 4. the main job -------------------------------------------------------------------------------
if [ "$RUN_MAIN" = 1 ]; then
  say "main job: accel env, then what the FULL_SHARD config does and the GPT example under it on 2 ranks"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  "$BUILD/bin/accel" launch -n 2 "$BUILD/bin/accel" env
  "$BUILD/bin/accel" config explain "$ROOT/configs/fsdp/full_shard.yaml"
  "$BUILD/bin/accel" launch --config_file "$ROOT/configs/fsdp/full_shard.yaml" "$BUILD/bin/gpt_lm" --steps 40
fi
