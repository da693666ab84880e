#pragma once
// The lightning indexer on FP4 keys and queries (reader_config::precision = indexer_precision::fp4),
// as DeepSeek-V4 runs it (docs/DESIGN.md §9):
//
//   I_j = Σ_h w_h · ReLU(q̂_h · k̂_j)
//
// with w_h the weights as the host hands them over (DeepSeek-V4: weights_proj(x) · 128^−0.5 ·
// 64^−0.5); k̂_j the indexer key of entry j as stored in fp4_e2m1_hadamard (format/fp4.hpp) —
// transformed by C^−1/2·H_C, quantized to e2m1 codes with one power-of-two scale per 32
// channels; q̂_h query head h transformed and quantized the same way here, once per read
// (prepare). The transform is orthogonal, so q̂·k̂ approximates q·k; the approximation is the
// quantization's alone.
//
// The arithmetic, exact where it can be. Write Q_i = 2·e2m1 of a query code and K_i of a key
// code, integers in [−12, 12], and e_b, f_b the block exponents of query and key (s = 2^e). Then
//
//   q̂_h · k̂_j = Σ_b P_b · 2^(e_b + f_b − 2),     P_b = Σ_{i in block b} Q_i · K_i
//
// where each P_b is an exact integer (|P_b| ≤ 32 · 144 = 4608: int32, even int16) and each term
// an exact double (|P_b| < 2^13, exponent in [−254, 250]). The portable path sums the terms in
// double, block after block (acc = fma(P_b, 2^(e_b − 1) · 2^(f_b − 1), acc)): exact whenever the
// nonzero terms of one head and key lie within 38 binades of each other (4 · 4608 · 2^span <
// 2^53 — e.g. whenever the query's and the key's block exponents each span at most 19; a block of
// zeros adds an exact 0 at any scale; after the transform a vector's blocks have similar scales,
// 0 to 2 binades apart). Only there do the two paths below promise more than determinism and
// agreement with each other, and there both give
//
//   d_hj = fp32(q̂_h · k̂_j)        the exact dot product rounded once to fp32 (nearest even)
//
// equal to a double-precision evaluation of the same dequantized values (tests/test_read_fp4.cpp).
// A NaN block (scale byte 0xFF, format/fp4.hpp) makes d NaN. Then, per key, in fp32:
//
//   r_h = d_h if d_h > 0, else 0              (NaN → 0, as the fp32 kernel's max(d, 0) does)
//   heads in blocks of 64, each of 16 lanes × 4 groups: lane l of block B accumulates
//     a_l = fma(r_h, w_h, a_l) over h = 64B + 16g + l, g = 0, 1, 2, 3 (from a_l = +0)
//   s_B = ((a_l + a_{l+8}) then + the same at distance 4, 2, 1): a_0 after four pairwise halvings
//   I_j = (0 + s_0) + s_1 + …                  (over head blocks, in order)
//
// with true fused multiply-adds on both paths (never a product rounded first), so that the
// portable path and the SIMD path give the same bits for every key — and for every key whose
// exact dot products are representable as above, the same bits as the defining formula.
//
// The SIMD path (AVX-512 VNNI: __AVX512VNNI__ with AVX512F/BW, 128-channel multiples; else the
// portable path runs). It folds the block scales into the integer codes, so that a whole key is
// one int32 dot product per head: with E_h = min_b e_hb and F_j = min_b f_jb, Q'_i = Q_i ·
// 2^(e_b − E_h) and K'_i = K_i · 2^(f_b − F_j), and
//
//   q̂_h · k̂_j = P' · 2^(E_h − 2) · 2^(F_j),     P' = Σ_i Q'_i · K'_i
//
// exactly. When every block exponent lies within 3 of the vector's least, |Q'|, |K'| ≤ 96 fit in
// int8, and vpdpbusd (unsigned × signed bytes, four products per int32 lane) computes P' with the
// key as the unsigned side, K' + 96 ∈ [0, 192], and the query's correction −96·Σ_i Q'_i loaded as
// the accumulator's start: |P'| ≤ C · 96 · 96 < 2^24 for C ≤ 1024, so P' is exact in fp32.
//
// The scales are then applied where they cost least, not where the definition rounds. Powers of
// two commute with rounding while nothing leaves fp32's normal range, so with w'_h = w_h ·
// 2^(E_h − 2 + c) (exact, once per read) the SIMD path sums
//
//   b_l = fma(max(P'_hj, 0), w'_h, b_l) over the same heads in the same order, the same tree
//   I_j = ((0 + s'_0) + s'_1 + …) · 2^(F_j − c)
//
// — two operations per head and key fewer than d_hj's two products — and gets the defining bits
// whenever (a) every d_hj is P'·2^(E_h − 2 + F_j) exactly and normal or zero (−124 − E_h ≤ F_j,
// E_h + F_j ≤ 105: also for heads of weight 0, whose overflowing d would make inf · 0 = NaN),
// (b) every nonzero partial sum, folded or not, is at least 2^−126 — all of them are integer
// multiples of 2^m with m the least exponent of a lowest bit of any w_h · 2^(E_h − 2), shifted by c
// or by F_j, so m + c ≥ −126 and m + F_j ≥ −126 suffice — and (c) none reaches 2^127: |P'| < 2^24,
// at most 2^L heads (padded), rounding growth below 2: L + M + 26 + c ≤ 127 and the same with F_j,
// M the greatest exponent of a w_h · 2^(E_h − 2). prepare picks c ∈ [−126 − m, 101 − L − M]
// nearest 0 (no such c, or a non-finite weight: the read goes to the portable path); the key's
// exponent range follows, and plan16 checks it with the others below. Realistic weights (DeepSeek's
// ~2^−13) leave every key but those at the ends of fp32 on the SIMD path.
//
// Keys are unpacked 64 bytes (4 blocks) at a time with vpshufb from one of 256 constant tables,
// picked by the key's pattern of four block shifts, whose 128-bit lanes hold each block's shifted
// codes. A key outside the bounds (a block exponent 4 or more above its least,
// a NaN block, F_j outside the fold's range) is scored by the portable path; a query outside them
// (E_h outside [−124, 105]) sends the whole read there. Heads lie in lanes (16 per register, 4
// registers per 64-head block), a tile of 4 keys keeps 16 accumulators in registers, and one
// broadcast of four key bytes feeds four vpdpbusd; the four keys' trees share their shuffles.
// Keys are planned 16 at a time (their scale bytes gathered: least exponent, shift pattern, fast
// or not) and unpacked up to 16 KiB at a time before any is scored. How close this runs to the
// measured int8 dot-product peak (bench_read: BM_sparse_decode_v4_precision, indexer_of_int8_peak)
// and where the rest of its time goes: bench/RESULTS.md ("DeepSeek-V4-precision decode step").

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "phasekv/format/fp4.hpp"
#include "phasekv/detail/simd/batch.hpp"
#include "phasekv/detail/simd/prefetch.hpp"
#include "phasekv/detail/simd/unroll.hpp"

