#pragma once
// FP8 entries: DeepSeek-V4's block format, and the scalar functions it is made of.
//
// One KV head of C channels whose last R are RoPE channels (R = the stream's rope channels when
// its policy applies RoPE, else 0) is stored as N = C − R e4m3fn codes in blocks of 64 channels
// with one power-of-two scale per block, followed by the R RoPE channels in bf16. For a block
// x[0 … n) of the N quantized channels (n = 64, or N mod 64 for a final partial block):
//
//   amax  = max(max_i |x_i|, 1e-4)                           (fp32; the floor is fp32(1e-4))
//   r     = amax · (1/448)                                    (fp32 product, fp32 constant)
//   s     = 2^k,  k = ceil(log2 r) = (exponent of r) − 127 + (1 if r's mantissa bits ≠ 0)
//   q_i   = e4m3fn(clamp(x_i / s, −448, 448)), round to nearest, ties to even
//   value = q_i · s                                           (what a read sees, exact in fp32)
//
// and the scale is stored as the UE8M0 byte b = k + 127 (scale = 2^(b − 127)). The RoPE channels
// are rounded to bf16 to nearest even (storage.hpp's float_to_bf16). Rotated pairs keep 8 bits of
// precision where quantizing them to 4 would move the position signal; the other channels share
// a scale per 64 because, after RMSNorm, a block's values are of one magnitude.
//
// Byte layout of one head (fp8_head_layout), offsets from the head's first byte:
//
//   [0, N)                         e4m3fn codes, channel c at byte c
//   [N', N' + 2R)                  the R bf16 RoPE values, little-endian; N' = N rounded up to
//                                  even (one zero byte after the codes when N is odd)
//   [N' + 2R, N' + 2R + B)         B = ceil(N / 64) UE8M0 scale bytes, block i's at offset i
//   [N' + 2R + B, bytes)           zero padding: a head is a whole number of 8-byte words
//
// For DeepSeek-V4 (C = 512, R = 64): codes [0, 448), bf16 [448, 576), seven scales [576, 583),
// byte 583 zero — 584 bytes, FlashMLA's FP8 sparse-decode layout. A final partial block (N not a
// multiple of 64) takes its amax over its own n channels only. An entry of H heads is H such
// heads back to back (head stride = bytes), so multi-head entries stay 8-byte aligned.
//
// e4m3fn (OCP FP8 E4M3, "fn": finite, no infinities): sign, 4 exponent bits with bias 7, 3
// mantissa bits; normal (1 + m/8)·2^(e−7) for e ≥ 1, subnormal m·2^−9, largest finite 448
// (0x7E), NaN S.1111.111 (0x7F, 0xFF). float_to_e4m3 rounds to nearest even in integer
// arithmetic, keeps the sign of zero (also when a tiny value rounds to 0), saturates finite
// values beyond 448 and ±Inf to ±448, and maps NaN to 0x7F with its sign. Decoding is exact; every
// e4m3 value times every scale the quantizer makes (2^−22 … 2^120) is exact in fp32 unless it
// exceeds fp32's range: only values with |x| ≥ 1.9375 · 2^127 (= 248 · 2^120, which rounds to the
// code 256 at the scale 2^120) come back as ±Inf.
//
// Non-finite input (a NaN or ±Inf anywhere in a block; the compressor passes them through unless
// append_options::check_finite is on) makes the whole block NaN: every code 0x7F and the scale
// byte 0xFF (UE8M0's NaN), so the block reads as NaN in every channel, as it would in fp32 storage
// after a softmax touched it. (NaN has no magnitude to scale by; ±Inf would need 2^128.)
//
// Everything here is independent of the FPU's rounding mode and of FTZ/DAZ: the conversions are
// integer arithmetic (or conversions with an explicit rounding), x / s — computed as x · 2^−k, the
// same value — is exact or too small to matter (|x / s| < 2^−126 encodes as ±0 either way), and
// q · s is a product of exact values whose results are normal.
//
// fp8_decode_channels is what the reader runs inside the attention kernel: on AVX-512 it widens 16
// codes at a time to fp32 (by way of fp16 where AVX-512 BW/VL are, with integer arithmetic
// otherwise and for NaN codes) and multiplies by the block's scale, giving the same bits as the
// scalar functions, under DAZ/FTZ too (tests/test_cache_fp8.cpp checks every code at every scale).
// The write path's fp8_quantize_head and fp8_round_head run the same rules 16 channels at a time
// (the block's amax as an integer maximum of magnitude bits, the codes by e4m3_encode16); the
// tests hold them to the scalar functions for every code at every scale.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "phasekv/format/storage.hpp"

