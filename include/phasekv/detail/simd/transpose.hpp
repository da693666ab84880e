#pragma once
// A scaled transpose, for the kernels that keep query heads in SIMD lanes and so take their
// queries as [channel][head] (kernels/attention.hpp, kernels/indexer.hpp):
//
//   out[c · out_stride + r] = scale · in[r · in_stride + c]      r < rows, c < cols
//
// With AVX-512, 16 × 16 blocks go through registers: 16 row loads, three rounds of shuffles
// (pairs of floats, pairs of pairs, then 128-bit quarters) and 16 column stores, where element
// by element each store's address would step 2 KB (a new line for every float of DeepSeek-V4's
// 64 × 512 attention queries). Every element is the single product scale · x either way, so
// both paths give the same bits.

#include <cstdint>
#include <type_traits>

#include "phasekv/detail/simd/batch.hpp"
#include "phasekv/detail/simd/config.hpp"

namespace phasekv::simd {

namespace detail {

#if PHASEKV_HAS_AVX512
// The unmasked shuffles, spelled as their masked forms with every lane selected: GCC 12's
// unmasked intrinsics pass _mm512_undefined_ps() as the unused source, which -Wuninitialized
// reports at every use. Same instructions.
inline __m512 unpacklo32(__m512 a, __m512 b) noexcept { return _mm512_mask_unpacklo_ps(a, 0xFFFF, a, b); }
inline __m512 unpackhi32(__m512 a, __m512 b) noexcept { return _mm512_mask_unpackhi_ps(a, 0xFFFF, a, b); }
inline __m512 unpacklo64(__m512 a, __m512 b) noexcept {
  const __m512d x = _mm512_castps_pd(a);
  return _mm512_castpd_ps(_mm512_mask_unpacklo_pd(x, 0xFF, x, _mm512_castps_pd(b)));
}
inline __m512 unpackhi64(__m512 a, __m512 b) noexcept {
  const __m512d x = _mm512_castps_pd(a);
  return _mm512_castpd_ps(_mm512_mask_unpackhi_pd(x, 0xFF, x, _mm512_castps_pd(b)));
}
// Quarters (0, 2) of a then of b, or (1, 3) of each.
inline __m512 even_quarters(__m512 a, __m512 b) noexcept { return _mm512_mask_shuffle_f32x4(a, 0xFFFF, a, b, 0x88); }
inline __m512 odd_quarters(__m512 a, __m512 b) noexcept { return _mm512_mask_shuffle_f32x4(a, 0xFFFF, a, b, 0xDD); }

// One 16 × 16 block: rows in[i · in_stride + 0 … 15] for i < 16 become out[j · out_stride + 0 … 15].
inline void transpose16x16(const float* in, std::int64_t in_stride, float scale, float* out,
                           std::int64_t out_stride) noexcept {
  const __m512 s = _mm512_set1_ps(scale);
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_mul_ps(_mm512_loadu_ps(in + i * in_stride), s);
  // Within each 128-bit quarter: pairs of rows interleaved, then pairs of those pairs. After
  // this, quarter q of r[4g + j] holds column 4q + j of rows 4g … 4g + 3.
  for (int i = 0; i < 16; i += 2) {
    t[i] = unpacklo32(r[i], r[i + 1]);
    t[i + 1] = unpackhi32(r[i], r[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {
    r[g] = unpacklo64(t[g], t[g + 2]);
    r[g + 1] = unpackhi64(t[g], t[g + 2]);
    r[g + 2] = unpacklo64(t[g + 1], t[g + 3]);
    r[g + 3] = unpackhi64(t[g + 1], t[g + 3]);
  }
  // Column 4q + j gathers quarter q of r[j], r[4 + j], r[8 + j], r[12 + j]: the even or odd
  // quarters of two registers, twice.
  for (int j = 0; j < 4; ++j) {
    const __m512 even_lo = even_quarters(r[j], r[4 + j]), even_hi = even_quarters(r[8 + j], r[12 + j]);
    const __m512 odd_lo = odd_quarters(r[j], r[4 + j]), odd_hi = odd_quarters(r[8 + j], r[12 + j]);
    _mm512_storeu_ps(out + j * out_stride, even_quarters(even_lo, even_hi));
    _mm512_storeu_ps(out + (8 + j) * out_stride, odd_quarters(even_lo, even_hi));
    _mm512_storeu_ps(out + (4 + j) * out_stride, even_quarters(odd_lo, odd_hi));
    _mm512_storeu_ps(out + (12 + j) * out_stride, odd_quarters(odd_lo, odd_hi));
  }
}
#endif

}  // namespace detail

template <class Arch = default_arch>
inline void transpose_scaled(const float* in, std::int64_t rows, std::int64_t cols, std::int64_t in_stride, float scale,
                             float* out, std::int64_t out_stride) noexcept {
  std::int64_t block_rows = 0, block_cols = 0;  // the part whole 16 × 16 blocks cover
#if PHASEKV_HAS_AVX512
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
    block_rows = rows / 16 * 16;
    block_cols = cols / 16 * 16;
    for (std::int64_t c = 0; c < block_cols; c += 16)
      for (std::int64_t r = 0; r < block_rows; r += 16)
        detail::transpose16x16(in + r * in_stride + c, in_stride, scale, out + c * out_stride + r, out_stride);
  }
#endif
  // The rest element by element: the last rows of the blocks' columns, then the last columns.
  for (std::int64_t c = 0; c < cols; ++c)
    for (std::int64_t r = c < block_cols ? block_rows : 0; r < rows; ++r)
      out[c * out_stride + r] = scale * in[r * in_stride + c];
}

}  // namespace phasekv::simd
