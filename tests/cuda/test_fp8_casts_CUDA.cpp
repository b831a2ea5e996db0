// The fused fp8 casts on CUDA (kernels/fp8_cast.cu through mixed_precision::quantize_dynamic and
// quantize_dynamic_axiswise) against the composite ATen path on the same device, bit for bit: the fp8
// bytes, the scales and 1/scale, for fp32, fp16 and bf16 inputs, e4m3 and e5m2, sizes with and without
// a tail past the 16-byte packs, inputs that are not 16-byte aligned, a margin, all-zero tensors and
// tensors holding inf or nan (every element nan, as the composite path documents). Without a device
// (or in a build without the kernels) every case skips.
#include "comm/cuda_comm.h"
#include "mixed_precision/fp8.h"
#include "support/scoped_env.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace accel::mixed_precision {
namespace {

#define SKIP_WITHOUT_FUSED_CASTS()                                                                                    \
  do {                                                                                                                \
    if (comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";                                             \
    if (!fused_fp8_casts(at::ones({1}, at::TensorOptions().device(at::kCUDA)))) GTEST_SKIP() << "no fused fp8 casts"; \
  } while (0)

// The fp8 bytes as uint8 (nan bytes compared as "both nan": the sign of a nan is not part of the contract).
void expect_same_fp8(const at::Tensor& fused, const at::Tensor& composite, const std::string& what) {
  ASSERT_EQ(fused.scalar_type(), composite.scalar_type()) << what;
  ASSERT_EQ(fused.sizes(), composite.sizes()) << what;
  const at::Tensor a = fused.to(at::kFloat).cpu(), b = composite.to(at::kFloat).cpu();
  const at::Tensor both_nan = a.isnan() & b.isnan();
  const at::Tensor same = (fused.view(at::kByte).cpu() == composite.view(at::kByte).cpu()) | both_nan;
  const std::int64_t differ = (~same).sum().item<std::int64_t>();
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << fused.numel() << " bytes differ";
}

void expect_same_scale(const at::Tensor& fused, const at::Tensor& composite, const std::string& what) {
  const at::Tensor a = fused.cpu().to(at::kFloat).reshape({-1}), b = composite.cpu().to(at::kFloat).reshape({-1});
  ASSERT_EQ(a.numel(), b.numel()) << what;
  EXPECT_TRUE(at::equal(a.view(at::kInt), b.view(at::kInt)) ||
              (a.isnan().all().item<bool>() && b.isnan().all().item<bool>()))
      << what << ": scale " << a.slice(0, 0, 4) << " vs " << b.slice(0, 0, 4);
}

// Values over many binades (subnormal e4m3 results included), a few outliers, both signs.
at::Tensor values(std::int64_t n, at::ScalarType dtype, int seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn({n}) * at::exp2(at::randint(-12, 6, {n}).to(at::kFloat));
  if (n > 10) {
    x[3] = 3e3f;
    x[n / 2] = -7e3f;
  }
  return x.to(at::TensorOptions().dtype(dtype).device(at::kCUDA));
}

TEST(Fp8Casts_CUDA, TensorwiseEqualsTheCompositePathBitForBit) {
  SKIP_WITHOUT_FUSED_CASTS();
  int cases = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16})
    for (auto format : {Fp8Format::E4M3, Fp8Format::E5M2})
      for (std::int64_t n : {1LL, 3LL, 16LL, 4097LL, (1LL << 20) + 5})
        for (int offset : {0, 1})  // 1: x starts one element past the 16-byte alignment
          for (int margin : {0, 2}) {
            const at::Tensor base = values(n + offset, dtype, cases);
            const at::Tensor x = base.slice(0, offset);
            const std::string what = std::string(c10::toString(dtype)) + " " + to_string(format) +
                                     " n=" + std::to_string(n) + " offset=" + std::to_string(offset) +
                                     " margin=" + std::to_string(margin);
            ASSERT_TRUE(fused_fp8_casts(x)) << what;
            const Fp8Tensor fused = quantize_dynamic(x, format, margin);
            const Fp8Tensor ref = quantize_dynamic_composite(x, format, margin);
            ASSERT_TRUE(fused.inverse.defined()) << what << ": not the fused path";
            expect_same_fp8(fused.data, ref.data, what);
            expect_same_scale(fused.scale, ref.scale, what);
            expect_same_scale(fused.inv_scale(), at::reciprocal(ref.scale), what + " (1/scale)");
            EXPECT_EQ(fused.scale.dim(), 0) << what;
            ++cases;
          }
  EXPECT_EQ(cases, 3 * 2 * 5 * 2 * 2);  // (5 sizes)
}

TEST(Fp8Casts_CUDA, TensorwiseEdgesZeroInfAndNan) {
  SKIP_WITHOUT_FUSED_CASTS();
  const auto opts = at::TensorOptions().device(at::kCUDA);
  const Fp8Tensor zeros = quantize_dynamic(at::zeros({1000}, opts), Fp8Format::E4M3);
  EXPECT_EQ(zeros.scale.item<float>(), 1.0f);  // amax 0: scale 1
  EXPECT_EQ(zeros.data.view(at::kByte).sum().item<std::int64_t>(), 0);
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    at::Tensor x = at::randn({1000}, opts);
    x[517] = bad;
    const Fp8Tensor fused = quantize_dynamic(x, Fp8Format::E4M3);
    const Fp8Tensor ref = quantize_dynamic_composite(x, Fp8Format::E4M3);
    EXPECT_TRUE(std::isnan(fused.scale.item<float>())) << bad;
    EXPECT_TRUE(fused.data.to(at::kFloat).isnan().all().item<bool>())
        << bad << ": every element nan, as the composite path";
    expect_same_fp8(fused.data, ref.data, "with " + std::to_string(bad));
  }
}

