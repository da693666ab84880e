#pragma once
// FP4 indexer keys: DeepSeek-V4's lightning-indexer format (docs/DESIGN.md §9), and
// the scalar functions it is made of.
//
// The indexer stream's policy pools its keys and rotates them by RoPE; the write path then
// transforms each head of C channels (C a power of two from 32 to 1024) by a scaled Hadamard
// matrix and quantizes the result to FP4 in blocks of 32 channels:
//
//   y     = C^−1/2 · H_C · x      H_C: Sylvester's Hadamard matrix, H_1 = [1],
//                                 H_2n = [[H_n, H_n], [H_n, −H_n]]: H[i][j] = (−1)^popcount(i & j)
//   for each block y[32b … 32b + 32):
//   amax  = max(max_i |y_i|, 6·2^−126)
//   s     = 2^k,  k = ceil(log2(amax / 6)) ∈ [−126, 126]
//   q_i   = e2m1(clamp(y_i / s, −6, 6)), round to nearest, ties to even on the e2m1 grid
//   value = q_i · s
//
// The reader transforms and quantizes its indexer queries the same way, once per read
// (kernels/indexer_fp4.hpp). C^−1/2·H_C is symmetric and orthogonal, so (H̃q)·(H̃k) = q·k:
// the transform keeps the dot products the indexer ranks by, and spreads each vector's energy
// over all its channels (an outlier channel no longer decides a block's scale) before the 4-bit
// rounding. DeepSeek's indexer runs the same maths; its keys and queries are Hadamard-rotated
// bf16 activations, phasekv's the fp32 values the compressor and the host hand over.
//
// The transform. Computed in double precision by the fast Walsh–Hadamard transform — log2 C
// passes of butterflies (a, b) → (a + b, a − b) over the channel pairs (i, i + h), h = 1, 2, 4,
// …, C/2 — then multiplied by the double nearest C^−1/2 (2^−m for C = 4^m, sqrt(0.5)·2^−m for
// C = 2·4^m; note 1/sqrt(2.0) is one ulp below it), and each value rounded to fp32 once. Every
// step is one IEEE double operation in a fixed order, so y is deterministic on every machine. When
// the inputs' significant bits span at most 53 − log2 C binades (46 for C = 128: fp32 values
// within 22 binades of each other, say) the butterflies' sums are exact, and y is exactly
// fp32(fl64(fl64(H·x) · fl64(C^−1/2))), the value a dense product in double gives
// (tests/test_cache_fp4.cpp); otherwise it differs from that by the butterflies' double
// roundings, below 2^−48·‖x‖. An exact zero comes out +0 (as from a dense sum), whatever the
// signs of the zeros it was summed from. A value whose transform reaches fp32's overflow
// threshold becomes ±Inf.
//
// e2m1 (OCP MX FP4): sign, 2 exponent bits with bias 1, 1 mantissa bit; the magnitudes of codes
// 0 … 7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 (code 1 is the subnormal 0.5), codes 8 … 15 their
// negatives (8 is −0). Rounding to nearest sends a value halfway between two neighbours to the
// one whose mantissa bit is 0: 0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4.
// The sign is kept, also when the value rounds to 0. `2 · e2m1` is an integer in [−12, 12]: the
// reader's integer dot products work on these doubled codes.
//
// The scale. k = ceil(log2(amax / 6)) is found exactly from the fp32 bits of amax = 1.f · 2^e:
// k = e − 2 when the fraction f is at most 0.5 (amax ≤ 1.5·2^e = 6·2^(e−2)), else e − 1. That is
// also what DeepSeek's fp32 evaluation gives — amax / 6 rounded to fp32, then the ceiling of its
// log2 read off its bits — for every amax ≥ 6·2^−126: the rounded quotient is a power of two only
// when amax is exactly 6 times one. The floor 6·2^−126 keeps k ≥ −126; k ≤ 126 since amax is
// finite. y / s lies in [−6, 6] (and is exact wherever it matters: below), so the clamp only
// documents the range. The scale is stored as the UE8M0 byte b = k + 127 ∈ [1, 253] (format/fp8.hpp).
//
// Byte layout of one head (fp4_head_layout), offsets from the head's first byte:
//
//   [0, C/2)              e2m1 codes, two per byte: channel 2i in bits 0–3 of byte i, channel
//                         2i + 1 in bits 4–7 (the order of OCP MX and of PyTorch's
//                         float4_e2m1fn_x2: the first element in the low nibble)
//   [C/2, C/2 + C/32)     one UE8M0 scale byte per block, block b's at C/2 + b
//
// with no padding: 17·C/32 bytes, 68 for DeepSeek-V4's 128 channels (64 bytes of codes, four
// scales), 17 bytes per token at S = 4 instead of 128 in fp32. An entry of H heads is H such
// heads back to back. No RoPE channels are kept apart (the transform mixes them with the rest).
//
// Dequantized values (fp4_dequantize_head) are the transformed y's as stored, q · 2^k: exact in
// fp32 except that |q · 2^k| ≥ 2^128 (codes ±4, ±6 at k = 126, from |y| ≥ 1.75·2^127) comes back
// as ±Inf, and that under FTZ the smallest, 0.5·2^−126 = 2^−127 (an fp32 subnormal), flushes to
// ±0. They are values in the transformed basis, not the keys: H̃ applied to them gives the keys
// back only approximately, so nothing converts FP4 entries into another storage type.
//
// Non-finite input. A block whose y holds a NaN or ±Inf (the compressor passes them through
// unless append_options::check_finite is on; a NaN anywhere in x reaches every y, since the
// transform mixes all channels) is stored as codes 0 with the scale byte 0xFF (UE8M0's NaN): it
// dequantizes to NaN in every channel, and the reader's head dot products with it are NaN, which
// the ReLU turns into 0 — the key scores as the fp32 kernel's max(NaN, 0) scores a NaN key. The
// reader's queries are finite (checked); one whose transform overflows fp32 gets the same NaN
// blocks, and its head adds 0 to every score.
//
// Independent of the FPU's rounding mode only where stated: the quantizer is integer arithmetic
// and exact double operations; the transform's double operations round as the mode says.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "phasekv/format/fp8.hpp"  // UE8M0 scale bytes
#include "phasekv/format/storage.hpp"

