"""torchao's float8 training of one linear layer, the independent reference for accel's Float8Linear
(tests/mixed_precision/test_float8_linear.cpp, Float8Linear.MatchesTorchaosFloat8Training).

usage: float8_torchao_reference.py IN.safetensors OUT.safetensors RECIPE
  IN holds x [M, K], weight [N, K], bias [N] and grad_output [M, N] (one floating dtype). RECIPE is
  torchao's recipe name (tensorwise or rowwise). An nn.Linear with that weight and bias, converted by
  torchao.float8.convert_to_float8_training with Float8LinearConfig.from_recipe_name(RECIPE) and
  emulate=True (its fp8 products emulated in higher precision, so it runs on the CPU), computes
  y = layer(x) and backward(grad_output). OUT gets y, grad_x, grad_weight and grad_bias.
exit status 77 where torchao is not installed (the test skips).
"""
import dataclasses
import sys

import torch
from safetensors.torch import load_file, save_file


def main():
    src, dst, recipe = sys.argv[1:4]
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        print(f"SKIP: torchao is not installed ({e})")
        sys.exit(77)
    t = load_file(src)
    w, b = t["weight"], t["bias"]
    layer = torch.nn.Sequential(torch.nn.Linear(w.shape[1], w.shape[0], dtype=w.dtype))
    with torch.no_grad():
        layer[0].weight.copy_(w)
        layer[0].bias.copy_(b)
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    convert_to_float8_training(layer, config=config)
    assert type(layer[0]).__name__ == "Float8Linear", layer
    x = t["x"].clone().requires_grad_(True)
    y = layer(x)
    y.backward(t["grad_output"])
    save_file({"y": y.detach().contiguous(), "grad_x": x.grad.contiguous(),
               "grad_weight": layer[0].weight.grad.contiguous(), "grad_bias": layer[0].bias.grad.contiguous()}, dst)
    print(f"torchao {recipe}: {type(layer[0]).__name__}, {config.cast_config_input.target_dtype} input, "
          f"{config.cast_config_grad_output.target_dtype} grad_output")


if __name__ == "__main__":
    main()