#include "phasekv/detail/simd/config.hpp"
#if PHASEKV_HAS_INT8_DOT
#include "phasekv/detail/simd/intrinsics.hpp"
#endif

namespace phasekv::kernels {

// Whether this build scores FP4 indexer keys with vpdpbusd.
inline constexpr bool has_int8_dot = PHASEKV_HAS_INT8_DOT != 0;

#if PHASEKV_HAS_INT8_DOT
// acc + the four-byte dot products of u (unsigned) and v (signed) per int32 lane: vpdpbusd. In
// inline assembly because GCC 12 allocates the intrinsic's accumulator badly: it copies every
// accumulator to another register and back around each instruction, about half the kernel's
// speed (Clang's intrinsic does no better; with this, both compilers run alike).
// bench/machine_limits.hpp times the int8 peak with it too.
inline __m512i dpbusd(__m512i acc, __m512i u, __m512i v) noexcept {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(v));
  return acc;
}
#endif

namespace detail {
// The unsigned side of vpdpbusd: a key's codes K' = 2·e2m1 · 2^shift (shift ≤ 3) plus this,
// in [0, 192].
inline constexpr int fp4_key_offset = 96;

#if PHASEKV_HAS_INT8_DOT
// K' + 96 by code for each of the 256 patterns of four block shifts (block L's shift in bits 2L
// and 2L + 1): 128-bit lane L of of[pattern] is block L's table, as vpshufb reads it.
struct fp4_shifted_code_tables {
  alignas(64) std::uint8_t of[256][64];
};

constexpr fp4_shifted_code_tables make_fp4_shifted_code_tables() {
  fp4_shifted_code_tables t{};
  for (int pattern = 0; pattern < 256; ++pattern)
    for (int lane = 0; lane < 4; ++lane)
      for (int code = 0; code < 16; ++code)
        t.of[pattern][16 * lane + code] =
            static_cast<std::uint8_t>(fp4_key_offset + e2m1_twice[code] * (1 << (pattern >> (2 * lane) & 3)));
  return t;
}

inline constexpr fp4_shifted_code_tables fp4_shifted_codes = make_fp4_shifted_code_tables();
#endif
}  // namespace detail