#include "phasekv/detail/simd/config.hpp"
#include "phasekv/detail/simd/intrinsics.hpp"

namespace phasekv {

// ---- e4m3fn ----------------------------------------------------------------------------------

inline constexpr float e4m3_max = 448.0f;

// Round to nearest even, saturating; NaN → 0x7F with the sign bit of the input.
inline std::uint8_t float_to_e4m3(float value) noexcept {
  const std::uint32_t bits = detail::float_bits(value);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t magnitude = bits & detail::f32_abs_mask;
  if (magnitude > detail::f32_infinity) return static_cast<std::uint8_t>(sign | 0x7Fu);
  // 448 and beyond (±Inf included) saturate. Values just below round to 448 at most, never up
  // into the NaN pattern: the next e4m3 step above 448 would be 480.
  constexpr std::uint32_t e4m3_max_bits = 0x43E00000u;  // 448 = 1.75 · 2^8
  if (magnitude >= e4m3_max_bits) return static_cast<std::uint8_t>(sign | 0x7Eu);
  constexpr std::uint32_t smallest_normal = 0x3C800000u;  // 2^-6
  if (magnitude >= smallest_normal) {
    // Rebias the exponent (127 → 7) and round the 20 dropped mantissa bits to nearest even; a
    // carry into the exponent is the correctly rounded result.
    const std::uint32_t kept_lsb = (magnitude >> 20) & 1u;
    const std::uint32_t rebiased = magnitude - ((127u - 7u) << 23);
    return static_cast<std::uint8_t>(sign | ((rebiased + 0x7FFFFu + kept_lsb) >> 20));
  }
  // Subnormal result (or zero): value / 2^-9 rounded to an integer in [0, 8]; 8 spells the
  // smallest normal, 2^-6, correctly. |x| ≤ 2^-10 (exponent field below 117, or the tie at
  // 2^-10 itself) rounds to ±0.
  const std::uint32_t exponent = magnitude >> 23;
  if (exponent < 117) return sign;
  const std::uint32_t significand = (magnitude & 0x007FFFFFu) | 0x00800000u;
  const std::uint32_t shift = 141u - exponent;  // 21 … 24
  const std::uint32_t quotient = significand >> shift;
  const std::uint32_t remainder = significand & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  const bool round_up = remainder > half || (remainder == half && (quotient & 1u) != 0);
  return static_cast<std::uint8_t>(sign | (quotient + (round_up ? 1u : 0u)));
}

// Exact. NaN codes give a quiet NaN with the code's sign.
inline float e4m3_to_float(std::uint8_t code) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(code) & 0x80u) << 24;
  const std::uint32_t magnitude = code & 0x7Fu;
  if (magnitude == 0x7Fu) return detail::float_from_bits(sign | 0x7FC00000u);
  // Normal: the 7 bits e.mmm shifted into fp32's exponent and mantissa, the bias moved 7 → 127.
  if (magnitude >= 0x08u) return detail::float_from_bits(sign | ((magnitude << 20) + ((127u - 7u) << 23)));
  // Subnormal m · 2^-9 (a normal fp32, computed exactly).
  return detail::float_from_bits(sign | detail::float_bits(static_cast<float>(magnitude) * 0x1p-9f));
}

// ---- UE8M0 scales ----------------------------------------------------------------------------

