#!/usr/bin/env bash
# A DeepSpeed config's optimizer and scheduler blocks reach a program that asks for them
# (gpt_lm, llama_finetune: Accelerator::create_optimizer / create_scheduler), once, from the main
# process; a program
# that passes its own optimizer and scheduler (linear_classifier), or prepares no scheduler
# (image_classifier), keeps what it has and is told, once, which block went unused.
# Usage: config_optimizer.sh ACCEL_CLI GPT_LM LINEAR_CLASSIFIER IMAGE_CLASSIFIER LLAMA_FINETUNE
set -u
ACCEL=$1 GPT=$2 LINEAR=$3 IMAGE=$4 LLAMA=$5
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/sgd.json" <<'JSON'
{
  "train_micro_batch_size_per_gpu": "auto",
  "zero_optimization": {"stage": 2},
  "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 2, "total_num_steps": "auto",
                                                    "warmup_max_lr": "auto", "warmup_type": "linear"}}
}
JSON
out=$(ACCEL_LOG_LEVEL=info "$ACCEL" launch -n 2 "$GPT" --config_file "$dir/sgd.json" --steps 4 2>&1) || fail "gpt_lm exited $?"
for want in "\[info\] optimizer: SGD \(lr 0\.05, momentum 0\.9, dampening 0, weight_decay 0\) \(the optimizer block of $dir/sgd.json\)" \
            "\[info\] scheduler: WarmupDecayLR \(the scheduler block of $dir/sgd.json\)"; do
  n=$(grep -cE "$want" <<<"$out")
  [ "$n" -eq 1 ] && echo "ok: once: $want" || fail "$n lines match '$want' (want exactly 1)"
done
grep -q "is not used" <<<"$out" && fail "gpt_lm was told a block went unused"
outl=$(ACCEL_LOG_LEVEL=info "$ACCEL" launch -n 2 "$LLAMA" --config_file "$dir/sgd.json" --steps 3 2>&1) || fail "llama_finetune exited $?"
for want in "\[info\] optimizer: SGD \(lr 0\.05, momentum 0\.9" "\[info\] scheduler: WarmupDecayLR"; do
  n=$(grep -cE "$want" <<<"$outl")
  [ "$n" -eq 1 ] && echo "ok: llama_finetune, once: $want" || fail "llama_finetune: $n lines match '$want' (want 1)"
done
grep -q "is not used" <<<"$outl" && fail "llama_finetune was told a block went unused"
out2=$("$ACCEL" launch -n 2 "$LINEAR" --config_file "$dir/sgd.json" --steps 4 2>&1) || fail "linear_classifier exited $?"
for block in optimizer scheduler; do
  n=$(grep -c "the $block block (.*) is not used: the program" <<<"$out2")
  [ "$n" -eq 1 ] && echo "ok: the unused $block block, once" || fail "$n warnings of the unused $block block (want 1)"
done
# image_classifier passes its own optimizer and prepares no scheduler: both blocks unused, each said once.
out3=$("$ACCEL" launch -n 2 "$IMAGE" --config_file "$dir/sgd.json" --steps 2 --batch 8 2>&1) || fail "image_classifier exited $?"
n=$(grep -c "the optimizer block (SGD) is not used" <<<"$out3")
[ "$n" -eq 1 ] && echo "ok: image_classifier's unused optimizer block, once" || fail "$n warnings of its unused optimizer block"
n=$(grep -c "the scheduler block (WarmupDecayLR) is not used: the program trains without a prepared scheduler" <<<"$out3")
[ "$n" -eq 1 ] && echo "ok: image_classifier's unused scheduler block, once" || fail "$n warnings of its unused scheduler block"
[ $failures -eq 0 ] && echo "PASSED" || { echo "$out"; echo "$outl"; echo "$out2"; echo "$out3"; echo "FAILED ($failures)"; }
[ $failures -eq 0 ]
