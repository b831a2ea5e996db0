#!/usr/bin/env bash
# The classifier examples' checkpoint options, as a user runs them:
#   classifier_checkpoints.sh ACCEL_CLI EXAMPLE CONFIG NP PYTHON OUT_DIR
# - --checkpointing_steps without a project directory stops before the first step, saying why;
# - so does --resume_from_checkpoint latest;
# - 8 steps in one go, saving at step 4 (--checkpointing_steps), against 4 steps resumed from that
#   checkpoint (--resume_from_checkpoint DIR): steps 5-8's losses bitwise equal;
# - --save_model_to after each: the two safetensors files, read by Python's safetensors, hold the same
#   tensors bit for bit.
set -uo pipefail
ACCEL=$1 EXAMPLE=$2 CONFIG=$3 NP=$4 PY=$5 OUT=$6
name=$(basename "$EXAMPLE")
W=$OUT/$name
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok:   $*"; }
run() {  # run ARGS...: the example at NP ranks under CONFIG, seed 5
  "$ACCEL" launch -n "$NP" "$EXAMPLE" --config_file "$CONFIG" --seed 5 "$@" > "$W/last.out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { echo "  ($name exited $rc:)"; tail -5 "$W/last.out" | sed 's/^/    /'; }
  return $rc
}

# Without a project directory, automatic checkpoints have nowhere to go: refused before training.
refused() {  # refused MESSAGE ARGS...
  local msg=$1; shift
  rm -f refused.log
  if run --steps 4 --log_file refused.log "$@"; then
    fail "$* without --project_dir ran"
  elif ! grep -q -- "$msg" last.out; then
    fail "$* without --project_dir: not the expected message"; tail -3 last.out
  elif [ -s refused.log ]; then
    fail "$* without --project_dir: trained before refusing"
  else
    pass "$* without --project_dir: refused before the first step"
  fi
}
refused "--checkpointing_steps saves under PROJECT_DIR/checkpoints" --checkpointing_steps 2
refused "--resume_from_checkpoint latest reads PROJECT_DIR/checkpoints" --resume_from_checkpoint latest

# (The same --steps in both runs: the examples' learning-rate schedules span --steps.)
run --steps 8 --project_dir p --checkpointing_steps 4 --log_file full.log --save_model_to full_model ||
  fail "uninterrupted run"
[ -d p/checkpoints/checkpoint_0 ] && [ -d p/checkpoints/checkpoint_1 ] ||
  fail "--checkpointing_steps 4 over 8 steps did not leave checkpoint_0 and checkpoint_1"
run --steps 8 --resume_from_checkpoint p/checkpoints/checkpoint_0 --log_file second.log --save_model_to resumed_model ||
  fail "resumed run"
grep -q "resumed from p/checkpoints/checkpoint_0 at step 4" last.out || fail "the resumed run did not say it resumed at step 4"
if [ -s full.log ] && [ "$(wc -l < second.log)" = 4 ] && diff <(sed -n 5,8p full.log) second.log > /dev/null; then
  pass "resumed from step 4: steps 5-8 bitwise equal to the uninterrupted run's"
else
  fail "resumed steps differ"; paste <(sed -n 5,8p full.log) second.log
fi

if "$PY" - full_model/model.safetensors resumed_model/model.safetensors <<'EOF'; then
import sys
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a and sorted(a) == sorted(b), (sorted(a), sorted(b))
for k in a:
    assert a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes(), k
print(f"  {len(a)} tensors, {sum(v.size for v in a.values())} values, equal bit for bit")
EOF
  pass "--save_model_to: the resumed run's weights equal the uninterrupted run's (Python safetensors)"
else
  fail "--save_model_to: the weights differ or do not load"
fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