// The queries of one read, transformed and quantized, in the layouts of both paths. The same
// layout in every build (the reader holds one); the SIMD fields stay empty where that path is
// not compiled in.
struct indexer_fp4_queries {
  std::int64_t heads = 0, channels = 0, blocks = 0, head_blocks = 0;
  std::vector<std::int8_t> codes;  // [heads][channels]: Q = 2·e2m1
  std::vector<double> scales;      // [heads][blocks]: 2^(e − 1), NaN for a NaN block
  std::vector<float> weights;      // [heads]
  std::vector<std::uint8_t> scale_bytes;  // [heads][blocks]: the UE8M0 bytes (scratch of prepare)
  // The SIMD path: whether it may run (every head's exponents within 3 of its least, that least
  // in [−124, 105], no NaN block; finite weights whose scaled values fit, see score_simd), and its
  // operands, heads padded to 64 per block with zeros.
  bool shifted = false;
  simd::aligned_vector<std::int8_t> q_t;         // [head block][slot][group][16 heads][4 bytes]: Q'
  simd::aligned_vector<std::int32_t> start;      // [padded heads]: −96 · Σ_i Q'_i
  simd::aligned_vector<float> w_scaled;          // [padded heads]: w_h · 2^(E_h − 2 + c), 0 for padding
  int rescale = 0;                               // c
  int key_least_min = 0, key_least_max = 0;      // the least scale bytes F + 127 of keys it may score
};

struct indexer_fp4 {
  using prepared = indexer_fp4_queries;

  static constexpr std::int64_t block_heads = 64;  // heads per register block: 4 groups of 16
  static constexpr std::int64_t lanes = 16;
  static constexpr std::int64_t tile_entries = 4;
  static constexpr int max_shift = 3;   // block exponents above the least that int8 codes absorb
  static constexpr int key_offset = detail::fp4_key_offset;

  // Channel counts the SIMD path takes (whole 64-byte runs of codes); every FP4 count otherwise.
  static constexpr bool simd_supports(std::int64_t channels) noexcept {
    return has_int8_dot && channels % 128 == 0 && channels <= fp4_max_channels;
  }

  // Transforms and quantizes queries [heads][channels] (format/fp4.hpp: fp4_quantize_head) and
  // lays them out for both paths. `channels` must pass is_fp4_channel_count.
  static void prepare(const float* queries, const float* weights, std::int64_t heads, std::int64_t channels,
                      prepared& p) {
    const fp4_head_layout layout = fp4_head_layout::of(channels);
    p.heads = heads;
    p.channels = channels;
    p.blocks = layout.blocks;
    p.head_blocks = (heads + block_heads - 1) / block_heads;
    p.codes.resize(static_cast<std::size_t>(heads * channels));
    p.scales.resize(static_cast<std::size_t>(heads * layout.blocks));
    p.weights.assign(weights, weights + heads);
    p.scale_bytes.resize(static_cast<std::size_t>(heads * layout.blocks));
    for (std::int64_t h = 0; h < heads; ++h)
      fp4_quantize_head_twice(queries + h * channels, layout, p.codes.data() + h * channels,
                              p.scale_bytes.data() + h * layout.blocks);
    for (std::size_t i = 0; i < p.scales.size(); ++i) p.scales[i] = half_scale(p.scale_bytes[i]);
    p.shifted = false;
#if PHASEKV_HAS_INT8_DOT
    if (simd_supports(channels)) prepare_shifted(p.scale_bytes.data(), p);
#endif
  }

  // out[j] = I_j for `count` FP4 keys at keys + j · stride (kv_heads = 1: one head per entry).
  // The SIMD path where this build and the queries allow it, the portable path otherwise.
  // `next`, if given, is where the caller reads next (the following page's keys, `next_count` of
  // them, same stride): the SIMD path prefetches them while it scores these, since the hardware
  // prefetchers lose the stream at the page boundary and the first thing the next call does is
  // gather every key's scale bytes.
  static void score(const prepared& p, const std::byte* keys, std::int64_t stride, std::int64_t count,
                    float* out, const std::byte* next = nullptr, std::int64_t next_count = 0) noexcept {
#if PHASEKV_HAS_INT8_DOT
    if (p.shifted) {
      score_simd(p, keys, stride, count, out, next, next_count);
      return;
    }
#endif
    (void)next, (void)next_count;
    score_portable(p, keys, stride, count, out);
  }

  // The definition, key by key, in scalar code; callable in every build (the tests hold the SIMD
  // path to it).
  static void score_portable(const prepared& p, const std::byte* keys, std::int64_t stride, std::int64_t count,
                             float* out) noexcept {
    for (std::int64_t j = 0; j < count; ++j) out[j] = score_one(p, keys + j * stride);
  }

