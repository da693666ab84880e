#pragma once
// Storage types of the compressed cache and the conversions between them and the
// fp32 the compressor and the reader compute in.
//
//   f32   IEEE binary32, stored as is.
//   bf16  the upper 16 bits of a binary32 (8-bit exponent, 7 stored mantissa bits).
//   f16   IEEE binary16 (5-bit exponent with bias 15, 10 stored mantissa bits; largest finite
//         65504, smallest subnormal 2^-24).
//   fp8_e4m3_block
//         DeepSeek-V4's FP8 entries: per head, e4m3fn codes in blocks of 64 channels with a
//         power-of-two (UE8M0) scale per block, the trailing RoPE channels in bf16 — 584 bytes
//         for 512 channels with 64 RoPE channels. Its layout and quantizer are in format/fp8.hpp;
//         it is stored entry by entry (page_pool.hpp: store_entries, load_entries), never as a
//         row of equal elements, so the row functions below reject it. Its unit of layout is the
//         byte (bytes_per_element = 1: a code), but an entry is not channels × 1 bytes.
//   fp4_e2m1_hadamard
//         DeepSeek-V4's FP4 indexer keys: per head, the values transformed by a scaled Hadamard
//         matrix, then e2m1 codes two to a byte in blocks of 32 channels with a UE8M0 scale per
//         block — 68 bytes for 128 channels (format/fp4.hpp). Block storage like fp8_e4m3_block
//         (bytes_per_element = 1, entries converted whole), for indexer streams only: its values
//         are the keys in the transformed basis, which only the FP4 indexer reads.
//
// Narrowing rounds to nearest, ties to even, independent of the FPU's rounding mode and of
// FTZ/DAZ (the scalar paths are pure integer arithmetic):
//   - a NaN stays a NaN and comes out quiet: the top stored mantissa bits are kept and the quiet
//     bit is set (what x86's F16C and AVX512-BF16 instructions do);
//   - ±Inf stays ±Inf; a finite value that rounds beyond the largest finite value becomes ±Inf
//     (for f16: |x| ≥ 65520, the midpoint between 65504 and 2^16);
//   - f16 subnormals are produced exactly (rounded), values at or below 2^-25 become ±0;
//   - the sign of zero is kept.
// Widening (bf16/f16 → f32) is exact. A signalling f16 NaN comes back quiet (F16C semantics);
// a bf16 pattern is widened bit for bit.
//
// The row functions use SIMD when the compiler enables it, and only where the result is
// bit-identical to the scalar functions below (tests/test_cache_storage.cpp checks that on
// millions of patterns):
//   - f16 uses F16C / AVX-512F conversion instructions with round-to-nearest-even;
//   - bf16 uses AVX-512F integer arithmetic. AVX512-BF16's vcvtneps2bf16 is NOT used: it
//     flushes fp32 subnormal inputs to ±0, which the scalar RNE path does not.

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>

#include "phasekv/detail/enum_name.hpp"
#include "phasekv/core/error.hpp"

#include "phasekv/detail/simd/config.hpp"
#include "phasekv/detail/simd/intrinsics.hpp"

