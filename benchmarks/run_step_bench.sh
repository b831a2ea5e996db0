#!/usr/bin/env bash
# The step_bench table of the README: plain libtorch at 1 rank, then every strategy at 1, 2 and 4
# ranks. Extra arguments go to step_bench (e.g. --steps 10).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/build/bin/step_bench"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { mpirun --oversubscribe --bind-to none -np "$1" "$BIN" --strategy "$2" "${@:3}"; }
echo "| strategy      | ranks | step ms | peak MiB | params | grads | optim | gathered | moved MiB | ×Ψ(n-1)/n·4B |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
run 1 plain "$@"
for n in 1 2 4; do
  for s in DDP ZERO_1 ZERO_2 ZERO_3; do run "$n" "$s" "$@"; done
  if [ "$n" = 4 ]; then ACCEL_RANKS_PER_NODE=2 run "$n" HYBRID_SHARD "$@"; fi
done
echo
echo "Same-run ratios (steps interleaved):"
run 1 plain,DDP,ZERO_3 "$@"
run 2 DDP,ZERO_3 "$@"
run 4 DDP,ZERO_3 "$@"
