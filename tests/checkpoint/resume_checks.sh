#!/usr/bin/env bash
# Checkpoint scenarios with the GPT example, run as a user would (`accel launch`, several launches):
#   resume_checks.sh ACCEL_CLI GPT_LM SOURCE_DIR PYTHON OUT_DIR SCENARIO
# bitwise   10 steps in one go vs 5 + save + resume: steps 6-10 bitwise equal (FULL_SHARD and ZeRO-1 at 2)
# reshard   ZeRO-3 at 4 -> ZeRO-1 at 2 -> DDP at 1 -> HSDP at 4 (2 copies of FULL_SHARD over 2 ranks:
#           configs/fsdp/hsdp.yaml) -> ZeRO-3 at 4, 4 steps each, against
#           20 uninterrupted steps (rtol 2e-4); and pure resharding (load, save, no step) reproduces
#           every tensor, optimizer moments included, bit for bit (tests/checkpoint/ckpt_tool.py);
#           save_model's safetensors equal the checkpoint's parameters
# kill      SIGKILL during save_state: the previous checkpoint loads and resumes bitwise; the next
#           save replaces the partial one
# restarts  a ZeRO-3 run killed 3 times under accel launch --max_restarts 3 --auto_resume: it finishes by
#           itself, its JSONL holds every step once, its final state is bitwise the uninterrupted run's
# hang      a rank SIGSTOPped under --max_restarts 1: the collective timeout ends the job naming that
#           rank, and the job started again finishes with the uninterrupted run's losses
# corrupt   truncated, bit-flipped or index-less checkpoints: a message naming the file, exit non-zero,
#           and the checkpoint files untouched
# merge     accel merge-weights: a ZeRO-3 checkpoint at 4 ranks merges into save_model's file byte for
#           byte; a bf16 run's full checkpoint into several files, fp32 or (--dtype bf16) rounded by torch;
#           --remove_checkpoint_dir; errors (a project directory, a flipped byte, a bad size, an output
#           inside the checkpoint)
set -uo pipefail
ACCEL=$1 GPT=$2 SRC=$3 PY=$4 OUT=$5 SCENARIO=$6
CFG=$SRC/configs
W=$OUT/$SCENARIO
rm -rf "$W" && mkdir -p "$W"
cd "$W"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok:   $*"; }
run() {  # run NP CONFIG ARGS...: the GPT example at NP ranks under CONFIG, 16-sample global batch, seed 3
  local np=$1 cfg=$2; shift 2
  "$ACCEL" launch -n "$np" "$GPT" --config_file "$CFG/$cfg.yaml" --seed 3 "$@" > "$W/last.out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { echo "  (gpt_lm at $np ranks under $cfg exited $rc:)"; tail -5 "$W/last.out" | sed 's/^/    /'; }
  return $rc
}
close() {  # close LOG REF FIRST LAST RTOL: steps FIRST..LAST of LOG against REF
  awk -v rtol="$5" -v a="$3" -v b="$4" 'NR == FNR { ref[$2] = $4; next }
    $2 >= a && $2 <= b { n++; d = $4 - ref[$2]; if (d < 0) d = -d; r = d / ref[$2]; if (r > worst) worst = r; if (r > rtol) bad = 1 }
    END { printf "steps %d-%d: %d compared, worst relative difference %.2e (tolerance %s)\n", a, b, n, worst, rtol; exit bad || n != b - a + 1 }' "$2" "$1"
}