// Both layouts of a tensorwise quantization from the one cast kernel that writes them (row-major and
// its transpose, through shared-memory tiles), against the composite path and its transposed copy:
// shapes with partial tiles at both edges, a single row or column, more columns than a grid's y could
// hold, an input one element past the 16-byte alignment, each layout alone and both.
TEST(Fp8Casts_CUDA, BothLayoutsEqualTheCompositePathBitForBit) {
  SKIP_WITHOUT_FUSED_CASTS();
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {1, 1}, {1, 77}, {77, 1}, {7, 33}, {64, 96}, {33, 47}, {4097, 24}, {3, 70000}, {1031, 2053}};
  int cases = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16})
    for (auto format : {Fp8Format::E4M3, Fp8Format::E5M2})
      for (const auto& [rows, cols] : shapes)
        for (unsigned layouts : {unsigned{kColumnMajor}, unsigned{kRowMajor | kColumnMajor}})
          for (int offset : {0, 1}) {
            const at::Tensor base = values(rows * cols + offset, dtype, 300 + cases);
            const at::Tensor x = base.slice(0, offset).view({rows, cols});
            const std::string what = std::string(c10::toString(dtype)) + " " + to_string(format) + " [" +
                                     std::to_string(rows) + ", " + std::to_string(cols) + "] layouts " +
                                     std::to_string(layouts) + " offset " + std::to_string(offset);
            const Fp8Layouts fused = quantize_dynamic_2d(x, format, layouts);
            const Fp8Tensor ref = quantize_dynamic_composite(x, format);
            ASSERT_TRUE(fused.column_major.inverse.defined()) << what << ": not the fused path";
            ASSERT_TRUE(is_column_major(fused.column_major.data)) << what;
            expect_same_fp8(fused.column_major.data, ref.data, what + " (column-major)");
            expect_same_scale(fused.column_major.scale, ref.scale, what);
            expect_same_scale(fused.column_major.inv_scale(), at::reciprocal(ref.scale), what + " (1/scale)");
            EXPECT_EQ(fused.row_major.data.defined(), (layouts & kRowMajor) != 0) << what;
            if (layouts & kRowMajor) {
              ASSERT_TRUE(fused.row_major.data.is_contiguous()) << what;
              expect_same_fp8(fused.row_major.data, ref.data, what + " (row-major)");
              EXPECT_EQ(fused.row_major.scale.data_ptr(), fused.column_major.scale.data_ptr()) << "one scale";
            }
            ++cases;
          }
  EXPECT_EQ(cases, 3 * 2 * 9 * 2 * 2);
  // A nan anywhere: every element nan in both layouts, as the composite path.
  at::Tensor x = at::randn({40, 50}, at::TensorOptions().device(at::kCUDA));
  x[17][3] = std::numeric_limits<float>::quiet_NaN();
  const Fp8Layouts bad = quantize_dynamic_2d(x, Fp8Format::E4M3, kRowMajor | kColumnMajor);
  EXPECT_TRUE(bad.column_major.data.to(at::kFloat).isnan().all().item<bool>());
  EXPECT_TRUE(bad.row_major.data.to(at::kFloat).isnan().all().item<bool>());
}