  // I of one key.
  static float score_one(const prepared& p, const std::byte* key) noexcept {
    const fp4_head_layout layout = fp4_head_layout::of(p.channels);
    std::int8_t k[fp4_max_channels];
    double key_scale[fp4_max_channels / fp4_block_channels];
    for (std::int64_t c = 0; c < p.channels; ++c) k[c] = e2m1_twice[fp4_code(key, c)];
    for (std::int64_t b = 0; b < p.blocks; ++b) key_scale[b] = half_scale(static_cast<std::uint8_t>(key[layout.scale_offset + b]));
    float total = 0.0f;
    for (std::int64_t hb = 0; hb < p.head_blocks; ++hb) {
      float a[lanes] = {};
      for (std::int64_t g = 0; g < block_heads / lanes; ++g)
        for (std::int64_t l = 0; l < lanes; ++l) {
          const std::int64_t h = hb * block_heads + g * lanes + l;
          if (h >= p.heads) continue;  // padding: fma(0, 0, a) = a
          const std::int8_t* q = p.codes.data() + h * p.channels;
          const double* q_scale = p.scales.data() + h * p.blocks;
          double acc = 0.0;
          for (std::int64_t b = 0; b < p.blocks; ++b) {
            std::int32_t dot = 0;
            for (std::int64_t i = b * fp4_block_channels; i < (b + 1) * fp4_block_channels; ++i)
              dot += static_cast<std::int32_t>(q[i]) * static_cast<std::int32_t>(k[i]);
            acc = std::fma(static_cast<double>(dot), q_scale[b] * key_scale[b], acc);
          }
          const auto d = static_cast<float>(acc);
          const float r = d > 0.0f ? d : 0.0f;
          a[l] = std::fma(r, p.weights[static_cast<std::size_t>(h)], a[l]);
        }
      total += halve(a);
    }
    return total;
  }

 private:
  // 2^(b − 128) = 2^(k − 1) for a scale byte b = k + 127; NaN for 0xFF. Built from its bits (a
  // normal double for every byte: biased exponent b + 895), which costs a fraction of ldexp's
  // call; prepare converts 256 of them a read.
  static double half_scale(std::uint8_t byte) noexcept {
    if (byte == ue8m0_nan) return std::numeric_limits<double>::quiet_NaN();
    const std::uint64_t bits = static_cast<std::uint64_t>(byte + 895u) << 52;
    double value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }

  // The 16 lanes summed in the order the header states: halves at distance 8, 4, 2, 1.
  static float halve(float* a) noexcept {
    for (std::int64_t width = lanes / 2; width >= 1; width /= 2)
      for (std::int64_t l = 0; l < width; ++l) a[l] = a[l] + a[l + width];
    return a[0];
  }

#if PHASEKV_HAS_INT8_DOT
  // Slots of a 128-channel run of codes: 32 dwords of unpacked keys, 16 of even channels then 16
  // of odd ones (see unpack).
  static constexpr std::int64_t slots_per_run = 32;

  // The channel the u-th byte of slot s (of run 0) holds.
  static constexpr std::int64_t slot_channel(std::int64_t s, std::int64_t u) noexcept {
    return s < 16 ? 2 * (4 * s + u) : 2 * (4 * (s - 16) + u) + 1;
  }

  static void prepare_shifted(const std::uint8_t* scale_bytes, prepared& p) {
    const std::int64_t padded = p.head_blocks * block_heads, slots = p.channels / 128 * slots_per_run;
    std::vector<int> least(static_cast<std::size_t>(p.heads));
    for (std::int64_t h = 0; h < p.heads; ++h) {
      int lo = 255, hi = 0;
      for (std::int64_t b = 0; b < p.blocks; ++b) {
        const int byte = scale_bytes[h * p.blocks + b];
        lo = std::min(lo, byte);
        hi = std::max(hi, byte);
      }
      // E = lo − 127 must lie in [−124, 105]; a NaN block (0xFF) exceeds every bound.
      if (hi == ue8m0_nan || hi - lo > max_shift || lo - 127 < -124 || lo - 127 > 105) return;
      least[static_cast<std::size_t>(h)] = lo;
    }
    if (!fold_weights(least, p)) return;
    p.q_t.assign(static_cast<std::size_t>(p.head_blocks * slots * block_heads * 4), 0);
    p.start.assign(static_cast<std::size_t>(padded), 0);
    std::int8_t shifted[fp4_max_channels];  // one head's Q', channel order
    for (std::int64_t h = 0; h < p.heads; ++h) {
      const int lo = least[static_cast<std::size_t>(h)];
      const std::int8_t* codes = p.codes.data() + h * p.channels;
      std::int32_t sum = 0;
      for (std::int64_t b = 0; b < p.blocks; ++b) {
        const int factor = 1 << (scale_bytes[h * p.blocks + b] - lo);
        for (std::int64_t c = b * fp4_block_channels; c < (b + 1) * fp4_block_channels; ++c) {
          shifted[c] = static_cast<std::int8_t>(codes[c] * factor);
          sum += shifted[c];
        }
      }
      p.start[static_cast<std::size_t>(h)] = -key_offset * sum;
      // Slot s of a run holds channels slot_channel(s, 0 … 3): four bytes, one store per slot.
      const std::int64_t hb = h / block_heads, g = (h % block_heads) / lanes, lane = h % lanes;
#if PHASEKV_HAS_AVX512_VBMI
      // The same stores a run at a time: its even channels' bytes are slots 0 … 15 in order, its
      // odd channels' slots 16 … 31, and consecutive slots of a head lie 4 · 16 · 4 bytes apart.
      alignas(64) static constexpr std::array<std::uint8_t, 64> even = [] {
        std::array<std::uint8_t, 64> a{};
        for (int i = 0; i < 64; ++i) a[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(2 * i);
        return a;
      }();
      const __m512i even_index = _mm512_load_si512(even.data());
      const __m512i odd_index = _mm512_add_epi8(even_index, _mm512_set1_epi8(1));
      const __m512i slot_offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                      _mm512_set1_epi32(static_cast<int>(4 * lanes * 4)));
      for (std::int64_t run = 0; run < slots / slots_per_run; ++run) {
        const __m512i low_half = _mm512_loadu_si512(shifted + run * 128);
        const __m512i high_half = _mm512_loadu_si512(shifted + run * 128 + 64);
        std::int8_t* first = p.q_t.data() + (((hb * slots + run * slots_per_run) * 4 + g) * lanes + lane) * 4;
        _mm512_i32scatter_epi32(first, slot_offsets, _mm512_permutex2var_epi8(low_half, even_index, high_half), 1);
        _mm512_i32scatter_epi32(first + 16 * 4 * lanes * 4, slot_offsets,
                                _mm512_permutex2var_epi8(low_half, odd_index, high_half), 1);
      }
#else
      for (std::int64_t s = 0; s < slots; ++s) {
        const std::int64_t base = s / slots_per_run * 128;
        const std::int8_t four[4] = {shifted[base + slot_channel(s % slots_per_run, 0)], shifted[base + slot_channel(s % slots_per_run, 1)],
                                     shifted[base + slot_channel(s % slots_per_run, 2)], shifted[base + slot_channel(s % slots_per_run, 3)]};
        std::memcpy(p.q_t.data() + (((hb * slots + s) * 4 + g) * lanes + lane) * 4, four, sizeof four);
      }
#endif
    }
    p.shifted = true;
  }

