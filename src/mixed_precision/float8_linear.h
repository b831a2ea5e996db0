// accel::nn::Float8Linear — a drop-in for torch::nn::Linear that computes its three matmuls in fp8
// (torchao's Float8Linear, "dynamic tensorwise" recipe):
//   forward:      out         = fp8mm(q_e4m3(input), q_e4m3(weight)^T) + bias
//   backward:     grad_input  = fp8mm(q_e5m2(grad_out), q_e4m3(weight))
//                 grad_weight = fp8mm(q_e5m2(grad_out)^T, q_e4m3(input))
//                 grad_bias   = grad_out summed over the batch (high precision, as torchao)
// Each q() is a dynamic tensorwise quantization (fp8.h: scale = fp8_max / amax). The forward's fp8
// input and weight are saved for backward (1 byte per element), not the high-precision tensors. Each
// operand is quantized into the layout its product hands at::_scaled_mm (fp8.h's Fp8Layout: the
// saved input and weight column-major, grad_output in both layouts from one cast), so no product
// copies an operand.
//
// fp8mm(a, b) = (float(a.data) @ float(b.data)) * (1/a.scale) * (1/b.scale), by one of two backends:
//   * at::_scaled_mm (cuBLASLt fp8 GEMM) on CUDA devices that support it (compute capability >= 8.9),
//     when the inner and output dims are multiples of 16;
//   * an exact emulation everywhere else: the fp8 values converted to fp32 and multiplied with a
//     fp32 matmul. Every product of two fp8 values is exact in fp32 (at most 4 x 4 significant bits,
//     exponents well inside fp32's range), so the emulation equals an fp32-accumulating scaled_mm
//     up to the order of summation.
// Parameters "weight" [out, in] and "bias" [out] have Linear's names, shapes and initialization, so
// state dicts interchange with torch::nn::Linear.
//
// The rowwise recipe (torchao's "rowwise"; Float8Recipe::Rowwise, fp8_config recipe: rowwise): every
// operand is e4m3 with one scale per slice along the matmul's inner dim (fp8.h's axiswise scales), so
// an outlier coarsens only its own row or column:
//   forward:      out         = fp8mm(q(input, per row), q(weight, per row)^T)
//   backward:     grad_input  = fp8mm(q(grad_out, per row), q(weight, per column))
//                 grad_weight = fp8mm(q(grad_out, per column)^T, q(input, per column))
// The forward saves the two operands backward needs, quantized along their backward axis (1 byte per
// element, as tensorwise). at::_scaled_mm takes the rowwise scales on CUDA and writes bf16: an fp32 or
// fp16 output (grad_weight of fp32 weights) is its bf16 product converted, as torchao's float8 training
// does on the device. The emulation, fp8mm = (float(a) @ float(b)) * (1/a.scale) * (1/b.scale)
// broadcast, rounds once to the output's dtype (as torchao's emulate=True).
#pragma once

#include "mixed_precision/fp8.h"

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <ostream>
#include <string>

namespace accel::mixed_precision {

enum class Float8Recipe { Tensorwise, Rowwise };
// "tensorwise" | "rowwise" (throws std::invalid_argument otherwise).
Float8Recipe float8_recipe_from_string(const std::string& s);
const char* to_string(Float8Recipe r);

enum class Float8MatmulBackend {
  Auto,      // at::_scaled_mm on a CUDA device that supports it (learned once per device by a small
             // product there, with a warning where it is refused), the emulation otherwise
  Emulated,  // always the fp32 emulation
  ScaledMM,  // always at::_scaled_mm (an error where the device or shapes do not allow it; this
             // libtorch also has a CPU implementation, which the tests use as a cross-check)
};

// a [M, K] @ b [K, N] for fp8 operands with their scales (tensorwise, or a's [M, 1] and b's [1, N]):
// (float(a.data) @ float(b.data)) * (1/a.scale) * (1/b.scale) [+ bias], returned in out_dtype. Any
// strides. A bias ([N]) is added in fp32 before the rounding to out_dtype, as cuBLASLt's epilogue does
// (at::_scaled_mm takes it for tensorwise scales and a bf16/fp16 output; other products on the device
// add it to their output). On the device, axiswise scales give a bf16 product, converted to an fp32 or
// fp16 out_dtype (torchao's way; the emulation rounds once).
// fast_accum: cuBLASLt's fast fp8 accumulation (use_fast_accum), which torchao's float8 training uses
// for the forward product; the emulation always accumulates in fp32.
at::Tensor float8_mm(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype,
                     Float8MatmulBackend backend = Float8MatmulBackend::Auto, const at::Tensor& bias = {},
                     bool fast_accum = false);

// How many operands at::_scaled_mm products had to copy into cuBLASLt's layouts (a row-major, b
// column-major) in this process: Float8Linear quantizes each operand straight into its product's
// layout (fp8.h's Fp8Layout), so its products copy none.
std::int64_t float8_operand_copies();
// Products computed by at::_scaled_mm in this process (what tests check to know it ran, rather than
// the emulation after a fallback).
std::int64_t float8_scaled_mm_products();
// Whether float8_mm would try at::_scaled_mm for a product [M, inner] @ [inner, n] of e4m3 (or e4m3
// and e5m2) operands by `backend` on `device`, as float8_mm itself decides: so that its operands are
// worth quantizing into cuBLASLt's layouts. The emulation takes any strides and keeps its bits: its
// operands stay row-major. (e5m2 x e5m2 is always emulated.) Under Auto on CUDA, the first call for a
// device and scaling (`rowwise`: either operand's scales per row or column) runs one small _scaled_mm
// there to learn whether the device has it (compute capability >= 8.9; rowwise kernels for rowwise),
// warning once where it does not.
bool float8_mm_tries_scaled_mm(Float8MatmulBackend backend, const at::Device& device, std::int64_t inner,
                               std::int64_t n, bool rowwise = false);

}  // namespace accel::mixed_precision