inline constexpr std::uint8_t ue8m0_nan = 0xFF;

// 2^(b − 127); 0xFF is NaN; b = 0 is 2^-127, an fp32 subnormal.
inline float ue8m0_to_float(std::uint8_t b) noexcept {
  if (b == ue8m0_nan) return detail::float_from_bits(0x7FC00000u);
  if (b == 0) return detail::float_from_bits(0x00400000u);
  return detail::float_from_bits(static_cast<std::uint32_t>(b) << 23);
}

// The amax floor, as DeepSeek's code applies it to an fp32 tensor.
inline constexpr float fp8_amax_floor = 1e-4f;

// The scale byte b = k + 127 of a block whose (floored) amax is finite and ≥ fp8_amax_floor:
// k = ceil(log2(amax · (1/448))), read off the fp32 bits of the product. Result in [105, 247].
inline std::uint8_t fp8_scale_byte(float amax) noexcept {
  const std::uint32_t bits = detail::float_bits(amax * (1.0f / e4m3_max));
  const std::uint32_t exponent = (bits >> 23) & 0xFFu;
  const std::uint32_t rounds_up = (bits & 0x007FFFFFu) != 0 ? 1u : 0u;
  return static_cast<std::uint8_t>(exponent + rounds_up);
}

// ---- the block layout of one head ------------------------------------------------------------

struct fp8_head_layout {
  static constexpr std::int64_t block_channels = 64;  // channels per scale
  static constexpr std::int64_t alignment = 8;        // bytes; a head is a whole number of these

  std::int64_t channels = 0;
  std::int64_t rope_channels = 0;  // the last ones, stored in bf16
  std::int64_t quantized = 0;      // channels − rope_channels: e4m3 codes at bytes [0, quantized)
  std::int64_t blocks = 0;         // ceil(quantized / 64)
  std::int64_t rope_offset = 0;    // first byte of the bf16 values: quantized rounded up to even
  std::int64_t scale_offset = 0;   // first scale byte: rope_offset + 2 · rope_channels
  std::int64_t bytes = 0;          // scale_offset + blocks, rounded up to a multiple of 8

  // Expects 0 ≤ rope_channels ≤ channels (page_pool_config::validate checks it).
  static constexpr fp8_head_layout of(std::int64_t channels, std::int64_t rope_channels) noexcept {
    fp8_head_layout l;
    l.channels = channels;
    l.rope_channels = rope_channels;
    l.quantized = channels - rope_channels;
    l.blocks = (l.quantized + block_channels - 1) / block_channels;
    l.rope_offset = (l.quantized + 1) / 2 * 2;
    l.scale_offset = l.rope_offset + 2 * rope_channels;
    l.bytes = (l.scale_offset + l.blocks + alignment - 1) / alignment * alignment;
    return l;
  }
};
static_assert(fp8_head_layout::of(512, 64).bytes == 584 && fp8_head_layout::of(512, 64).scale_offset == 576,
              "DeepSeek-V4's entry is FlashMLA's 584 bytes");

namespace detail {

inline std::uint16_t load_u16(const std::byte* at) noexcept {
  std::uint16_t v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

inline float fp8_channel(const std::byte* head, const fp8_head_layout& l, std::int64_t c) noexcept {
  if (c >= l.quantized) return bf16_to_float(load_u16(head + l.rope_offset + 2 * (c - l.quantized)));
  const auto code = static_cast<std::uint8_t>(head[c]);
  const auto scale = static_cast<std::uint8_t>(head[l.scale_offset + c / fp8_head_layout::block_channels]);
  return e4m3_to_float(code) * ue8m0_to_float(scale);
}

#if PHASEKV_HAS_AVX512
// e4m3_to_float of the code in each 32-bit lane (its low byte), the same bits.
inline __m512 e4m3_decode16(__m512i code) noexcept {
  const __m512i magnitude = _mm512_and_si512(code, _mm512_set1_epi32(0x7F));
  const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(magnitude, 20), _mm512_set1_epi32((127 - 7) << 23));
  const __m512 subnormal = _mm512_mul_ps(_mm512_cvtepi32_ps(magnitude), _mm512_set1_ps(0x1p-9f));
  const __mmask16 is_subnormal = _mm512_cmplt_epu32_mask(magnitude, _mm512_set1_epi32(0x08));
  const __mmask16 is_nan = _mm512_cmpeq_epu32_mask(magnitude, _mm512_set1_epi32(0x7F));
  __m512i value = _mm512_mask_blend_epi32(is_subnormal, normal, _mm512_castps_si512(subnormal));
  value = _mm512_mask_blend_epi32(is_nan, value, _mm512_set1_epi32(0x7FC00000));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(code, _mm512_set1_epi32(0x80)), 24);
  return _mm512_castsi512_ps(_mm512_or_si512(value, sign));
}

