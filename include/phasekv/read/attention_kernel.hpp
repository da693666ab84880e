#pragma once
// Attention of the query heads of one KV head over one piece of keys, shaped
// for decode — dozens of query heads sharing each key (MQA/GQA), hundreds of keys per piece:
//
//   logits   ℓ[k][h] = Σ_c q'[h][c] · key_k[c]          q' = scale · q
//   softmax  m[h] = max_k ℓ[k][h],  p[k][h] = exp(ℓ[k][h] − m[h]),  d[h] = Σ_k p[k][h]
//   output   o[h][c] = Σ_k p[k][h] · value_k[c]
//
// Keys and values arrive as row pointers — selected entries straight from their pages, window
// tokens from the ring — so nothing is gathered or packed per read. The logits keep the query
// heads in SIMD lanes, like the indexer: the queries are transposed once per read to
// [channel][heads] (heads padded to whole batches with zero queries, whose results are never
// read), and a tile of 6 keys broadcasts their channels against 4 batches of heads, 24
// accumulators (AVX-512). The max, exp and sum then run down the keys with heads in lanes. The
// output keeps channels in lanes instead: a tile of 6 heads × 4 channel batches broadcasts
// p[k][h] against the value rows. On one core of Zen 5 the two passes run at ~200 and ~175
// GFLOP/s on a 64-head, 512-channel, 256-key piece whose rows are in the L2. Sums run over keys in ascending order from zero, so a piece gives
// the same state wherever it runs.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "phasekv/simd/batch.hpp"
#include "phasekv/simd/exp.hpp"
#include "phasekv/simd/prefetch.hpp"
#include "phasekv/simd/unroll.hpp"

namespace phasekv::kernels {

// The queries of one KV head's group in the kernel's layout: q_t[channel][padded heads].
// Independent of the ISA (only `padded`, a value, depends on the vector width).
struct attention_queries {
  std::int64_t heads = 0, padded = 0, channels = 0;
  simd::aligned_vector<float> q_t;
};

template <class Arch = simd::default_arch>
struct attention {
  using batch = xsimd::batch<float, Arch>;
  using aligned_floats = simd::aligned_vector<float>;
  static constexpr std::int64_t lanes = static_cast<std::int64_t>(batch::size);
  // Tile shapes: 24 accumulators plus the loaded batches fit AVX-512's 32 registers; with 16
  // (AVX2, SSE) the tiles shrink to 8 and 12 accumulators rather than spill.
  static constexpr bool wide = lanes >= 16;
  static constexpr std::int64_t head_batches = 4;             // batches of heads per logit tile
  static constexpr std::int64_t tile_keys = wide ? 6 : 2;     // keys per logit tile
  static constexpr std::int64_t tile_heads = 6;               // heads per output tile
  static constexpr std::int64_t channel_batches = wide ? 4 : 2;  // batches of channels per output tile

  using prepared = attention_queries;

  static std::int64_t padded_heads(std::int64_t heads) noexcept { return (heads + lanes - 1) / lanes * lanes; }

  static void prepare(const float* queries, std::int64_t heads, std::int64_t channels, float scale, prepared& p) {
    p.heads = heads;
    p.padded = padded_heads(heads);
    p.channels = channels;
    p.q_t.assign(static_cast<std::size_t>(channels * p.padded), 0.0f);
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t c = 0; c < channels; ++c)
        p.q_t[static_cast<std::size_t>(c * p.padded + h)] = queries[h * channels + c] * scale;
  }

  // ℓ[k][h] for k < count into logits[k · padded + h] (aligned; padded heads included).
  static void logits(const prepared& p, const float* const* keys, std::int64_t count, float* out) noexcept {
    for (std::int64_t h0 = 0; h0 < p.padded; h0 += head_batches * lanes) {
      switch (std::min(head_batches, (p.padded - h0) / lanes)) {
        case 4: logit_tiles<4>(p, h0, keys, count, out); break;
        case 3: logit_tiles<3>(p, h0, keys, count, out); break;
        case 2: logit_tiles<2>(p, h0, keys, count, out); break;
        default: logit_tiles<1>(p, h0, keys, count, out); break;
      }
    }
  }

