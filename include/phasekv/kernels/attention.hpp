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
// p[k][h] against the value rows (both passes near the FMA peak: bench/RESULTS.md). Sums run
// over keys in ascending order from zero, so a piece gives the same state wherever it runs.
//
// FP8 entries (fp8_e4m3_block, format/fp8.hpp) are dequantized inside both passes, never a page
// ahead of them: 16 codes at a time are widened in registers and multiplied by their block's
// scale (bf16 RoPE channels: shifted), one 64-channel block per key at a time. The logit tile
// widens its keys' next block into a line in L1 and broadcasts from it as it would from an fp32
// row; the output pass widens one block of every key of the piece (≤ 64 KiB), which all its
// head tiles then read — widening per head tile would repeat the work query_heads / 6 times.
// Where the values are the keys (tied K/V, DeepSeek-V4's entries and window) the logit tiles
// widen into the caller's rows instead of a line, and the output pass reads those as fp32 rows:
// each block is widened once per read, not twice.
// Dequantized values are exact in fp32 and every sum runs in the same order, so a read over fp8
// entries is bit-identical to the fp32 read of the dequantized entries (tests/test_read_fp8.cpp).
// Widening a block of 64 channels takes ~20 instructions by way of fp16 (format/fp8.hpp,
// fp8_decode_block; ~14 per 16 channels in integer arithmetic without AVX-512 BW/VL), next to
// the 256 FMAs and 64 broadcasts that 64 query heads spend on them in the logit pass, while the
// entries it reads from memory are 3.5× fewer bytes (bench_read's BM_sparse_decode_fp8 compares
// the two: bench/RESULTS.md).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "phasekv/format/fp8.hpp"
#include "phasekv/detail/simd/batch.hpp"
#include "phasekv/detail/simd/exp.hpp"
#include "phasekv/detail/simd/prefetch.hpp"
#include "phasekv/detail/simd/transpose.hpp"
#include "phasekv/detail/simd/unroll.hpp"

namespace phasekv::kernels {

// The queries of one KV head's group in the kernel's layout: q_t[channel][padded heads].
// Independent of the ISA (only `padded`, a value, depends on the vector width).
struct attention_queries {
  std::int64_t heads = 0, padded = 0, channels = 0;
  simd::aligned_vector<float> q_t;
};

// A piece's keys or values stored as fp8_e4m3_block: per key the first byte of its KV head's
// block layout, and that layout.
struct fp8_heads {
  const std::byte* const* heads = nullptr;
  fp8_head_layout layout;
};

// Where the output pass widens fp8 values: one block of channels of every key of a piece.
struct fp8_scratch {
  simd::aligned_vector<float> slab;  // [keys][64]
  std::vector<const float*> rows;    // the slab's rows
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
    p.q_t.resize(static_cast<std::size_t>(channels * p.padded));
    simd::transpose_scaled<Arch>(queries, heads, channels, channels, scale, p.q_t.data(), p.padded);
    if (heads < p.padded)
      for (std::int64_t c = 0; c < channels; ++c)
        std::fill(p.q_t.begin() + c * p.padded + heads, p.q_t.begin() + (c + 1) * p.padded, 0.0f);
  }

