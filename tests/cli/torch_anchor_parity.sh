#!/usr/bin/env bash
# benchmarks/torch_anchor.py trains what step_bench trains: under `accel launch` (which must keep the
# venv's python link so torch imports), rank 0's loss at every step of PyTorch's run equals step_bench's
# to 1e-4 relative: plain at 1 rank (same init, same data, same AdamW), and at 2 ranks DDP, and
# FULL_SHARD / SHARD_GRAD_OP against FSDP2 with / without reshard_after_forward (the averaged
# gradients too). A small model keeps it short; the workload's sizes are flags of both.
# Usage: torch_anchor_parity.sh ACCEL STEP_BENCH PYTHON SOURCE_DIR. Exit 77 (skipped) when PYTHON has no torch.
set -uo pipefail
ACCEL=$1 BENCH=$2 PY=$3 SRC=$4
"$PY" -c "import torch" 2>/dev/null || { echo "SKIP: $PY cannot import torch"; exit 77; }
unset OMP_NUM_THREADS
size=(--layers 2 --d-model 64 --heads 4 --vocab 256 --seq 16 --batch 2 --steps 4 --warmup 0 --show-loss)
failures=0
losses() { grep -Eo "^step +[0-9]+ .* loss [-0-9.e+]+" | awk '{print $NF}'; }
# (The last case: attention fused in scaled_dot_product_attention on both sides, --attention sdpa.)
for case in "1 plain plain" "2 DDP DDP" "2 FULL_SHARD FSDP2" "2 SHARD_GRAD_OP FSDP2_NO_RESHARD" "2 DDP DDP sdpa"; do
  read -r n ours theirs attention <<<"$case"
  attn=(--attention "${attention:-eager}")
  a=$("$ACCEL" launch -n "$n" "$BENCH" --strategy "$ours" "${size[@]}" "${attn[@]}" 2>&1) || { echo "FAIL: step_bench $ours exited $?"; echo "$a"; failures=$((failures+1)); continue; }
  b=$("$ACCEL" launch -n "$n" "$PY" "$SRC/benchmarks/torch_anchor.py" --device cpu --strategy "$theirs" "${size[@]}" "${attn[@]}" 2>&1) \
    || { echo "FAIL: torch_anchor $theirs exited $?"; echo "$b"; failures=$((failures+1)); continue; }
  la=$(losses <<<"$a") lb=$(losses <<<"$b")
  echo "n=$n ${attn[*]} step_bench $ours: $(echo $la) | torch_anchor $theirs: $(echo $lb)"
  if [ "$(wc -l <<<"$la")" -ne 4 ] || [ "$(wc -l <<<"$lb")" -ne 4 ]; then
    echo "FAIL: expected 4 losses from each"; failures=$((failures+1)); continue
  fi
  if paste <(echo "$la") <(echo "$lb") | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * ($1 < 0 ? -$1 : $1)) bad = 1 } END { exit bad }'; then
    echo "ok:   n=$n $ours equals PyTorch's $theirs step by step (${attn[*]})"
  else
    echo "FAIL: n=$n $ours and PyTorch's $theirs differ"; failures=$((failures+1))
  fi
done
# A size whose products (M*N*K >= 2^20) take accel's oneDNN path, forced on so that any x86 libtorch with
# oneDNN runs it: DDP's losses still equal PyTorch's (libtorch's BLAS) step by step.
big=(--layers 2 --d-model 128 --heads 4 --vocab 512 --seq 32 --batch 4 --steps 4 --warmup 0 --show-loss)
a=$(ACCEL_CPU_GEMM=onednn "$ACCEL" launch -n 2 "$BENCH" --strategy DDP "${big[@]}" 2>&1) || { echo "FAIL: step_bench DDP (onednn) exited $?"; echo "$a"; exit 1; }
b=$("$ACCEL" launch -n 2 "$PY" "$SRC/benchmarks/torch_anchor.py" --device cpu --strategy DDP "${big[@]}" 2>&1) \
  || { echo "FAIL: torch_anchor DDP exited $?"; echo "$b"; exit 1; }
gemm=$(grep -o "^cpu gemm .*" <<<"$a" || true)
echo "$gemm"
if [ -z "$gemm" ]; then
  echo "FAIL: step_bench --show-loss printed no 'cpu gemm' line"; echo "$a"; failures=$((failures+1))
elif grep -q "^cpu gemm onednn" <<<"$gemm"; then
  products=$(sed -E 's/.*, ([0-9]+) products through oneDNN.*/\1/' <<<"$gemm")
  [ "$products" -gt 0 ] || { echo "FAIL: no product went through oneDNN"; failures=$((failures+1)); }
  la=$(losses <<<"$a") lb=$(losses <<<"$b")
  echo "n=2 step_bench DDP (onednn): $(echo $la) | torch_anchor DDP: $(echo $lb)"
  if [ "$(wc -l <<<"$la")" -eq 4 ] && [ "$(wc -l <<<"$lb")" -eq 4 ] &&
     paste <(echo "$la") <(echo "$lb") | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * ($1 < 0 ? -$1 : $1)) bad = 1 } END { exit bad }'; then
    echo "ok:   n=2 DDP with oneDNN products equals PyTorch's DDP step by step"
  else
    echo "FAIL: n=2 DDP with oneDNN products and PyTorch's DDP differ"; failures=$((failures+1))
  fi
elif grep -q "^cpu gemm libtorch" <<<"$gemm"; then
  echo "(oneDNN's matmul is not in this libtorch: that case is skipped)"
else
  echo "FAIL: unexpected line: $gemm"; failures=$((failures+1))
fi
[ $failures -eq 0 ]
