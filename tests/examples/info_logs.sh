#!/usr/bin/env bash
# ACCEL_LOG_LEVEL=info says what the run decided, once, from the main process: the transport, the
# binding, the ACCEL_* variables set, and the resolved plan. At debug: the gradient buckets and every
# collective. At the default level (warning) none of these lines is written.
# Usage: info_logs.sh ACCEL_CLI GPT_LM CONFIG
set -u
ACCEL=$1 GPT=$2 CONFIG=$3
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
out=$(ACCEL_LOG_LEVEL=info "$ACCEL" launch -n 2 "$GPT" --config_file "$CONFIG" --steps 2 2>&1) || fail "the run exited $?"
for want in '\[info\] transport: CPU collectives over shm \(2 rank\(s\) on 1 node\(s\)\)' \
            '\[info\] binding: rank 0 on [0-9]+ CPU\(s\), [0-9]+ intra-op thread\(s\), device cpu' \
            '\[info\] environment: .*ACCEL_LOG_LEVEL=info' \
            '\[info\] plan: FSDP FULL_SHARD on 2 rank\(s\) of cpu, shard group of 2: optimizer sharded, gradients sharded, parameters sharded'; do
  n=$(grep -cE "$want" <<<"$out")
  [ "$n" -eq 1 ] && echo "ok: once: $want" || fail "$n lines match '$want' (want exactly 1)"
done
grep -E '\[info\] (transport|binding|environment|plan):' <<<"$out" | grep -v 'rank 0/2' && fail "a rank other than 0 logged a decision"
# At debug, the gradient buckets once per shard group (its rank 0) and every collective of every rank.
debug=$(ACCEL_LOG_LEVEL=debug "$ACCEL" launch -n 2 "$GPT" --config_file "$CONFIG" --steps 2 2>&1) || fail "the debug run exited $?"
n=$(grep -cE '\[debug\] gradient buckets \(reduce-scatter, Float, up to [0-9]+ B each, 2 in flight\): [0-9]+ flat' <<<"$debug")
[ "$n" -eq 1 ] && echo "ok: the buckets once" || fail "$n bucket lines at debug (want 1)"
for r in 0 1; do
  grep -qE "\[accel rank $r/2\] \[debug\] reduce_scatter.* over shm in a group of 2" <<<"$debug" \
    && echo "ok: rank $r logs its reduce-scatters" || fail "no reduce_scatter line from rank $r at debug"
done
quiet=$("$ACCEL" launch -n 2 "$GPT" --config_file "$CONFIG" --steps 2 2>&1) || fail "the quiet run exited $?"
grep -qE '\[info\]' <<<"$quiet" && fail "info lines at the default level"
[ $failures -eq 0 ] && echo "PASSED" || { echo "$out"; echo "FAILED ($failures)"; }
[ $failures -eq 0 ]
