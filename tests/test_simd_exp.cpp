// phasekv::simd::exp and exp_bounded_above (include/phasekv/detail/simd/exp.hpp) against std::exp.
//
// Reference: std::exp in double, rounded to float — within half an ulp of the true value except
// where the double result lies within 2^-29 ulp of a float rounding boundary, which a tolerance
// of 1 ulp absorbs. The header's claim (≤ 1 ulp everywhere) was checked exhaustively over all
// ~2.2e9 floats in [−110, 90]; here a sample keeps it honest: every 1009th float of that range
// (2.2 million) plus the 4000 floats around each interesting point (0, ±1, the overflow
// threshold, the ends of the normal and subnormal results). Each kernel runs for the compiler's best architecture and,
// when it differs, AVX2 — so on an AVX-512 machine both the vscalefps path and the integer
// exponent path are checked.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "phasekv/detail/simd/exp.hpp"

namespace test_simd_exp {

namespace {

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Ulps between two non-negative floats (ordered by their bit patterns; subnormals included).
std::int64_t ulps(float a, float b) {
  return std::llabs(static_cast<std::int64_t>(bits(a)) - static_cast<std::int64_t>(bits(b)));
}

float reference(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

// Runs exp over xs with batch arch Arch (padding the last batch) and returns the results.
template <class Arch, bool Bounded>
std::vector<float> run(const std::vector<float>& xs) {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = batch::size;
  std::vector<float> in(xs), out((xs.size() + lanes - 1) / lanes * lanes);
  in.resize(out.size(), 0.0f);
  for (std::size_t k = 0; k < in.size(); k += lanes) {
    const batch x = batch::load_unaligned(in.data() + k);
    const batch y = Bounded ? phasekv::simd::exp_bounded_above(x) : phasekv::simd::exp(x);
    y.store_unaligned(out.data() + k);
  }
  out.resize(xs.size());
  return out;
}

// Every 1009th float of [lo, hi] plus ±2000 floats around each of `centres`.
std::vector<float> sample(float lo, float hi, std::initializer_list<float> centres) {
  std::vector<float> xs;
  for (std::uint32_t u = 0;; u += 1009) {  // [0, hi]
    const float x = from_bits(u);
    if (x > hi) break;
    xs.push_back(x);
  }
  for (std::uint32_t u = 0x80000000u;; u += 1009) {  // [lo, −0]
    const float x = from_bits(u);
    if (x < lo) break;
    xs.push_back(x);
  }
  for (const float c : centres) {
    xs.push_back(c);
    float below = c, above = c;
    for (int k = 0; k < 2000; ++k) {
      below = std::nextafter(below, -std::numeric_limits<float>::infinity());
      above = std::nextafter(above, std::numeric_limits<float>::infinity());
      xs.push_back(below);
      xs.push_back(above);
    }
  }
  return xs;
}

template <class Arch, bool Bounded>
void check_accuracy(float hi) {
  // 0, where exp(x) = 1; the overflow threshold ln(FLT_MAX); the end of the normal results
  // ln(FLT_MIN); the end of the subnormal ones (ln(2^-149) − ln 2 / 2).
  const std::vector<float> xs = sample(-110.0f, hi, {0.0f, 88.7228394f, -87.3365479f, -103.972076f, 1.0f, -1.0f});
  const std::vector<float> ys = run<Arch, Bounded>(xs);
  std::int64_t worst = 0;
  float worst_x = 0.0f;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    const float ref = reference(xs[k]);
    std::int64_t d;
    if (std::isinf(ref) || std::isinf(ys[k])) d = ref == ys[k] ? 0 : std::numeric_limits<std::int64_t>::max();
    else d = ulps(ys[k], ref);
    if (d > worst) worst = d, worst_x = xs[k];
  }
  const float got = run<Arch, Bounded>({worst_x})[0];
  INFO("arguments " << xs.size() << ", worst at x = " << worst_x << ": " << got << " against " << reference(worst_x));
  CHECK(worst <= 1);
}

template <class Arch>
void check_special_values() {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> xs = {-inf, -1e30f, -1e6f, -200.0f, -104.0f, 0.0f, -0.0f,
                                 89.0f, 100.0f, 1e6f, 1e30f, std::numeric_limits<float>::max(), inf};
  const std::vector<float> ys = run<Arch, false>(xs);
  for (std::size_t k = 0; k < 5; ++k) {
    INFO("x = " << xs[k]);
    CHECK(ys[k] == 0.0f);
    CHECK_FALSE(std::signbit(ys[k]));
  }
  CHECK(ys[5] == 1.0f);  // exactly
  CHECK(ys[6] == 1.0f);
  for (std::size_t k = 7; k < xs.size(); ++k) {
    INFO("x = " << xs[k]);
    CHECK(ys[k] == inf);
  }
  CHECK(std::isnan(run<Arch, false>({std::numeric_limits<float>::quiet_NaN()})[0]));

  // The softmax form: the same values wherever it is defined, and −∞ (a masked logit) → 0.
  const std::vector<float> bounded = {-inf, -1e30f, -200.0f, -104.0f, -87.5f, -3.25f, 0.0f, 1.5f, 88.7f};
  const std::vector<float> a = run<Arch, true>(bounded), b = run<Arch, false>(bounded);
  for (std::size_t k = 0; k < bounded.size(); ++k) {
    INFO("x = " << bounded[k]);
    CHECK(bits(a[k]) == bits(b[k]));
  }
  CHECK(a[0] == 0.0f);
  CHECK(std::isnan(run<Arch, true>({std::numeric_limits<float>::quiet_NaN()})[0]));
}

}  // namespace

TEST_CASE("simd exp: within 1 ulp of the correctly rounded result", "[simd][exp]") {
  check_accuracy<xsimd::default_arch, false>(90.0f);
  check_accuracy<xsimd::default_arch, true>(88.7f);
#if XSIMD_WITH_FMA3_AVX2
  check_accuracy<xsimd::fma3<xsimd::avx2>, false>(90.0f);
  check_accuracy<xsimd::fma3<xsimd::avx2>, true>(88.7f);
#endif
}

TEST_CASE("simd exp: underflow to +0, overflow to +inf, NaN stays NaN", "[simd][exp]") {
  check_special_values<xsimd::default_arch>();
#if XSIMD_WITH_FMA3_AVX2
  check_special_values<xsimd::fma3<xsimd::avx2>>();
#endif
}

}  // namespace test_simd_exp