#include "phasekv/detail/simd/config.hpp"
#include "phasekv/detail/simd/intrinsics.hpp"

namespace phasekv {

// ---- e2m1 ------------------------------------------------------------------------------------

inline constexpr double e2m1_max = 6.0;

// Twice the value of each code: an integer in [−12, 12] (codes 8 … 15 are the negatives of 0 … 7).
inline constexpr std::int8_t e2m1_twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Exact.
inline float e2m1_to_float(std::uint8_t code) noexcept {
  const float magnitude = 0.5f * static_cast<float>(e2m1_twice[code & 0x07u]);
  return (code & 0x08u) != 0 ? -magnitude : magnitude;
}

// The code of v rounded to nearest on the e2m1 grid, ties to the even mantissa bit; |v| > 6
// saturates to ±6. v must not be NaN. The sign of v is kept (−0 and negatives rounding to 0 give
// code 8). The quantizer applies the same thresholds to the fp32 quotients x · 2^−k.
inline std::uint8_t e2m1_code(double v) noexcept {
  const double a = std::fabs(v);
  // One count per boundary passed; a tie passes the boundary only towards the even code.
  const unsigned magnitude = static_cast<unsigned>(a > 0.25) + static_cast<unsigned>(a >= 0.75) +
                             static_cast<unsigned>(a > 1.25) + static_cast<unsigned>(a >= 1.75) +
                             static_cast<unsigned>(a > 2.5) + static_cast<unsigned>(a >= 3.5) +
                             static_cast<unsigned>(a > 5.0);
  return static_cast<std::uint8_t>((std::signbit(v) ? 0x08u : 0x00u) | magnitude);
}

// ---- the block scale -------------------------------------------------------------------------

inline constexpr std::int64_t fp4_block_channels = 32;
// The amax floor 6 · 2^−126, which keeps the scale a normal power of two.
inline constexpr float fp4_amax_floor = 0x1.8p-124f;

// The UE8M0 byte b = k + 127 of a block whose floored amax is finite (≥ fp4_amax_floor):
// k = ceil(log2(amax / 6)) from amax's bits (see the header comment). Result in [1, 253].
inline std::uint8_t fp4_scale_byte(float amax) noexcept {
  const std::uint32_t bits = detail::float_bits(amax);
  const std::uint32_t exponent = (bits >> 23) & 0xFFu;  // e + 127
  const std::uint32_t above = (bits & 0x007FFFFFu) > 0x00400000u ? 1u : 0u;  // f > 0.5
  return static_cast<std::uint8_t>(exponent - 2u + above);
}

// ---- the Hadamard transform ------------------------------------------------------------------

// The most channels an FP4 head may have: the transform's scratch lives on the stack (8 KiB), so
// quantizing never allocates (and never fails).
inline constexpr std::int64_t fp4_max_channels = 1024;

// Whether C channels can be stored as FP4: a power of two, at least one block of 32, at most 1024.
constexpr bool is_fp4_channel_count(std::int64_t channels) noexcept {
  return channels >= fp4_block_channels && channels <= fp4_max_channels && (channels & (channels - 1)) == 0;
}

// The double nearest n^−1/2 for a power of two n.
inline double hadamard_scale(std::int64_t n) noexcept {
  int m = 0;
  while ((std::int64_t{1} << (m + 1)) <= n) ++m;  // n = 2^m
  return std::ldexp(m % 2 == 0 ? 1.0 : std::sqrt(0.5), -(m / 2));
}

namespace detail {

// In place: w[0 … n) ← fl64(H_n · w) · fl64(n^−1/2), the butterflies in the order stated above
// (each pass's butterflies are independent, so running passes 1, 2, 4 run by run of 8 channels
// changes no result); with AVX-512, 8 butterflies at a time.
inline void hadamard_in_place(double* w, std::int64_t n) noexcept {
  std::int64_t h = 1;
#if PHASEKV_HAS_AVX512
  if (n >= 8) {
    // The same butterflies 8 lanes at a time (a + b is b + a bit for bit): passes 1, 2, 4 within
    // a register (the partner lane by a permutation, sums kept in the lower and differences in
    // the upper lane of each pair), then whole registers.
    for (std::int64_t i = 0; i < n; i += 8) {
      __m512d v = _mm512_loadu_pd(w + i), s = _mm512_permute_pd(v, 0x55);  // partners at distance 1
      v = _mm512_mask_blend_pd(0xAA, _mm512_add_pd(v, s), _mm512_sub_pd(s, v));
      s = _mm512_permutex_pd(v, 0x4E);                                      // distance 2
      v = _mm512_mask_blend_pd(0xCC, _mm512_add_pd(v, s), _mm512_sub_pd(s, v));
      s = _mm512_shuffle_f64x2(v, v, 0x4E);                                 // distance 4
      v = _mm512_mask_blend_pd(0xF0, _mm512_add_pd(v, s), _mm512_sub_pd(s, v));
      _mm512_storeu_pd(w + i, v);
    }
    for (h = 8; h < n; h *= 2)
      for (std::int64_t i = 0; i < n; i += 2 * h)
        for (std::int64_t j = i; j < i + h; j += 8) {
          const __m512d a = _mm512_loadu_pd(w + j), b = _mm512_loadu_pd(w + j + h);
          _mm512_storeu_pd(w + j, _mm512_add_pd(a, b));
          _mm512_storeu_pd(w + j + h, _mm512_sub_pd(a, b));
        }
  }
#endif
  for (; h < n; h *= 2)
    for (std::int64_t i = 0; i < n; i += 2 * h)
      for (std::int64_t j = i; j < i + h; ++j) {
        const double a = w[j], b = w[j + h];
        w[j] = a + b;
        w[j + h] = a - b;
      }
  // + 0.0 turns an exact zero into +0 whatever the signs of the zeros it came from (−0 − +0 is −0,
  // where the exact sum has no sign); it changes no other value.
  const double scale = hadamard_scale(n);
  for (std::int64_t i = 0; i < n; ++i) w[i] = w[i] * scale + 0.0;
}

}  // namespace detail

// out[i] = fp32(the transform of in[0 … n)), n a power of two in [1, 1024]. in and out may be the
// same array.
inline void hadamard_transform(const float* in, std::int64_t n, float* out) noexcept {
  std::array<double, fp4_max_channels> scratch;
  double* w = scratch.data();
  for (std::int64_t i = 0; i < n; ++i) w[i] = static_cast<double>(in[i]);
  detail::hadamard_in_place(w, n);
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(w[i]);
}

// ---- the block layout of one head ------------------------------------------------------------

struct fp4_head_layout {
  static constexpr std::int64_t block_channels = fp4_block_channels;

