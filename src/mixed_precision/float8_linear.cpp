#include "mixed_precision/float8_linear.h"
#include "base/error.h"
#include "mixed_precision/autocast.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/linear.h>

#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>

namespace accel::mixed_precision {

namespace {

// Per CUDA device and scaling (tensorwise, rowwise): does at::_scaled_mm work there? Learned once, by a
// 16 x 16 product on the device (no CUDA headers needed): a device below compute capability 8.9 makes
// _scaled_mm throw, and so may one that has tensorwise scaling but not rowwise (a build or an
// architecture without the rowwise kernels), after which Auto uses the emulation there for that
// scaling. Asked before any product, so that the layouts forward chooses for backward's operands and
// the products backward runs agree from the first step.
std::mutex g_mu;
std::map<std::pair<int, bool>, bool> g_cuda_scaled_mm_ok;

bool cuda_runs_scaled_mm(const at::Device& device, bool rowwise) {
  const auto opts = at::TensorOptions().device(device);
  const int dev = device.has_index() ? device.index() : at::empty({0}, opts).get_device();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_cuda_scaled_mm_ok.find({dev, rowwise});
    if (it != g_cuda_scaled_mm_ok.end()) return it->second;
  }
  bool ok = true;
  try {
    const auto on = at::TensorOptions().device(at::kCUDA, static_cast<c10::DeviceIndex>(dev));
    const at::Tensor a = at::ones({16, 16}, on).to(at::kFloat8_e4m3fn);
    // (rowwise: a's [M, 1] and b's [1, N] fp32 scales, a bf16 output, as scaled_mm below passes them)
    const at::Tensor sa = rowwise ? at::ones({16, 1}, on) : at::ones({}, on);
    const at::Tensor sb = rowwise ? at::ones({1, 16}, on) : at::ones({}, on);
    (void)at::_scaled_mm(a, a.t(), sa, sb, std::nullopt, std::nullopt, at::kBFloat16);
  } catch (const c10::Error& e) {
    ok = false;
    TORCH_WARN("accel Float8Linear: at::_scaled_mm with ", rowwise ? "rowwise" : "tensorwise",
               " scales is unavailable on cuda:", dev,
               " (fp8 products need compute capability >= 8.9, rowwise scales a build and device with those "
               "kernels); using the fp32 emulation of those fp8 matmuls. ",
               e.what_without_backtrace());
  }
  std::lock_guard<std::mutex> lock(g_mu);
  return g_cuda_scaled_mm_ok.emplace(std::make_pair(dev, rowwise), ok).first->second;
}

bool axiswise(const Fp8Tensor& t) { return t.scale.numel() != 1; }

// (a.scale * b.scale)^-1 as the product of the two inverses: a 0-dim fp32 tensor (tensorwise; the
// same numbers at::_scaled_mm receives as scale_a and scale_b), or [M, N] by broadcasting a's [M, 1]
// and b's [1, N].
at::Tensor combined_inv_scale(const Fp8Tensor& a, const Fp8Tensor& b) {
  auto inv = [&](const at::Tensor& s) {
    at::Tensor f = s.to(a.data.device(), at::kFloat);
    return at::reciprocal(s.numel() == 1 ? f.reshape({}) : f);
  };
  return inv(a.scale) * inv(b.scale);
}

void check_axiswise_scales(const Fp8Tensor& a, const Fp8Tensor& b) {
  const bool a_ok = !axiswise(a) || (a.scale.dim() == 2 && a.scale.size(0) == a.data.size(0) && a.scale.size(1) == 1);
  const bool b_ok = !axiswise(b) || (b.scale.dim() == 2 && b.scale.size(0) == 1 && b.scale.size(1) == b.data.size(1));
  if (!a_ok || !b_ok)
    throw accel::InvalidArgumentError(
        "float8_mm: axiswise scales must be a's [M, 1] and b's [1, N] (the inner dim is the one reduced)");
}

at::Tensor emulated_mm(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype, const at::Tensor& bias) {
  at::Tensor acc = at::mm(a.data.to(at::kFloat), b.data.to(at::kFloat));
  acc.mul_(combined_inv_scale(a, b));
  if (bias.defined()) acc.add_(bias.to(out_dtype).to(at::kFloat));  // (the device's epilogue takes it in out_dtype)
  return acc.to(out_dtype);
}

std::atomic<std::int64_t> g_operand_copies{0}, g_scaled_mm_products{0};

at::Tensor scaled_mm(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype, const at::Tensor& bias,
                     bool fast_accum) {
  // cuBLASLt wants a row-major, b column-major: an operand in another layout is copied (and counted).
  at::Tensor A = a.data, B = b.data;
  if (!A.is_contiguous()) {
    A = A.contiguous();
    g_operand_copies.fetch_add(1, std::memory_order_relaxed);
  }
  if (!is_column_major(B)) {
    B = B.t().contiguous().t();
    g_operand_copies.fetch_add(1, std::memory_order_relaxed);
  }
  // Tensorwise: 0-dim scales; rowwise (either operand axiswise): a's [M, 1] and b's [1, N], cuBLASLt's
  // rowwise scaling, also where an operand has one row or column (a [1, 1] scale, which axiswise() calls
  // tensorwise: _scaled_mm takes a 0-dim scale beside a [1, N] one for neither kind).
  const bool rowwise = axiswise(a) || axiswise(b);
  const std::int64_t m = A.size(0), n = B.size(1);
  at::Tensor sa = a.inv_scale().to(A.device()), sb = b.inv_scale().to(A.device());
  sa = rowwise ? sa.reshape({-1, 1}).expand({m, 1}).contiguous() : sa.reshape({}).contiguous();
  sb = rowwise ? sb.reshape({1, -1}).expand({1, n}).contiguous() : sb.reshape({}).contiguous();
  // Rowwise scaling writes bf16: an fp32 or fp16 output is the bf16 product converted, as torchao's
  // float8 training does on the device (its emulation, as this one, keeps fp32).
  const at::ScalarType product_dtype = rowwise ? at::kBFloat16 : out_dtype;
  // cuBLASLt adds a bias of the output's dtype in its epilogue, in fp32 before the rounding (tensorwise
  // scales, bf16/fp16 outputs); any other bias is added to the output.
  const bool half_out = out_dtype == at::kBFloat16 || out_dtype == at::kHalf;
  const bool epilogue = bias.defined() && half_out && !rowwise;
  at::Tensor out = at::_scaled_mm(A, B, sa, sb, epilogue ? std::optional<at::Tensor>(bias.to(out_dtype)) : std::nullopt,
                                  std::nullopt, product_dtype, fast_accum);
  if (product_dtype != out_dtype) out = out.to(out_dtype);
  if (bias.defined() && !epilogue) out.add_(bias.to(out_dtype));
  g_scaled_mm_products.fetch_add(1, std::memory_order_relaxed);
  return out;
}

}  // namespace

