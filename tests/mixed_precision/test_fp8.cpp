// fp8 scaling and casting (e4m3, e5m2), and the fp8 all-gather codec.
//
// Round-trip bound. With a scale s, y = x * s is rounded to the nearest fp8 value and divided by s.
//   * normal range (|y| >= smallest normal: 2^-6 for e4m3, 2^-14 for e5m2): round-to-nearest with m
//     mantissa bits has relative error <= 2^-(m+1): 2^-4 for e4m3 (m = 3), 2^-3 for e5m2 (m = 2).
//     The fp32 multiply by s and divide by s add <= 2^-24 each: we allow 2^-4 (resp. 2^-3) + 2^-21.
//   * subnormal range (|y| below that): the spacing is constant, 2^-9 (e4m3) / 2^-16 (e5m2), so the
//     absolute error of y is <= half of it: 2^-10 / 2^-17, i.e. 2^-10 / s in x's units (+ the same
//     fp32 slack, relative to |x|).
#include "mixed_precision/fp8.h"
#include "test_world.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace accel::mixed_precision {
namespace {

struct FormatBounds {
  Fp8Format f;
  double max, min_normal, rel, subnormal_abs;
};
const FormatBounds kFormats[] = {
    {Fp8Format::E4M3, 448.0, std::ldexp(1.0, -6), std::ldexp(1.0, -4), std::ldexp(1.0, -10)},
    {Fp8Format::E5M2, 57344.0, std::ldexp(1.0, -14), std::ldexp(1.0, -3), std::ldexp(1.0, -17)},
};

TEST(Fp8, FormatConstants) {
  EXPECT_EQ(fp8_dtype(Fp8Format::E4M3), at::kFloat8_e4m3fn);
  EXPECT_EQ(fp8_dtype(Fp8Format::E5M2), at::kFloat8_e5m2);
  EXPECT_EQ(fp8_max(Fp8Format::E4M3), 448.0);
  EXPECT_EQ(fp8_max(Fp8Format::E5M2), 57344.0);
}

// Values across the whole scaled range: magnitudes 2^u for u uniform over 40 binades below amax
// (reaching deep into the subnormals and below the smallest subnormal), both signs, plus amax itself.
TEST(Fp8, RoundTripErrorWithinTheFormatsBound) {
  for (const auto& fb : kFormats)
    for (double amax : {1.0, 3.7e-3, 1234.5, 6.0e4}) {
      SCOPED_TRACE(std::string(to_string(fb.f)) + " amax " + std::to_string(amax));
      at::manual_seed(7);
      at::Tensor u = at::rand({20000}, at::kDouble) * -40.0;
      at::Tensor sign = at::where(at::rand({20000}) < 0.5, -1.0, 1.0).to(at::kDouble);
      at::Tensor x = (sign * at::pow(2.0, u) * amax).to(at::kFloat);
      x[0] = amax;
      x[1] = -amax;
      const Fp8Tensor q = quantize_dynamic(x, fb.f);
      ASSERT_EQ(q.data.scalar_type(), fp8_dtype(fb.f));
      const double s = q.scale.item<double>();
      EXPECT_EQ(s, scale_from_amax(static_cast<double>(static_cast<float>(amax)), fb.f));
      EXPECT_NEAR(s, fb.max / amax, 1e-6 * fb.max / amax);
      const at::Tensor back = q.dequantize().to(at::kDouble);
      const at::Tensor xd = x.to(at::kDouble);
      ASSERT_TRUE(at::isfinite(back).all().item<bool>());
      const at::Tensor err = (back - xd).abs();
      const at::Tensor normal = xd.abs() * s >= fb.min_normal;
      const double slack = std::ldexp(1.0, -21);
      const at::Tensor bound = at::where(normal, xd.abs() * (fb.rel + slack), fb.subnormal_abs / s + xd.abs() * slack);
      const at::Tensor excess = err - bound;
      EXPECT_LE(excess.max().item<double>(), 0.0)
          << "worst element " << x[excess.argmax()].item<double>() << " -> " << back[excess.argmax()].item<double>();
      // The bound is tight: the worst normal element reaches 2^-(m+1) / (1 + 2^-(m+1)) (halfway
      // between 1 and the next value above it): 0.94 (e4m3) / 0.89 (e5m2) of the bound.
      const at::Tensor rel = at::where(normal, err / xd.abs(), at::zeros_like(err));
      EXPECT_GT(rel.max().item<double>(), 0.85 * fb.rel);
      // amax maps to +-max exactly.
      EXPECT_EQ(q.data[0].to(at::kFloat).item<float>(), static_cast<float>(fb.max));
      EXPECT_EQ(q.data[1].to(at::kFloat).item<float>(), -static_cast<float>(fb.max));
    }
}

// Every finite fp8 value is a fixed point of quantize(dequantize(.)) at scale 1 (the cast is exact
// on its own grid), and bf16 inputs quantize like their fp32 values.
TEST(Fp8, EveryFiniteFp8ValueRoundTripsExactly) {
  for (const auto& fb : kFormats) {
    at::Tensor bytes = at::arange(256, at::kInt).to(at::kByte);
    at::Tensor vals = bytes.view(fp8_dtype(fb.f)).to(at::kFloat);
    at::Tensor finite = vals.masked_select(at::isfinite(vals));
    EXPECT_EQ(finite.numel(), fb.f == Fp8Format::E4M3 ? 254 : 248);  // e4m3fn: 2 nans; e5m2: 2 infs, 6 nans
    at::Tensor q = quantize(finite, 1.0, fb.f);
    EXPECT_TRUE(at::equal(q.to(at::kFloat), finite)) << to_string(fb.f);
    at::Tensor b = at::randn({1000}).to(at::kBFloat16);
    EXPECT_TRUE(
        at::equal(quantize(b, 3.0, fb.f).view(at::kByte), quantize(b.to(at::kFloat), 3.0, fb.f).view(at::kByte)));
  }
}

// Saturation is explicit: finite values beyond the range clamp to +-max (a plain cast would give nan
// for e4m3fn and inf for e5m2); +-inf clamps too (documented); nan stays nan.
TEST(Fp8, SaturatesNeverInfOrNanFromFiniteInputs) {
  for (const auto& fb : kFormats) {
    SCOPED_TRACE(to_string(fb.f));
    const float big = std::numeric_limits<float>::max();
    at::Tensor x = at::tensor({1e10f, -1e10f, static_cast<float>(fb.max) * 1.01f, big, -big, 1.0f});
    // Plain casts do not saturate: this is what the clamp is for.
    at::Tensor plain = x.to(fp8_dtype(fb.f)).to(at::kFloat);
    EXPECT_FALSE(at::isfinite(plain[0]).item<bool>());
    at::Tensor q = quantize(x, 1.0, fb.f).to(at::kFloat);
    EXPECT_TRUE(at::isfinite(q).all().item<bool>());
    EXPECT_TRUE(
        at::equal(q, at::tensor({float(fb.max), -float(fb.max), float(fb.max), float(fb.max), -float(fb.max), 1.0f})));
    // A large scale pushes finite values past max: still saturated.
    at::Tensor q2 = quantize(at::randn({1000}), 1e30, fb.f).to(at::kFloat);
    EXPECT_TRUE(at::isfinite(q2).all().item<bool>());
    EXPECT_EQ(q2.abs().max().item<float>(), float(fb.max));
    // Non-finite inputs with a given scale: inf -> +-max, nan -> nan.
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    at::Tensor q3 = quantize(at::tensor({inf, -inf, nan, 2.0f}), 1.0, fb.f).to(at::kFloat);
    EXPECT_EQ(q3[0].item<float>(), float(fb.max));
    EXPECT_EQ(q3[1].item<float>(), -float(fb.max));
    EXPECT_TRUE(std::isnan(q3[2].item<float>()));
    EXPECT_EQ(q3[3].item<float>(), 2.0f);
    // Dynamic scaling of a tensor holding inf or nan: every element is nan (the overflow stays visible).
    for (float bad : {inf, -inf, nan}) {
      const Fp8Tensor d = quantize_dynamic(at::tensor({1.0f, bad, 3.0f}), fb.f);
      EXPECT_TRUE(std::isnan(d.scale.item<float>()));
      EXPECT_TRUE(at::isnan(d.dequantize()).all().item<bool>());
    }
  }
}

TEST(Fp8, ZeroAmaxTinyAmaxAndMargin) {
  for (const auto& fb : kFormats) {
    const Fp8Tensor z = quantize_dynamic(at::zeros({5, 3}), fb.f);
    EXPECT_EQ(z.scale.item<float>(), 1.0f);
    EXPECT_TRUE(at::equal(z.dequantize(), at::zeros({5, 3})));
    const Fp8Tensor e = quantize_dynamic(at::empty({0}), fb.f);
    EXPECT_EQ(e.scale.item<float>(), 1.0f);
    EXPECT_EQ(scale_from_amax(0.0, fb.f), 1.0);
    // A tiny amax: the scale stays finite in fp32 (amax floored at 1e-12, torchao's EPS).
    const Fp8Tensor t = quantize_dynamic(at::full({4}, 1e-30f), fb.f);
    EXPECT_TRUE(std::isfinite(t.scale.item<float>()));
    EXPECT_TRUE(at::isfinite(t.dequantize()).all().item<bool>());
    // margin m: scale = max / amax / 2^m.
    EXPECT_FLOAT_EQ(scale_from_amax(at::tensor(2.0f), fb.f, 3).item<float>(), float(fb.max / 2.0 / 8.0));
    EXPECT_FLOAT_EQ(static_cast<float>(scale_from_amax(2.0, fb.f, 3)), float(fb.max / 2.0 / 8.0));
    EXPECT_THROW(scale_from_amax(2.0, fb.f, -1), std::invalid_argument);
  }
}

// ---- layouts for the products -------------------------------------------------------------------

// The bytes of an fp8 tensor in logical order (any strides), as uint8.
at::Tensor bytes_of(const at::Tensor& q) { return q.view(at::kByte).contiguous(); }

// Both layouts of one quantization hold quantize_dynamic's values and scale; row-major is contiguous,
// column-major is the transpose of a contiguous tensor; a layout not asked for is left undefined.
TEST(Fp8Layouts, BothLayoutsHoldTheSameValuesAndScale) {
  at::manual_seed(3);
  for (const auto& fb : kFormats)
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor x = (at::randn({37, 53}) * 5).to(dtype);
      const Fp8Tensor ref = quantize_dynamic(x, fb.f);
      const Fp8Layouts both = quantize_dynamic_2d(x, fb.f, kRowMajor | kColumnMajor);
      ASSERT_TRUE(both.row_major.data.is_contiguous());
      ASSERT_TRUE(is_column_major(both.column_major.data));
      EXPECT_FALSE(both.column_major.data.is_contiguous());
      EXPECT_EQ(both.column_major.data.sizes(), x.sizes());
      EXPECT_EQ(both.column_major.data.stride(0), 1);
      EXPECT_EQ(both.column_major.data.stride(1), 37);
      for (const Fp8Tensor* q : {&both.row_major, &both.column_major}) {
        EXPECT_TRUE(at::equal(bytes_of(q->data), bytes_of(ref.data)));
        EXPECT_TRUE(at::equal(q->scale, ref.scale));
        EXPECT_EQ(q->format, fb.f);
      }
      const Fp8Layouts col = quantize_dynamic_2d(x, fb.f, kColumnMajor);
      EXPECT_FALSE(col.row_major.data.defined());
      EXPECT_TRUE(at::equal(bytes_of(col.column_major.data), bytes_of(ref.data)));
      const Fp8Layouts row = quantize_dynamic_2d(x, fb.f, kRowMajor);
      EXPECT_FALSE(row.column_major.data.defined());
      EXPECT_TRUE(row.row_major.data.is_contiguous());
    }
  EXPECT_THROW(quantize_dynamic_2d(at::randn({6}), Fp8Format::E4M3, kRowMajor), std::invalid_argument);
  EXPECT_THROW(quantize_dynamic_2d(at::randn({2, 3}), Fp8Format::E4M3, 0), std::invalid_argument);
  EXPECT_THROW(quantize_dynamic_2d(at::randn({2, 3}), Fp8Format::E4M3, 4), std::invalid_argument);
}