namespace phasekv {

enum class storage_type { f32, bf16, f16, fp8_e4m3_block, fp4_e2m1_hadamard };

// Whether entries are stored as a block layout per head (FP8, FP4) rather than as rows of equal
// elements: their unit of layout is the byte, and they convert entry by entry.
constexpr bool is_block_storage(storage_type type) noexcept {
  return type == storage_type::fp8_e4m3_block || type == storage_type::fp4_e2m1_hadamard;
}

// The size of one stored element: a value of f32/bf16/f16, one byte of a block storage type
// (whose heads' sizes fp8_head_layout and fp4_head_layout give).
constexpr std::int64_t bytes_per_element(storage_type type) noexcept {
  return type == storage_type::f32 ? 4 : is_block_storage(type) ? 1 : 2;
}

// Whether every channel is one element of bytes_per_element bytes (store_row and load_row apply).
constexpr bool is_row_storage(storage_type type) noexcept {
  return type == storage_type::f32 || type == storage_type::bf16 || type == storage_type::f16;
}

inline const char* to_string(storage_type type) noexcept {
  return phasekv::detail::enum_name(type, {"f32", "bf16", "f16", "fp8_e4m3_block", "fp4_e2m1_hadamard"});
}

inline std::ostream& operator<<(std::ostream& out, storage_type type) { return out << to_string(type); }

inline bool is_valid(storage_type type) noexcept {
  return is_row_storage(type) || is_block_storage(type);
}

namespace detail {

inline std::uint32_t float_bits(float value) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float float_from_bits(std::uint32_t bits) noexcept {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

constexpr std::uint32_t f32_abs_mask = 0x7FFFFFFFu;
constexpr std::uint32_t f32_infinity = 0x7F800000u;

}  // namespace detail

// ---- scalar conversions (bit patterns of the 16-bit formats as std::uint16_t) -------------------

inline std::uint16_t float_to_bf16(float value) noexcept {
  const std::uint32_t bits = detail::float_bits(value);
  if ((bits & detail::f32_abs_mask) > detail::f32_infinity) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // NaN: keep the payload top, set quiet
  }
  // Adding 0x7FFF rounds the dropped half up when it exceeds one half; the kept LSB breaks ties
  // to even. A carry out of the mantissa increments the exponent, which is correct, and turns
  // values beyond the largest bf16 into ±Inf.
  const std::uint32_t kept_lsb = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7FFFu + kept_lsb) >> 16);
}

inline float bf16_to_float(std::uint16_t bits) noexcept {
  return detail::float_from_bits(static_cast<std::uint32_t>(bits) << 16);
}

inline std::uint16_t float_to_f16(float value) noexcept {
  const std::uint32_t bits = detail::float_bits(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & detail::f32_abs_mask;

  if (magnitude > detail::f32_infinity) {  // NaN: top 10 mantissa bits, quiet bit set
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x03FFu));
  }
  constexpr std::uint32_t overflow_threshold = 0x477FF000u;  // 65520 = 65504 + half an ulp; ties go to Inf (65504 is odd)
  if (magnitude >= overflow_threshold) return static_cast<std::uint16_t>(sign | 0x7C00u);

  constexpr std::uint32_t smallest_normal_f16 = 0x38800000u;  // 2^-14
  if (magnitude >= smallest_normal_f16) {
    // Rebias the exponent (127 → 15) and round the 13 dropped mantissa bits to nearest even; a
    // carry into the exponent is the correct rounded result (it cannot reach Inf: see above).
    const std::uint32_t kept_lsb = (magnitude >> 13) & 1u;
    const std::uint32_t rebiased = magnitude - ((127u - 15u) << 23);
    return static_cast<std::uint16_t>(sign | ((rebiased + 0x0FFFu + kept_lsb) >> 13));
  }

  // Result is an f16 subnormal (or zero): value / 2^-24, rounded to an integer.
  const std::uint32_t exponent = magnitude >> 23;
  if (exponent < 102) return static_cast<std::uint16_t>(sign);  // |x| < 2^-25: rounds to ±0
  const std::uint32_t significand = (magnitude & 0x007FFFFFu) | 0x00800000u;
  const std::uint32_t shift = 126u - exponent;  // 14 … 24
  const std::uint32_t quotient = significand >> shift;
  const std::uint32_t remainder = significand & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  const bool round_up = remainder > half || (remainder == half && (quotient & 1u) != 0);
  // quotient + 1 == 0x400 is the smallest normal, which this encoding also spells correctly.
  return static_cast<std::uint16_t>(sign | (quotient + (round_up ? 1u : 0u)));
}

