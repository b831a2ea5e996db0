#!/usr/bin/env bash
# The step_bench tables of docs/performance.md.
#   bash benchmarks/run_step_bench.sh [step_bench args]
#       plain libtorch at 1 rank, then every strategy at 1, 2 and 4 ranks (fp32), then same-run ratios.
#   bash benchmarks/run_step_bench.sh --precision-table [step_bench args]
#       DDP and ZERO_3 at 2 ranks in each of fp32, bf16, fp16 and fp8, then per strategy the same-run
#       ratios of the four precisions (their steps interleaved in one run). A smaller model than the
#       default (--layers 4 --d-model 192, unless given): a CPU without bf16/fp16/fp8 matmul hardware
#       (an AVX2 VM, benchmarks/results/2026-11-27-performance-history.md) took ~16 s for the default model's bf16 step.
#   bash benchmarks/run_step_bench.sh --vs-torch [--repeats R] [step_bench args]
#       accel against PyTorch on the same GPT step (benchmarks/torch_anchor.py): accel DDP / PyTorch
#       DDP, FULL_SHARD / FSDP2 (fully_shard per block), SHARD_GRAD_OP / FSDP2 without
#       reshard_after_forward, and at 1 rank plain C++ / plain Python and accel's one process (NO:
#       the engine's passthrough, its fused step) / plain Python, at 1, 2 and 4 ranks. Each pair
#       runs alternately (accel, torch, accel, torch, ...) R times [3]; the table shows each side's
#       median and their ratio (below 1: accel is faster). Whole processes on a shared machine are
#       noisy: the spread (min-max of the R runs) is shown too.
#   bash benchmarks/run_step_bench.sh --large [--repeats R] [step_bench args]
#       issue 17's 0.59B GPT (--d-model 1560 --layers 20 --batch 1 --steps 3 --warmup 1, unless given) at
#       2 ranks: DDP, then ZERO_2 and ZERO_3 node-shared (ACCEL_NODE_SHARED_PARAMS=1 ACCEL_NODE_SHARED_GRADS=1,
#       the default on one CPU node) and private (both 0: the path GPUs and multi-node runs take), in turn
#       R times [3] (one model alone fills ~10 GB per rank, so their steps cannot be interleaved in one
#       run); the table shows each one's median step (min-max), its ratio to DDP's median, the median wait
#       on collectives and its share of the step, and peak RSS per rank (the last run; with node-shared
#       parameters it counts the shared buffers in each rank). About 8 minutes at R=3; run it alone.
# Extra arguments go to step_bench (and torch_anchor.py: --steps, --warmup, --batch, --layers,
# --d-model, --heads, --seq, --vocab), e.g. --steps 10. Every run starts through `accel launch`, so
# each rank is bound to its share of the cores with as many intra-op threads (docs/cli.md).
# STEP_BENCH, ACCEL_CLI and TORCH_PYTHON override the binaries (default build/bin/step_bench,
# build/bin/accel, and the build's ACCEL_PYTHON).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${STEP_BENCH:-$ROOT/build/bin/step_bench}
CLI=${ACCEL_CLI:-$(dirname "$BIN")/accel}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# What accel's engine does with float32 CPU matmuls here (ACCEL_CPU_GEMM; `accel env` says why).
gemm_line() { "$CLI" env 2>/dev/null | sed -n 's/^CPU fp32 matmuls  */accel'"'"'s float32 CPU matmuls (not plain'"'"'s): /p'; }
run() { "$CLI" launch -n "$1" "$BIN" --strategy "$2" "${@:3}" 2> >(grep -v '^accel launch: ' >&2); }
# Which shards the sharded rows used (every table says it): node-shared on one CPU node by default.
shards_line() {
  local p=${ACCEL_NODE_SHARED_PARAMS:-1} g=${ACCEL_NODE_SHARED_GRADS:-1}
  if [ "$p" = 0 ] && [ "$g" = 0 ]; then
    echo "Shards: private (ACCEL_NODE_SHARED_PARAMS=0 ACCEL_NODE_SHARED_GRADS=0, the path GPUs and multi-node runs take)"
  elif [ "$p" != 0 ] && [ "$g" != 0 ]; then
    echo "Shards: node-shared (the default on one CPU node; ACCEL_NODE_SHARED_PARAMS=0 ACCEL_NODE_SHARED_GRADS=0 for private)"
  else
    echo "Shards: ACCEL_NODE_SHARED_PARAMS=$p ACCEL_NODE_SHARED_GRADS=$g (node-shared where 1)"
  fi
}