  // The weights with the head scales folded in, w'_h = w_h · 2^(E_h − 2 + c), and the range of key
  // exponents F for which the folded sum is the defining one times 2^(c − F) exactly (the header's
  // conditions); false when no c fits (weights spanning some 200 binades, a non-finite weight).
  static bool fold_weights(const std::vector<int>& least, prepared& p) {
    const std::int64_t padded = p.head_blocks * block_heads;
    int log2_heads = 0;
    while ((std::int64_t{1} << log2_heads) < padded) ++log2_heads;
    // m0: the least exponent of a lowest bit any w_h · 2^(E_h − 2) can have; mx: the greatest
    // exponent of one. Zero weights add exact zeros and bound nothing.
    int m0 = 0, mx = 0, e_min = 105, e_max = -124;
    bool any = false;
    for (std::int64_t h = 0; h < p.heads; ++h) {
      const float w = p.weights[static_cast<std::size_t>(h)];
      if (!std::isfinite(w)) return false;
      const int e = least[static_cast<std::size_t>(h)] - 127;
      e_min = std::min(e_min, e);
      e_max = std::max(e_max, e);
      if (w == 0.0f) continue;
      const int exponent = std::ilogb(w) + e - 2;  // exact: ilogb of a subnormal w is its true exponent
      m0 = any ? std::min(m0, exponent - 23) : exponent - 23;
      mx = any ? std::max(mx, exponent) : exponent;
      any = true;
    }
    // c keeps every nonzero folded value at or above 2^−126 (m0 + c ≥ −126) and every partial sum
    // below 2^127 (log2_heads + mx + 26 + c ≤ 127); the nearest such to 0.
    const int c_lo = -126 - m0, c_hi = 101 - log2_heads - mx;
    if (c_lo > c_hi) return false;
    const int c = std::clamp(0, c_lo, c_hi);
    // The same two bounds for the unfolded sums of a key of exponent F, d_hj exact and normal (F ≥
    // −124 − E_h, E_h + F ≤ 105), and 2^(F − c) a normal fp32.
    const int f_lo = std::max({-126 - m0, -124 - e_min, c - 126}), f_hi = std::min({101 - log2_heads - mx, 105 - e_max, c + 127});
    if (f_lo > f_hi) return false;
    p.rescale = c;
    p.key_least_min = std::max(1, f_lo + 127);
    p.key_least_max = std::min(254, f_hi + 127);
    p.w_scaled.assign(static_cast<std::size_t>(padded), 0.0f);
    for (std::int64_t h = 0; h < p.heads; ++h)
      p.w_scaled[static_cast<std::size_t>(h)] =
          std::ldexp(p.weights[static_cast<std::size_t>(h)], least[static_cast<std::size_t>(h)] - 127 - 2 + c);
    return true;
  }

