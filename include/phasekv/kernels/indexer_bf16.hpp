#pragma once
// The lightning indexer in bf16 (reader_config::indexer_precision = bf16), as DeepSeek runs its
// indexer in low precision:
//
//   I_j = Σ_h w_h · ReLU(q̃_h · k̃_j)      q̃, k̃: queries and keys rounded to bf16
//
// Each product of two bf16 values is exact in fp32; the sums run in fp32. With AVX512-BF16,
// vdpbf16ps adds two such products per fp32 lane per instruction, so the kernel below — the
// shape of kernels/indexer.hpp over channel *pairs*: a tile of 6 entries against 4 batches of 16
// heads, 24 accumulators — does half the instructions of the fp32 kernel and reads half its
// key bytes, straight from the bf16 pages. Without AVX512-BF16 (or with an odd channel count)
// the reader widens the keys and runs the fp32 kernel on the rounded queries instead: the same
// products, summed in another order, so scores agree to fp32 rounding, not bit for bit.

#include <cstdint>
#include <cstring>
#include <vector>

#include "phasekv/format/storage.hpp"
#include "phasekv/detail/simd/batch.hpp"
#include "phasekv/detail/simd/unroll.hpp"

#include "phasekv/detail/simd/config.hpp"
#if PHASEKV_HAS_BF16_DOT
#include "phasekv/detail/simd/intrinsics.hpp"
#endif

namespace phasekv::kernels {

// Whether this build scores bf16 indexer keys with vdpbf16ps.
inline constexpr bool has_bf16_dot = PHASEKV_HAS_BF16_DOT != 0;

// Queries [heads][channels] rounded to bf16, back in fp32 (for the fallback path and for tests).
inline void round_to_bf16(const float* in, std::int64_t n, float* out) noexcept {
  for (std::int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(float_to_bf16(in[i]));
}

// The bf16 kernel's queries: q_t[block][pair][64 heads], each 32-bit lane holding a head's
// channels 2p (low half) and 2p + 1 (high half) in bf16 — the order of two consecutive bf16 keys
// in memory. Defined in every build (empty unless the kernel runs), so the reader that holds one
// has one layout whatever the flags.
struct indexer_bf16_queries {
  std::int64_t channels = 0, pairs = 0, blocks = 0;
  simd::aligned_vector<std::uint32_t> q_t;
  simd::aligned_vector<float> w;
};

#if PHASEKV_HAS_BF16_DOT

struct indexer_bf16 {
  static constexpr std::int64_t lanes = 16;
  static constexpr std::int64_t block = 4 * lanes;  // heads per register block
  static constexpr std::int64_t tile_entries = 6;

  using prepared = indexer_bf16_queries;

  static bool supports(std::int64_t channels) noexcept { return channels % 2 == 0; }

  static void prepare(const float* queries, const float* weights, std::int64_t heads, std::int64_t channels,
                      prepared& p) {
    p.channels = channels;
    p.pairs = channels / 2;
    p.blocks = (heads + block - 1) / block;
    p.q_t.assign(static_cast<std::size_t>(p.blocks * p.pairs * block), 0u);
    p.w.assign(static_cast<std::size_t>(p.blocks * block), 0.0f);
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t b = h / block, lane = h % block;
      p.w[static_cast<std::size_t>(h)] = weights[h];
      for (std::int64_t c = 0; c < channels; ++c) {
        const std::uint32_t bits = float_to_bf16(queries[h * channels + c]);
        p.q_t[static_cast<std::size_t>((b * p.pairs + c / 2) * block + lane)] |= bits << (16 * (c % 2));
      }
    }
  }

  // out[j] = I_j for `count` entries whose bf16 keys are rows of `keys`, `stride` elements apart.
  static void score(const prepared& p, const std::uint16_t* keys, std::int64_t stride, std::int64_t count,
                    float* out) noexcept {
    for (std::int64_t j = 0; j < count; ++j) out[j] = 0.0f;
    for (std::int64_t b = 0; b < p.blocks; ++b) {
      const std::uint32_t* q = p.q_t.data() + b * p.pairs * block;
      const float* w = p.w.data() + b * block;
      std::int64_t j = 0;
      for (; j + tile_entries <= count; j += tile_entries) tile<tile_entries>(p, q, w, keys + j * stride, stride, out + j);
      const std::uint16_t* k = keys + j * stride;
      switch (count - j) {  // the last few entries in one tile
        case 5: tile<5>(p, q, w, k, stride, out + j); break;
        case 4: tile<4>(p, q, w, k, stride, out + j); break;
        case 3: tile<3>(p, q, w, k, stride, out + j); break;
        case 2: tile<2>(p, q, w, k, stride, out + j); break;
        case 1: tile<1>(p, q, w, k, stride, out + j); break;
        default: break;
      }
    }
  }

 private:
  // NE entries against the 4 head batches of one block: NE·4 accumulators.
  template <std::int64_t NE>
  PHASEKV_FLATTEN static void tile(const prepared& p, const std::uint32_t* q, const float* w, const std::uint16_t* k,
                                   std::int64_t stride, float* out) noexcept {
    __m512 acc[NE][4];
    simd::unroll<NE>([&](auto e) { simd::unroll<4>([&](auto b) { acc[e][b] = _mm512_setzero_ps(); }); });
    for (std::int64_t pair = 0; pair < p.pairs; ++pair, q += block) {
      __m512bh qb[4];
      simd::unroll<4>([&](auto b) { qb[b] = (__m512bh)_mm512_load_si512(q + b * lanes); });
      simd::unroll<NE>([&](auto e) {
        std::uint32_t two;  // keys 2·pair and 2·pair + 1 of entry e
        std::memcpy(&two, k + e * stride + 2 * pair, sizeof two);
        const __m512bh kb = (__m512bh)_mm512_set1_epi32(static_cast<int>(two));
        simd::unroll<4>([&](auto b) { acc[e][b] = _mm512_dpbf16_ps(acc[e][b], qb[b], kb); });
      });
    }
    const __m512 zero = _mm512_setzero_ps();
    simd::unroll<NE>([&](auto e) {
      __m512 s = _mm512_mul_ps(_mm512_max_ps(acc[e][0], zero), _mm512_load_ps(w));
      s = _mm512_fmadd_ps(_mm512_max_ps(acc[e][1], zero), _mm512_load_ps(w + lanes), s);
      s = _mm512_fmadd_ps(_mm512_max_ps(acc[e][2], zero), _mm512_load_ps(w + 2 * lanes), s);
      s = _mm512_fmadd_ps(_mm512_max_ps(acc[e][3], zero), _mm512_load_ps(w + 3 * lanes), s);
      out[e] += _mm512_reduce_add_ps(s);
    });
  }
};

#endif

}  // namespace phasekv::kernels
