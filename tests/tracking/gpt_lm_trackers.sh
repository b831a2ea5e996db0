#!/usr/bin/env bash
# The GPT example on 2 ranks with trackers, its files checked by check_tracker_files.py (the real
# tensorboard package). Two ways in:
#   yaml:  log_with [tensorboard, jsonl, csv] and project_dir in the config file (ZeRO-2);
#   flag:  --log_with tensorboard,jsonl,csv --project_dir (HYBRID_SHARD over 2 simulated nodes: a
#          replicate group), with per-rank peak memory and weight histograms.
# usage: gpt_lm_trackers.sh ACCEL_CLI GPT_LM SOURCE_DIR PYTHON OUT_DIR yaml|flag
set -euo pipefail
accel=$1 gpt=$2 src=$3 python=$4 out=$5 mode=$6
dir=$out/$mode
rm -rf "$dir" && mkdir -p "$dir"
steps=8
case $mode in
  yaml)
    cfg=$dir/zero2_trackers.yaml
    cp "$src/configs/deepspeed/zero2.yaml" "$cfg"
    cp "$src/configs/deepspeed/zero2.json" "$dir/"  # the YAML names it beside itself
    printf 'log_with: [tensorboard, jsonl, csv]\nproject_dir: %s\n' "$dir/project" >> "$cfg"
    "$accel" launch -n 2 "$gpt" --config_file "$cfg" --steps $steps --log_file "$dir/loss.log"
    "$python" "$src/tests/tracking/check_tracker_files.py" "$dir/project/gpt_lm" --steps $steps \
      --loss_log "$dir/loss.log" --seq 32 --batch 16
    ;;
  flag)
    ACCEL_RANKS_PER_NODE=1 "$accel" launch -n 2 "$gpt" \
      --config_file "$src/configs/fsdp/hybrid_shard.yaml" --steps $steps --log_file "$dir/loss.log" \
      --log_with tensorboard,jsonl,csv --project_dir "$dir/project" --histogram_every 4
    "$python" "$src/tests/tracking/check_tracker_files.py" "$dir/project/gpt_lm" --steps $steps \
      --loss_log "$dir/loss.log" --seq 32 --batch 16 --memory --histogram_every 4 --groups world,replicate
    ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