  // In place, logits → p = exp(ℓ − m) down each head's column; m[h] and d[h] for every padded
  // head (count ≥ 1).
  static void softmax(float* l, std::int64_t count, std::int64_t padded, float* m, float* d) noexcept {
    for (std::int64_t h = 0; h < padded; h += lanes) {
      batch mx = batch::load_aligned(l + h);
      for (std::int64_t k = 1; k < count; ++k) mx = xsimd::max(mx, batch::load_aligned(l + k * padded + h));
      batch sum(0.0f);
      for (std::int64_t k = 0; k < count; ++k) {
        const batch e = simd::exp_bounded_above(batch::load_aligned(l + k * padded + h) - mx);
        e.store_aligned(l + k * padded + h);
        sum += e;
      }
      mx.store_unaligned(m + h);
      sum.store_unaligned(d + h);
    }
  }

  // o[h][c] = Σ_k p[k · padded + h] · values[k][c] for h < heads, c < channels (o row-major).
  static void output(const float* p, std::int64_t padded, std::int64_t heads, const float* const* values,
                     std::int64_t count, std::int64_t channels, float* o) noexcept {
    std::int64_t c = 0;
    for (; c + channel_batches * lanes <= channels; c += channel_batches * lanes)
      output_tiles<channel_batches>(p, padded, heads, values, count, c, channels, o);
    for (; c + lanes <= channels; c += lanes) output_tiles<1>(p, padded, heads, values, count, c, channels, o);
    for (; c < channels; ++c)
      for (std::int64_t h = 0; h < heads; ++h) {
        float a = 0.0f;
        for (std::int64_t k = 0; k < count; ++k) a = std::fma(p[k * padded + h], values[k][c], a);
        o[h * channels + c] = a;
      }
  }

 private:
  template <std::int64_t NB>
  static void logit_tiles(const prepared& p, std::int64_t h0, const float* const* keys, std::int64_t count,
                          float* out) noexcept {
    std::int64_t k = 0;
    for (; k + tile_keys <= count; k += tile_keys) {
      // The next tile's rows, when whole: selected entries lie anywhere in the cache, and each
      // row is only a few dozen lines long, too short for the hardware prefetchers to get going.
      const float* const* ahead = k + 2 * tile_keys <= count ? keys + k + tile_keys : nullptr;
      logit_tile<NB, tile_keys>(p, h0, keys + k, ahead, out + k * p.padded);
    }
    // The last count mod tile_keys keys in one narrower tile (each query batch loaded once for
    // them all, not once per key).
    if constexpr (!wide) {
      for (; k < count; ++k) logit_tile<NB, 1>(p, h0, keys + k, nullptr, out + k * p.padded);
      return;
    }
    switch (count - k) {
      case 5: logit_tile<NB, 5>(p, h0, keys + k, nullptr, out + k * p.padded); break;
      case 4: logit_tile<NB, 4>(p, h0, keys + k, nullptr, out + k * p.padded); break;
      case 3: logit_tile<NB, 3>(p, h0, keys + k, nullptr, out + k * p.padded); break;
      case 2: logit_tile<NB, 2>(p, h0, keys + k, nullptr, out + k * p.padded); break;
      case 1: logit_tile<NB, 1>(p, h0, keys + k, nullptr, out + k * p.padded); break;
      default: break;
    }
  }

