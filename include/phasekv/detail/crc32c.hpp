#pragma once
// CRC-32C (Castagnoli), the checksum of sequence snapshots (cache/snapshot.hpp).
//
//   polynomial 0x1EDC6F41 (bit-reflected 0x82F63B78), initial value 0xFFFFFFFF, final XOR
//   0xFFFFFFFF, bits taken least significant first — the CRC of iSCSI, SCTP and ext4:
//   crc32c("123456789") = 0xE3069283. crc32c(b, crc32c(a)) = crc32c(a ‖ b), so a long buffer
//   can be checksummed in pieces.
//
// Why a CRC and not a hash: a CRC of this degree detects every single-bit error and every burst
// of up to 32 bits in a buffer of any length — with certainty, not with high probability — so a
// snapshot with any one bit flipped is always rejected.
//
// Three implementations with bit-identical results (tests/test_cache_snapshot.cpp compares them):
//   - SSE4.2 (when the compiler enables it): the crc32 instruction, 8 bytes per instruction.
//     One instruction has a latency of 3 cycles and a throughput of one per cycle, so a single
//     chain would use a third of the unit; the loop runs three chains over the three thirds of
//     each block and merges them (below): about 8 bytes per cycle.
//   - AVX-512 with VPCLMULQDQ (when the compiler enables it, for 256 bytes or more): folding
//     with carry-less multiplies, 256 bytes per step (below), faster than memory can deliver.
//   - portable: a table-driven loop over 8 bytes per step (8 tables of 256 entries, "slicing by
//     8"). A build for the x86-64 baseline (no -msse4.2 or -march) gets this one.
// Their speeds, and what they mean for snapshots: bench/RESULTS.md ("Sequence snapshots").
//
// The algebra of the merge. Read a 32-bit register r as a polynomial over GF(2), bit i the
// coefficient of x^(31−i) ("reflected"), and a message m of n bytes likewise (its first byte's
// bit 0 the highest coefficient). The register update without the initial and final XOR is
//   update(r, m) = (r·x^(8n) + m·x^32) mod P,
// which is linear, so for three parts a ‖ b ‖ c of B bytes each
//   update(r, a ‖ b ‖ c) = shift(update(r, a), 2B) ⊕ shift(update(0, b), B) ⊕ update(0, c),
//   shift(r, n) = r·x^(8n) mod P.
// shift is one carry-less multiply by the constant k = x^(8n−33) mod P (PCLMULQDQ; the 64-bit
// product, read reflected, is r·k·x) followed by one crc32 of that product, which multiplies by
// x^32 and reduces: r·k·x^33 = r·x^(8n) mod P. Without PCLMULQDQ the multiply runs bit by bit.

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif
#if defined(__SSE4_2__) && defined(__PCLMUL__)
#include <wmmintrin.h>
#endif
#if defined(__SSE4_2__) && defined(__AVX512F__) && defined(__VPCLMULQDQ__)
#include "phasekv/detail/simd/intrinsics.hpp"
#endif