if [ "${1:-}" = "--vs-torch" ]; then
  shift
  repeats=3
  if [ "${1:-}" = "--repeats" ]; then repeats=$2; shift 2; fi
  PY=${TORCH_PYTHON:-$(sed -n 's/^ACCEL_PYTHON:FILEPATH=//p' "$(dirname "$BIN")/../CMakeCache.txt" 2>/dev/null || true)}
  [ -n "$PY" ] || { echo "run_step_bench.sh: set TORCH_PYTHON to a Python with torch" >&2; exit 2; }
  step_ms() { grep -o '"step_ms": [0-9.]*' | tail -1 | awk '{print $2}'; }
  accel_ms() { run "$1" "$2" --json "${@:3}" | step_ms; }
  torch_ms() {
    "$CLI" launch -n "$1" "$PY" "$ROOT/benchmarks/torch_anchor.py" --strategy "$2" --json "${@:3}" \
      2> >(grep -v '^accel launch: ' >&2) | step_ms
  }
  stats() { tr ' ' '\n' | sort -g | awk '{v[NR] = $1} END {printf "%.1f %.1f-%.1f", v[int((NR + 1) / 2)], v[1], v[NR]}'; }
  device=$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")' 2>/dev/null || echo cpu)
  echo "accel vs PyTorch ($device; $("$PY" -c 'import torch; print("torch", torch.__version__)'), the same GPT step; median of $repeats alternating runs each, ms per step (min-max)"
  gemm_line
  shards_line
  echo
  echo "| ranks | accel | PyTorch | accel ms | PyTorch ms | ratio |"
  echo "|---:|---|---|---:|---:|---:|"
  for n in 1 2 4; do
    pairs="DDP:DDP FULL_SHARD:FSDP2 SHARD_GRAD_OP:FSDP2_NO_RESHARD"
    [ "$n" = 1 ] && pairs="plain:plain NO:plain $pairs"  # (NO: accel's one process, its fused step)
    for pair in $pairs; do
      ours=${pair%%:*} theirs=${pair#*:} a="" t=""
      for ((i = 0; i < repeats; i++)); do
        a="$a $(accel_ms "$n" "$ours" "$@")"
        t="$t $(torch_ms "$n" "$theirs" "$@")"
      done
      read -r am ar <<<"$(echo $a | stats)"
      read -r tm tr_ <<<"$(echo $t | stats)"
      label=$ours
      [ "$ours" = plain ] && label="plain (C++ libtorch)"
      [ "$ours" = NO ] && label="NO (accel, one process)"
      printf "| %d | %s | %s | %s (%s) | %s (%s) | %.2f |\n" "$n" "$label" "$theirs" "$am" "$ar" "$tm" "$tr_" \
        "$(awk -v a="$am" -v b="$tm" 'BEGIN {print a / b}')"
    done
  done
  exit 0
fi
if [ "${1:-}" = "--large" ]; then
  shift
  repeats=3
  if [ "${1:-}" = "--repeats" ]; then repeats=$2; shift 2; fi
  args=("$@")
  for kv in "--d-model 1560" "--layers 20" "--batch 1" "--steps 3" "--warmup 1"; do
    case " $* " in *" ${kv% *}"*) ;; *) args+=($kv) ;; esac
  done
  field() { grep -o "\"$1\": [0-9.e+-]*" | tail -1 | awk '{print $2}'; }
  declare -A steps waits rss
  for ((i = 0; i < repeats; i++)); do
    for s in DDP ZERO_2-node-shared ZERO_3-node-shared ZERO_2-private ZERO_3-private; do
      case $s in
        *-private) line=$(ACCEL_NODE_SHARED_PARAMS=0 ACCEL_NODE_SHARED_GRADS=0 run 2 "${s%-private}" --json "${args[@]}") ;;
        *-node-shared) line=$(ACCEL_NODE_SHARED_PARAMS=1 ACCEL_NODE_SHARED_GRADS=1 run 2 "${s%-node-shared}" --json "${args[@]}")
          [ "$s" = ZERO_3-node-shared ] && shared=$(echo "$line" | field node_shared_bytes) ;;
        *) line=$(run 2 "$s" --json "${args[@]}") ;;
      esac
      steps[$s]="${steps[$s]:-} $(echo "$line" | field step_ms)"
      waits[$s]="${waits[$s]:-} $(echo "$line" | field wait_ms)"
      rss[$s]=$(echo "$line" | field peak_rss)
    done
  done
  median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
  range() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {printf "%.0f-%.0f", v[1], v[NR]}'; }
  echo "step_bench ${args[*]}, 2 ranks, median of $repeats runs in turn (ms per step, the slowest rank)"
  gemm_line
  echo
  echo "| strategy | step ms (min-max) | × DDP | wait ms | wait share | peak RSS MiB |"
  echo "|---|---:|---:|---:|---:|---:|"
  ddp=$(echo ${steps[DDP]} | median)
  for s in DDP ZERO_2-node-shared ZERO_3-node-shared ZERO_2-private ZERO_3-private; do
    m=$(echo ${steps[$s]} | median) w=$(echo ${waits[$s]} | median)
    printf "| %s | %.0f (%s) | %.2f | %.0f | %.0f%% | %.0f |\n" "$s" "$m" "$(echo ${steps[$s]} | range)" \
      "$(awk -v a="$m" -v b="$ddp" 'BEGIN {print a / b}')" "$w" "$(awk -v a="$w" -v b="$m" 'BEGIN {print 100 * a / b}')" \
      "$(awk -v b="${rss[$s]}" 'BEGIN {print b / 1048576}')"
  done
  echo
  echo "*-node-shared (the default on one CPU node): ACCEL_NODE_SHARED_PARAMS=1 ACCEL_NODE_SHARED_GRADS=1, ZeRO-3's parameters"
  echo "in one shared buffer per flat that both ranks map, and the reduce-scatters' inputs in a shared pool the peers read in"
  echo "place; ZeRO-3's peak RSS counts the $(awk -v b="${shared:-0}" 'BEGIN {printf "%.0f", b / 1048576}') MiB of parameters in each rank, the node holds them once."
  echo "*-private (the path GPUs and multi-node runs take): ACCEL_NODE_SHARED_PARAMS=0 ACCEL_NODE_SHARED_GRADS=0, each rank's"
  echo "shard and gradient buffers its own, parameters all-gathered around each unit's use."
  echo "DDP has no node-shared buffers in either mode (parameters replicated, gradients all-reduced from private buckets)."
  exit 0
fi
HEADER="| strategy      | precision | ranks | step ms | peak MiB | node MiB | params | grads | optim | gathered | activations | moved MiB | ×Ψ(n-1)/n·4B | peak RSS MiB | PSS MiB | wait ms |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"

if [ "${1:-}" = "--precision-table" ]; then
  shift
  args=("$@")
  case " $* " in *" --layers"*) ;; *) args+=(--layers 4) ;; esac
  case " $* " in *" --d-model"*) ;; *) args+=(--d-model 192) ;; esac
  shards_line
  echo "$HEADER"
  for s in DDP ZERO_3; do
    for p in fp32 bf16 fp16 fp8; do run 2 "$s" --precision "$p" "${args[@]}"; done
  done
  echo
  echo "Same-run ratios (steps interleaved):"
  for s in DDP ZERO_3; do run 2 "$s" --precision fp32,bf16,fp16,fp8 "${args[@]}"; done
  exit 0
fi

shards_line
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
