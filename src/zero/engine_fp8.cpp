// The fp8 all-gather (ShardingSpec::fp8_all_gather): sharded units travel as e4m3 bytes with one
// scale per parameter, agreed over the shard group after each step, and are dequantized into the
// compute buffer when they arrive.
#include "zero/engine.h"

#include "base/memory.h"
#include "mixed_precision/fp8.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace accel::zero {

using memory::Category;
using memory::CategoryScope;

comm::WorkPtr Engine::gather_fp8_async(Flat& f) {
  {
    CategoryScope cat(Category::Gathered);
    f.fp8_full = at::empty({f.flat_param->layout().padded()}, f.fp8_shard.options());
  }
  return gather_->all_gather_async(f.fp8_shard, f.fp8_full);
}

void Engine::dequantize_arrived(Flat& f) {
  if (!f.fp8_full.defined()) return;
  c10::NoGradGuard ng;
  const sharding::FlatParam& fp = *f.flat_param;
  for (std::size_t i = 0; i < fp.params().size(); ++i) {
    const std::int64_t off = fp.layout().offset(i), n = fp.params()[i].numel();
    fp.full().narrow(0, off, n).copy_(mixed_precision::dequantize(
        f.fp8_full.narrow(0, off, n), f.fp8_scales[static_cast<std::int64_t>(i)], fp.full().scalar_type()));
  }
  f.fp8_full = at::Tensor();
}

bool Engine::fp8_gathered(const Flat& f) const {
  // (options().sharded: parameters sharded over a group of more than one rank.)
  return spec_.fp8_all_gather && f.flat_param->options().sharded && !f.persistent &&
         f.flat_param->shard().is_floating_point();
}

void Engine::quantize_fp8_shards() {
  // Per parameter: this rank's piece of it (the intersection of its region with the shard), from
  // the master where there is one (fp32), else from the compute shard.
  struct Piece {
    Flat* f;
    std::size_t param;
    std::int64_t b, lo, hi;  // flat-buffer elements: this rank's shard starts at b; [lo, hi) inside it
  };
  std::vector<Piece> pieces;
  std::vector<at::Tensor> values;
  for (auto& f : flats_) {
    if (!fp8_gathered(f)) continue;
    const auto& layout = f.flat_param->layout();
    auto [b, e] = layout.shard_range(f.flat_param->options().rank);
    const at::Tensor& src = f.master.defined() && f.opt_region == npos ? f.master : f.flat_param->shard();
    for (std::size_t i = 0; i < f.flat_param->params().size(); ++i) {
      const std::int64_t off = layout.offset(i), lo = std::min(std::max(off, b), e),
                         hi = std::max(lo, std::min(off + f.flat_param->params()[i].numel(), e));
      pieces.push_back({&f, i, b, lo, hi});
      values.push_back(src.narrow(0, lo - b, hi - lo));
    }
  }
  if (pieces.empty()) return;  // (the same on every rank: every rank has the same flats)
  c10::NoGradGuard ng;
  using mixed_precision::Fp8Format;
  // One all-reduce of every parameter's amax: the scales of whole parameters, the same on every rank.
  at::Tensor scales = mixed_precision::agree_scales(mixed_precision::local_amaxes(values), *shard_, Fp8Format::E4M3);
  for (std::size_t j = 0; j < pieces.size(); ++j) {
    const Piece& pc = pieces[j];
    Flat& f = *pc.f;
    if (pc.param == 0) {
      CategoryScope cat(Category::Parameters);
      if (!f.fp8_shard.defined())
        f.fp8_shard = at::zeros({f.flat_param->shard().numel()},
                                f.flat_param->shard().options().dtype(mixed_precision::fp8_dtype(Fp8Format::E4M3)));
      f.fp8_scales =
          scales.narrow(0, static_cast<std::int64_t>(j), static_cast<std::int64_t>(f.flat_param->params().size()))
              .clone();
    }
    if (pc.hi > pc.lo)
      f.fp8_shard.narrow(0, pc.lo - pc.b, pc.hi - pc.lo)
          .copy_(mixed_precision::quantize(values[j], scales[static_cast<std::int64_t>(j)], Fp8Format::E4M3));
  }
}

}  // namespace accel::zero