case "$SCENARIO" in
bitwise)
  for c in "fsdp/full_shard" "deepspeed/zero1"; do
    n=${c#*/}
    run 2 "$c" --steps 10 --log_file "full_$n.log" || fail "$c: uninterrupted run"
    run 2 "$c" --steps 5 --project_dir "p_$n" --checkpointing_steps 5 --log_file "first_$n.log" || fail "$c: first half"
    run 2 "$c" --steps 10 --project_dir "p_$n" --resume_from_checkpoint latest --log_file "second_$n.log" || fail "$c: resumed half"
    if diff <(sed -n 6,10p "full_$n.log") "second_$n.log" > /dev/null && [ "$(wc -l < "second_$n.log")" = 5 ]; then
      pass "$c at 2 ranks: resumed steps 6-10 bitwise equal to the uninterrupted run"
    else
      fail "$c: resumed steps differ"; paste <(sed -n 6,10p "full_$n.log") "second_$n.log"
    fi
    diff <(sed -n 1,5p "full_$n.log") "first_$n.log" > /dev/null && pass "$c: steps 1-5 equal too" || fail "$c: first half differs"
  done
  ;;
reshard)
  run 4 deepspeed/zero3 --steps 20 --log_file full.log || fail "uninterrupted ZeRO-3 at 4"
  prev=""
  step=0
  for leg in "4 deepspeed/zero3" "2 deepspeed/zero1" "1 ddp" "4 fsdp/hsdp" "4 deepspeed/zero3"; do
    set -- $leg
    step=$((step + 4))
    resume=()
    [ -n "$prev" ] && resume=(--resume_from_checkpoint "$prev")
    run "$1" "$2" --steps $step "${resume[@]}" --save_state_to "ckpt_$step" --log_file "leg_$step.log" || fail "leg to step $step ($2 at $1)"
    if msg=$(close "leg_$step.log" full.log $((step - 3)) $step 2e-4); then pass "$2 at $1 ranks, $msg"; else fail "$2 at $1 ranks, $msg"; fi
    prev=ckpt_$step
  done
  # Pure resharding: ZeRO-3 at 4 -> ZeRO-1 at 2 -> DDP at 1 -> SHARD_GRAD_OP at 2 -> HSDP at 4 (the first
  # copy's ranks write) and back, loading and saving without a step.
  run 2 deepspeed/zero1 --steps 4 --resume_from_checkpoint ckpt_4 --save_state_to re_zero1_2 || fail "reshard to ZeRO-1 at 2"
  run 1 ddp --steps 4 --resume_from_checkpoint re_zero1_2 --save_state_to re_ddp_1 || fail "reshard to DDP at 1"
  run 2 fsdp/shard_grad_op --steps 4 --resume_from_checkpoint re_ddp_1 --save_state_to re_sgo_2 || fail "reshard to SHARD_GRAD_OP at 2"
  run 4 fsdp/hsdp --steps 4 --resume_from_checkpoint re_sgo_2 --save_state_to re_hsdp_4 || fail "reshard to HSDP at 4"
  for r in 2 3; do [ "$(stat -c %s re_hsdp_4/shard_$r.bin)" = 0 ] || fail "HSDP: rank $r of the second copy wrote data"; done
  run 4 deepspeed/zero3 --steps 4 --resume_from_checkpoint re_hsdp_4 --save_state_to re_zero3_4 || fail "reshard back to ZeRO-3 at 4"
  # save_model from ZeRO-3 at 4: the safetensors weights equal the checkpoint's parameters.
  run 4 deepspeed/zero3 --steps 4 --resume_from_checkpoint ckpt_4 --save_model_to model_4 || fail "save_model"
  if out=$("$PY" "$SRC/tests/checkpoint/ckpt_tool.py" export ckpt_4 model_4); then pass "save_model: $out"; else fail "save_model: $out"; fi
  # A full checkpoint (rank 0 writes whole tensors) from ZeRO-3 at 4 holds the same tensors, and loads.
  run 4 deepspeed/zero3 --steps 4 --resume_from_checkpoint ckpt_4 --save_state_to re_full_4 --full_state || fail "full save"
  for r in 1 2 3; do [ "$(stat -c %s re_full_4/shard_$r.bin)" = 0 ] || fail "full save: rank $r wrote data"; done
  run 2 deepspeed/zero1 --steps 8 --resume_from_checkpoint re_full_4 --log_file leg_full.log || fail "resuming from the full checkpoint"
  if msg=$(close leg_full.log full.log 5 8 2e-4); then pass "resumed from the full checkpoint at ZeRO-1@2, $msg"; else fail "full resume, $msg"; fi
  for c in re_zero1_2 re_ddp_1 re_sgo_2 re_hsdp_4 re_zero3_4 re_full_4; do
    if out=$("$PY" "$SRC/tests/checkpoint/ckpt_tool.py" same ckpt_4 "$c"); then pass "$c: $out"; else fail "$c"; echo "$out"; fi
  done
  ;;