// quantize_dynamic_2d(x, ..., gelu_first) on the device: the casts compute at::gelu(x) on the way, and the
// bytes and scale are those of the composite path over at::gelu(x), in either layout and both (the flat
// cast for the row-major bytes alone, the tiled one for the column-major), for fp32, fp16 and bf16.
TEST(Fp8Casts_CUDA, TensorwiseOfGeluEqualsTheCompositePathBitForBit) {
  SKIP_WITHOUT_FUSED_CASTS();
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{1, 1}, {7, 33}, {64, 96}, {1031, 2053}};
  int cases = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16})
    for (const auto& [rows, cols] : shapes)
      for (unsigned layouts : {unsigned{kRowMajor}, unsigned{kColumnMajor}, unsigned{kRowMajor | kColumnMajor}})
        for (int offset : {0, 1}) {
          // (values around GELU's bend and its tails, and outliers)
          const at::Tensor base = values(rows * cols + offset, dtype, 700 + cases) * 4;
          const at::Tensor x = base.slice(0, offset).view({rows, cols});
          const std::string what = std::string(c10::toString(dtype)) + " [" + std::to_string(rows) + ", " +
                                   std::to_string(cols) + "] layouts " + std::to_string(layouts) + " offset " +
                                   std::to_string(offset);
          const Fp8Layouts fused = quantize_dynamic_2d(x, Fp8Format::E4M3, layouts, 0, /*gelu_first=*/true);
          const Fp8Tensor ref = quantize_dynamic_composite(at::gelu(x), Fp8Format::E4M3);
          const Fp8Tensor& any = layouts & kRowMajor ? fused.row_major : fused.column_major;
          ASSERT_TRUE(any.inverse.defined()) << what << ": not the fused path";
          expect_same_scale(any.scale, ref.scale, what);
          if (layouts & kRowMajor) expect_same_fp8(fused.row_major.data, ref.data, what + " (row-major)");
          if (layouts & kColumnMajor) {
            ASSERT_TRUE(is_column_major(fused.column_major.data)) << what;
            expect_same_fp8(fused.column_major.data, ref.data, what + " (column-major)");
          }
          ++cases;
        }
  EXPECT_EQ(cases, 3 * 4 * 3 * 2);
}

// The column sums of a [rows, cols] x in the kernels' order (kernels/fp8_cast.cu: tile_transpose_kernel's
// col_partial, then sum_partials_kernel), by plain fp32 additions on the host: in each 32-row tile, the
// rows ty, ty + 8, ty + 16, ty + 24 of each of 8 threads from 0, the 8 in order; the tiles in 32 groups of
// consecutive ones, each from 0, the groups in order.
at::Tensor column_sums_in_the_kernels_order(const at::Tensor& x_in) {
  const at::Tensor x = x_in.cpu().to(at::kFloat).contiguous();
  const std::int64_t rows = x.size(0), cols = x.size(1), tiles = (rows + 31) / 32, chunk = (tiles + 31) / 32;
  const auto a = x.accessor<float, 2>();
  at::Tensor out = at::empty({cols}, at::kFloat);
  std::vector<float> tile(static_cast<std::size_t>(tiles));
  for (std::int64_t c = 0; c < cols; ++c) {
    for (std::int64_t t = 0; t < tiles; ++t) {
      float total = 0.0f;
      for (int ty = 0; ty < 8; ++ty) {
        float s = 0.0f;
        for (int i = ty; i < 32; i += 8)
          if (t * 32 + i < rows) s += a[t * 32 + i][c];
        total = ty == 0 ? s : total + s;
      }
      tile[static_cast<std::size_t>(t)] = total;
    }
    float total = 0.0f;
    for (int g = 0; g < 32; ++g) {
      float s = 0.0f;
      for (std::int64_t t = g * chunk; t < std::min((g + 1) * chunk, tiles); ++t)
        s += tile[static_cast<std::size_t>(t)];
      total = g == 0 ? s : total + s;
    }
    out[c] = total;
  }
  return out;
}

