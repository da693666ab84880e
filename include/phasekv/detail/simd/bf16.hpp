#pragma once
// Reading bf16 inputs (raw bit patterns in std::uint16_t, as torch's bf16 `.view(torch.int16)`
// gives them) as fp32. bf16 is the top half of an fp32, so widening is exact: the fp32 value of
// bf16 bits b is the float whose bits are b << 16. A kernel that loads bf16 rows through these
// functions therefore computes exactly what it computes on the widened fp32 rows, bit for bit,
// while reading half the bytes.
//
// (format/storage.hpp has the same conversion for the cache's stored formats; the write path
// keeps its own copy so that compress/ does not depend on cache/.)

#include <cstdint>
#include <cstring>

#include "phasekv/detail/simd/batch.hpp"

#include "phasekv/detail/simd/config.hpp"
#include "phasekv/detail/simd/intrinsics.hpp"

namespace phasekv::simd {

// The fp32 value of bf16 bits (exact).
inline float bf16_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// Whether bf16 bits encode a finite value: not when the exponent bits are all ones (±Inf, NaN).
inline bool bf16_is_finite(std::uint16_t bits) noexcept { return (bits & 0x7F80u) != 0x7F80u; }

// One element of a row as fp32, whichever type the row has.
inline float to_float(float v) noexcept { return v; }
inline float to_float(std::uint16_t bits) noexcept { return bf16_to_float(bits); }

// batch::size consecutive elements as an fp32 batch. The bf16 load widens 16 (AVX-512) or 8
// (AVX2) lanes: zero-extend each 16-bit pattern to 32 bits, then shift it into the top half.
template <class Arch>
inline xsimd::batch<float, Arch> load(const float* p) noexcept {
  return xsimd::batch<float, Arch>::load_unaligned(p);
}
template <class Arch>
inline xsimd::batch<float, Arch> load(const std::uint16_t* p) noexcept {
  using batch = xsimd::batch<float, Arch>;
#if PHASEKV_HAS_AVX512
  if constexpr (batch::size == 16) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return batch(_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
  }
#endif
#if PHASEKV_HAS_AVX2
  if constexpr (batch::size == 8) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return batch(_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
#endif
  alignas(vector_alignment) float widened[batch::size];
  for (std::size_t i = 0; i < batch::size; ++i) widened[i] = bf16_to_float(p[i]);
  return batch::load_aligned(widened);
}

// dst[i] = src[i] as fp32, i ∈ [0, n).
inline void widen(const float* src, float* dst, std::int64_t n) noexcept {
  if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
}
template <class Arch = default_arch>
inline void widen(const std::uint16_t* src, float* dst, std::int64_t n) noexcept {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::int64_t lanes = static_cast<std::int64_t>(batch::size);
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) load<Arch>(src + i).store_unaligned(dst + i);
  for (; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

}  // namespace phasekv::simd