namespace accel::nn {

class Float8LinearImpl : public torch::nn::Cloneable<Float8LinearImpl> {
 public:
  Float8LinearImpl(std::int64_t in_features, std::int64_t out_features)
      : Float8LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}
  explicit Float8LinearImpl(const torch::nn::LinearOptions& options_);

  // Registers "weight" and "bias" (an undefined "bias" without bias, as Linear does) and
  // initializes them as torch::nn::Linear does.
  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  // input [..., in_features] -> [..., out_features], in input's dtype (floating). Differentiable
  // with respect to input, weight and bias. Under autocast it follows torch::nn::Linear (and
  // torchao's Float8Linear): the input (floating, not fp64) is cast to its device's autocast dtype,
  // the output comes out in that dtype, and the layer's own ops run with autocast off.
  at::Tensor forward(const at::Tensor& input);
  // forward(at::gelu(pre)) (exact GELU), the same values and gradients (pre's included), without the GELU's
  // output: under the tensorwise recipe on CUDA the fused casts compute it while quantizing it, saving
  // a write and two reads of an activation as large as pre (the MLP's 4d-wide one). Elsewhere (rowwise,
  // the CPU's composite casts) it is computed inside the layer. Under autocast on the CPU, or over a pre
  // not in the autocast dtype, it is that graph itself.
  at::Tensor forward_gelu(const at::Tensor& pre);

  torch::nn::LinearOptions options;
  at::Tensor weight;
  at::Tensor bias;
  mixed_precision::Float8MatmulBackend backend = mixed_precision::Float8MatmulBackend::Auto;
  mixed_precision::Float8Recipe recipe = mixed_precision::Float8Recipe::Tensorwise;
  // The gradients' format under the tensorwise recipe: E5M2 (HYBRID, the default) or E4M3
  // (fp8_config fp8_format E4M3). The rowwise recipe is e4m3 throughout.
  mixed_precision::Fp8Format grad_format = mixed_precision::Fp8Format::E5M2;
  // The forward product with cuBLASLt's fast fp8 accumulation, as torchao's float8 training does
  // (Float8LinearConfig's gemm_config_output); the two backward products always accumulate exactly.
  // Only at::_scaled_mm sees it: the emulation accumulates in fp32.
  bool fast_accum_output = true;
  // The weight already in e4m3 with its scale (what an fp8 all-gather of the unit delivers: see
  // fp8.h). When set, forward uses it instead of quantizing `weight`, which must then hold the
  // matching values (dequantized); grad_weight still goes to `weight`. The owner sets it for each
  // forward (after each gather) and clears it when the weight changes.
  std::optional<mixed_precision::Fp8Tensor> weight_fp8;

 private:
  at::Tensor forward_impl(const at::Tensor& input, bool gelu);
};

TORCH_MODULE(Float8Linear);

// Sets the recipe (and the tensorwise gradients' format) of every Float8Linear in `model` (the
// Accelerator does it at prepare from the config's fp8_config recipe and fp8_format); returns how
// many there were.
int set_float8_recipe(torch::nn::Module& model, mixed_precision::Float8Recipe recipe,
                      mixed_precision::Fp8Format grad_format = mixed_precision::Fp8Format::E5M2);

// A linear layer chosen at construction: a torch::nn::Linear (fp8 == false) or a Float8Linear
// (fp8 == true), both built from `options` with the same parameter names, shapes, registration order
// and RNG draws, so one model definition serves both precisions and their state dicts interchange.
// Why a factory: C++ models hold typed members (torch::nn::Linear fc1), which cannot be swapped for
// another module type after construction the way Python's torchao swaps nn.Linear modules in place.
// A model that wants the choice holds a torch::nn::AnyModule instead, registers its .ptr() under the
// usual name, and calls .forward(x) (an at::Tensor in, an at::Tensor out, for both kinds):
//   fc1 = make_linear(torch::nn::LinearOptions(d, 4 * d), cfg.fp8);
//   register_module("fc1", fc1.ptr());
// With fp8 == false the layer is exactly torch::nn::Linear(options): same numerics, bit for bit.
torch::nn::AnyModule make_linear(const torch::nn::LinearOptions& options, bool fp8);

}  // namespace accel::nn
