#!/usr/bin/env bash
# accel's test command: set up what is missing (apt packages, the torch venv, the build), then run
# every ctest test (multi-rank ones under mpirun). Extra arguments go to ctest (e.g. -R comm_np2).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh" --no-run
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "$ROOT/build" --output-on-failure "$@"
