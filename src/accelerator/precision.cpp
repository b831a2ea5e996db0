#include "accelerator/precision.h"
#include "base/error.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace accel {

void apply_precision_policy(AcceleratorConfig& cfg) {
  zero::ShardingSpec& s = cfg.spec;
  const auto where = cfg.source.empty() ? std::string("the configuration") : cfg.source;
  if (s.master_dtype == c10::kBFloat16 && cfg.mixed_precision != MixedPrecision::Bf16)
    throw ConfigError(
        fmt::format("{}: bf16 master weights (bf16_master_weights_and_grads) need mixed_precision bf16, "
                    "not '{}'",
                    where, to_string(cfg.mixed_precision)));
  switch (cfg.mixed_precision) {
    case MixedPrecision::No: return;
    case MixedPrecision::Bf16: s.param_dtype = c10::kBFloat16; break;
    case MixedPrecision::Fp16: s.param_dtype = c10::kHalf; break;
    case MixedPrecision::Fp8:
      s.param_dtype = c10::kBFloat16;
      // (The gathered fp8 weight carries one scale: the rowwise recipe quantizes its weights itself.)
      s.fp8_all_gather =
          cfg.fp8.enable_fsdp_float8_all_gather && s.shards_parameters() && cfg.fp8.recipe == "tensorwise";
      break;
  }
  if (!s.reduce_dtype) s.reduce_dtype = c10::kFloat;
  if (!s.master_dtype) s.master_dtype = c10::kFloat;
  // The window adds up in the compute dtype or a wider one: another 16-bit dtype would hold neither.
  if (const auto a = s.accumulate_dtype; a && *a != *s.param_dtype && c10::promoteTypes(*a, *s.param_dtype) != *a)
    throw ConfigError(
        fmt::format("{}: data_types.grad_accum_dtype {} cannot hold the {} gradients of mixed_precision "
                    "{}: use fp32, or {} itself",
                    where, dtype_label(*a), dtype_label(*s.param_dtype), to_string(cfg.mixed_precision),
                    dtype_label(*s.param_dtype)));
}

const char* dtype_label(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "fp32";
    case c10::ScalarType::Double: return "fp64";
    case c10::ScalarType::Half: return "fp16";
    case c10::ScalarType::BFloat16: return "bf16";
    default: return c10::toString(t);
  }
}

std::optional<c10::ScalarType> autocast_dtype(MixedPrecision p) {
  switch (p) {
    case MixedPrecision::No: return std::nullopt;
    case MixedPrecision::Fp16: return c10::kHalf;
    case MixedPrecision::Bf16:
    case MixedPrecision::Fp8: return c10::kBFloat16;
  }
  return std::nullopt;
}

LossScaling::LossScaling(const LossScalerConfig& config, std::shared_ptr<zero::Engine> engine, c10::Device device)
    : scaler_(config), engine_(std::move(engine)), device_(device) {}

at::Tensor LossScaling::scale_loss(const at::Tensor& loss) const { return loss * scaler_.scale(); }

double LossScaling::unscale(std::optional<double> max_norm, double norm_type) {
  if (checked_) return norm_;
  checked_ = true;
  std::vector<at::Tensor> grads = engine_->step_grads();
  // Every rank takes part (the overflow may sit in one rank's shard only): one all-reduce.
  overflow_ = mixed_precision::found_inf_across_ranks(grads, engine_->world(), device_);
  if (overflow_) return norm_ = std::numeric_limits<double>::infinity();
  comm::Communicator* group = engine_->plan().state_split ? engine_->shard_group().get() : nullptr;
  const double s = scaler_.scale();
  const bool l2 = norm_type == 2.0;  // the fused pass computes the L2 norm
  norm_ = mixed_precision::unscale_and_clip(grads, s, l2 ? max_norm : std::nullopt, group);
  double coef = 1.0 / s;
  if (l2 && max_norm && *max_norm / (norm_ + 1e-6) < 1.0) coef *= *max_norm / (norm_ + 1e-6);
  engine_->grads_scaled(coef);
  if (!l2) norm_ = engine_->clip_grad_norm(max_norm.value_or(std::numeric_limits<double>::infinity()), norm_type);
  clipped_ = max_norm.has_value();
  return norm_;
}

bool LossScaling::finish_step(std::optional<double> clip) {
  if (!checked_)
    unscale(clip);
  else if (clip && !clipped_ && !overflow_)
    engine_->clip_grad_norm(*clip);
  const bool overflow = overflow_;
  checked_ = overflow_ = clipped_ = false;
  return scaler_.update(overflow);
}

std::string LossScaling::state_text() const {
  const auto st = scaler_.state();
  char buf[256];
  std::snprintf(buf, sizeof buf, "v1 %.17g %lld %lld %d %lld %lld", st.cur_scale, static_cast<long long>(st.cur_iter),
                static_cast<long long>(st.last_overflow_iter), st.cur_hysteresis,
                static_cast<long long>(st.consecutive_overflows), static_cast<long long>(st.skipped_steps));
  return buf;
}

void LossScaling::load_state_text(const std::string& text) {
  std::istringstream in(text);
  std::string tag;
  mixed_precision::LossScaler::State st;
  long long iter = 0, last = 0, consecutive = 0, skipped = 0;
  if (!(in >> tag >> st.cur_scale >> iter >> last >> st.cur_hysteresis >> consecutive >> skipped) || tag != "v1" ||
      !(st.cur_scale > 0) || !std::isfinite(st.cur_scale))
    throw accel::InvalidArgumentError(
        fmt::format("the loss scaler state '{}' is not one this version of accel wrote", text));
  st.cur_iter = iter;
  st.last_overflow_iter = last;
  st.consecutive_overflows = consecutive;
  st.skipped_steps = skipped;
  scaler_.load_state(st);
}

}  // namespace accel
