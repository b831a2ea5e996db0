#!/usr/bin/env bash
# scripts/gpu_lease.sh — a lent GPU's 15 minutes (docs/gpu.md) as two prepared calls of the device
# tool. Each call has a deadline of its own, so it ends with its summary and its logs packed under
# $OUT rather than being cut off at the tool's limit with nothing. The machine goes back after 30 s
# idle, so the second call must follow the first at once.
#   bash scripts/gpu_lease.sh 1 [SECONDS]   call 1 (device timeout_s 600; SECONDS default 540):
#       gpu_check.sh's tests (every strategy at 1-4 ranks on the GPU, offload, the examples, the
#       reshard), then, in that order, as time allows: accel's bf16 and fp8 steps at the product-bound
#       shape (d 4096, 5 layers, seq 1024, batch FP8_BATCH = 32: fp8 against bf16, and bf16's MFU at
#       1.14B), fp8's 200-step loss curve at that shape, and ZeRO-Infinity's GPU-busy share at batch
#       16, two then four micro-batches a step (the step in backward and in optimizer.step()). Logs:
#       $OUT/part1.tgz.
#   bash scripts/gpu_lease.sh 2 SECONDS     call 2 (the device time left, SECONDS a little under it):
#       the largest-model table at an 8 GB cap, batch LEASE_BATCH (default 1): no offload searched
#       from d 1280 (its answer at batch 1: two runs), then ZeRO-Infinity and ZeRO-Offload each
#       confirmed in one run at the size known to train (LEASE_START, LEASE_MAX_D; ">=" in the table:
#       6x the no-offload size is d 3200, 2.5x is d 2048), the searches stopped at 55% of SECONDS;
#       then, at the product-bound shape: torchao's float8 + torch.compile; accel's bf16 and fp8 steps
#       under the profiler and torchao's under torch.profiler (where the time goes, first, so that a
#       deadline leaves them); PyTorch's bf16 + torch.compile; accel's fp8 with the loss as
#       torch_anchor.py computes it (step_bench --loss composite: against call 1's fp8 step, what the
#       fused cross entropy is worth); the rowwise recipe under both per-column cast kernels
#       (ACCEL_FP8_COLWISE single and chunked: which to default to); then accel against PyTorch,
#       rounds of every pair (at most LEASE_VS_ROUNDS, default 5) until the time is up. Logs:
#       $OUT/part2.tgz, the table in $OUT/largest_model.txt and its runs in $OUT/largest_model.log.
# The bundle is .gpu_bundle beside this checkout (scripts/gpu_bundle.sh made it; carry it).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PART=${1:-}
OUTDIR=${OUT:-/tmp/gpu_lease}
BUNDLE=${LEASE_BUNDLE:-$ROOT/.gpu_bundle}
WORK=${LEASE_WORK:-/tmp}  # where gpu_check.sh's logs go before they are packed under $OUT
mkdir -p "$OUTDIR"
case "$PART" in
  1)
    SECONDS_LEFT=${2:-540}
    GPU_CHECK_DEADLINE_S=$SECONDS_LEFT FP8_ROUNDS=1 OFFLOAD_BATCHES=16 OFFLOAD_ACCUM="2 4" ACCEL_COMM_TIMEOUT_S=${ACCEL_COMM_TIMEOUT_S:-60} \
      GPU_CHECK_OUT="$WORK/gpu_lease_part1" GPU_CHECK_TAR="$OUTDIR/part1.tgz" \
      bash "$ROOT/scripts/gpu_check.sh" --bundle "$BUNDLE" --bench '^(fp8_bound_accel|fp8_bound_curve|offload_busy)'
    ;;
  2)
    SECONDS_LEFT=${2:?"gpu_lease.sh 2 SECONDS: the device time this call may use"}
    [[ "$SECONDS_LEFT" =~ ^[0-9]+$ ]] || { echo "gpu_lease.sh: SECONDS must be a whole number, not '$SECONDS_LEFT'" >&2; exit 2; }
    t0=$(date +%s)
    # The bundle's libraries for running its programs by hand (and Open MPI copied into / where absent).
    setup=$(bash "$ROOT/scripts/gpu_check.sh" --bundle "$BUNDLE" --setup-only 2>&1)
    eval "$(grep '^export LD_LIBRARY_PATH=' <<<"$setup" | tail -1)"
    STEP_BENCH="$BUNDLE/bin/step_bench" ACCEL_CLI="$BUNDLE/bin/accel" \
      bash "$ROOT/benchmarks/largest_model.sh" --device cuda --device-memory 8 --resolution 128 \
      --batch "${LEASE_BATCH:-1}" --deadline-s $((SECONDS_LEFT * 55 / 100)) \
      --strategies "ZERO_3 ZERO_3+ckpt+opt+param ZERO_3+opt" \
      --start "${LEASE_START:-ZERO_3=1280 ZERO_3+opt=2304 ZERO_3+ckpt+opt+param=3200}" \
      --max-d "${LEASE_MAX_D:-ZERO_3+opt=2304 ZERO_3+ckpt+opt+param=3200}" \
      --log "$OUTDIR/largest_model.log" ${LEASE_SIB:+--step-in-backward} | tee "$OUTDIR/largest_model.txt"
    left=$((SECONDS_LEFT - ($(date +%s) - t0) - 15))
    if ((left > 30)); then
      GPU_CHECK_DEADLINE_S=$left FP8_ROUNDS=1 VS_ROUNDS=${LEASE_VS_ROUNDS:-5} GPU_CHECK_OUT="$WORK/gpu_lease_part2" \
        GPU_CHECK_TAR="$OUTDIR/part2.tgz" bash "$ROOT/scripts/gpu_check.sh" --bundle "$BUNDLE" --bench-only \
        --only '^(fp8_bound_torchao|fp8_bound_loss|fp8_bound_torch_bf16|fp8_bound_rowwise|profile_fp8_bound|vs_torch_)'
    else
      echo "gpu_lease.sh: ${left}s left after the largest-model table: nothing more started"
    fi
    ;;
  *)
    sed -n '2,/^set -uo/p' "$0" | sed '$d'
    exit 2
    ;;
esac
