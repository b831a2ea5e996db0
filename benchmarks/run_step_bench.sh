#!/usr/bin/env bash
# The step_bench tables of the README.
#   bash benchmarks/run_step_bench.sh [step_bench args]
#       plain libtorch at 1 rank, then every strategy at 1, 2 and 4 ranks (fp32), then same-run ratios.
#   bash benchmarks/run_step_bench.sh --precision-table [step_bench args]
#       DDP and ZERO_3 at 2 ranks in each of fp32, bf16, fp16 and fp8, then per strategy the same-run
#       ratios of the four precisions (their steps interleaved in one run). A smaller model than the
#       default (--layers 4 --d-model 192, unless given): this CPU has no bf16/fp16/fp8 matmul
#       hardware, and the default model's bf16 step takes ~16 s here.
# Extra arguments go to step_bench (e.g. --steps 10). STEP_BENCH overrides the binary
# (default build/bin/step_bench).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${STEP_BENCH:-$ROOT/build/bin/step_bench}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { mpirun --oversubscribe --bind-to none -np "$1" "$BIN" --strategy "$2" "${@:3}"; }
HEADER="| strategy      | precision | ranks | step ms | peak MiB | params | grads | optim | gathered | activations | moved MiB | ×Ψ(n-1)/n·4B | peak RSS MiB |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"

if [ "${1:-}" = "--precision-table" ]; then
  shift
  args=("$@")
  case " $* " in *" --layers"*) ;; *) args+=(--layers 4) ;; esac
  case " $* " in *" --d-model"*) ;; *) args+=(--d-model 192) ;; esac
  echo "$HEADER"
  for s in DDP ZERO_3; do
    for p in fp32 bf16 fp16 fp8; do run 2 "$s" --precision "$p" "${args[@]}"; done
  done
  echo
  echo "Same-run ratios (steps interleaved):"
  for s in DDP ZERO_3; do run 2 "$s" --precision fp32,bf16,fp16,fp8 "${args[@]}"; done
  exit 0
fi

echo "$HEADER"
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
