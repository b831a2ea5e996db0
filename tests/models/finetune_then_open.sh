#!/usr/bin/env bash
# finetune_then_open.sh LAUNCHER NP CONFIG LLAMA_FINETUNE PYTHON SOURCE_DIR OUT_DIR
# The README's flow: examples/llama_finetune trains under CONFIG at NP ranks and saves a Transformers
# directory; Transformers' AutoModelForCausalLM.from_pretrained opens it (no missing or unexpected
# weights) and generates from it.
set -eu
launcher=$1 np=$2 config=$3 exe=$4 python=$5 src=$6 out=$7
rm -rf "$out"
"$launcher" launch -n "$np" "$exe" --config_file "$config" --steps 20 --save "$out" --max_shard_size 100KB
test -f "$out/model.safetensors.index.json" || { echo "FAILED: no index (expected a sharded save)"; exit 1; }
"$python" "$src/tests/models/llama_interop.py" open "$out"
