#!/usr/bin/env bash
# finetune_then_open.sh LAUNCHER NP CONFIG LLAMA_FINETUNE PYTHON SOURCE_DIR OUT_DIR
# The README's flow: examples/llama_finetune trains under CONFIG at NP ranks and saves a Transformers
# directory; Transformers' AutoModelForCausalLM.from_pretrained opens it (no missing or unexpected
# weights) and generates from it. The run's save_state checkpoint, merged offline by `accel
# merge-weights` beside the config files, is the same directory byte for byte, and opens too.
set -eu
launcher=$1 np=$2 config=$3 exe=$4 python=$5 src=$6 out=$7
rm -rf "$out"
rm -rf "$out.state" "$out.merged"
"$launcher" launch -n "$np" "$exe" --config_file "$config" --steps 20 --save "$out" --max_shard_size 100KB \
  --save_state_to "$out.state"
test -f "$out/model.safetensors.index.json" || { echo "FAILED: no index (expected a sharded save)"; exit 1; }
"$python" "$src/tests/models/llama_interop.py" open "$out"
"$launcher" merge-weights "$out.state" "$out.merged" --max_shard_size 100KB
cp "$out/config.json" "$out/generation_config.json" "$out.merged/"
diff -r "$out" "$out.merged" || { echo "FAILED: the merged checkpoint differs from save_pretrained's"; exit 1; }
echo "merged: $(ls "$out.merged" | wc -l) files, each save_pretrained's byte for byte"
"$python" "$src/tests/models/llama_interop.py" open "$out.merged"