kill)
  run 2 fsdp/full_shard --steps 10 --log_file full.log || fail "uninterrupted run"
  run 2 fsdp/full_shard --steps 3 --project_dir p --checkpointing_steps 3 --log_file a.log || fail "first run"
  [ -f p/checkpoints/checkpoint_0/index.json ] && pass "checkpoint_0 saved" || fail "no checkpoint_0"
  # The second run pauses 60 s between writing checkpoint_1 and publishing it; it is killed there,
  # accel launch with it (its status directory goes to tmp/ here: a SIGKILL leaves it behind).
  mkdir -p tmp
  ACCEL_CHECKPOINT_PAUSE_MS=60000 TMPDIR=$PWD/tmp setsid "$ACCEL" launch -n 2 "$GPT" --config_file "$CFG/fsdp/full_shard.yaml" --seed 3 \
    --steps 10 --project_dir p --checkpointing_steps 3 --resume_from_checkpoint latest > b.out 2>&1 &
  pid=$!
  for _ in $(seq 150); do [ -f p/checkpoints/checkpoint_1.partial/index.json ] && break; sleep 0.2; done
  [ -f p/checkpoints/checkpoint_1.partial/index.json ] && pass "the save of checkpoint_1 was under way" || fail "checkpoint_1 never started"
  kill -KILL -- -$pid 2>/dev/null; wait $pid 2>/dev/null
  sleep 1
  [ ! -e p/checkpoints/checkpoint_1 ] && pass "killed mid-save: no checkpoint_1 published" || fail "checkpoint_1 exists after the kill"
  run 2 fsdp/full_shard --steps 10 --project_dir p --checkpointing_steps 3 --resume_from_checkpoint latest --log_file c.log \
    || fail "resuming after the kill"
  grep -q "resumed from latest at step 3" last.out && pass "resumed from checkpoint_0 (step 3)" || fail "did not resume at step 3"
  diff <(sed -n 4,10p full.log) c.log > /dev/null && pass "steps 4-10 bitwise equal to the uninterrupted run" \
    || { fail "steps 4-10 differ"; paste <(sed -n 4,10p full.log) c.log; }
  [ -f p/checkpoints/checkpoint_1/index.json ] && [ ! -e p/checkpoints/checkpoint_1.partial ] \
    && pass "the next save published checkpoint_1 and removed the partial one" || fail "checkpoint_1 / partial after the resumed run"
  ;;
