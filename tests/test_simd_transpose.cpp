// phasekv::simd::transpose_scaled (include/phasekv/detail/simd/transpose.hpp) and
// phasekv::kernels::all_finite (include/phasekv/kernels/finite.hpp) against their definitions,
// element by element.
//
// The transpose runs for the compiler's best architecture (16 × 16 register blocks on AVX-512)
// and for SSE2 (element by element); both must give out[c · out_stride + r] = scale · in[r ·
// in_stride + c] bit for bit, on every shape around the block size (whole blocks, one row or
// column more or less, fewer rows than a block), must leave the output's padding untouched, and
// carry NaN, ±inf, −0 and subnormals through as the scalar product does.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "phasekv/kernels/finite.hpp"
#include "phasekv/detail/simd/transpose.hpp"

namespace test_simd_transpose {

namespace {

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

template <class Arch>
void check_transpose(std::int64_t rows, std::int64_t cols, float scale, std::mt19937& rng) {
  const std::int64_t in_stride = cols + 3, out_stride = rows + 5;
  std::vector<float> in(static_cast<std::size_t>(rows * in_stride));
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  for (float& x : in) x = value(rng);
  // A few special values at places the blocks and the edges both reach.
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -0.0f, std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::max()};
  for (std::size_t k = 0; k < std::size(specials); ++k)
    in[std::uniform_int_distribution<std::size_t>(0, in.size() - 1)(rng)] = specials[k];
  const float untouched = -12345.0f;
  std::vector<float> out(static_cast<std::size_t>(cols * out_stride), untouched);
  phasekv::simd::transpose_scaled<Arch>(in.data(), rows, cols, in_stride, scale, out.data(), out_stride);
  std::int64_t wrong = 0, padding = 0;
  for (std::int64_t c = 0; c < cols; ++c)
    for (std::int64_t r = 0; r < out_stride; ++r) {
      const float got = out[static_cast<std::size_t>(c * out_stride + r)];
      if (r >= rows) {
        padding += bits(got) != bits(untouched) ? 1 : 0;
        continue;
      }
      const float want = scale * in[static_cast<std::size_t>(r * in_stride + c)];
      wrong += (bits(got) != bits(want) && !(std::isnan(got) && std::isnan(want))) ? 1 : 0;
    }
  INFO(rows << " × " << cols << ", scale " << scale);
  CHECK(wrong == 0);
  CHECK(padding == 0);
}

template <class Arch>
void check_all_shapes() {
  std::mt19937 rng(20261202);
  for (std::int64_t rows : {1, 2, 15, 16, 17, 31, 32, 33, 64, 65})
    for (std::int64_t cols : {1, 5, 16, 17, 47, 48, 128, 131, 512})
      for (float scale : {1.0f, 0.0441941738f, -3.0f}) check_transpose<Arch>(rows, cols, scale, rng);
}

}  // namespace

TEST_CASE("simd transpose: every element is scale · x at its transposed place, on every shape",
          "[simd][transpose]") {
  check_all_shapes<phasekv::simd::default_arch>();
#if XSIMD_WITH_SSE2
  check_all_shapes<xsimd::sse2>();
#endif
}

TEST_CASE("all_finite: false exactly when some element is NaN or infinite, wherever it is", "[simd][finite]") {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (std::int64_t n = 0; n <= 100; ++n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i % 3 == 0 ? -0.0f : std::ldexp(1.0f, static_cast<int>(i % 200) - 100);
    if (n > 0) v[0] = std::numeric_limits<float>::max();
    CHECK(phasekv::kernels::all_finite(v.data(), n));
    // Every position of every kind of non-finite value: the four sums and the scalar tail.
    for (std::int64_t i = 0; i < n; ++i)
      for (float b : bad) {
        std::vector<float> w = v;
        w[static_cast<std::size_t>(i)] = b;
        INFO("n = " << n << ", position " << i << ", value " << b);
        CHECK_FALSE(phasekv::kernels::all_finite(w.data(), n));
      }
  }
}

}  // namespace test_simd_transpose