#if PHASEKV_HAS_AVX512_BW_VL
// The two parts of fp8_decode16's fp16 path (below): whether scale byte b may take it (b ∈
// [1, 246]), and 16 codes (the bytes of `raw`) widened and multiplied by 2^(b − 119).
inline bool fp16_path_takes(std::uint8_t scale_byte) noexcept { return scale_byte - 1u <= 245u; }
inline __m512 fp16_widen16(__m128i raw, std::uint8_t scale_byte) noexcept {
  const __m256i half = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), 7),
                                        _mm256_set1_epi16(static_cast<short>(0xBFFF)));
  return _mm512_mul_ps(_mm512_cvtph_ps(half), _mm512_set1_ps(float_from_bits(static_cast<std::uint32_t>(scale_byte + 8) << 23)));
}
#endif

// 16 codes to fp32 times the scale of byte b: e4m3_to_float(code) · ue8m0_to_float(b) lane by
// lane, the same bits.
//
// With AVX-512 BW/VL, by way of fp16: a code s eeee mmm spelled s 0 eeee mmm 0000000 is the fp16
// value code · 2^−8 exactly — fp16's exponent bias 15 is e4m3's 7 plus 8, and fp16's subnormals
// (exponent field 0) are e4m3's scaled the same — which vcvtph2ps widens exactly (whatever
// MXCSR.DAZ says: it does not apply to this conversion); one product by 2^(b − 119) = 2^8 · scale
// then rounds code · scale once, as the scalar product does. Sign-extending the byte to 16 bits
// and shifting left by 7 puts s in bit 15 (and bit 14, cleared). Five instructions for the
// integer arithmetic's twelve. Codes of magnitude 0x7F (NaN; fp16 would read 1.875), the scale
// byte 0 (2^−127 is an fp32 subnormal, which DAZ reads as 0 in the scalar product) and those past
// 246 (2^(b − 119) overflows; 0xFF is NaN) take the integer path.
inline __m512 fp8_decode16(const std::byte* codes, std::uint8_t scale_byte) noexcept {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
#if PHASEKV_HAS_AVX512_BW_VL
  const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_or_si128(raw, _mm_set1_epi8(static_cast<char>(0x80))),
                                            _mm_set1_epi8(static_cast<char>(0xFF)));
  if (fp16_path_takes(scale_byte) && nan == 0) return fp16_widen16(raw, scale_byte);
#endif
  return _mm512_mul_ps(e4m3_decode16(_mm512_cvtepu8_epi32(raw)), _mm512_set1_ps(ue8m0_to_float(scale_byte)));
}

