#!/usr/bin/env bash
# A step_bench that fails at 2 ranks, for `accel bench`'s failing-run test: every rank of a 2-rank
# run exits 3 with a message; any other world size runs the real step_bench ($BENCH_REAL_STEP_BENCH)
# with the same arguments. (accel launch starts it through accel-rank, which exports WORLD_SIZE.)
if [ "${WORLD_SIZE:-1}" = 2 ]; then
  echo "bench_failing_step_bench: simulated failure at 2 ranks (rank ${RANK:-?})" >&2
  exit 3
fi
exec "${BENCH_REAL_STEP_BENCH:?set BENCH_REAL_STEP_BENCH to the real step_bench}" "$@"