  // NB batches of heads from h0 against NK keys: NB·NK accumulators, each query batch loaded
  // once per channel and each key channel broadcast once.
  template <std::int64_t NB, std::int64_t NK>
  PHASEKV_FLATTEN static void logit_tile(const prepared& p, std::int64_t h0, const float* const* keys,
                                         const float* const* ahead, float* out) noexcept {
    batch acc[NK][NB];
    simd::unroll<NK>([&](auto k) { simd::unroll<NB>([&](auto b) { acc[k][b] = batch(0.0f); }); });
    const float* row[NK];
    simd::unroll<NK>([&](auto k) { row[k] = keys[k]; });
    const float* q = p.q_t.data() + h0;
    for (std::int64_t c0 = 0; c0 < p.channels; c0 += simd::line_floats) {
      if (ahead) simd::unroll<NK>([&](auto k) { simd::prefetch(ahead[k] + c0, 1); });
      const std::int64_t c1 = std::min(p.channels, c0 + simd::line_floats);
      for (std::int64_t c = c0; c < c1; ++c, q += p.padded) {
        batch qb[NB];
        simd::unroll<NB>([&](auto b) { qb[b] = batch::load_aligned(q + b * lanes); });
        simd::unroll<NK>([&](auto k) {
          const batch kc(row[k][c]);
          simd::unroll<NB>([&](auto b) { acc[k][b] = xsimd::fma(qb[b], kc, acc[k][b]); });
        });
      }
    }
    simd::unroll<NK>([&](auto k) {
      simd::unroll<NB>([&](auto b) { acc[k][b].store_aligned(out + k * p.padded + h0 + b * lanes); });
    });
  }

  // Keys ahead whose value slices the output pass prefetches: the rows lie anywhere (selected
  // entries), so no hardware prefetcher predicts them.
  static constexpr std::int64_t output_ahead = 8;

  template <std::int64_t NC>
  static void output_tiles(const float* p, std::int64_t padded, std::int64_t heads, const float* const* values,
                           std::int64_t count, std::int64_t c, std::int64_t channels, float* o) noexcept {
    std::int64_t h = 0;
    for (; h + tile_heads <= heads; h += tile_heads) output_tile<tile_heads, NC>(p, padded, h, values, count, c, channels, o);
    switch (heads - h) {
      case 5: output_tile<5, NC>(p, padded, h, values, count, c, channels, o); break;
      case 4: output_tile<4, NC>(p, padded, h, values, count, c, channels, o); break;
      case 3: output_tile<3, NC>(p, padded, h, values, count, c, channels, o); break;
      case 2: output_tile<2, NC>(p, padded, h, values, count, c, channels, o); break;
      case 1: output_tile<1, NC>(p, padded, h, values, count, c, channels, o); break;
      default: break;
    }
  }

  // NH heads from h0 × NC channel batches from c: each value batch loaded once per key and each
  // probability broadcast once.
  template <std::int64_t NH, std::int64_t NC>
  PHASEKV_FLATTEN static void output_tile(const float* p, std::int64_t padded, std::int64_t h0, const float* const* values,
                          std::int64_t count, std::int64_t c, std::int64_t channels, float* o) noexcept {
    batch acc[NH][NC];
    simd::unroll<NH>([&](auto h) { simd::unroll<NC>([&](auto n) { acc[h][n] = batch(0.0f); }); });
    const float* pk = p + h0;
    for (std::int64_t k = 0; k < count; ++k, pk += padded) {
      if (k + output_ahead < count) simd::prefetch(values[k + output_ahead] + c, NC * lanes);
      const float* v = values[k] + c;
      batch vb[NC];
      simd::unroll<NC>([&](auto n) { vb[n] = batch::load_unaligned(v + n * lanes); });
      simd::unroll<NH>([&](auto h) {
        const batch w(pk[h]);
        simd::unroll<NC>([&](auto n) { acc[h][n] = xsimd::fma(w, vb[n], acc[h][n]); });
      });
    }
    simd::unroll<NH>([&](auto h) {
      simd::unroll<NC>([&](auto n) { acc[h][n].store_unaligned(o + (h0 + h) * channels + c + n * lanes); });
    });
  }
};

}  // namespace phasekv::kernels