// column_major() moves a row-major fp8 tensor into the other layout, values and scale unchanged, and
// leaves a column-major one as it is (the same storage); axiswise quantization takes a layout too.
TEST(Fp8Layouts, ColumnMajorAndAxiswiseLayouts) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({20, 12}) * at::exp(at::randn({20, 1}));
  const Fp8Tensor q = quantize_dynamic(x, Fp8Format::E4M3);
  const Fp8Tensor c = column_major(q);
  ASSERT_TRUE(is_column_major(c.data));
  EXPECT_TRUE(at::equal(bytes_of(c.data), bytes_of(q.data)));
  EXPECT_TRUE(at::equal(c.scale, q.scale));
  EXPECT_EQ(column_major(c).data.data_ptr(), c.data.data_ptr()) << "already column-major: no copy";
  EXPECT_THROW(column_major(quantize_dynamic(at::randn({6}), Fp8Format::E4M3)), std::invalid_argument);
  for (std::int64_t dim : {0, 1}) {
    const Fp8Tensor r = quantize_dynamic_axiswise(x, dim, Fp8Format::E4M3, 0, true);
    const Fp8Tensor k = quantize_dynamic_axiswise(x, dim, Fp8Format::E4M3, 0, true, kColumnMajor);
    ASSERT_TRUE(r.data.is_contiguous());
    ASSERT_TRUE(is_column_major(k.data));
    EXPECT_TRUE(at::equal(bytes_of(k.data), bytes_of(r.data))) << dim;
    EXPECT_TRUE(at::equal(k.scale, r.scale)) << dim;
  }
}