namespace phasekv {

namespace detail::crc32c_impl {

constexpr std::uint32_t reflected_polynomial = 0x82F63B78u;

// ---- GF(2) arithmetic modulo P, reflected --------------------------------------------------------

// a·b mod P. Walks a's coefficients from x^0 (bit 31) upwards while b is multiplied by x.
constexpr std::uint32_t multiply(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (std::uint32_t bit = 0x80000000u; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ reflected_polynomial : b >> 1;  // b·x: x^31 wraps to P's low terms
  }
  return product;
}

// x^n mod P, by squaring.
constexpr std::uint32_t x_power(std::uint64_t n) noexcept {
  std::uint32_t result = 0x80000000u;  // x^0
  std::uint32_t square = 0x40000000u;  // x^1, then x^2, x^4, …
  for (; n != 0; n >>= 1) {
    if (n & 1u) result = multiply(result, square);
    square = multiply(square, square);
  }
  return result;
}

// ---- tables ------------------------------------------------------------------------------------

// table[s][b]: the register contribution of byte b followed by s zero bytes.
struct byte_tables {
  std::uint32_t table[8][256] = {};
};

constexpr byte_tables make_byte_tables() noexcept {
  byte_tables t;
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t r = b;
    for (int k = 0; k < 8; ++k) r = (r & 1u) ? (r >> 1) ^ reflected_polynomial : r >> 1;
    t.table[0][b] = r;
  }
  for (int s = 1; s < 8; ++s)
    for (std::uint32_t b = 0; b < 256; ++b)
      t.table[s][b] = (t.table[s - 1][b] >> 8) ^ t.table[0][t.table[s - 1][b] & 0xFFu];
  return t;
}

inline constexpr byte_tables tables = make_byte_tables();

// Little-endian 8-byte load, whatever the host's byte order (one mov on x86).
inline std::uint64_t load_le64(const unsigned char* p) noexcept {
  std::uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

// ---- portable register update --------------------------------------------------------------------

inline std::uint32_t update_portable(std::uint32_t r, const unsigned char* p, std::size_t n) noexcept {
  const auto& t = tables.table;
  for (; n >= 8; p += 8, n -= 8) {
    const std::uint64_t w = load_le64(p) ^ r;
    r = t[7][w & 0xFFu] ^ t[6][(w >> 8) & 0xFFu] ^ t[5][(w >> 16) & 0xFFu] ^ t[4][(w >> 24) & 0xFFu] ^
        t[3][(w >> 32) & 0xFFu] ^ t[2][(w >> 40) & 0xFFu] ^ t[1][(w >> 48) & 0xFFu] ^ t[0][w >> 56];
  }
  for (; n > 0; ++p, --n) r = (r >> 8) ^ t[0][(r ^ *p) & 0xFFu];
  return r;
}

// ---- SSE4.2 register update: three chains per block ------------------------------------------------

// Block sizes B (bytes per chain) from large to small, so that the tail of a long buffer also
// runs three chains; below 3·64 bytes one chain finishes. Larger B amortises the merge (about
// 20 cycles of latency) over more of the 3·B/8 cycles a block takes.
inline constexpr std::size_t chain_bytes[3] = {4096, 512, 64};

// shift(r, n) for n = B and n = 2B of each block size: constants for the carry-less multiply
// (x^(8n−33)) and for the bitwise one (x^(8n)).
struct shift_constants {
  std::uint32_t clmul[3][2];
  std::uint32_t bitwise[3][2];
};

constexpr shift_constants make_shift_constants() noexcept {
  shift_constants c{};
  for (int s = 0; s < 3; ++s) {
    for (int twice = 0; twice < 2; ++twice) {
      const std::uint64_t bits = 8 * chain_bytes[s] * static_cast<std::uint64_t>(twice + 1);
      c.clmul[s][twice] = x_power(bits - 33);
      c.bitwise[s][twice] = x_power(bits);
    }
  }
  return c;
}

inline constexpr shift_constants shifts = make_shift_constants();

#if defined(__SSE4_2__)

// r·x^(8n) mod P given the constants of n.
inline std::uint32_t shift(std::uint32_t r, std::uint32_t clmul_constant, std::uint32_t bitwise_constant) noexcept {
#if defined(__PCLMUL__)
  (void)bitwise_constant;
  const __m128i product = _mm_clmulepi64_si128(_mm_cvtsi32_si128(static_cast<int>(r)),
                                               _mm_cvtsi32_si128(static_cast<int>(clmul_constant)), 0);
  return static_cast<std::uint32_t>(_mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(product))));
#else
  (void)clmul_constant;
  return multiply(r, bitwise_constant);
#endif
}

// The register update of n bytes at src; with Copy, the bytes are also stored to dst (fused, so
// each byte is read once: a snapshot copies and checksums in one pass).
template <bool Copy>
inline std::uint32_t update_sse42(std::uint32_t r, const unsigned char* src, unsigned char* dst,
                                  std::size_t n) noexcept {
  std::uint64_t r0 = r;
  for (int s = 0; s < 3; ++s) {
    const std::size_t b = chain_bytes[s];
    for (; n >= 3 * b; src += 3 * b, dst += Copy ? 3 * b : 0, n -= 3 * b) {
      std::uint64_t r1 = 0, r2 = 0;
      for (std::size_t i = 0; i < b; i += 8) {
        std::uint64_t w0, w1, w2;
        std::memcpy(&w0, src + i, 8);
        std::memcpy(&w1, src + b + i, 8);
        std::memcpy(&w2, src + 2 * b + i, 8);
        r0 = _mm_crc32_u64(r0, w0);
        r1 = _mm_crc32_u64(r1, w1);
        r2 = _mm_crc32_u64(r2, w2);
        if constexpr (Copy) {
          std::memcpy(dst + i, &w0, 8);
          std::memcpy(dst + b + i, &w1, 8);
          std::memcpy(dst + 2 * b + i, &w2, 8);
        }
      }
      r0 = shift(static_cast<std::uint32_t>(r0), shifts.clmul[s][1], shifts.bitwise[s][1]) ^
           shift(static_cast<std::uint32_t>(r1), shifts.clmul[s][0], shifts.bitwise[s][0]) ^ r2;
    }
  }
  for (; n >= 8; src += 8, dst += Copy ? 8 : 0, n -= 8) {
    std::uint64_t w;
    std::memcpy(&w, src, 8);
    r0 = _mm_crc32_u64(r0, w);
    if constexpr (Copy) std::memcpy(dst, &w, 8);
  }
  std::uint32_t r32 = static_cast<std::uint32_t>(r0);
  for (; n > 0; ++src, --n) {
    r32 = _mm_crc32_u8(r32, *src);
    if constexpr (Copy) *dst++ = *src;
  }
  return r32;
}