// quantize_dynamic_2d's column sums (a linear layer's bias gradient) on the device: with the column-major
// layout the tiled cast sums each tile's columns as it reads them, and a second kernel adds the tiles.
// The bytes are those without the sums; the sums are the kernels' order's bit for bit (the host loop
// above), the same bits twice, and a sum at all (within the bound of any order of rows additions of an
// fp64 reference). Without the column-major layout (the flat cast) they are at::sum's, bit for bit.
TEST(Fp8Casts_CUDA, ColumnSumsWithTheCastAreTheKernelsOrderBitForBit) {
  SKIP_WITHOUT_FUSED_CASTS();
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {1, 1}, {7, 33}, {64, 96}, {4097, 24}, {1031, 2053}};
  int cases = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16})
    for (const auto& [rows, cols] : shapes) {
      const at::Tensor x = values(rows * cols, dtype, 900 + cases).view({rows, cols});
      const std::string what =
          std::string(c10::toString(dtype)) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
      const unsigned both = kRowMajor | kColumnMajor;
      const Fp8Layouts with = quantize_dynamic_2d(x, Fp8Format::E5M2, both, 0, false, /*column_sums=*/true);
      const Fp8Layouts without = quantize_dynamic_2d(x, Fp8Format::E5M2, both);
      expect_same_fp8(with.row_major.data, without.row_major.data, what + " (row-major)");
      expect_same_fp8(with.column_major.data, without.column_major.data, what + " (column-major)");
      ASSERT_TRUE(with.column_sums.defined()) << what;
      ASSERT_EQ(with.column_sums.scalar_type(), at::kFloat) << what;
      const at::Tensor want = column_sums_in_the_kernels_order(x);
      const at::Tensor got = with.column_sums.cpu();
      EXPECT_TRUE(at::equal(got.view(at::kInt), want.view(at::kInt)))
          << what << ": largest difference " << (got - want).abs().max().item<float>();
      const at::Tensor mass = x.cpu().to(at::kDouble).abs().sum(0);
      const double err = ((got.to(at::kDouble) - x.cpu().to(at::kDouble).sum(0)).abs() / mass).max().item<double>();
      EXPECT_LE(err, static_cast<double>(rows) * std::ldexp(1.0, -24)) << what;
      const Fp8Layouts again = quantize_dynamic_2d(x, Fp8Format::E5M2, both, 0, false, true);
      EXPECT_TRUE(at::equal(again.column_sums, with.column_sums)) << what << ": not the same bits twice";
      // The flat cast (row-major alone): at::sum's bits.
      const Fp8Layouts flat = quantize_dynamic_2d(x, Fp8Format::E5M2, kRowMajor, 0, false, true);
      EXPECT_TRUE(at::equal(flat.column_sums, x.sum(0, false, at::kFloat))) << what;
      ++cases;
    }
  EXPECT_EQ(cases, 3 * 5);
}

// column_major() of a row-major fp8 tensor on the device (the tiled transpose kernel), and the axiswise
// casts into the column-major layout (per row: the fused cast, then that kernel; per column: the cast
// writing it through tiles), against ATen's transposed copy.
TEST(Fp8Casts_CUDA, ColumnMajorTransposesOnTheDevice) {
  SKIP_WITHOUT_FUSED_CASTS();
  for (const auto& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {5, 3}, {32, 32}, {33, 65}, {2048, 96}, {96, 2048}, {3, 70000}}) {
    const std::string what = "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
    const at::Tensor x = values(rows * cols, at::kBFloat16, 7).view({rows, cols});
    const Fp8Tensor q = quantize_dynamic(x, Fp8Format::E4M3);
    const Fp8Tensor c = column_major(q);
    ASSERT_TRUE(is_column_major(c.data)) << what;
    expect_same_fp8(c.data, q.data.t().contiguous().t(), what);
    for (std::int64_t dim : {0, 1}) {
      const Fp8Tensor k = quantize_dynamic_axiswise(x, dim, Fp8Format::E4M3, 0, true, kColumnMajor);
      const Fp8Tensor ref = quantize_dynamic_axiswise_composite(x, dim, Fp8Format::E4M3, 0, true);
      ASSERT_TRUE(is_column_major(k.data)) << what << " dim " << dim;
      expect_same_fp8(k.data, ref.data, what + " axiswise dim " + std::to_string(dim));
      expect_same_scale(k.scale, ref.scale, what + " axiswise dim " + std::to_string(dim));
    }
  }
}