// A whole block of 64 codes at scale byte b into out[0 … 64) by the fp16 path of fp8_decode16,
// one test of the 64 codes for NaN and one scale check for all: false (nothing written) where that
// path does not apply. Sixteen codes at a time would repeat the scale lookup and the tests four
// times per block inside the kernels' logit pass.
inline bool fp8_decode_block(const std::byte* codes, std::uint8_t scale_byte, float* out) noexcept {
#if PHASEKV_HAS_AVX512_BW_VL
  const __m512i raw = _mm512_loadu_si512(codes);
  const __mmask64 nan = _mm512_cmpeq_epi8_mask(_mm512_or_si512(raw, _mm512_set1_epi8(static_cast<char>(0x80))),
                                               _mm512_set1_epi8(static_cast<char>(0xFF)));
  if (!fp16_path_takes(scale_byte) || nan != 0) return false;
  _mm512_storeu_ps(out, fp16_widen16(_mm512_castsi512_si128(raw), scale_byte));
  _mm512_storeu_ps(out + 16, fp16_widen16(_mm512_extracti32x4_epi32(raw, 1), scale_byte));
  _mm512_storeu_ps(out + 32, fp16_widen16(_mm512_extracti32x4_epi32(raw, 2), scale_byte));
  _mm512_storeu_ps(out + 48, fp16_widen16(_mm512_extracti32x4_epi32(raw, 3), scale_byte));
  return true;
#else
  (void)codes, (void)scale_byte, (void)out;
  return false;
#endif
}

// float_to_e4m3 of 16 values already in [−448, 448] (so neither NaN nor saturation arises), one
// code per 32-bit lane, by the scalar function's rules: a normal code rebiases the exponent and
// rounds the 20 dropped mantissa bits to nearest even in integer arithmetic; a subnormal one
// (|y| < 2^−6) is |y| · 2^9 — exact — converted to an integer with an explicit round to nearest
// even (0 … 8, whatever MXCSR says); the sign bit is kept, −0 included.
inline __m512i e4m3_encode16(__m512 y) noexcept {
  const __m512i bits = _mm512_castps_si512(y);
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
  const __m512i kept_lsb = _mm512_and_si512(_mm512_srli_epi32(magnitude, 20), _mm512_set1_epi32(1));
  const __m512i rebiased = _mm512_sub_epi32(magnitude, _mm512_set1_epi32((127 - 7) << 23));
  const __m512i normal =
      _mm512_srli_epi32(_mm512_add_epi32(rebiased, _mm512_add_epi32(kept_lsb, _mm512_set1_epi32(0x7FFFF))), 20);
  const __m512 scaled = _mm512_mul_ps(_mm512_castsi512_ps(magnitude), _mm512_set1_ps(0x1p9f));
  const __m512i subnormal = _mm512_cvt_roundps_epi32(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 is_normal = _mm512_cmpge_epi32_mask(magnitude, _mm512_set1_epi32(0x3C800000));  // 2^−6
  return _mm512_or_si512(sign, _mm512_mask_blend_epi32(is_normal, subnormal, normal));
}

// Lanes [0, n) of a run of at most 16 (n ≥ 16: all of them).
inline __mmask16 lanes_below(std::int64_t n) noexcept {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// 16 bf16 values to fp32 (exact).
inline __m512 bf16_decode16(const std::byte* values) noexcept {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(values)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#endif

}  // namespace detail

// Channels [first, first + count) of one head at `head`, dequantized into out[0 … count): code ·
// scale for quantized channels, the bf16 value widened for RoPE channels. No alignment needed.
inline void fp8_decode_channels(const std::byte* head, const fp8_head_layout& l, std::int64_t first,
                                std::int64_t count, float* out) noexcept {
  std::int64_t i = 0;  // out[i] is channel first + i
#if PHASEKV_HAS_AVX512
  constexpr std::uint64_t block = fp8_head_layout::block_channels;
  // Whole blocks of codes from a block's start (the attention kernel's calls) …
  while (first % static_cast<std::int64_t>(block) == 0 && i + 64 <= count && first + i + 64 <= l.quantized &&
         detail::fp8_decode_block(head + first + i, static_cast<std::uint8_t>(head[l.scale_offset + (first + i) / 64]), out + i))
    i += 64;
  // … then runs of 16 that lie inside one block of codes, or inside the bf16 channels.
  for (; i + 16 <= count; i += 16) {
    const std::int64_t c = first + i;
    const auto channel = static_cast<std::uint64_t>(c);  // ≥ 0: unsigned division is a shift
    if (c + 16 <= l.quantized && channel % block <= block - 16) {
      const auto scale_byte = static_cast<std::uint8_t>(head[l.scale_offset + static_cast<std::int64_t>(channel / block)]);
      _mm512_storeu_ps(out + i, detail::fp8_decode16(head + c, scale_byte));
    } else if (c >= l.quantized) {
      _mm512_storeu_ps(out + i, detail::bf16_decode16(head + l.rope_offset + 2 * (c - l.quantized)));
    } else {
      for (std::int64_t k = 0; k < 16; ++k) out[i + k] = detail::fp8_channel(head, l, c + k);
    }
  }
#endif
  // (A plain `for (; i < count; ++i)` here made GCC 12 warn of a 2^62-th iteration after the
  // SIMD loop had consumed a constant count; the remainder as a count of its own does not.)
  for (std::int64_t rest = count - i; rest > 0; --rest, ++i) out[i] = detail::fp8_channel(head, l, first + i);
}

// The whole head: out[0 … channels).
inline void fp8_dequantize_head(const std::byte* head, const fp8_head_layout& l, float* out) noexcept {
  fp8_decode_channels(head, l, 0, l.channels, out);
}

namespace detail {

// The UE8M0 scale byte of the block values[first, last): ue8m0_nan when a value is NaN or ±Inf.
inline std::uint8_t fp8_block_scale_byte(const float* values, std::int64_t first, std::int64_t last) noexcept {
#if PHASEKV_HAS_AVX512
  // The largest magnitude's bits: for finite non-negative floats the integer order is the value
  // order, and a NaN or Inf has bits above the largest finite float's.
  __m512i largest = _mm512_setzero_si512();
  for (std::int64_t c = first; c < last; c += 16) {
    const __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(lanes_below(last - c), values + c));
    largest = _mm512_max_epu32(largest, _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)));
  }
  const auto amax_bits = static_cast<std::uint32_t>(_mm512_reduce_max_epu32(largest));
  if (amax_bits > 0x7F7FFFFFu) return ue8m0_nan;
  return fp8_scale_byte(std::max(fp8_amax_floor, detail::float_from_bits(amax_bits)));
#else
  float amax = fp8_amax_floor;
  bool finite = true;
  for (std::int64_t c = first; c < last; ++c) {
    const float magnitude = std::fabs(values[c]);
    finite = finite && magnitude <= detail::float_from_bits(0x7F7FFFFFu);  // false for NaN and Inf
    amax = std::max(amax, magnitude);
  }
  return finite ? fp8_scale_byte(amax) : ue8m0_nan;
#endif
}