  std::int64_t channels = 0;
  std::int64_t blocks = 0;        // channels / 32
  std::int64_t scale_offset = 0;  // channels / 2: the code bytes come first
  std::int64_t bytes = 0;         // scale_offset + blocks

  // Expects is_fp4_channel_count(channels) (page_pool_config::validate checks it).
  static constexpr fp4_head_layout of(std::int64_t channels) noexcept {
    fp4_head_layout l;
    l.channels = channels;
    l.blocks = channels / block_channels;
    l.scale_offset = channels / 2;
    l.bytes = l.scale_offset + l.blocks;
    return l;
  }
};
static_assert(fp4_head_layout::of(128).bytes == 68, "DeepSeek-V4's indexer key is 64 bytes of codes and 4 scales");

// The code of channel c of a head.
inline std::uint8_t fp4_code(const std::byte* head, std::int64_t c) noexcept {
  const auto byte = static_cast<std::uint8_t>(head[c / 2]);
  return static_cast<std::uint8_t>(c % 2 == 0 ? byte & 0x0Fu : byte >> 4);
}

namespace detail {

// One block: 32 transformed values x into 16 code bytes and the scale byte. Written as loops
// over the block that compilers vectorize (integer max for amax; e2m1_code's thresholds on
// fp32 quotients).
inline void fp4_quantize_block(const float* x, std::byte* codes, std::byte& scale) noexcept {
  // The largest magnitude's bits: for non-NaN values the integer order of |x|'s bits is the order
  // of |x|, and any NaN or ±Inf puts the maximum at or above the infinity pattern.
  std::uint32_t top = 0;
  for (std::int64_t i = 0; i < fp4_block_channels; ++i) top = std::max(top, float_bits(x[i]) & f32_abs_mask);
  if (top >= f32_infinity) {
    std::memset(codes, 0, static_cast<std::size_t>(fp4_block_channels / 2));
    scale = std::byte{ue8m0_nan};
    return;
  }
  const std::uint8_t scale_byte = fp4_scale_byte(std::max(float_from_bits(top), fp4_amax_floor));
  scale = std::byte{scale_byte};
  // 2^−k, a normal fp32 for k ∈ [−126, 126]. x · 2^−k is exact whenever it is a normal number; a
  // smaller product (|x / s| < 2^−126, far below the first boundary 0.25) rounds to ±0 or to a
  // subnormal of the same sign, and encodes as ±0 either way. |x / s| ≤ 6 since amax ≤ 6 · s,
  // so the clamp is the thresholds' saturation.
  const float inverse = float_from_bits(static_cast<std::uint32_t>(254 - scale_byte) << 23);
  std::uint8_t c[fp4_block_channels];
  for (std::int64_t i = 0; i < fp4_block_channels; ++i) {
    const float v = x[i] * inverse, a = std::fabs(v);
    const unsigned magnitude = static_cast<unsigned>(a > 0.25f) + static_cast<unsigned>(a >= 0.75f) +
                               static_cast<unsigned>(a > 1.25f) + static_cast<unsigned>(a >= 1.75f) +
                               static_cast<unsigned>(a > 2.5f) + static_cast<unsigned>(a >= 3.5f) +
                               static_cast<unsigned>(a > 5.0f);
    c[i] = static_cast<std::uint8_t>(((float_bits(v) >> 28) & 0x08u) | magnitude);
  }
  // Two codes a byte, the even channel's in the low nibble: read as a little-endian pair p = c[2i]
  // + 256 · c[2i + 1] (codes < 16), the byte is the low 8 bits of p | p >> 4 — a form compilers
  // vectorize (byte by byte, they emit scalar inserts and extracts).
  for (std::int64_t i = 0; i < fp4_block_channels / 2; ++i) {
    const auto pair = static_cast<std::uint16_t>(c[2 * i] | (c[2 * i + 1] << 8));
    codes[i] = std::byte{static_cast<std::uint8_t>(pair | pair >> 4)};
  }
}

}  // namespace detail

// Quantizes the already transformed values y[0 … channels) into the l.bytes bytes at `head`
// (every byte written). No alignment needed.
inline void fp4_quantize_transformed(const float* y, const fp4_head_layout& l, std::byte* head) noexcept {
  for (std::int64_t b = 0; b < l.blocks; ++b)
    detail::fp4_quantize_block(y + b * fp4_block_channels, head + b * (fp4_block_channels / 2), head[l.scale_offset + b]);
}

// Transforms one head's channels values[0 … channels) and quantizes them into the l.bytes bytes
// at `head` (every byte written). No alignment needed.
inline void fp4_quantize_head(const float* values, const fp4_head_layout& l, std::byte* head) noexcept {
  std::array<double, fp4_max_channels> scratch;
  double* w = scratch.data();
  for (std::int64_t i = 0; i < l.channels; ++i) w[i] = static_cast<double>(values[i]);
  detail::hadamard_in_place(w, l.channels);
  float y[fp4_block_channels];  // rounded to fp32 a block at a time, where the quantizer reads them
  for (std::int64_t b = 0; b < l.blocks; ++b) {
    for (std::int64_t i = 0; i < fp4_block_channels; ++i) y[i] = static_cast<float>(w[b * fp4_block_channels + i]);
    detail::fp4_quantize_block(y, head + b * (fp4_block_channels / 2), head[l.scale_offset + b]);
  }
}

namespace detail {

// The codes of one block, as fp4_quantize_block finds them, as doubled e2m1 values (the integers
// the reader multiplies: e2m1_twice of each code) and the scale byte; false, with nothing
// written, for a block holding a NaN or ±Inf (the caller takes fp4_quantize_block's path).
// AVX-512 builds only: the same operations as the scalar quantizer — the same amax bits, the
// same scale byte and 2^−k, fp32 products x · 2^−k, the same seven thresholds — 16 lanes at a
// time, so every code is the scalar one (tests/test_cache_fp4.cpp compares them).
#if PHASEKV_HAS_AVX512
inline bool fp4_quantize_block_twice(const float* x, std::int8_t* twice, std::uint8_t& scale_byte) noexcept {
  const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
  const __m512i abs_mask = _mm512_set1_epi32(static_cast<int>(f32_abs_mask));
  const std::uint32_t top = _mm512_reduce_max_epu32(_mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(x0), abs_mask),
                                                                     _mm512_and_si512(_mm512_castps_si512(x1), abs_mask)));
  if (top >= f32_infinity) return false;
  scale_byte = fp4_scale_byte(std::max(float_from_bits(top), fp4_amax_floor));
  const __m512 inverse = _mm512_set1_ps(float_from_bits(static_cast<std::uint32_t>(254 - scale_byte) << 23));
  // e2m1_twice of the magnitudes 0 … 7, indexed by the count of thresholds passed.
  const __m512i magnitude_twice = _mm512_setr_epi32(0, 1, 2, 3, 4, 6, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
  const auto codes16 = [&](__m512 xs) {
    const __m512 v = _mm512_mul_ps(xs, inverse), a = _mm512_abs_ps(v);
    __m512i m = zero;
    m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.25f), _CMP_GT_OQ), m, one);
    m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.75f), _CMP_GE_OQ), m, one);
    m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.25f), _CMP_GT_OQ), m, one);
    m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.75f), _CMP_GE_OQ), m, one);
    m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(2.5f), _CMP_GT_OQ), m, one);
    m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.5f), _CMP_GE_OQ), m, one);
    m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(5.0f), _CMP_GT_OQ), m, one);
    const __m512i magnitude = _mm512_permutexvar_epi32(m, magnitude_twice);
    // The sign bit of v (a negative value, −0 included) negates: e2m1_twice[8 | m] = −e2m1_twice[m].
    const __mmask16 negative = _mm512_cmplt_epi32_mask(_mm512_castps_si512(v), zero);
    return _mm512_mask_sub_epi32(magnitude, negative, zero, magnitude);
  };
  _mm_storeu_si128(reinterpret_cast<__m128i*>(twice), _mm512_cvtepi32_epi8(codes16(x0)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(twice + 16), _mm512_cvtepi32_epi8(codes16(x1)));
  return true;
}
#endif

}  // namespace detail