// ---- the fp8 all-gather codec -----------------------------------------------------------------

// Units of different sizes (each a multiple of the world size: the engine pads), identical "full"
// tensors on every rank, each rank holding its contiguous shard.
std::vector<at::Tensor> full_units(int n) {
  at::manual_seed(42);
  return {at::randn({64 * n}) * 3.0, at::randn({10 * n}) * 1e-3, at::randn({8, 3 * n}) * 200.0};
}

TEST(Fp8AllGather, AgreedScalesAreTheWholeUnitsScalesInOneAllReduce) {
  auto world = test::world();
  const int n = world->size(), r = world->rank();
  auto units = full_units(n);
  std::vector<at::Tensor> shards;
  for (auto& u : units) shards.push_back(u.reshape({-1}).chunk(n)[r]);
  world->reset_counters();
  const at::Tensor scales = agree_scales(local_amaxes(shards), *world, Fp8Format::E4M3);
  EXPECT_EQ(world->counters()[comm::Collective::AllReduce].calls, 1u);
  EXPECT_EQ(world->counters().total().calls, 1u);
  ASSERT_EQ(scales.numel(), 3);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(scales[i].item<float>(), scale_from_amax(abs_max(units[i]), Fp8Format::E4M3).item<float>());
}

// At every world size (the acceptance case is np 2): the gathered unit equals quantize -> dequantize
// of the full tensor with the agreed scale (bit for bit), and the gather moves half the bytes of a
// bf16 gather of the same unit, counted by the communicator.
TEST(Fp8AllGather, GathersHalfTheBytesOfBf16AndEqualsQuantizeOfTheFullUnit) {
  auto world = test::world();
  const int n = world->size(), r = world->rank();
  auto units = full_units(n);
  std::vector<at::Tensor> shards;
  for (auto& u : units) shards.push_back(u.reshape({-1}).chunk(n)[r].contiguous());
  const at::Tensor scales = agree_scales(local_amaxes(shards), *world, Fp8Format::E4M3);
  for (std::size_t i = 0; i < units.size(); ++i) {
    SCOPED_TRACE("unit " + std::to_string(i));
    world->reset_counters();
    const Fp8Tensor full = all_gather_fp8(shards[i], scales[i], Fp8Format::E4M3, *world);
    const auto fp8_counts = world->counters()[comm::Collective::AllGather];
    at::Tensor bf16_out = at::empty({units[i].numel()}, at::kBFloat16);
    world->reset_counters();
    world->all_gather(shards[i].to(at::kBFloat16), bf16_out);
    const auto bf16_counts = world->counters()[comm::Collective::AllGather];
    EXPECT_EQ(fp8_counts.calls, 1u);
    EXPECT_EQ(fp8_counts.bytes_sent, static_cast<std::uint64_t>(shards[i].numel()));
    EXPECT_EQ(fp8_counts.bytes_received, static_cast<std::uint64_t>(units[i].numel()));
    EXPECT_EQ(2 * fp8_counts.bytes_sent, bf16_counts.bytes_sent);
    EXPECT_EQ(2 * fp8_counts.bytes_received, bf16_counts.bytes_received);

    const at::Tensor expect_q = quantize(units[i].reshape({-1}), scales[i], Fp8Format::E4M3);
    EXPECT_TRUE(at::equal(full.data.view(at::kByte), expect_q.view(at::kByte)));
    EXPECT_TRUE(at::equal(full.dequantize(), dequantize(expect_q, scales[i])));
    EXPECT_EQ(full.scale.item<float>(), scales[i].item<float>());
    // and it is an fp8-accurate copy of the unit (the bound of RoundTripErrorWithinTheFormatsBound)
    const at::Tensor x = units[i].reshape({-1});
    const double s = scales[i].item<double>();
    const at::Tensor bound =
        at::maximum(x.abs() * (std::ldexp(1.0, -4) + std::ldexp(1.0, -21)), at::full_like(x, std::ldexp(1.0, -10) / s));
    EXPECT_TRUE(((full.dequantize() - x).abs() <= bound).all().item<bool>());
  }
}

TEST(Fp8AllGather, AsyncIntoACallerBufferAndBadBuffersRejected) {
  auto world = test::world();
  const int n = world->size(), r = world->rank();
  at::Tensor unit = full_units(n)[0];
  at::Tensor shard = unit.chunk(n)[r].contiguous();
  at::Tensor scale = agree_scales(local_amaxes({shard}), *world, Fp8Format::E5M2)[0];
  at::Tensor out = at::empty({unit.numel()}, at::kFloat8_e5m2);
  all_gather_fp8_async(shard, scale, Fp8Format::E5M2, *world, out)->wait();
  EXPECT_TRUE(at::equal(out.view(at::kByte), quantize(unit, scale, Fp8Format::E5M2).view(at::kByte)));
  // Checked locally, before any communication (so every rank throws and none hangs).
  EXPECT_THROW(all_gather_fp8_async(shard, scale, Fp8Format::E4M3, *world, out), std::invalid_argument);
  EXPECT_THROW(all_gather_fp8_async(shard, scale, Fp8Format::E5M2, *world, out.narrow(0, 0, 1)), std::invalid_argument);
}

}  // namespace
}  // namespace accel::mixed_precision