inline float f16_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(bits) & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  std::uint32_t mantissa = bits & 0x03FFu;

  if (exponent == 0x1F) {  // Inf, or NaN made quiet like F16C's vcvtph2ps
    const std::uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
    return detail::float_from_bits(sign | detail::f32_infinity | quiet | (mantissa << 13));
  }
  if (exponent != 0) return detail::float_from_bits(sign | ((exponent + 127u - 15u) << 23) | (mantissa << 13));
  if (mantissa == 0) return detail::float_from_bits(sign);

  // Subnormal mantissa · 2^-24: normalise so the leading one becomes the implicit bit.
  std::uint32_t f32_exponent = 127u - 14u;  // exponent of 2^-14, lowered once per shift
  while ((mantissa & 0x0400u) == 0) {
    mantissa <<= 1;
    --f32_exponent;
  }
  return detail::float_from_bits(sign | (f32_exponent << 23) | ((mantissa & 0x03FFu) << 13));
}

// ---- rows -----------------------------------------------------------------------------------

namespace detail {

// GCC 12 warns "__Y may be used uninitialized" inside its own AVX-512 intrinsics once they are
// inlined (GCC bug 105593, fixed in GCC 13); the warning is about the intrinsics' placeholder
// operand, not about this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Each helper converts a prefix of the row with SIMD and returns how many elements it did; the
// caller finishes the tail with the scalar functions.

inline std::int64_t store_bf16_simd(const float* src, std::uint16_t* dst, std::int64_t n) noexcept {
  std::int64_t i = 0;
#if PHASEKV_HAS_AVX512
  // The scalar rule, 16 lanes at a time.
  const __m512i abs_mask = _mm512_set1_epi32(static_cast<int>(f32_abs_mask));
  const __m512i infinity = _mm512_set1_epi32(static_cast<int>(f32_infinity));
  const __m512i round_bias = _mm512_set1_epi32(0x7FFF);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i quiet_bit = _mm512_set1_epi32(0x0040);
  for (const std::int64_t end = n - n % 16; i < end; i += 16) {
    const __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(src + i));
    const __m512i high = _mm512_srli_epi32(bits, 16);
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, round_bias), _mm512_and_si512(high, one)), 16);
    // Signed compare is right here: both sides are at most 0x7FFFFFFF.
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, abs_mask), infinity);
    const __m512i result = _mm512_mask_blend_epi32(is_nan, rounded, _mm512_or_si512(high, quiet_bit));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(result));
  }
#else
  (void)src;
  (void)dst;
  (void)n;
#endif
  return i;
}

inline std::int64_t load_bf16_simd(const std::uint16_t* src, float* dst, std::int64_t n) noexcept {
  std::int64_t i = 0;
#if PHASEKV_HAS_AVX512
  for (const std::int64_t end = n - n % 16; i < end; i += 16) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
  }
#else
  (void)src;
  (void)dst;
  (void)n;
#endif
  return i;
}

inline std::int64_t store_f16_simd(const float* src, std::uint16_t* dst, std::int64_t n) noexcept {
  std::int64_t i = 0;
#if PHASEKV_HAS_AVX512
  for (const std::int64_t end = n - n % 16; i < end; i += 16) {
    const __m256i halves = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), halves);
  }
#endif
#if PHASEKV_HAS_F16C
  for (const std::int64_t end = i + (n - i) / 8 * 8; i < end; i += 8) {
    const __m128i halves = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), halves);
  }
#endif
  (void)src;
  (void)dst;
  (void)n;
  return i;
}