#endif  // __SSE4_2__

#if defined(__SSE4_2__) && defined(__AVX512F__) && defined(__VPCLMULQDQ__)
#define PHASEKV_CRC32C_FOLD 1

// Folding with carry-less multiplies (AVX-512 VPCLMULQDQ), for buffers of 256 bytes or more.
//
// A 16-byte lane loaded little-endian holds a polynomial D of degree < 128, its low qword the
// coefficients of x^127 … x^64 (D_hi, read reflected as a 64-bit value) and its high qword those
// of x^63 … x^0 (D_lo). An accumulator F stands for the bytes folded into it so far, modulo P.
// Moving it T bits further along the message is
//   F·x^T = D_hi·x^(T+64) + D_lo·x^T ≡ clmul(F_hi, k_hi) ⊕ clmul(F_lo, k_lo)   (mod P),
//   k_hi = (x^(T+63) mod P) << 32,  k_lo = (x^(T−1) mod P) << 32,
// because a carry-less product of two reflected 64-bit values, read as a reflected 128-bit value,
// is their polynomial product times x. Each product has degree < 96, so the folded lane stays a
// 128-bit lane. The initial register r enters as r XORed into the first four message bytes
// (r·x^(8n−32)·x^32 = r·x^(8n)), and at the end the folded polynomial F, fed to the crc32
// instruction as 16 bytes, gives F·x^32 mod P — the register after the folded bytes.
//
// The loop keeps 4 accumulators of 4 lanes (256 bytes per step, T = 2048), so four independent
// multiply chains hide the multiply's latency; then folds them into one lane.

// GCC 12 warns "__Y is (or may be) used uninitialized" inside its own AVX-512 intrinsics once
// they are inlined (GCC bug 105593, fixed in GCC 13); see storage.hpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// k_hi in the low qword, k_lo in the high qword: the constants that move a lane T bits on.
inline __m128i fold_constants(std::uint64_t bits) noexcept {
  const auto k_hi = static_cast<long long>(static_cast<std::uint64_t>(x_power(bits + 63)) << 32);
  const auto k_lo = static_cast<long long>(static_cast<std::uint64_t>(x_power(bits - 1)) << 32);
  return _mm_set_epi64x(k_lo, k_hi);
}

struct fold_constant_set {
  __m512i step;    // T = 2048 bits in every lane: one 256-byte step of the main loop
  __m512i zmm;     // T = 512 bits: one accumulator onto the next
  __m512i lanes;   // lanes 0, 1, 2 of the last accumulator onto lane 3 (T = 384, 256, 128)
  __m128i lane;    // T = 128 bits: one 16-byte block onto the next
};

inline const fold_constant_set& fold_set() noexcept {
  static const fold_constant_set set = [] {
    fold_constant_set c;
    c.step = _mm512_broadcast_i32x4(fold_constants(2048));
    c.zmm = _mm512_broadcast_i32x4(fold_constants(512));
    c.lane = fold_constants(128);
    c.lanes = _mm512_inserti32x4(
        _mm512_inserti32x4(_mm512_inserti32x4(_mm512_setzero_si512(), fold_constants(384), 0), fold_constants(256), 1),
        c.lane, 2);
    return c;
  }();
  return set;
}

inline __m512i fold(__m512i f, __m512i k) noexcept {
  return _mm512_xor_si512(_mm512_clmulepi64_epi128(f, k, 0x00), _mm512_clmulepi64_epi128(f, k, 0x11));
}
inline __m128i fold(__m128i f, __m128i k) noexcept {
  return _mm_xor_si128(_mm_clmulepi64_si128(f, k, 0x00), _mm_clmulepi64_si128(f, k, 0x11));
}