restarts)
  # The same ZeRO-3 run at 2 ranks twice: once uninterrupted, once under accel launch --max_restarts 3
  # --auto_resume with one rank SIGKILLed at a random step 3 times (each kill after the job started
  # again). The killed run must end by itself (exit 0), its JSONL metrics must hold every step once with
  # the uninterrupted run's losses, and its final state (parameters, optimizer moments, step, loader
  # position: tests/checkpoint/ckpt_tool.py same) must be the uninterrupted one's bit for bit.
  # --dropout: every step draws from each rank's generator, which the checkpoints must restore.
  common=(--steps 200 --checkpointing_steps 10 --total_limit 2 --log_with jsonl --full_state --dropout 0.1)
  run 2 deepspeed/zero3 "${common[@]}" --project_dir p_full --save_state_to final_full --log_file full.log \
    || fail "uninterrupted run"
  setsid "$ACCEL" launch -n 2 --max_restarts 3 --auto_resume "$GPT" --config_file "$CFG/deepspeed/zero3.yaml" --seed 3 \
    "${common[@]}" --project_dir p_killed --save_state_to final_killed --log_file killed.log > killed.out 2>&1 &
  pid=$!
  last_step() { tail -1 killed.log 2>/dev/null | awk 'END { print $2 + 0 }'; }
  for k in 1 2 3; do
    target=$(( $(last_step) + 5 + RANDOM % 20 ))  # (a step takes tens of ms here)
    # The first kill after the first checkpoint (step 10) is on disk, so that every restart has one to
    # resume from (a kill before it restarted from scratch, and the count of resumes came out 2).
    if [ "$k" = 1 ] && [ "$target" -lt 15 ]; then target=15; fi
    for _ in $(seq 600); do [ "$(last_step)" -ge $target ] && break; sleep 0.05; done
    ranks=()  # this job's gpt_lm processes (not its launcher, mpirun or accel-rank, whose command lines name it too)
    for p in $(pgrep -x gpt_lm); do tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | grep -q -- "--project_dir p_killed" && ranks+=("$p"); done
    [ ${#ranks[@]} -gt 0 ] || { fail "kill $k: no rank to kill"; break; }
    victim=${ranks[$((RANDOM % ${#ranks[@]}))]}
    echo "kill $k: SIGKILL to pid $victim at step $(last_step) (target $target)"
    kill -KILL "$victim"
    for _ in $(seq 600); do grep -q "restart $k of 3" killed.out && break; sleep 0.1; done
    grep -q "restart $k of 3" killed.out || { fail "kill $k: the job was not started again"; break; }
  done
  wait $pid
  rc=$?
  [ $rc -eq 0 ] && pass "the killed run finished by itself (exit 0) after 3 restarts" || { fail "the killed run exited $rc"; tail -20 killed.out; }
  n=$(grep -c "accel: resumed from" killed.out)
  [ "$n" -ge 3 ] && pass "it resumed $n times from its newest checkpoint" || fail "resumed $n times"
  "$PY" - p_full/gpt_lm/metrics.jsonl p_killed/gpt_lm/metrics.jsonl <<'PYEOF2' && pass "JSONL: every step once, the losses the uninterrupted run's" || fail "JSONL metrics"
import json, sys
full, killed = ([json.loads(l) for l in open(f) if l.strip()] for f in sys.argv[1:3])
steps = [r["step"] for r in killed]
print(f"JSONL: {len(killed)} records, steps {steps[0]}..{steps[-1]}")
ok = steps == list(range(1, 201)) and [r["loss"] for r in killed] == [r["loss"] for r in full]
sys.exit(0 if ok else 1)
PYEOF2
  diff full.log killed.log > /dev/null && pass "its loss log (one file across the restarts): every step once, bitwise the uninterrupted run's" \
    || fail "loss log differs: $(wc -l < killed.log) lines"
  "$PY" "$SRC/tests/checkpoint/ckpt_tool.py" same final_full final_killed && pass "final state bitwise the uninterrupted run's" \
    || fail "final state differs"
  ;;
hang)
  # One rank SIGSTOPped mid-run (it stops answering) under accel launch --max_restarts 1 --auto_resume
  # with ACCEL_COMM_TIMEOUT_S=5: the job ends within the timeout (plus teardown), the waiting rank's
  # TimeoutError and accel launch's summary both name the stopped rank, no process is left stopped,
  # and the job started again finishes with its loss log bitwise the uninterrupted run's.
  # The resume comes from the config file's resume_from_checkpoint: latest (not --auto_resume).
  timeout_s=5
  printf 'distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\nresume_from_checkpoint: latest\n' > zero3_resume.yaml
  common=(--config_file zero3_resume.yaml --seed 3 --steps 150 --checkpointing_steps 10 --total_limit 2)
  "$ACCEL" launch -n 2 "$GPT" "${common[@]}" --project_dir p_full --log_file full.log > full.out 2>&1 || fail "uninterrupted run"
  ACCEL_COMM_TIMEOUT_S=$timeout_s setsid "$ACCEL" launch -n 2 --max_restarts 1 "$GPT" \
    "${common[@]}" --project_dir p_hung --log_file hung.log > hung.out 2>&1 &
  pid=$!
  last_step() { tail -1 hung.log 2> /dev/null | awk 'END { print $2 + 0 }'; }
  for _ in $(seq 600); do [ "$(last_step)" -ge 20 ] && break; sleep 0.05; done
  ranks=()
  for p in $(pgrep -x gpt_lm); do tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | grep -q -- "--project_dir p_hung" && ranks+=("$p"); done
  victim=${ranks[$((RANDOM % ${#ranks[@]}))]}
  vrank=$(tr '\0' '\n' < /proc/$victim/environ | sed -n 's/^RANK=//p')
  t0=$(date +%s%N)
  kill -STOP "$victim"
  echo "SIGSTOP to rank $vrank (pid $victim) at step $(last_step)"
  for _ in $(seq 600); do grep -q "restart 1 of 1" hung.out && break; sleep 0.05; done
  elapsed=$(( ($(date +%s%N) - t0) / 1000000 ))
  if grep -q "restart 1 of 1" hung.out && [ $elapsed -le $(( (timeout_s + 5) * 1000 )) ]; then
    pass "the job ended ${elapsed} ms after the stop (collective timeout ${timeout_s} s) and started again"
  else
    fail "the job did not end and start again within ${timeout_s} s + 5 s (${elapsed} ms)"
  fi
  grep -q "rank $vrank (pid $victim, stopped (SIGSTOP or a debugger)) has not joined it" hung.out \
    && pass "the waiting rank's TimeoutError names rank $vrank, stopped" || { fail "no TimeoutError naming rank $vrank"; grep -i timeout hung.out; }
  grep -Eq "accel launch: rank $vrank \(node 0, local rank $vrank, host [^)]*\) stopped answering: it was stopped by signal 19" hung.out \
    && pass "accel launch names rank $vrank as the one that stopped answering" || { fail "accel launch does not name rank $vrank"; grep "accel launch" hung.out; }
  kill -0 "$victim" 2> /dev/null && fail "the stopped rank (pid $victim) is still there" || pass "the stopped rank is gone"
  wait $pid
  rc=$?
  [ $rc -eq 0 ] && pass "the job started again finished (exit 0)" || { fail "the job exited $rc"; tail -20 hung.out; }
  grep -Eq "accel: resumed from p_hung/checkpoints/checkpoint_[0-9]+ at step [1-9][0-9]* \(restart 1\)" hung.out \
    && pass "the job started again resumed (resume_from_checkpoint: latest)" || fail "no resume after the restart"
  diff full.log hung.log > /dev/null && pass "its loss log: every step once, bitwise the uninterrupted run's" \
    || fail "loss log differs: $(wc -l < hung.log) lines"
  ;;
corrupt)
  run 2 fsdp/full_shard --steps 2 --save_state_to good || fail "saving"
  check() {  # check LABEL REGEX: the resume from ./bad fails saying REGEX, and ./bad is unchanged
    local before after
    before=$(cd bad && find . -type f -exec md5sum {} + | sort)
    if run 2 fsdp/full_shard --steps 4 --resume_from_checkpoint bad; then fail "$1: loading succeeded"; return; fi
    grep -Eq "$2" last.out && pass "$1: says /$2/" || { fail "$1: message"; grep error last.out | head -3; }
    after=$(cd bad && find . -type f -exec md5sum {} + | sort)
    [ "$before" = "$after" ] && pass "$1: checkpoint files untouched" || fail "$1: files changed"
  }
  rm -rf bad && cp -r good bad && truncate -s -100 bad/shard_1.bin
  check "truncated shard" "bad/shard_1.bin is truncated: [0-9]+ bytes, but .* needs bytes"
  rm -rf bad && cp -r good bad && printf '\xff' | dd of=bad/shard_0.bin bs=1 seek=200 conv=notrunc 2> /dev/null
  check "flipped byte" "bad/shard_0.bin: .* fail their CRC32 check \(the file is corrupted\)"
  rm -rf bad && cp -r good bad && rm bad/index.json
  check "no index" "no index.json in bad: not an accel checkpoint, or a save that did not finish"
  rm -rf bad && cp -r good bad && head -c 300 good/index.json > bad/index.json
  check "cut index" "bad/index.json does not parse"
  rm -rf bad && cp -r good bad
  run 2 fsdp/full_shard --steps 4 --resume_from_checkpoint bad --d_model 48 && fail "a model of another shape loaded"
  grep -Eq "parameter '.*' is \[[0-9, ]+\] in the checkpoint but \[[0-9, ]+\] in the model" last.out \
    && pass "another model shape: names the parameter and both shapes" || fail "shape mismatch message"
  ;;
merge)
  # accel merge-weights, offline in one process. ZeRO-3 at 4 ranks: the merged file is save_model's at
  # the same step byte for byte, and the checkpoint's parameters as numpy reads them (ckpt_tool.py).
  run 4 deepspeed/zero3 --steps 4 --save_state_to ck --save_model_to model || fail "ZeRO-3 at 4 ranks"
  if "$ACCEL" merge-weights ck merged > merge.out 2>&1; then pass "merge-weights ck merged"; else fail "merge-weights exited $?"; cat merge.out; fi
  cmp -s merged/model.safetensors model/model.safetensors && pass "ZeRO-3@4 merged: save_model's file byte for byte" \
    || fail "the merged file differs from save_model's"
  grep -q "saved by ZERO_3 at 4 rank(s), step 4" merge.out && pass "it says what it merged" || { fail "summary line"; cat merge.out; }
  if out=$("$PY" "$SRC/tests/checkpoint/ckpt_tool.py" export ck merged); then pass "numpy + safetensors: $out"; else fail "$out"; fi
  # bf16 over fp32 masters under FULL_SHARD at 2, a full checkpoint, several files: the default keeps the
  # fp32 masters, --dtype bf16 is them rounded (torch's rounding), both sharded with an index.
  "$ACCEL" launch -n 2 --mixed_precision bf16 "$GPT" --config_file "$CFG/fsdp/full_shard.yaml" --seed 3 --steps 4 \
    --save_state_to ck16 --full_state > last.out 2>&1 || { fail "bf16 FULL_SHARD at 2"; tail -3 last.out; }
  "$ACCEL" merge-weights ck16 m32 --max_shard_size 20KB > /dev/null 2>&1 || fail "merge into 20 KB files"
  "$ACCEL" merge-weights ck16 m16 --dtype bf16 --max-shard-size 20KB > /dev/null 2>&1 || fail "merge --dtype bf16"
  if out=$("$PY" "$SRC/tests/checkpoint/ckpt_tool.py" export ck16 m32); then pass "bf16 run, fp32 masters: $out"; else fail "$out"; fi
  if out=$("$PY" - m32 m16 <<'PY'
import glob, json, sys
import torch
from safetensors.torch import load_file
def load(d):
    idx = json.load(open(f"{d}/model.safetensors.index.json"))
    files = sorted(glob.glob(f"{d}/model-*.safetensors"))
    assert len(files) > 1 and set(idx["weight_map"].values()) == {f.split("/")[-1] for f in files}, files
    t = {}
    for f in files:
        t.update(load_file(f))
    assert set(t) == set(idx["weight_map"]), "index and files disagree"
    return t
a, b = load(sys.argv[1]), load(sys.argv[2])
assert set(a) == set(b) and all(v.dtype == torch.float32 for v in a.values()) and all(v.dtype == torch.bfloat16 for v in b.values())
bad = [k for k in a if not torch.equal(a[k].to(torch.bfloat16), b[k])]
print(f"{len(a)} tensors in {len(glob.glob(sys.argv[1] + '/model-*'))} files; bf16 = fp32 rounded: {len(a) - len(bad)} of {len(a)}")
sys.exit(1 if bad else 0)
PY
  ); then pass "$out"; else fail "bf16 export: $out"; fi
  # --remove_checkpoint_dir: the same weights, then the checkpoint is gone.
  "$ACCEL" merge-weights ck16 m_one > /dev/null 2>&1 && cp -r ck16 ck16_copy \
    && "$ACCEL" merge-weights ck16_copy m_rm --remove_checkpoint_dir > /dev/null 2>&1 \
    && cmp -s m_rm/model.safetensors m_one/model.safetensors && [ ! -e ck16_copy ] \
    && pass "--remove_checkpoint_dir: the same file, the checkpoint removed" || fail "--remove_checkpoint_dir"
  # Errors: exit 1 with the reason, and an earlier merge in the output directory left as it was.
  mkdir -p proj/checkpoints && cp -r ck proj/checkpoints/checkpoint_0
  "$ACCEL" merge-weights proj out > err.out 2>&1 && fail "a project directory merged"
  grep -q "no index.json in proj: not a checkpoint; its newest checkpoint is proj/checkpoints/checkpoint_0" err.out \
    && pass "a project directory: names its newest checkpoint" || { fail "project directory message"; cat err.out; }
  cp -r ck bad && before=$(md5sum merged/model.safetensors)
  off=$("$PY" -c "import json; i = json.load(open('bad/index.json')); print(min(s['offset'] for k, e in i['tensors'].items() if k.startswith('param/') for s in e['slices'] if s['file'] == 'shard_0.bin'))")
  printf '\xff' | dd of=bad/shard_0.bin bs=1 seek=$((off + 1)) conv=notrunc 2> /dev/null
  "$ACCEL" merge-weights bad merged > err.out 2>&1; rc=$?
  [ $rc = 1 ] && grep -Eq "bad/shard_0.bin: .* fail their CRC32 check" err.out && pass "a flipped byte: exit 1 naming the file" \
    || { fail "flipped byte: exit $rc"; cat err.out; }
  [ "$before" = "$(md5sum merged/model.safetensors)" ] && [ "$(ls merged)" = model.safetensors ] \
    && pass "the earlier merge in the output directory is untouched" || fail "the output changed"
  "$ACCEL" merge-weights ck merged --max_shard_size 10XB > err.out 2>&1; rc=$?
  [ $rc != 0 ] && grep -q "size '10XB': unknown unit 'XB'" err.out && pass "a bad size: refused (exit $rc)" \
    || { fail "bad size: exit $rc"; cat err.out; }
  # An output inside the checkpoint, which --remove_checkpoint_dir would delete with it: refused.
  "$ACCEL" merge-weights ck ck/new/../hf --remove_checkpoint_dir > err.out 2>&1; rc=$?
  [ $rc = 1 ] && grep -q "is inside the checkpoint ck" err.out && [ -f ck/index.json ] && [ ! -e ck/hf ] \
    && pass "an output inside the checkpoint: exit 1, the checkpoint kept" || { fail "output inside: exit $rc"; cat err.out; }
  ;;
*) echo "unknown scenario $SCENARIO"; exit 2 ;;
esac
[ $failures -eq 0 ] && echo "PASSED: $SCENARIO" || echo "FAILED: $SCENARIO ($failures)"
[ $failures -eq 0 ]
