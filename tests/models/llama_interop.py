"""Transformers' side of the Llama interop tests (tests/models/test_llama.cpp).

  make OUT_DIR
      Random models of the Llama family made here from a config (no download): Llama (untied, tied, an
      explicit head_dim, saved in bf16, Llama 3.1's rope, linear rope, with biases), Qwen2 (with and
      without sliding layers) and Mistral (a window, none), each saved with save_pretrained and a small
      max_shard_size (so sharded, with an index) into OUT_DIR/<variant>, plus
      OUT_DIR/<variant>.reference.safetensors: tokens [B, T] and Transformers' logits (eager attention,
      fp32) on them; for the PADDED variants also a padded batch (row 0 padded on the left, row 1 on
      the right): its attention_mask, position_ids (as generate() derives them), the logits with both
      and with the mask alone, labels with -100 at the pads and Transformers' loss. Every weight and bias is drawn from normal(0, 0.12) (the norms from U(0.5, 1.5)), so
      attention is far from uniform and a wrong rotary or mask shows.
  check DIR ACCEL_FILE [DIR ACCEL_FILE ...]
      Opens each DIR with AutoModelForCausalLM.from_pretrained (eager attention, fp32), runs it on
      ACCEL_FILE's `tokens`, and compares with ACCEL_FILE's `logits` (what accel computed):
      exit 1 unless max |diff| <= 1e-5 and the load reported no missing or unexpected weights.

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
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

TOL = 1e-5
STD = 0.12

FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
            "mistral": (MistralConfig, MistralForCausalLM)}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

# name: (family, config changes, dtype saved). The tokens are 11 long, so windows of 4 matter.
VARIANTS = {
    "untied": ("llama", {}, torch.float32),
    "tied": ("llama", {"tie_word_embeddings": True}, torch.float32),
    "head_dim": ("llama", {"head_dim": 12}, torch.float32),  # head_dim != hidden_size / heads (q_proj 72 x 48)
    "bf16": ("llama", {}, torch.bfloat16),  # saved in bf16: accel converts on load
    # Llama 3.1's rope: with head_dim 8 and an original context of 16, one frequency is kept, one
    # interpolated and two divided by the factor.
    "llama3_rope": ("llama", {"rope_parameters": LLAMA3_ROPE}, torch.float32),
    "linear_rope": ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 5000.0, "factor": 2.0}},
                    torch.float32),
    "llama_biases": ("llama", {"attention_bias": True, "mlp_bias": True}, torch.float32),
    "qwen2": ("qwen2", {"tie_word_embeddings": True}, torch.float32),
    "qwen2_sliding": ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
                      torch.float32),
    "mistral": ("mistral", {"sliding_window": 4}, torch.float32),
    "mistral_no_window": ("mistral", {"sliding_window": None}, torch.float32),
}


# The switch a variant tests, undone: the same weights under it must give other logits (by > 0.1), or
# the variant would not test the switch.
DEFAULT_ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}}
SWITCH_OFF = {
    "llama3_rope": DEFAULT_ROPE,
    "linear_rope": DEFAULT_ROPE,
    "qwen2_sliding": {"use_sliding_window": False},
    "mistral": {"sliding_window": None},
}


PADDED = ("untied", "llama3_rope", "qwen2_sliding", "mistral")


def padded_reference(model, tokens):
    """Row 0 padded on the left (3 pads), row 1 on the right (2 pads)."""
    mask = torch.ones_like(tokens)
    mask[0, :3] = 0
    mask[1, -2:] = 0
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # what generate() passes
    labels = tokens.masked_fill(mask == 0, -100)
    with torch.no_grad():
        out = model(tokens, attention_mask=mask, position_ids=position_ids, labels=labels)
        mask_only = model(tokens, attention_mask=mask).logits
    return {"mask": mask, "position_ids": position_ids, "logits_padded": out.logits.float(),
            "logits_mask_only": mask_only.float(), "labels": labels, "loss": out.loss.float().reshape(1)}


def make(out):
    torch.manual_seed(1234)
    for name, (family, changes, dtype) in VARIANTS.items():
        config_class, model_class = FAMILIES[family]
        kw = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
                  num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                  tie_word_embeddings=False, attn_implementation="eager")
        kw.update(changes)
        cfg = config_class(**kw)
        model = model_class(cfg).eval()
        with torch.no_grad():  # weights and biases far from the init's, norms that matter
            for n, p in model.named_parameters():
                if n.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
                else:
                    p.normal_(0.0, STD)
        model = model.to(dtype)
        d = os.path.join(out, name)
        model.save_pretrained(d, max_shard_size="40KB")
        tokens = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(7))
        # Transformers' logits for the directory: opened as a user would, in fp32 (model.float() would
        # keep the rotary inv_freq buffer that .to(bf16) rounded).
        ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            logits = ref(tokens).logits
        tensors = {"tokens": tokens, "logits": logits.float()}
        if name in PADDED:
            tensors.update(padded_reference(ref, tokens))
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, name + ".reference.safetensors"))
        if name in SWITCH_OFF:
            off = model_class(config_class(**{**kw, **SWITCH_OFF[name]})).eval()
            off.load_state_dict(ref.state_dict())
            with torch.no_grad():
                moved = (off(tokens).logits - logits).abs().max().item()
            print(f"{name}: the same weights with {SWITCH_OFF[name]} move the logits by {moved:.3f}")
            if not moved > 0.1:
                raise SystemExit(f"{name}: the variant does not exercise its switch")
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
        print(f"made {d}: {type(model).__name__}, {len(files)} safetensors files, {changes or 'untied'}, "
              f"saved in {dtype}")


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
