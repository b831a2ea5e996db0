#!/usr/bin/env bash
# The GPT example on 2 ranks with trackers, its files checked by check_tracker_files.py (the real
# tensorboard package). Two ways in:
#   yaml:  log_with [tensorboard, jsonl, csv] and project_dir in the config file (ZeRO-2);
#   flag:  --log_with tensorboard,jsonl,csv --project_dir (HYBRID_SHARD over 2 simulated nodes: a
#          replicate group), with per-rank peak memory and weight histograms;
#   resume: 8 steps with a checkpoint at 5, then a run resumed from it to step 12 into the same
#          project: the JSONL and the CSV hold steps 1-12 once each, 1-5 from the first run and 6-12
#          from the second (their losses those of each run's own --log_file), and --warmup_steps 8
#          goes on where it stopped: the learning rate logged after step s is 3e-3 * min(1, s / 8) (the
#          rate of step s + 1; step 1 runs at 0, as Transformers' linear warmup does).
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
  resume)
    run=("$accel" launch -n 2 "$gpt" --config_file "$src/configs/deepspeed/zero2.yaml" --project_dir "$dir/project"
         --log_with jsonl,csv --warmup_steps 8)
    "${run[@]}" --steps 8 --checkpointing_steps 5 --log_file "$dir/first.log"
    "${run[@]}" --steps 12 --resume_from_checkpoint latest --log_file "$dir/second.log"
    "$python" - "$dir/project/gpt_lm" "$dir/first.log" "$dir/second.log" <<'PY'
import csv, json, sys
d, first, second = sys.argv[1:]
loss = {}
for path, steps in ((first, range(1, 6)), (second, range(6, 13))):
    for line in open(path):
        _, s, _, x = line.split()
        if int(s) in steps:
            loss[int(s)] = float(x)
jsonl = [json.loads(l) for l in open(d + "/metrics.jsonl")]
rows = list(csv.DictReader(open(d + "/metrics.csv", newline="")))
bad = []
for name, recs in (("JSONL", [(r["step"], r["loss"]) for r in jsonl]), ("CSV", [(int(r["step"]), float(r["loss"])) for r in rows])):
    steps = [s for s, _ in recs]
    if steps != list(range(1, 13)):
        bad.append(f"{name} steps {steps}, expected 1..12 once each")
    bad += [f"{name} step {s}: loss {x} != {loss.get(s)}" for s, x in recs if loss.get(s) != x]
bad += [f"JSONL step {r['step']}: lr {r['lr']}, expected {3e-3 * min(1, r['step'] / 8)} (linear warmup over 8 steps)"
        for r in jsonl if abs(r["lr"] - 3e-3 * min(1, r["step"] / 8)) > 1e-12]
print("\n".join(bad) if bad else "resumed run: JSONL and CSV hold steps 1-12 once each, losses of the run that made each; the warmup went on")
sys.exit(1 if bad else 0)
PY
    ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