  // Keys j < n (at keys + j · stride) as bytes K' + 96, key j's at out + j · channels: per
  // 128-channel run its 64 even channels (byte i: channel 2i), then its 64 odd ones (channel
  // 2i + 1), each block's codes shifted by its exponent above the key's least. The run's pattern
  // of four shifts (plan16) picks its table: 128-bit lane L of the packed codes is block L of the
  // run, and vpshufb looks up within lanes, so each lane reads its own block's table. Run by run,
  // so that the loop over keys is straight: ~14 instructions a key and run.
  static void unpack(const std::byte* keys, std::int64_t stride, std::int64_t n, std::int64_t runs,
                     const std::uint8_t* patterns, std::uint8_t* out) noexcept {
    const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
    const std::int64_t channels = 128 * runs;
    for (std::int64_t run = 0; run < runs; ++run)
      for (std::int64_t j = 0; j < n; ++j) {
        const __m512i table = _mm512_load_si512(detail::fp4_shifted_codes.of[patterns[run * max_run + j]]);
        const __m512i packed = _mm512_loadu_si512(keys + j * stride + 64 * run);
        std::uint8_t* to = out + j * channels + 128 * run;
        _mm512_store_si512(to, _mm512_shuffle_epi8(table, _mm512_and_si512(packed, low_nibbles)));
        _mm512_store_si512(to + 64, _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles)));
      }
  }

  // The tree of the header: halves at distance 8, 4, 2, 1.
  static float halve(__m512 s) noexcept {
    const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
    const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
  }

  // Unpacked codes of up to this many bytes are scored at a time: 128 keys of 128 channels.
  static constexpr std::int64_t unpacked_bytes = 16384;
  static constexpr std::int64_t max_run = unpacked_bytes / 128;

  // The plan of keys[0 … 16) (lanes past n left alone), from their scale bytes gathered four at
  // a time: least[j] their least byte, patterns[run · max_run + j] each run's four block shifts
  // above it (2 bits each, clamped to 3: a key the SIMD path does not score may have anything
  // there), and bit j of the result whether the SIMD path may score key j.
  static std::uint32_t plan16(const prepared& p, const std::byte* keys, std::int64_t stride, std::int64_t n,
                              const fp4_head_layout& layout, std::int32_t* least, std::uint8_t* patterns) noexcept {
    const __mmask16 live = static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
    const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32(static_cast<int>(stride)));
    const __m512i byte = _mm512_set1_epi32(0xFF);
    const std::int64_t runs = layout.channels / 128;
    __m512i four[fp4_max_channels / 128];
    __m512i lo = byte, hi = _mm512_setzero_si512();
    for (std::int64_t run = 0; run < runs; ++run) {
      four[run] = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, keys + layout.scale_offset + 4 * run, 1);
      // The least and greatest of each lane's four bytes, in its low byte.
      __m512i small = _mm512_min_epu8(four[run], _mm512_srli_epi32(four[run], 8));
      small = _mm512_min_epu8(small, _mm512_srli_epi32(small, 16));
      __m512i large = _mm512_max_epu8(four[run], _mm512_srli_epi32(four[run], 8));
      large = _mm512_max_epu8(large, _mm512_srli_epi32(large, 16));
      lo = _mm512_min_epu32(lo, _mm512_and_si512(small, byte));
      hi = _mm512_max_epu32(hi, _mm512_and_si512(large, byte));
    }
    _mm512_storeu_si512(least, lo);
    // Pattern = Σ_L min(byte_L − least, 3) · 4^L: the least copied to every byte of its lane,
    // the shifts weighed and summed in pairs (vpmaddubsw: d0 + 4·d1, 16·d2 + 64·d3), then the pairs.
    const __m512i spread = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12));
    const __m512i least_bytes = _mm512_shuffle_epi8(lo, spread);
    const __m512i weights = _mm512_set1_epi32(0x40100401);
    for (std::int64_t run = 0; run < runs; ++run) {
      const __m512i shifts = _mm512_min_epu8(_mm512_sub_epi8(four[run], least_bytes), _mm512_set1_epi8(max_shift));
      const __m512i pattern = _mm512_madd_epi16(_mm512_maddubs_epi16(shifts, weights), _mm512_set1_epi16(1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(patterns + run * max_run), _mm512_cvtepi32_epi8(pattern));
    }
    // lo within the folded weights' range (so ≥ 1: 2^F a normal fp32), hi ≠ 0xFF (no NaN block),
    // hi − lo ≤ 3.
    const __mmask16 fast = _mm512_cmpge_epu32_mask(lo, _mm512_set1_epi32(p.key_least_min)) &
                           _mm512_cmple_epu32_mask(lo, _mm512_set1_epi32(p.key_least_max)) &
                           _mm512_cmpneq_epu32_mask(hi, byte) &
                           _mm512_cmple_epu32_mask(_mm512_sub_epi32(hi, lo), _mm512_set1_epi32(max_shift));
    return static_cast<std::uint32_t>(fast & live);
  }

  static void score_simd(const prepared& p, const std::byte* keys, std::int64_t stride, std::int64_t count,
                         float* out, const std::byte* next, std::int64_t next_count) noexcept {
    const fp4_head_layout layout = fp4_head_layout::of(p.channels);
    const std::int64_t runs = p.channels / 128;
    const std::int64_t run = unpacked_bytes / p.channels;  // keys unpacked at a time, a multiple of 16
    alignas(64) std::uint8_t unpacked[unpacked_bytes];
    alignas(64) std::int32_t least[max_run];
    std::uint8_t patterns[fp4_max_channels / 128 * max_run];
    std::uint32_t fast[max_run / 16];
    for (std::int64_t first = 0; first < count; first += run) {
      const std::int64_t n = std::min(run, count - first);
      const std::byte* base = keys + first * stride;
      for (std::int64_t j = 0; j < n; j += 16) fast[j / 16] = plan16(p, base + j * stride, stride, n - j, layout, least + j, patterns + j);
      // Every key of the run unpacked before any is scored (interleaving the two gains nothing,
      // bench/RESULTS.md).
      unpack(base, stride, n, runs, patterns, unpacked);
      // The next keys' lines, a few per tile of the first head block: those of the caller's next
      // page during the last run, those of this call's next run before it.
      const bool last_run = first + n >= count;
      const std::byte* ahead = last_run ? next : base + n * stride;
      const std::int64_t ahead_bytes = (last_run ? next_count : std::min(run, count - first - n)) * stride;
      const std::int64_t tiles = (n + tile_entries - 1) / tile_entries;
      const std::int64_t lines_per_tile = ahead ? (ahead_bytes + 64 * tiles - 1) / (64 * tiles) : 0;
      for (std::int64_t hb = 0; hb < p.head_blocks; ++hb) {
        std::int64_t j = 0;
        for (; j + tile_entries <= n; j += tile_entries) {
          if (hb == 0 && lines_per_tile > 0) {
            const std::int64_t from = j / tile_entries * lines_per_tile * 64;
            if (from < ahead_bytes) simd::prefetch_bytes(ahead + from, std::min(ahead_bytes - from, lines_per_tile * 64));
          }
          tile<tile_entries>(p, hb, unpacked + j * p.channels, out + first + j);
        }
        switch (n - j) {  // the last few entries in one tile
          case 3: tile<3>(p, hb, unpacked + j * p.channels, out + first + j); break;
          case 2: tile<2>(p, hb, unpacked + j * p.channels, out + first + j); break;
          case 1: tile<1>(p, hb, unpacked + j * p.channels, out + first + j); break;
          default: break;
        }
      }
      // The folded sums times 2^(F − c): exact (a normal result or zero), the defining I_j.
      for (std::int64_t j = 0; j < n; j += 16) {
        const __mmask16 live = static_cast<__mmask16>(n - j >= 16 ? 0xFFFFu : (1u << (n - j)) - 1u);
        const __m512i exponent = _mm512_sub_epi32(_mm512_load_si512(least + j), _mm512_set1_epi32(p.rescale));
        const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(exponent, 23));  // garbage for keys not fast
        float* o = out + first + j;
        _mm512_mask_storeu_ps(o, live, _mm512_mul_ps(_mm512_maskz_loadu_ps(live, o), scale));
      }
      // Keys the shifted codes cannot hold exactly: the portable path, which is the definition.
      // One test per 16 keys: almost every key is fast.
      for (std::int64_t j0 = 0; j0 < n; j0 += 16) {
        const std::int64_t live = std::min<std::int64_t>(16, n - j0);
        const std::uint32_t slow = ~fast[j0 / 16] & ((1u << live) - 1u);
        if (slow != 0)
          for (std::int64_t j = j0; j < j0 + live; ++j)
            if ((slow >> (j - j0) & 1u) != 0) out[first + j] = score_one(p, base + j * stride);
      }
    }
  }

  // One slot of two keys: a[g] += bytes 4s … 4s + 3 of key a against query group g, the same for b
  // — eight vpdpbusd in one statement. Per instruction (kernels::dpbusd) GCC still moves one or two
  // accumulators through spare registers every slot.
  static void slot_pair(__m512i (&a)[4], __m512i (&b)[4], const std::uint8_t* key_a, const std::uint8_t* key_b,
                        __m512i q0, __m512i q1, __m512i q2, __m512i q3) noexcept {
    __m512i k;
    __asm__(
        "vpbroadcastd %[ka], %[k]\n\t"
        "vpdpbusd %[q0], %[k], %[a0]\n\t"
        "vpdpbusd %[q1], %[k], %[a1]\n\t"
        "vpdpbusd %[q2], %[k], %[a2]\n\t"
        "vpdpbusd %[q3], %[k], %[a3]\n\t"
        "vpbroadcastd %[kb], %[k]\n\t"
        "vpdpbusd %[q0], %[k], %[b0]\n\t"
        "vpdpbusd %[q1], %[k], %[b1]\n\t"
        "vpdpbusd %[q2], %[k], %[b2]\n\t"
        "vpdpbusd %[q3], %[k], %[b3]"
        : [k] "=&v"(k), [a0] "+v"(a[0]), [a1] "+v"(a[1]), [a2] "+v"(a[2]), [a3] "+v"(a[3]), [b0] "+v"(b[0]),
          [b1] "+v"(b[1]), [b2] "+v"(b[2]), [b3] "+v"(b[3])
        : [q0] "v"(q0), [q1] "v"(q1), [q2] "v"(q2), [q3] "v"(q3),
          [ka] "m"(*reinterpret_cast<const std::uint32_t*>(key_a)), [kb] "m"(*reinterpret_cast<const std::uint32_t*>(key_b)));
  }

  // NE keys against head block hb: NE · 4 int32 accumulators (16 for NE = 4: enough independent
  // chains to cover vpdpbusd's latency, few enough to stay in registers with the query groups),
  // then per key the folded lanes b_l = Σ_g fma(max(P', 0), w'_h, b_l) and their tree s'_hb,
  // added to out — or stored there for hb = 0: 0 + s'_0 = s'_0 bit for bit, since a sum that
  // starts from +0 is never −0 (the header's order; out · 2^(F − c) is the score).
  template <std::int64_t NE>
  PHASEKV_FLATTEN static void tile(const prepared& p, std::int64_t hb, const std::uint8_t* unpacked, float* out) noexcept {
    const std::int64_t slots = p.channels / 128 * slots_per_run;
    const std::int8_t* q = p.q_t.data() + hb * slots * block_heads * 4;
    __m512i acc[NE][4];
    simd::unroll<4>([&](auto g) {
      const __m512i start = _mm512_load_si512(p.start.data() + hb * block_heads + g * lanes);
      simd::unroll<NE>([&](auto e) { acc[e][g] = start; });
    });
    for (std::int64_t s = 0; s < slots; ++s, q += block_heads * 4) {
      const __m512i q0 = _mm512_load_si512(q), q1 = _mm512_load_si512(q + 64);
      const __m512i q2 = _mm512_load_si512(q + 128), q3 = _mm512_load_si512(q + 192);
      const std::uint8_t* key = unpacked + 4 * s;  // key e's bytes 4s … 4s + 3 at key + e · channels
      simd::unroll<NE / 2>([&](auto pair) {
        slot_pair(acc[2 * pair], acc[2 * pair + 1], key + 2 * pair * p.channels, key + (2 * pair + 1) * p.channels,
                  q0, q1, q2, q3);
      });
      if constexpr (NE % 2 == 1) {
        std::int32_t four;
        std::memcpy(&four, key + (NE - 1) * p.channels, sizeof four);
        const __m512i kb = _mm512_set1_epi32(four);
        acc[NE - 1][0] = dpbusd(acc[NE - 1][0], kb, q0);
        acc[NE - 1][1] = dpbusd(acc[NE - 1][1], kb, q1);
        acc[NE - 1][2] = dpbusd(acc[NE - 1][2], kb, q2);
        acc[NE - 1][3] = dpbusd(acc[NE - 1][3], kb, q3);
      }
    }
    // P' is exact in fp32 (|P'| < 2^24), max(P', 0) taken on the integers.
    __m512 b[NE];
    simd::unroll<NE>([&](auto e) {
      b[e] = _mm512_setzero_ps();
      simd::unroll<4>([&](auto g) {
        const __m512 r = _mm512_cvtepi32_ps(_mm512_max_epi32(acc[e][g], _mm512_setzero_si512()));
        b[e] = _mm512_fmadd_ps(r, _mm512_load_ps(p.w_scaled.data() + hb * block_heads + g * lanes), b[e]);
      });
    });
    if constexpr (NE == 4) {
      const __m128 s = halve4(b[0], b[1], b[2], b[3]);
      _mm_storeu_ps(out, hb == 0 ? s : _mm_add_ps(_mm_loadu_ps(out), s));
    } else {
      simd::unroll<NE>([&](auto e) { out[e] = hb == 0 ? halve(b[e]) : out[e] + halve(b[e]); });
    }
  }

  // halve() of four vectors at once, lane e of the result that of b_e: the same sums of the same
  // operands (so the same bits), four keys sharing each shuffle and add.
  static __m128 halve4(__m512 b0, __m512 b1, __m512 b2, __m512 b3) noexcept {
    // Distance 8: [low 8 | high 8] halves of two keys side by side, then added.
    const __m512 t01 = _mm512_add_ps(_mm512_shuffle_f32x4(b0, b1, 0x44), _mm512_shuffle_f32x4(b0, b1, 0xEE));
    const __m512 t23 = _mm512_add_ps(_mm512_shuffle_f32x4(b2, b3, 0x44), _mm512_shuffle_f32x4(b2, b3, 0xEE));
    // t01 = [t0 lanes 0–3, t0 4–7, t1 0–3, t1 4–7]; distance 4: one 128-bit lane per key.
    const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t01, t23, 0x88), _mm512_shuffle_f32x4(t01, t23, 0xDD));
    // Distance 2, then 1, inside each 128-bit lane; key e's sum ends in lane 4e.
    const __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4E));
    const __m512 w = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), w));
  }
#endif
};

}  // namespace phasekv::kernels