at::Tensor float8_mm(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype, Float8MatmulBackend backend,
                     const at::Tensor& bias, bool fast_accum) {
  if (a.data.dim() != 2 || b.data.dim() != 2 || a.data.size(1) != b.data.size(0))
    throw accel::InvalidArgumentError("float8_mm: expected a [M, K] and b [K, N]");
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != b.data.size(1)))
    throw accel::InvalidArgumentError("float8_mm: the bias must be [N], one value per output column");
  check_axiswise_scales(a, b);
  if (a.format == Fp8Format::E5M2 && b.format == Fp8Format::E5M2)
    backend = Float8MatmulBackend::Emulated;  // no e5m2 x e5m2 GEMM in cuBLASLt; never used by Float8Linear
  if (!float8_mm_tries_scaled_mm(backend, a.data.device(), a.data.size(1), b.data.size(1), axiswise(a) || axiswise(b)))
    return emulated_mm(a, b, out_dtype, bias);
  return scaled_mm(a, b, out_dtype, bias, fast_accum);  // (Auto: the device was found to run it)
}

std::int64_t float8_operand_copies() { return g_operand_copies.load(std::memory_order_relaxed); }

std::int64_t float8_scaled_mm_products() { return g_scaled_mm_products.load(std::memory_order_relaxed); }

bool float8_mm_tries_scaled_mm(Float8MatmulBackend backend, const at::Device& device, std::int64_t inner,
                               std::int64_t n, bool rowwise) {
  switch (backend) {
    case Float8MatmulBackend::Emulated: return false;
    case Float8MatmulBackend::ScaledMM: return true;
    case Float8MatmulBackend::Auto: break;
  }
  // _scaled_mm needs the inner and output dims to be multiples of 16 (torchao pads them instead).
  if (!device.is_cuda() || inner % 16 != 0 || n % 16 != 0) return false;
  return cuda_runs_scaled_mm(device, rowwise);
}

