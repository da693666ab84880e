#pragma once
// A vectorised float exp for the softmax gates. xsimd's exp wraps a degree-7 polynomial in
// compares and blends for every special case (about 22 instructions a batch on AVX-512); vector
// gates evaluate W exps per channel, so that was the largest single cost of a gated entry. This
// one is 13 instructions on AVX-512 (vscalefps does the 2^n scaling and its overflow and
// underflow), 12 in the softmax form below, and about 20 elsewhere.
//
//   n = round(x·log2 e),  r = x − n·ln2   (Cody–Waite: ln2 in two parts, |r| ≤ ln2/2)
//   exp(x) = 2^n · p(r),  p(r) = 1 + r + c2 r² + … + c6 r⁶
//
// p is a relative-error minimax fit of e^r on [−ln2/2, ln2/2]·1.0001 with the first two
// coefficients pinned to 1 (our own fit: Remez exchange on c2…c6 at 40 digits; approximation
// error 3.1e-9, ~0.03 ulp), so what is left is the rounding of the Horner steps. Checked exhaustively over every float in [−110, 90] on the
// AVX-512, AVX2 and SSE2 (no FMA) paths against std::exp in double rounded to float: at most
// 1 ulp (99.2–99.5% correctly rounded), subnormal results included; tests/test_simd_exp.cpp
// keeps a sample of that check. Special values:
//   x < −103.98 (incl. −∞) → +0,   x > 88.73 (incl. +∞) → +∞,   NaN → NaN (x86 min/max order).
// Assumes the default round-to-nearest mode; flush-to-zero modes flush subnormal results.

#include <cstdint>
#include <type_traits>

#include "phasekv/detail/simd/batch.hpp"
#include "phasekv/detail/simd/config.hpp"

namespace phasekv::simd {

namespace exp_detail {
// Clamping keeps r finite for ±∞ (∞ − ∞ would be NaN) while still landing beyond both ends of
// the float range, so the scaling below produces the 0 or ∞ of an out-of-range argument.
inline constexpr float lowest = -110.0f;
inline constexpr float highest = 90.0f;
inline constexpr float log2e = 1.44269504088896341f;
inline constexpr float ln2_hi = 0.693145751953125f;       // 16 significant bits: n·ln2_hi is exact
inline constexpr float ln2_lo = 1.42860682030941723e-6f;  // ln2 − ln2_hi
// Adding 1.5·2^23 rounds a float of magnitude < 2^22 to an integer, which then sits in the low
// mantissa bits of the sum (round to nearest even, the FP mode's rounding).
inline constexpr float round_magic = 12582912.0f;
inline constexpr std::int32_t round_magic_bits = 0x4B400000;
inline constexpr float c2 = 0.499999934478f;
inline constexpr float c3 = 0.166665206317f;
inline constexpr float c4 = 0.0416683880453f;
inline constexpr float c5 = 0.00836871687973f;
inline constexpr float c6 = 0.00138145986467f;

// AVX-512 scales by 2^n in one instruction (vscalefps); elsewhere the exponent bits are built.
#if PHASEKV_HAS_AVX512
template <class Arch>
inline constexpr bool has_scalef = std::is_base_of_v<xsimd::avx512f, Arch>;
#else
template <class Arch>
inline constexpr bool has_scalef = false;
#endif
}  // namespace exp_detail

namespace exp_detail {
// Upper = false skips the clamp at the top, for arguments known not to exceed 88.7 (a
// max-subtracted softmax gives x ≤ 0): one instruction fewer, which the gate kernel, where the
// exp is most of the work, feels.
template <bool Upper, class Arch>
inline xsimd::batch<float, Arch> exp(const xsimd::batch<float, Arch>& x) noexcept {
  using batch = xsimd::batch<float, Arch>;
  // max(bound, x) and min(bound, x) return x when x is NaN on x86 (the second operand wins),
  // so a NaN argument survives the clamp and poisons p.
  batch xc = xsimd::max(batch(lowest), x);
  if constexpr (Upper) xc = xsimd::min(batch(highest), xc);
  const batch t = simd::fma(xc, batch(log2e), batch(round_magic));
  const batch n = t - batch(round_magic);
  // fma with negated constants: xsimd 8.1's fnma is −(x·y) + z, which GCC emits as a separate
  // negation and an fma.
  batch r = simd::fma(n, batch(-ln2_hi), xc);  // exact: see ln2_hi
  r = simd::fma(n, batch(-ln2_lo), r);
  batch p = simd::fma(batch(c6), r, batch(c5));
  p = simd::fma(p, r, batch(c4));
  p = simd::fma(p, r, batch(c3));
  p = simd::fma(p, r, batch(c2));
  p = simd::fma(p, r, batch(1.0f));
  p = simd::fma(p, r, batch(1.0f));
  if constexpr (has_scalef<Arch>) {
#if PHASEKV_HAS_AVX512
    // p·2^n with one rounding, overflowing to ∞ and underflowing through subnormals to 0.
    return batch(_mm512_scalef_ps(p, n));
#endif
  } else {
    // 2^n for n ∈ [−159, 130] as two normal powers of two: p·2^n1 is exact, ·2^n2 rounds once.
    using ibatch = xsimd::batch<std::int32_t, Arch>;
    const ibatch ni = xsimd::bitwise_cast<ibatch>(t) - ibatch(round_magic_bits);
    const ibatch n1 = ni >> 1;
    const ibatch n2 = ni - n1;
    const batch s1 = xsimd::bitwise_cast<batch>((n1 + ibatch(127)) << 23);
    const batch s2 = xsimd::bitwise_cast<batch>((n2 + ibatch(127)) << 23);
    return (p * s1) * s2;
  }
}
}  // namespace exp_detail

// e^x for every float x (see the top of the file for accuracy and special values).
template <class Arch>
inline xsimd::batch<float, Arch> exp(const xsimd::batch<float, Arch>& x) noexcept {
  return exp_detail::exp<true>(x);
}

// e^x for x ≤ 88.7 (not +∞), as exp() otherwise: the softmax form, whose max-subtracted
// arguments are ≤ 0. Larger arguments give unspecified results.
template <class Arch>
inline xsimd::batch<float, Arch> exp_bounded_above(const xsimd::batch<float, Arch>& x) noexcept {
  return exp_detail::exp<false>(x);
}

}  // namespace phasekv::simd