// 2^−k for the scale byte b = k + 127 of a finite block (b in [105, 247]): exact and normal, and
// x · 2^−k is the same fp32 value as x / 2^k (one exact quotient, rounded once either way).
inline float ue8m0_inverse(std::uint8_t b) noexcept {
  return detail::float_from_bits(static_cast<std::uint32_t>(254 - b) << 23);
}

// The e4m3 codes of the finite block values[first, last) at the scale byte b, into codes[first, last):
// float_to_e4m3(clamp(x / s, −448, 448)).
inline void fp8_encode_block(const float* values, std::int64_t first, std::int64_t last, std::uint8_t b,
                             std::byte* codes) noexcept {
  const float inverse = ue8m0_inverse(b);
  std::int64_t c = first;
#if PHASEKV_HAS_AVX512
  const __m512 low = _mm512_set1_ps(-e4m3_max), high = _mm512_set1_ps(e4m3_max);
  for (; c < last; c += 16) {
    const __mmask16 lanes = lanes_below(last - c);
    const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, values + c), _mm512_set1_ps(inverse));
    _mm512_mask_cvtepi32_storeu_epi8(codes + c, lanes, e4m3_encode16(_mm512_min_ps(_mm512_max_ps(y, low), high)));
  }
#endif
  for (; c < last; ++c) codes[c] = std::byte{float_to_e4m3(std::clamp(values[c] * inverse, -e4m3_max, e4m3_max))};
}

}  // namespace detail

