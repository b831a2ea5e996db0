#!/usr/bin/env bash
# A stand-in for step_bench --device cuda ... --json in tests/scripts/gpu_scripts.sh: a size trains
# when d_model <= FAKE_MAX_D_<strategy label> (ZERO_3, OPT for --offload-optimizer alone, INF for the
# parameters offloaded too), and prints step_bench's JSON line; larger sizes fail as out of device
# memory. Each run sleeps FAKE_SLEEP seconds. FAKE_THROW_OPT=1: every run with its optimizer offloaded
# ends as an exception nothing caught does (its message on stderr, SIGABRT), whatever its size.
# FAKE_PEER_THROWS=1: a size over the limit ends as a rank killed at the memory limit whose peer threw
# on the broken link before mpirun ended it (both on stderr, SIGABRT): still a size that did not fit.
d=0 oo="" op=""
while [ $# -gt 0 ]; do
  case "$1" in
    --d-model) d=$2; shift ;;
    --offload-optimizer) oo=$2; shift ;;
    --offload-param) op=$2; shift ;;
  esac
  shift
done
max=${FAKE_MAX_D_ZERO_3:-1280}
[ -n "$oo" ] && max=${FAKE_MAX_D_OPT:-2304}
[ -n "$op" ] && max=${FAKE_MAX_D_INF:-9999}
sleep "${FAKE_SLEEP:-0}"
if [ -n "$oo" ] && [ -n "${FAKE_THROW_OPT:-}" ]; then
  echo "terminate called after throwing an instance of 'c10::Error'" >&2
  echo "  what():  Can't detach views in-place. Use detach() instead." >&2
  kill -ABRT $$
fi
if ((d > max)) && [ -n "${FAKE_PEER_THROWS:-}" ]; then
  echo "terminate called after throwing an instance of 'accel::CommError'" >&2
  echo "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)." >&2
  kill -ABRT $$
fi
if ((d > max)); then
  echo "step_bench: out of memory on the device (the stand-in's limit is d_model $max)" >&2
  exit 3
fi
p=$((12 * d * d * 20 + 4096 * d))
echo "{\"strategy\": \"ZERO_3\", \"params\": $p, \"d_model\": $d, \"cuda_peak\": 7.0e9, \"peak_rss\": 2.0e9, \"node_pss\": 2.0e9, \"step_ms\": 1000, \"device_busy_share\": 0.6, \"device_compute_share\": 0.5}"