  // ℓ[k][h] for k < count into logits[k · padded + h] (aligned; padded heads included). Keys are
  // fp32 rows (const float* const*) or fp8 heads (fp8_heads). For fp8 keys, `widened` (if not
  // null, [count][channels] floats) receives every key dequantized, where the logit tiles widen
  // them anyway: an output pass over the same heads (tied K/V, as DeepSeek-V4's entries) then
  // reads them as fp32 rows instead of widening each block a second time.
  template <class Keys>
  static void logits(const prepared& p, const Keys& keys, std::int64_t count, float* out,
                     float* widened = nullptr) noexcept {
    for (std::int64_t h0 = 0; h0 < p.padded; h0 += head_batches * lanes) {
      switch (std::min(head_batches, (p.padded - h0) / lanes)) {
        case 4: logit_tiles<4>(p, h0, keys, count, out, widened); break;
        case 3: logit_tiles<3>(p, h0, keys, count, out, widened); break;
        case 2: logit_tiles<2>(p, h0, keys, count, out, widened); break;
        default: logit_tiles<1>(p, h0, keys, count, out, widened); break;
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
    output_columns(p, padded, heads, values, count, channels, o, channels);
  }

  // The same over fp8 values, widened one 64-channel block of every key at a time into `scratch`
  // (see the header comment) and summed by the fp32 code above: the same bits as output() over
  // the dequantized rows.
  static void output(const float* p, std::int64_t padded, std::int64_t heads, const fp8_heads& values,
                     std::int64_t count, std::int64_t channels, float* o, fp8_scratch& scratch) {
    constexpr std::int64_t width = fp8_head_layout::block_channels;
    scratch.slab.resize(static_cast<std::size_t>(count * width));
    scratch.rows.resize(static_cast<std::size_t>(count));
    for (std::int64_t k = 0; k < count; ++k) scratch.rows[static_cast<std::size_t>(k)] = scratch.slab.data() + k * width;
    for (std::int64_t c0 = 0; c0 < channels; c0 += width) {
      const std::int64_t n = std::min(width, channels - c0);
      for (std::int64_t k = 0; k < count; ++k) {
        // Whole heads ahead on the first block; the later blocks find them in the cache.
        if (c0 == 0 && k + output_ahead < count) simd::prefetch_bytes(values.heads[k + output_ahead], values.layout.bytes);
        fp8_decode_channels(values.heads[k], values.layout, c0, n, scratch.slab.data() + k * width);
      }
      output_columns(p, padded, heads, scratch.rows.data(), count, n, o + c0, channels);
    }
  }

 private:
  // Columns [0, width) of the output, whose rows are o_stride floats apart.
  static void output_columns(const float* p, std::int64_t padded, std::int64_t heads, const float* const* values,
                             std::int64_t count, std::int64_t width, float* o, std::int64_t o_stride) noexcept {
    std::int64_t c = 0;
    for (; c + channel_batches * lanes <= width; c += channel_batches * lanes)
      output_tiles<channel_batches>(p, padded, heads, values, count, c, o_stride, o);
    for (; c + lanes <= width; c += lanes) output_tiles<1>(p, padded, heads, values, count, c, o_stride, o);
    for (; c < width; ++c)
      for (std::int64_t h = 0; h < heads; ++h) {
        float a = 0.0f;
        for (std::int64_t k = 0; k < count; ++k) a = std::fma(p[k * padded + h], values[k][c], a);
        o[h * o_stride + c] = a;
      }
  }

  static const float* const* advance(const float* const* rows, std::int64_t n) noexcept { return rows + n; }
  static fp8_heads advance(const fp8_heads& keys, std::int64_t n) noexcept { return {keys.heads + n, keys.layout}; }

  template <std::int64_t NB, class Keys>
  static void logit_tiles(const prepared& p, std::int64_t h0, const Keys& keys, std::int64_t count, float* out,
                          float* widened) noexcept {
    auto rows = [&](std::int64_t k) { return widened ? widened + k * p.channels : nullptr; };
    std::int64_t k = 0;
    for (; k + tile_keys <= count; k += tile_keys) {
      // Prefetch the next tile's rows when it is whole: selected entries lie anywhere in the
      // cache, and each row is only a few dozen lines long, too short for the hardware
      // prefetchers to get going.
      logit_tile<NB, tile_keys>(p, h0, advance(keys, k), k + 2 * tile_keys <= count, out + k * p.padded, rows(k));
    }
    // The last count mod tile_keys keys in one narrower tile (each query batch loaded once for
    // them all, not once per key).
    if constexpr (!wide) {
      for (; k < count; ++k) logit_tile<NB, 1>(p, h0, advance(keys, k), false, out + k * p.padded, rows(k));
      return;
    }
    switch (count - k) {
      case 5: logit_tile<NB, 5>(p, h0, advance(keys, k), false, out + k * p.padded, rows(k)); break;
      case 4: logit_tile<NB, 4>(p, h0, advance(keys, k), false, out + k * p.padded, rows(k)); break;
      case 3: logit_tile<NB, 3>(p, h0, advance(keys, k), false, out + k * p.padded, rows(k)); break;
      case 2: logit_tile<NB, 2>(p, h0, advance(keys, k), false, out + k * p.padded, rows(k)); break;
      case 1: logit_tile<NB, 1>(p, h0, advance(keys, k), false, out + k * p.padded, rows(k)); break;
      default: break;
    }
  }

  // fp8 keys are widened a block (64 channels) at a time: fewer, longer runs of the conversion.
  static constexpr std::int64_t fp8_chunk = fp8_head_layout::block_channels;
  template <std::int64_t NK>
  struct alignas(64) fp8_lines {
    float values[NK][fp8_chunk];
  };
  struct no_lines {};

  // NB batches of heads from h0 against NK keys: NB·NK accumulators, each query batch loaded
  // once per channel and each key channel broadcast once — from the fp32 row itself, or from
  // the 64-channel line an fp8 key was just widened into: on the stack, or in the caller's
  // rows (`widened`: key k's at widened + k · channels) when it keeps them.
  template <std::int64_t NB, std::int64_t NK, class Keys>
  PHASEKV_FLATTEN static void logit_tile(const prepared& p, std::int64_t h0, const Keys& keys, bool prefetch_next,
                                         float* out, [[maybe_unused]] float* widened) noexcept {
    constexpr bool fp8 = std::is_same_v<Keys, fp8_heads>;
    batch acc[NK][NB];
    simd::unroll<NK>([&](auto k) { simd::unroll<NB>([&](auto b) { acc[k][b] = batch(0.0f); }); });
    const float* row[NK];
    // fp8: the widened lines (nothing for fp32, whose frame stays as it was), and the next tile's
    // heads fetched a few cache lines per block of channels.
    [[maybe_unused]] std::conditional_t<fp8, fp8_lines<NK>, no_lines> line;
    [[maybe_unused]] std::int64_t head_lines = 0, lines_per_chunk = 0;
    if constexpr (fp8) {
      const std::int64_t chunks = (p.channels + fp8_chunk - 1) / fp8_chunk;
      head_lines = (keys.layout.bytes + 63) / 64;
      lines_per_chunk = (head_lines + chunks - 1) / chunks;
    } else {
      simd::unroll<NK>([&](auto k) { row[k] = keys[k]; });
    }
    const float* q = p.q_t.data() + h0;
    constexpr std::int64_t chunk = fp8 ? fp8_chunk : simd::line_floats;
    for (std::int64_t c0 = 0; c0 < p.channels; c0 += chunk) {
      const std::int64_t c1 = std::min(p.channels, c0 + chunk);
      std::int64_t base = 0;  // the channel row[k][0] holds
      if constexpr (fp8) {
        if (prefetch_next) {
          const std::int64_t first = c0 / fp8_chunk * lines_per_chunk;
          const std::int64_t n = std::min(head_lines, first + lines_per_chunk) - first;
          if (n > 0) simd::unroll<NK>([&](auto k) { simd::prefetch_bytes(keys.heads[NK + k] + first * 64, n * 64); });
        }
        simd::unroll<NK>([&](auto k) {
          float* to = widened ? widened + k * p.channels + c0 : line.values[k];
          fp8_decode_channels(keys.heads[k], keys.layout, c0, c1 - c0, to);
          row[k] = to;
        });
        base = c0;
      } else {
        if (prefetch_next) simd::unroll<NK>([&](auto k) { simd::prefetch(keys[NK + k] + c0, 1); });
      }
      for (std::int64_t c = c0; c < c1; ++c, q += p.padded) {
        batch qb[NB];
        simd::unroll<NB>([&](auto b) {
          qb[b] = batch::load_aligned(q + b * lanes);
          if constexpr (NK > 1) simd::keep_in_register(qb[b]);  // GCC folded it into the tail tiles' FMAs
        });
        simd::unroll<NK>([&](auto k) {
          const batch kc(row[k][c - base]);
          simd::unroll<NB>([&](auto b) { acc[k][b] = simd::fma(qb[b], kc, acc[k][b]); });
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

  // `channels` is the stride of o's rows.
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
        simd::unroll<NC>([&](auto n) { acc[h][n] = simd::fma(w, vb[n], acc[h][n]); });
      });
    }
    simd::unroll<NH>([&](auto h) {
      simd::unroll<NC>([&](auto n) { acc[h][n].store_unaligned(o + (h0 + h) * channels + c + n * lanes); });
    });
  }
};

}  // namespace phasekv::kernels