inline std::int64_t load_f16_simd(const std::uint16_t* src, float* dst, std::int64_t n) noexcept {
  std::int64_t i = 0;
#if PHASEKV_HAS_AVX512
  for (const std::int64_t end = n - n % 16; i < end; i += 16) {
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
#endif
#if PHASEKV_HAS_F16C
  for (const std::int64_t end = i + (n - i) / 8 * 8; i < end; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
#endif
  (void)src;
  (void)dst;
  (void)n;
  return i;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// The row checks run on every call: a cheap test the optimiser can see through (so it knows the
// pointers are non-null after it), and a cold path that builds the message.
inline bool row_arguments_ok(const void* src, const void* dst, storage_type type) noexcept {
  // The 16-bit paths access elements as std::uint16_t, so pointers must be element-aligned.
  const auto element_bytes = static_cast<std::uintptr_t>(bytes_per_element(type));
  return is_row_storage(type) && src != nullptr && dst != nullptr &&
         reinterpret_cast<std::uintptr_t>(src) % element_bytes == 0 &&
         reinterpret_cast<std::uintptr_t>(dst) % element_bytes == 0;
}

[[noreturn]] inline void fail_row(const void* src, const void* dst, std::int64_t n, storage_type type) {
  if (!is_valid(type)) fail<input_error>("storage_type", static_cast<int>(type), "is not a storage_type");
  if (!is_row_storage(type))
    fail<input_error>("storage_type", to_string(type),
                      "is stored in blocks, not rows: convert whole entries (store_entries, load_entries)");
  if (src == nullptr || dst == nullptr) {
    fail<input_error>("row length", n, "needs non-null source and destination pointers");
  }
  fail<input_error>("row length", n,
                    std::string("needs source and destination aligned to the element size of ") + to_string(type));
}

}  // namespace detail

// Converts n fp32 values to `type` at dst (n · bytes_per_element(type) bytes). Both pointers must
// be aligned to their element size; source and destination must not overlap.
inline void store_row(const float* src, void* dst, std::int64_t n, storage_type type) {
  // The length test stays here, in view of the loops below, so the optimiser knows n > 0.
  if (n <= 0) {
    if (n < 0) detail::fail<input_error>("row length", n, "must be non-negative");
    return;
  }
  if (!detail::row_arguments_ok(src, dst, type)) detail::fail_row(src, dst, n, type);
  switch (type) {
    case storage_type::f32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case storage_type::bf16: {
      auto* out = static_cast<std::uint16_t*>(dst);
      for (std::int64_t i = detail::store_bf16_simd(src, out, n); i < n; ++i) out[i] = float_to_bf16(src[i]);
      return;
    }
    case storage_type::f16: {
      auto* out = static_cast<std::uint16_t*>(dst);
      for (std::int64_t i = detail::store_f16_simd(src, out, n); i < n; ++i) out[i] = float_to_f16(src[i]);
      return;
    }
    case storage_type::fp8_e4m3_block:
    case storage_type::fp4_e2m1_hadamard: return;  // rejected by row_arguments_ok
  }
}

// Converts n values of `type` at src back to fp32 (exact). Both pointers must be aligned to their
// element size; source and destination must not overlap.
inline void load_row(const void* src, float* dst, std::int64_t n, storage_type type) {
  // The length test stays here, in view of the loops below, so the optimiser knows n > 0.
  if (n <= 0) {
    if (n < 0) detail::fail<input_error>("row length", n, "must be non-negative");
    return;
  }
  if (!detail::row_arguments_ok(src, dst, type)) detail::fail_row(src, dst, n, type);
  switch (type) {
    case storage_type::f32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case storage_type::bf16: {
      const auto* in = static_cast<const std::uint16_t*>(src);
      for (std::int64_t i = detail::load_bf16_simd(in, dst, n); i < n; ++i) dst[i] = bf16_to_float(in[i]);
      return;
    }
    case storage_type::f16: {
      const auto* in = static_cast<const std::uint16_t*>(src);
      for (std::int64_t i = detail::load_f16_simd(in, dst, n); i < n; ++i) dst[i] = f16_to_float(in[i]);
      return;
    }
    case storage_type::fp8_e4m3_block:
    case storage_type::fp4_e2m1_hadamard: return;  // rejected by row_arguments_ok
  }
}

}  // namespace phasekv