// What fp4_quantize_transformed stores for y[0 … channels), unpacked: twice[c] = e2m1_twice of
// channel c's code and scale_bytes[b] = block b's scale byte. The reader's queries take this
// form (they are multiplied as integers, never stored).
inline void fp4_quantize_transformed_twice(const float* y, const fp4_head_layout& l, std::int8_t* twice,
                                           std::uint8_t* scale_bytes) noexcept {
  for (std::int64_t b = 0; b < l.blocks; ++b) {
    const float* x = y + b * fp4_block_channels;
    std::int8_t* out = twice + b * fp4_block_channels;
#if PHASEKV_HAS_AVX512
    if (detail::fp4_quantize_block_twice(x, out, scale_bytes[b])) continue;
#endif
    std::byte codes[fp4_block_channels / 2], scale;
    detail::fp4_quantize_block(x, codes, scale);
    scale_bytes[b] = static_cast<std::uint8_t>(scale);
    for (std::int64_t i = 0; i < fp4_block_channels; ++i) out[i] = e2m1_twice[fp4_code(codes, i)];
  }
}

// The same for a head not yet transformed: what fp4_quantize_head stores, unpacked.
inline void fp4_quantize_head_twice(const float* values, const fp4_head_layout& l, std::int8_t* twice,
                                    std::uint8_t* scale_bytes) noexcept {
  std::array<double, fp4_max_channels> scratch;
  double* w = scratch.data();
  for (std::int64_t i = 0; i < l.channels; ++i) w[i] = static_cast<double>(values[i]);
  detail::hadamard_in_place(w, l.channels);
  std::array<float, fp4_max_channels> y;
  for (std::int64_t i = 0; i < l.channels; ++i) y[static_cast<std::size_t>(i)] = static_cast<float>(w[i]);
  fp4_quantize_transformed_twice(y.data(), l, twice, scale_bytes);
}

// The stored (transformed) values of a head: out[c] = e2m1(code c) · 2^(b − 127), NaN for a block
// whose scale byte is 0xFF.
inline void fp4_dequantize_head(const std::byte* head, const fp4_head_layout& l, float* out) noexcept {
  for (std::int64_t b = 0; b < l.blocks; ++b) {
    const float scale = ue8m0_to_float(static_cast<std::uint8_t>(head[l.scale_offset + b]));
    for (std::int64_t i = 0; i < fp4_block_channels; ++i) {
      const std::int64_t c = b * fp4_block_channels + i;
      out[c] = e2m1_to_float(fp4_code(head, c)) * scale;
    }
  }
}

}  // namespace phasekv