// update(r, src[0 … n)) for n ≥ 256, also storing the bytes to dst when Copy.
template <bool Copy>
inline std::uint32_t update_fold(std::uint32_t r, const unsigned char* src, unsigned char* dst,
                                 std::size_t n) noexcept {
  const fold_constant_set& k = fold_set();
  __m512i x0 = _mm512_loadu_si512(src), x1 = _mm512_loadu_si512(src + 64);
  __m512i x2 = _mm512_loadu_si512(src + 128), x3 = _mm512_loadu_si512(src + 192);
  if constexpr (Copy) {
    _mm512_storeu_si512(dst, x0);
    _mm512_storeu_si512(dst + 64, x1);
    _mm512_storeu_si512(dst + 128, x2);
    _mm512_storeu_si512(dst + 192, x3);
    dst += 256;
  }
  x0 = _mm512_xor_si512(x0, _mm512_inserti32x4(_mm512_setzero_si512(), _mm_cvtsi32_si128(static_cast<int>(r)), 0));
  src += 256;
  n -= 256;
  for (; n >= 256; src += 256, n -= 256) {
    const __m512i d0 = _mm512_loadu_si512(src), d1 = _mm512_loadu_si512(src + 64);
    const __m512i d2 = _mm512_loadu_si512(src + 128), d3 = _mm512_loadu_si512(src + 192);
    if constexpr (Copy) {
      _mm512_storeu_si512(dst, d0);
      _mm512_storeu_si512(dst + 64, d1);
      _mm512_storeu_si512(dst + 128, d2);
      _mm512_storeu_si512(dst + 192, d3);
      dst += 256;
    }
    x0 = _mm512_xor_si512(fold(x0, k.step), d0);
    x1 = _mm512_xor_si512(fold(x1, k.step), d1);
    x2 = _mm512_xor_si512(fold(x2, k.step), d2);
    x3 = _mm512_xor_si512(fold(x3, k.step), d3);
  }
  x1 = _mm512_xor_si512(fold(x0, k.zmm), x1);
  x2 = _mm512_xor_si512(fold(x1, k.zmm), x2);
  x3 = _mm512_xor_si512(fold(x2, k.zmm), x3);
  const __m512i moved = fold(x3, k.lanes);  // lane 3's constants are zero: it contributes nothing here
  __m128i f = _mm_xor_si128(_mm_xor_si128(_mm512_extracti32x4_epi32(moved, 0), _mm512_extracti32x4_epi32(moved, 1)),
                            _mm_xor_si128(_mm512_extracti32x4_epi32(moved, 2), _mm512_extracti32x4_epi32(x3, 3)));
  for (; n >= 16; src += 16, n -= 16) {
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    if constexpr (Copy) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), d);
      dst += 16;
    }
    f = _mm_xor_si128(fold(f, k.lane), d);
  }
  std::uint64_t reg = _mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(f)));
  reg = _mm_crc32_u64(reg, static_cast<std::uint64_t>(_mm_extract_epi64(f, 1)));
  std::uint32_t r32 = static_cast<std::uint32_t>(reg);
  for (; n > 0; ++src, --n) {
    r32 = _mm_crc32_u8(r32, *src);
    if constexpr (Copy) *dst++ = *src;
  }
  return r32;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // fold

// The fastest register update this build has; Copy also stores the bytes to dst.
template <bool Copy>
inline std::uint32_t update(std::uint32_t r, const unsigned char* src, unsigned char* dst, std::size_t n) noexcept {
#if defined(PHASEKV_CRC32C_FOLD)
  if (n >= 256) return update_fold<Copy>(r, src, dst, n);
#endif
#if defined(__SSE4_2__)
  return update_sse42<Copy>(r, src, dst, n);
#else
  if constexpr (Copy) {
    if (n > 0) std::memcpy(dst, src, n);
  }
  return update_portable(r, src, n);
#endif
}

}  // namespace detail::crc32c_impl

// CRC-32C of n bytes, continuing from `crc` (the CRC of the bytes before them; 0 to start).
inline std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
  return ~detail::crc32c_impl::update<false>(~crc, static_cast<const unsigned char*>(data), nullptr, n);
}

// The table-driven implementation, whatever the compiler enables (for tests and comparisons).
inline std::uint32_t crc32c_portable(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
  return ~detail::crc32c_impl::update_portable(~crc, static_cast<const unsigned char*>(data), n);
}

// Copies n bytes from src to dst (which must not overlap) and returns the CRC-32C of those bytes
// continuing from `crc`: one pass over the data, each byte loaded once for both.
inline std::uint32_t crc32c_copy(void* dst, const void* src, std::size_t n, std::uint32_t crc = 0) noexcept {
  return ~detail::crc32c_impl::update<true>(~crc, static_cast<const unsigned char*>(src),
                                            static_cast<unsigned char*>(dst), n);
}

}  // namespace phasekv