// Per row and per column, under both column kernels (ACCEL_FP8_COLWISE single and chunked: the rows
// split among blocks, their maxima met by atomics), with and without power-of-two scales; per column
// also into the column-major layout, which the cast writes through shared-memory tiles (shapes with
// partial tiles of rows and columns, one chunk and many).
class AxiswiseCasts : public ::testing::TestWithParam<const char*> {};

TEST_P(AxiswiseCasts, EqualTheCompositePathBitForBit) {
  SKIP_WITHOUT_FUSED_CASTS();
  const test::ScopedEnv mode("ACCEL_FP8_COLWISE", std::string(GetParam()));
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{1, 1},     {7, 33},    {128, 4096},
                                                                     {4097, 24}, {3, 70000}, {20000, 40}};
  int cases = 0, column_major_cases = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16})
    for (auto format : {Fp8Format::E4M3, Fp8Format::E5M2})
      for (const auto& [rows, cols] : shapes)
        for (std::int64_t dim : {0, 1})
          for (bool pow2 : {false, true}) {  // (pow2: scales rounded down to powers of two, the rowwise recipe's)
            at::Tensor x = values(rows * cols, dtype, 100 + cases).view({rows, cols});
            if (rows > 1) x.select(0, rows - 1).zero_();  // an all-zero row: its scale 1 (dim 1)
            if (cols > 1) x.select(1, cols - 1).zero_();  // and an all-zero column (dim 0)
            const std::string what = std::string(c10::toString(dtype)) + " " + to_string(format) + " [" +
                                     std::to_string(rows) + ", " + std::to_string(cols) + "] dim " +
                                     std::to_string(dim) + (pow2 ? " pow2" : "");
            const Fp8Tensor fused = quantize_dynamic_axiswise(x, dim, format, 0, pow2);
            const Fp8Tensor ref = quantize_dynamic_axiswise_composite(x, dim, format, 0, pow2);
            ASSERT_TRUE(fused.inverse.defined()) << what << ": not the fused path";
            EXPECT_EQ(fused.scale.sizes(), ref.scale.sizes()) << what;
            expect_same_fp8(fused.data, ref.data, what);
            expect_same_scale(fused.scale, ref.scale, what);
            expect_same_scale(fused.inv_scale(), at::reciprocal(ref.scale), what + " (1/scale)");
            if (dim == 0) {  // the per-column cast writing the column-major layout itself
              const Fp8Tensor col = quantize_dynamic_axiswise(x, dim, format, 0, pow2, kColumnMajor);
              ASSERT_TRUE(is_column_major(col.data)) << what << " column-major";
              expect_same_fp8(col.data, ref.data, what + " column-major");
              expect_same_scale(col.scale, ref.scale, what + " column-major");
              expect_same_scale(col.inv_scale(), at::reciprocal(ref.scale), what + " column-major (1/scale)");
              ++column_major_cases;
            }
            ++cases;
          }
  EXPECT_EQ(cases, 3 * 2 * 6 * 2 * 2);  // (6 shapes)
  EXPECT_EQ(column_major_cases, cases / 2);
  // A transposed (non-contiguous) input: quantized as its contiguous copy.
  const at::Tensor w = values(64 * 48, at::kBFloat16, 7).view({64, 48}).t();
  for (std::int64_t dim : {0, 1})
    expect_same_fp8(quantize_dynamic_axiswise(w, dim, Fp8Format::E4M3).data,
                    quantize_dynamic_axiswise_composite(w, dim, Fp8Format::E4M3).data, "transposed");
}

INSTANTIATE_TEST_SUITE_P(Fp8Casts_CUDA, AxiswiseCasts, ::testing::Values("single", "chunked"));

}  // namespace
}  // namespace accel::mixed_precision
