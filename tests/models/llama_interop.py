"""Transformers' side of the Llama interop tests (tests/models/test_llama.cpp).

  make OUT_DIR
      Random LlamaForCausalLM models made here from a LlamaConfig (no download), saved with
      save_pretrained and a small max_shard_size (so sharded, with an index) into OUT_DIR/<variant>
      (VARIANTS: untied, tied, an explicit head_dim, saved in bf16), plus OUT_DIR/<name>.reference.safetensors: tokens [B, T] and Transformers' logits
      (eager attention, fp32) on them.
  check DIR ACCEL_FILE [DIR ACCEL_FILE ...]
      Opens each DIR with AutoModelForCausalLM.from_pretrained (eager attention, fp32), runs it on
      ACCEL_FILE's `tokens`, and compares with ACCEL_FILE's `logits` (what accel computed):
      exit 1 unless max |diff| <= 1e-4 and the load reported no missing or unexpected weights.

  open DIR
      AutoModelForCausalLM.from_pretrained(DIR): exit 1 unless the load reported no missing or
      unexpected weights; prints the greedy continuation of an arithmetic sequence (the sequences
      examples/llama_finetune.cpp trains on).

One interpreter run per invocation: importing transformers takes seconds.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

TOL = 1e-4


# name: (LlamaConfig changes, dtype saved)
VARIANTS = {
    "untied": ({}, torch.float32),
    "tied": ({"tie_word_embeddings": True}, torch.float32),
    "head_dim": ({"head_dim": 12}, torch.float32),  # head_dim != hidden_size / heads (q_proj 72 x 48)
    "bf16": ({}, torch.bfloat16),  # saved in bf16: accel converts on load
}


def make(out):
    torch.manual_seed(1234)
    for name, (changes, dtype) in VARIANTS.items():
        kw = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
                  num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=5000.0,
                  tie_word_embeddings=False, attn_implementation="eager")
        kw.update(changes)
        cfg = LlamaConfig(**kw)
        model = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():  # the norms start at ones: make them matter
            for n, p in model.named_parameters():
                if n.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
        model = model.to(dtype)
        d = os.path.join(out, name)
        model.save_pretrained(d, max_shard_size="40KB")
        tokens = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(7))
        # Transformers' logits for the directory: opened as a user would, in fp32 (model.float() would
        # keep the rotary inv_freq buffer that .to(bf16) rounded).
        ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            logits = ref(tokens).logits
        save_file({"tokens": tokens.contiguous(), "logits": logits.float().contiguous()},
                  os.path.join(out, name + ".reference.safetensors"))
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
        print(f"made {d}: {len(files)} safetensors files, {changes or 'untied'}, saved in {dtype}")


def check(pairs):
    ok = True
    for d, accel_file in pairs:
        model, info = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32,
                                                           output_loading_info=True)
        model.eval()
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        ref = load_file(accel_file)
        with torch.no_grad():
            logits = model(ref["tokens"]).logits
        diff = (logits - ref["logits"]).abs().max().item()
        cfg = json.load(open(os.path.join(d, "config.json")))
        print(f"{d}: {type(model).__name__}, tie_word_embeddings={model.config.tie_word_embeddings}, "
              f"kv heads {model.config.num_key_value_heads}/{model.config.num_attention_heads}, "
              f"max |logits diff| {diff:.3e}, loading info {bad or 'clean'}, config dtype {cfg.get('dtype')}")
        if bad or not diff <= TOL:
            ok = False
    return ok


def open_dir(d):
    model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    prompt = torch.tensor([[5, 8, 11, 14, 17, 20, 23]]) % model.config.vocab_size
    out = model.generate(prompt, max_new_tokens=5, do_sample=False)
    print(f"{d}: {type(model).__name__} opened, {sum(p.numel() for p in model.parameters())} parameters, "
          f"loading info {bad or 'clean'}; greedy continuation of {prompt[0].tolist()}: "
          f"{out[0, prompt.shape[1]:].tolist()}")
    return not bad


def main(argv):
    if argv[:1] == ["open"] and len(argv) == 2:
        return 0 if open_dir(argv[1]) else 1
    if argv[:1] == ["make"] and len(argv) == 2:
        make(argv[1])
        return 0
    if argv[:1] == ["check"] and len(argv) >= 3 and len(argv) % 2 == 1:
        return 0 if check(list(zip(argv[1::2], argv[2::2]))) else 1
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