Float8Recipe float8_recipe_from_string(const std::string& s) {
  if (s == "tensorwise") return Float8Recipe::Tensorwise;
  if (s == "rowwise") return Float8Recipe::Rowwise;
  throw accel::InvalidArgumentError("fp8 recipe must be tensorwise or rowwise, got '" + s + "'");
}

const char* to_string(Float8Recipe r) { return r == Float8Recipe::Rowwise ? "rowwise" : "tensorwise"; }

}  // namespace accel::mixed_precision

namespace accel::nn {

namespace {

using mixed_precision::Float8MatmulBackend;
using mixed_precision::Fp8Format;
using mixed_precision::Fp8Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The rowwise recipe's scales are powers of two (torchao's rowwise recipe, round_scales_to_power_of_2).
constexpr bool kPow2 = true;

Fp8Tensor transposed(const Fp8Tensor& t) {
  auto axes = [](const at::Tensor& s) { return s.defined() && s.dim() == 2 ? s.t() : s; };
  return Fp8Tensor{t.data.t(), axes(t.scale), t.format, axes(t.inverse)};
}

// Autocast off on a device type for a scope, where it is on there: the layer's own ops (the
// emulation's fp32 product, the scales and casts) run in the precision they are written for, not
// autocast's (which would round the emulated product to bf16 before its scaling, where cuBLASLt
// accumulates in fp32).
std::optional<mixed_precision::AutocastScope> autocast_off(c10::DeviceType device) {
  std::optional<mixed_precision::AutocastScope> off;
  if (mixed_precision::autocast_dtype_on(device)) off.emplace(device, std::nullopt);
  return off;
}

// The operands backward reads are saved in fp8 (1 byte per element), each in the layout of its
// product: where the product will try at::_scaled_mm (float8_mm_tries_scaled_mm), cuBLASLt's (first
// operand row-major, second column-major), quantized straight into it (fp8.h's Fp8Layout), so no product
// copies an operand; where it will be emulated, row-major as quantized (the emulation takes any strides,
// and keeps its bits). An operand no gradient needs (keep_x, keep_w: the caller's grad mode and
// requires_grad, which forward cannot see itself) is not quantized for backward.
struct Float8LinearFunction : public torch::autograd::Function<Float8LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias_opt, const std::optional<at::Tensor>& weight_fp8_data,
                            const std::optional<at::Tensor>& weight_fp8_scale, int64_t backend_i, bool rowwise,
                            bool e4m3_grads, bool fast_accum, bool keep_x, bool keep_w, bool gelu_input) {
    using mixed_precision::kColumnMajor;
    using mixed_precision::kRowMajor;
    // (Optional tensors: a C++ autograd Function rejects undefined at::Tensor inputs.)
    const at::Tensor bias = bias_opt ? *bias_opt : at::Tensor();
    const auto backend = static_cast<Float8MatmulBackend>(backend_i);
    const std::int64_t in = weight.size(1), out_features = weight.size(0);
    // gelu_input (forward_gelu): the layer's input is at::gelu(input). The fused tensorwise casts compute
    // it on the way, and it is never written; elsewhere it is computed here. Backward applies GELU's
    // gradient to grad_input, from `input` (saved, as GELU would have saved it).
    const bool fuse_gelu = gelu_input && !rowwise && mixed_precision::fused_fp8_casts(input);
    const at::Tensor x2 = (gelu_input && !fuse_gelu ? at::gelu(input) : input).reshape({-1, in});
    // grad_input = grad_out [M, N] @ weight [N, K]; grad_weight = grad_out^T [N, M] @ input [M, K]. The
    // second operand of each (weight, input; grad_out^T's layout too) column-major where it goes to
    // cuBLASLt.
    const bool w_col =
        keep_w && mixed_precision::float8_mm_tries_scaled_mm(backend, input.device(), out_features, in, rowwise);
    const bool x_col =
        keep_x && mixed_precision::float8_mm_tries_scaled_mm(backend, input.device(), x2.size(0), in, rowwise);
    at::Tensor out;
    Fp8Tensor x_back, w_back;
    if (rowwise) {
      // Forward along the rows; backward's operands quantized here along their own axis (saved fp8).
      using mixed_precision::quantize_dynamic_axiswise;
      const Fp8Tensor xq = quantize_dynamic_axiswise(x2, 1, Fp8Format::E4M3, 0, kPow2);
      const Fp8Tensor wq = quantize_dynamic_axiswise(weight, 1, Fp8Format::E4M3, 0, kPow2);
      out = mixed_precision::float8_mm(xq, transposed(wq), input.scalar_type(), backend, bias, fast_accum);
      if (keep_x)  // for grad_weight
        x_back = quantize_dynamic_axiswise(x2, 0, Fp8Format::E4M3, 0, kPow2, x_col ? kColumnMajor : kRowMajor);
      if (keep_w)  // for grad_input
        w_back = quantize_dynamic_axiswise(weight, 0, Fp8Format::E4M3, 0, kPow2, w_col ? kColumnMajor : kRowMajor);
    } else {
      const mixed_precision::Fp8Layouts xl = mixed_precision::quantize_dynamic_2d(
          x2, Fp8Format::E4M3, kRowMajor | (x_col ? kColumnMajor : 0u), 0, fuse_gelu);
      Fp8Tensor wq;
      if (weight_fp8_data) {
        wq = Fp8Tensor{*weight_fp8_data, weight_fp8_scale->to(at::kFloat).reshape({}), Fp8Format::E4M3};
        if (keep_w) w_back = w_col ? mixed_precision::column_major(wq) : wq;
      } else {
        const mixed_precision::Fp8Layouts wl =
            mixed_precision::quantize_dynamic_2d(weight, Fp8Format::E4M3, kRowMajor | (w_col ? kColumnMajor : 0u));
        wq = wl.row_major;
        if (keep_w) w_back = w_col ? wl.column_major : wl.row_major;
      }
      out = mixed_precision::float8_mm(xl.row_major, transposed(wq), input.scalar_type(), backend, bias, fast_accum);
      if (keep_x) x_back = x_col ? xl.column_major : xl.row_major;
    }
    // Through save_for_backward, so that autograd frees each once this layer's backward has run
    // (saved_data lives as long as the graph) and checks that nothing changed them in place: the input's
    // fp8 operand, the weight's when quantized here, GELU's input. The inverses: 1/scale where the fused
    // casts computed it. A precomputed fp8 weight (the unit's fp8 all-gather) goes to saved_data, as
    // the engine may gather into its buffer again before backward.
    const bool w_here = !weight_fp8_data;
    ctx->save_for_backward({x_back.data, x_back.scale, x_back.inverse, w_here ? w_back.data : at::Tensor(),
                            w_here ? w_back.scale : at::Tensor(), w_here ? w_back.inverse : at::Tensor(),
                            gelu_input && keep_w ? input : at::Tensor()});
    if (!w_here) {
      ctx->saved_data["wq"] = w_back.data;
      ctx->saved_data["ws"] = w_back.scale;
      ctx->saved_data["wi"] = w_back.inverse;
    }

    ctx->saved_data["input_sizes"] = input.sizes().vec();
    ctx->saved_data["input_dtype"] = static_cast<int64_t>(input.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.defined() ? bias.scalar_type() : at::kFloat);
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["out_features"] = out_features;
    ctx->saved_data["backend"] = backend_i;
    ctx->saved_data["rowwise"] = rowwise;
    ctx->saved_data["e4m3_grads"] = e4m3_grads;
    ctx->saved_data["x_col"] = x_col;  // (grad_weight's product goes to cuBLASLt: grad_out^T row-major too)
    ctx->saved_data["gelu"] = gelu_input;

    std::vector<int64_t> out_sizes = input.sizes().vec();
    out_sizes.back() = out_features;
    return out.reshape(out_sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    using mixed_precision::kColumnMajor;
    using mixed_precision::kRowMajor;
    // (Autocast off, as in forward, where backward runs under it.)
    const std::optional<mixed_precision::AutocastScope> off = autocast_off(grad_outputs[0].device().type());
    const auto backend = static_cast<Float8MatmulBackend>(ctx->saved_data["backend"].toInt());
    const bool rowwise = ctx->saved_data["rowwise"].toBool();
    const bool x_col = ctx->saved_data["x_col"].toBool();
    const Fp8Format grad_format = ctx->saved_data["e4m3_grads"].toBool() ? Fp8Format::E4M3 : Fp8Format::E5M2;
    const auto input_sizes = ctx->saved_data["input_sizes"].toIntVector();
    const auto input_dtype = static_cast<at::ScalarType>(ctx->saved_data["input_dtype"].toInt());
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const auto bias_dtype = static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt());
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const bool need_input = ctx->needs_input_grad(0), need_weight = ctx->needs_input_grad(1);
    const bool need_bias = has_bias && ctx->needs_input_grad(2);
    // The fp8 operand forward kept for this gradient (forward keeps those whose gradient is asked): the
    // input's (for grad_weight) or the weight's (for grad_input).
    const variable_list saved = ctx->get_saved_variables();
    auto kept = [&](bool input_operand) {
      Fp8Tensor t;
      if (input_operand)
        t = Fp8Tensor{saved[0], saved[1], Fp8Format::E4M3, saved[2]};
      else if (ctx->saved_data.count("wq") != 0)
        t = Fp8Tensor{ctx->saved_data["wq"].toTensor(), ctx->saved_data["ws"].toTensor(), Fp8Format::E4M3,
                      ctx->saved_data["wi"].toTensor()};
      else
        t = Fp8Tensor{saved[3], saved[4], Fp8Format::E4M3, saved[5]};
      if (!t.data.defined()) throw accel::LogicError("Float8Linear: backward needs an operand forward did not keep");
      return t;
    };

    const at::Tensor go = grad_outputs[0].reshape({-1, ctx->saved_data["out_features"].toInt()});
    // grad_weight's first operand is grad_output transposed: row-major as grad_output column-major, where
    // that product goes to cuBLASLt (as the saved input does).
    const mixed_precision::Fp8Layout go_t = x_col ? kColumnMajor : kRowMajor;

    at::Tensor grad_input, grad_weight, grad_bias;
    if (rowwise) {  // e4m3, each along the inner dim of its product
      using mixed_precision::quantize_dynamic_axiswise;
      if (need_input)  // [M, N] @ [N, K]: grad_out per row, weight per column (saved)
        grad_input = mixed_precision::float8_mm(quantize_dynamic_axiswise(go, 1, Fp8Format::E4M3, 0, kPow2),
                                                kept(false), input_dtype, backend)
                         .reshape(input_sizes);
      if (need_weight)  // [N, M] @ [M, K]: grad_out per column, input per column (saved)
        grad_weight =
            mixed_precision::float8_mm(transposed(quantize_dynamic_axiswise(go, 0, Fp8Format::E4M3, 0, kPow2, go_t)),
                                       kept(true), weight_dtype, backend);
    } else if (need_input || need_weight) {
      // (with the bias's gradient: the column sums of grad_out, summed by its cast on CUDA)
      const mixed_precision::Fp8Layouts gq = mixed_precision::quantize_dynamic_2d(
          go, grad_format, (need_input ? kRowMajor : 0u) | (need_weight ? static_cast<unsigned>(go_t) : 0u), 0, false,
          need_bias);
      if (need_bias) grad_bias = gq.column_sums.to(bias_dtype);
      if (need_input)  // [M, N] @ [N, K]
        grad_input = mixed_precision::float8_mm(gq.row_major, kept(false), input_dtype, backend).reshape(input_sizes);
      if (need_weight)  // [N, M] @ [M, K]
        grad_weight = mixed_precision::float8_mm(transposed(x_col ? gq.column_major : gq.row_major), kept(true),
                                                 weight_dtype, backend);
    }
    if (grad_input.defined() && ctx->saved_data["gelu"].toBool())  // (GELU's backward, as autograd's)
      grad_input = at::gelu_backward(grad_input, saved[6]);
    if (need_bias && !grad_bias.defined())  // (summed in fp32 without an fp32 copy of the gradient)
      grad_bias = go.sum(0, /*keepdim=*/false, at::kFloat).to(bias_dtype);
    return {grad_input,   grad_weight,  grad_bias,    at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

Float8LinearImpl::Float8LinearImpl(const torch::nn::LinearOptions& options_) : options(options_) { reset(); }

void Float8LinearImpl::reset() {
  weight = register_parameter("weight", at::empty({options.out_features(), options.in_features()}));
  if (options.bias())
    bias = register_parameter("bias", at::empty({options.out_features()}));
  else
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  reset_parameters();
}

// torch::nn::LinearImpl::reset_parameters, step for step (same RNG draws, same bounds).
void Float8LinearImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias.defined()) {
    auto [fan_in, fan_out] = torch::nn::init::_calculate_fan_in_and_fan_out(weight);
    (void)fan_out;
    const auto bound = 1 / std::sqrt(fan_in);
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void Float8LinearImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "accel::nn::Float8Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << options.bias() << ")";
}