// Quantizes one head's channels values[0 … channels) into the l.bytes bytes at `head` (every byte
// written, padding as 0). No alignment needed.
inline void fp8_quantize_head(const float* values, const fp8_head_layout& l, std::byte* head) noexcept {
  std::memset(head, 0, static_cast<std::size_t>(l.bytes));
  for (std::int64_t b = 0; b < l.blocks; ++b) {
    const std::int64_t first = b * fp8_head_layout::block_channels;
    const std::int64_t last = std::min(l.quantized, first + fp8_head_layout::block_channels);
    const std::uint8_t scale_byte = detail::fp8_block_scale_byte(values, first, last);
    head[l.scale_offset + b] = std::byte{scale_byte};
    if (scale_byte == ue8m0_nan) {
      std::memset(head + first, 0x7F, static_cast<std::size_t>(last - first));
      continue;
    }
    detail::fp8_encode_block(values, first, last, scale_byte, head);
  }
  // The bf16 RoPE channels: a SIMD prefix (its stores may alias bytes), then the scalar rule.
  auto* rope = reinterpret_cast<std::uint16_t*>(head + l.rope_offset);  // 2-byte aligned
  for (std::int64_t r = detail::store_bf16_simd(values + l.quantized, rope, l.rope_channels); r < l.rope_channels; ++r) {
    const std::uint16_t bits = float_to_bf16(values[l.quantized + r]);
    std::memcpy(head + l.rope_offset + 2 * r, &bits, sizeof bits);
  }
}

// Replaces one head's values[0 … channels) in place by what an FP8 head of layout l holds:
// fp8_dequantize_head(fp8_quantize_head(values)) bit for bit (a NaN block as NaN), without the
// bytes. Rounded values round to themselves (a block whose amax fell to 224·s rescales to s/2
// and every code doubles exactly) unless a value came back as ±Inf (|x| ≥ 1.9375 · 2^127), whose
// block then turns NaN. For hosts that simulate FP8 storage in fp32 rows of their own (an FP8
// raw window of the cache keeps the bytes: paged_cache.hpp).
inline void fp8_round_head(float* values, const fp8_head_layout& l) noexcept {
  for (std::int64_t b = 0; b < l.blocks; ++b) {
    const std::int64_t first = b * fp8_head_layout::block_channels;
    const std::int64_t last = std::min(l.quantized, first + fp8_head_layout::block_channels);
    const std::uint8_t scale_byte = detail::fp8_block_scale_byte(values, first, last);
    if (scale_byte == ue8m0_nan) {
      std::fill(values + first, values + last, e4m3_to_float(0x7F));
      continue;
    }
    const float scale = ue8m0_to_float(scale_byte), inverse = detail::ue8m0_inverse(scale_byte);
    std::int64_t c = first;
#if PHASEKV_HAS_AVX512
    const __m512 low = _mm512_set1_ps(-e4m3_max), high = _mm512_set1_ps(e4m3_max);
    for (; c < last; c += 16) {
      const __mmask16 lanes = detail::lanes_below(last - c);
      const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, values + c), _mm512_set1_ps(inverse));
      const __m512i code = detail::e4m3_encode16(_mm512_min_ps(_mm512_max_ps(y, low), high));
      _mm512_mask_storeu_ps(values + c, lanes, _mm512_mul_ps(detail::e4m3_decode16(code), _mm512_set1_ps(scale)));
    }
#endif
    for (; c < last; ++c)
      values[c] = e4m3_to_float(float_to_e4m3(std::clamp(values[c] * inverse, -e4m3_max, e4m3_max))) * scale;
  }
  for (std::int64_t r = l.quantized; r < l.channels; ++r) values[r] = bf16_to_float(float_to_bf16(values[r]));
}

}  // namespace phasekv