at::Tensor Float8LinearImpl::forward(const at::Tensor& input) { return forward_impl(input, /*gelu=*/false); }

at::Tensor Float8LinearImpl::forward_gelu(const at::Tensor& pre) {
  // Under autocast: on CUDA, at::gelu is on none of autocast's lists, so over a pre already in the
  // autocast dtype (fc1's output) it runs in that dtype, as inside the layer; otherwise (another dtype
  // that forward would cast, the CPU's autocast) the graph of forward(at::gelu(pre)) itself.
  const std::optional<c10::ScalarType> cast_to = mixed_precision::autocast_dtype_on(pre.device().type());
  if (cast_to && !(pre.is_cuda() && pre.scalar_type() == *cast_to)) return forward(at::gelu(pre));
  return forward_impl(pre, /*gelu=*/true);
}

at::Tensor Float8LinearImpl::forward_impl(const at::Tensor& input, bool gelu) {
  if (!at::isFloatingType(input.scalar_type()))
    throw accel::InvalidArgumentError("Float8Linear: expected a floating input");
  if (input.dim() < 1 || input.size(-1) != options.in_features())
    throw accel::InvalidArgumentError(
        fmt::format("Float8Linear: input's last dimension is {}, expected in_features = {}",
                    input.dim() ? input.size(-1) : 0, options.in_features()));
  std::optional<at::Tensor> wd, ws, b;
  if (bias.defined()) b = bias;
  if (weight_fp8 && recipe == mixed_precision::Float8Recipe::Rowwise)
    throw accel::InvalidArgumentError(
        "Float8Linear: a precomputed fp8 weight (the fp8 all-gather) is tensorwise; the rowwise recipe quantizes "
        "the weight per row itself (turn enable_fsdp_float8_all_gather off)");
  if (weight_fp8) {
    if (weight_fp8->format != Fp8Format::E4M3 || !weight_fp8->data.sizes().equals(weight.sizes()))
      throw accel::InvalidArgumentError("Float8Linear: weight_fp8 must be an e4m3 tensor of the weight's shape");
    wd = weight_fp8->data;
    ws = weight_fp8->scale;
  }
  // Under autocast, as torch::nn::Linear (and torchao's Float8Linear): a floating input other than
  // fp64 goes in at its device's autocast dtype, so the output comes out in it (on CUDA, autocast's
  // layer_norm hands an fp32 input to the layer after it). The weight is quantized from its own dtype.
  const c10::DeviceType device = input.device().type();
  const std::optional<c10::ScalarType> cast_to = mixed_precision::autocast_dtype_on(device);
  const at::Tensor x = cast_to && input.scalar_type() != at::kDouble ? input.to(*cast_to) : input;
  const std::optional<mixed_precision::AutocastScope> off = autocast_off(device);
  // What backward will need: the fp8 input for grad_weight, the fp8 weight for grad_input (none under
  // NoGradGuard, where the parameters still require grad).
  const bool grad = at::GradMode::is_enabled();
  return Float8LinearFunction::apply(x, weight, b, wd, ws, static_cast<int64_t>(backend),
                                     recipe == mixed_precision::Float8Recipe::Rowwise, grad_format == Fp8Format::E4M3,
                                     fast_accum_output, grad && weight.requires_grad(), grad && x.requires_grad(),
                                     gelu);
}

int set_float8_recipe(torch::nn::Module& model, mixed_precision::Float8Recipe recipe, Fp8Format grad_format) {
  int n = 0;
  for (const auto& m : model.modules(/*include_self=*/true))
    if (auto* f = dynamic_cast<Float8LinearImpl*>(m.get())) {
      f->recipe = recipe;
      f->grad_format = grad_format;
      ++n;
    }
  return n;
}

torch::nn::AnyModule make_linear(const torch::nn::LinearOptions& options, bool fp8) {
  if (fp8) return torch::nn::AnyModule(Float8Linear(options));
  return torch::nn::AnyModule(torch::nn::Linear(options));
}

}  // namespace accel::nn
