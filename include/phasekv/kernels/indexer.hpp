#pragma once
// The lightning indexer's scores for a run of entries:
//
//   I_j = Σ_h w_h · ReLU(q_h · k_j)
//
// Shaped for decode: a few dozen indexer heads against tens of thousands of entries. The
// queries are transposed once per read to [channel][head] (heads padded to a whole number of
// 4-batch blocks with weight 0, so padding adds nothing), then each tile of entries keeps
// 4 batches of heads per entry in named registers while it streams the keys, and applies the
// ReLU, the weights and the sum over heads before anything is stored. A general GEMM would
// repack the queries for every page and write a heads × entries matrix back to memory first.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "phasekv/detail/simd/batch.hpp"
#include "phasekv/detail/simd/prefetch.hpp"
#include "phasekv/detail/simd/transpose.hpp"
#include "phasekv/detail/simd/unroll.hpp"

namespace phasekv::kernels {

// Queries [heads][channels] and weights [heads] in the kernel's layout:
// q_t[block][channel][block heads] and w[padded heads]. Independent of the ISA (a member of the
// reader, whose layout must not depend on compile flags).
struct indexer_queries {
  std::int64_t channels = 0, blocks = 0;
  simd::aligned_vector<float> q_t, w;
};

template <class Arch = simd::default_arch>
struct indexer {
  using batch = xsimd::batch<float, Arch>;
  static constexpr std::int64_t lanes = static_cast<std::int64_t>(batch::size);
  static constexpr std::int64_t block = 4 * lanes;  // heads per register block

  using prepared = indexer_queries;  // blocks of 4·lanes heads

  static void prepare(const float* queries, const float* weights, std::int64_t heads, std::int64_t channels,
                      prepared& p) {
    p.channels = channels;
    p.blocks = (heads + block - 1) / block;
    p.q_t.assign(static_cast<std::size_t>(p.blocks * channels * block), 0.0f);
    p.w.assign(static_cast<std::size_t>(p.blocks * block), 0.0f);
    std::copy(weights, weights + heads, p.w.begin());
    for (std::int64_t b = 0; b < p.blocks; ++b)
      simd::transpose_scaled<Arch>(queries + b * block * channels, std::min(block, heads - b * block), channels, channels,
                                   1.0f, p.q_t.data() + b * channels * block, block);
  }

  // out[j] = I_j for `count` entries whose keys are rows of `keys` (stride = channels). `next`,
  // if given, is where the caller reads next (the following page's keys, `next_count` rows): the
  // first block prefetches its rows `ahead` entries before they are scored, across the page
  // boundary, where the hardware prefetchers lose the stream.
  static void score(const prepared& p, const float* keys, std::int64_t count, float* out,
                    const float* next = nullptr, std::int64_t next_count = 0) noexcept {
    for (std::int64_t j = 0; j < count; ++j) out[j] = 0.0f;
    for (std::int64_t b = 0; b < p.blocks; ++b) {
      const float* q = p.q_t.data() + b * p.channels * block;
      const float* w = p.w.data() + b * block;
      std::int64_t j = 0;
      // Six entries keep 24 accumulators live: that fits AVX-512's 32 registers, not AVX2's 16.
      if constexpr (lanes >= 16)
        for (; j + 6 <= count; j += 6) {
          row_prefetcher later;
          if (b == 0) later = row_prefetcher(keys, count, next, next_count, j + ahead, p.channels);
          tile6(q, w, keys + j * p.channels, p.channels, out + j, later);
        }
      for (; j + 4 <= count; j += 4) tile4(q, w, keys + j * p.channels, p.channels, out + j);
      for (; j < count; ++j) tile1(q, w, keys + j * p.channels, p.channels, out + j);
    }
  }

 private:
  static constexpr std::int64_t ahead = 16;  // entries: enough scoring to cover a miss to DRAM

  // The six rows starting at entry `from` of keys[0, count) ++ next[0, next_count), prefetched a
  // few lines at a time while a tile runs (step() every 8 channels): issued all at once, their
  // 48 lines (128 channels) filled the core's miss buffers and stalled the tile's own loads, which
  // slows the kernel whenever the keys come from DRAM (a batch of sequences, a cold cache); with
  // the keys in cache the spreading changes nothing.
  struct row_prefetcher {
    const float* rows[6] = {};
    std::int64_t lines_per_row = 0, line = 0, end = 0, per_step = 0;

    row_prefetcher() = default;
    row_prefetcher(const float* keys, std::int64_t count, const float* next, std::int64_t next_count,
                   std::int64_t from, std::int64_t channels) noexcept {
      for (std::int64_t e = from; e < from + 6; ++e) {
        if (e < count) rows[e - from] = keys + e * channels;
        else if (e - count < next_count) rows[e - from] = next + (e - count) * channels;
      }
      lines_per_row = (channels + simd::line_floats - 1) / simd::line_floats;
      end = 6 * lines_per_row;
      const std::int64_t steps = (channels + 7) / 8;
      per_step = (end + steps - 1) / steps;
    }

    void step() noexcept {
      for (std::int64_t stop = std::min(end, line + per_step); line < stop; ++line)
        if (const float* row = rows[line / lines_per_row]) simd::prefetch(row + line % lines_per_row * simd::line_floats, 1);
    }
  };

  // Σ over the block's heads of w · ReLU(acc), for one entry's four accumulators.
  static float reduce(const float* w, const batch& a0, const batch& a1, const batch& a2, const batch& a3) noexcept {
    const batch zero(0.0f);
    batch s = xsimd::max(a0, zero) * batch::load_aligned(w);
    s = simd::fma(xsimd::max(a1, zero), batch::load_aligned(w + lanes), s);
    s = simd::fma(xsimd::max(a2, zero), batch::load_aligned(w + 2 * lanes), s);
    s = simd::fma(xsimd::max(a3, zero), batch::load_aligned(w + 3 * lanes), s);
    return simd::reduce_add(s);
  }

  // Six entries at a time: 24 accumulators, each query batch loaded once per channel; `later`
  // prefetches the rows of a tile to come.
  PHASEKV_NOINLINE static void tile6(const float* q, const float* w, const float* k, std::int64_t channels, float* out,
                                     row_prefetcher& later) noexcept {
    batch a00(0.0f), a01(0.0f), a02(0.0f), a03(0.0f), a10(0.0f), a11(0.0f), a12(0.0f), a13(0.0f);
    batch a20(0.0f), a21(0.0f), a22(0.0f), a23(0.0f), a30(0.0f), a31(0.0f), a32(0.0f), a33(0.0f);
    batch a40(0.0f), a41(0.0f), a42(0.0f), a43(0.0f), a50(0.0f), a51(0.0f), a52(0.0f), a53(0.0f);
    for (std::int64_t c = 0; c < channels; ++c, q += block) {
      if (c % 8 == 0) later.step();
      const batch q0 = batch::load_aligned(q), q1 = batch::load_aligned(q + lanes);
      const batch q2 = batch::load_aligned(q + 2 * lanes), q3 = batch::load_aligned(q + 3 * lanes);
      batch kb(k[c]);
      a00 = simd::fma(q0, kb, a00), a01 = simd::fma(q1, kb, a01), a02 = simd::fma(q2, kb, a02), a03 = simd::fma(q3, kb, a03);
      kb = batch(k[channels + c]);
      a10 = simd::fma(q0, kb, a10), a11 = simd::fma(q1, kb, a11), a12 = simd::fma(q2, kb, a12), a13 = simd::fma(q3, kb, a13);
      kb = batch(k[2 * channels + c]);
      a20 = simd::fma(q0, kb, a20), a21 = simd::fma(q1, kb, a21), a22 = simd::fma(q2, kb, a22), a23 = simd::fma(q3, kb, a23);
      kb = batch(k[3 * channels + c]);
      a30 = simd::fma(q0, kb, a30), a31 = simd::fma(q1, kb, a31), a32 = simd::fma(q2, kb, a32), a33 = simd::fma(q3, kb, a33);
      kb = batch(k[4 * channels + c]);
      a40 = simd::fma(q0, kb, a40), a41 = simd::fma(q1, kb, a41), a42 = simd::fma(q2, kb, a42), a43 = simd::fma(q3, kb, a43);
      kb = batch(k[5 * channels + c]);
      a50 = simd::fma(q0, kb, a50), a51 = simd::fma(q1, kb, a51), a52 = simd::fma(q2, kb, a52), a53 = simd::fma(q3, kb, a53);
    }
    out[0] += reduce(w, a00, a01, a02, a03);
    out[1] += reduce(w, a10, a11, a12, a13);
    out[2] += reduce(w, a20, a21, a22, a23);
    out[3] += reduce(w, a30, a31, a32, a33);
    out[4] += reduce(w, a40, a41, a42, a43);
    out[5] += reduce(w, a50, a51, a52, a53);
  }

  // Four entries at a time: 16 accumulators, each query batch loaded once per channel (held in
  // a register: simd::keep_in_register).
  PHASEKV_NOINLINE static void tile4(const float* q, const float* w, const float* k, std::int64_t channels, float* out) noexcept {
    batch a00(0.0f), a01(0.0f), a02(0.0f), a03(0.0f), a10(0.0f), a11(0.0f), a12(0.0f), a13(0.0f);
    batch a20(0.0f), a21(0.0f), a22(0.0f), a23(0.0f), a30(0.0f), a31(0.0f), a32(0.0f), a33(0.0f);
    for (std::int64_t c = 0; c < channels; ++c, q += block) {
      batch q0 = batch::load_aligned(q), q1 = batch::load_aligned(q + lanes);
      batch q2 = batch::load_aligned(q + 2 * lanes), q3 = batch::load_aligned(q + 3 * lanes);
      simd::keep_in_register(q0), simd::keep_in_register(q1), simd::keep_in_register(q2), simd::keep_in_register(q3);
      const batch k0(k[c]), k1(k[channels + c]), k2(k[2 * channels + c]), k3(k[3 * channels + c]);
      a00 = simd::fma(q0, k0, a00), a01 = simd::fma(q1, k0, a01), a02 = simd::fma(q2, k0, a02), a03 = simd::fma(q3, k0, a03);
      a10 = simd::fma(q0, k1, a10), a11 = simd::fma(q1, k1, a11), a12 = simd::fma(q2, k1, a12), a13 = simd::fma(q3, k1, a13);
      a20 = simd::fma(q0, k2, a20), a21 = simd::fma(q1, k2, a21), a22 = simd::fma(q2, k2, a22), a23 = simd::fma(q3, k2, a23);
      a30 = simd::fma(q0, k3, a30), a31 = simd::fma(q1, k3, a31), a32 = simd::fma(q2, k3, a32), a33 = simd::fma(q3, k3, a33);
    }
    out[0] += reduce(w, a00, a01, a02, a03);
    out[1] += reduce(w, a10, a11, a12, a13);
    out[2] += reduce(w, a20, a21, a22, a23);
    out[3] += reduce(w, a30, a31, a32, a33);
  }

  static void tile1(const float* q, const float* w, const float* k, std::int64_t channels, float* out) noexcept {
    batch a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
    for (std::int64_t c = 0; c < channels; ++c, q += block) {
      const batch kc(k[c]);
      a0 = simd::fma(batch::load_aligned(q), kc, a0);
      a1 = simd::fma(batch::load_aligned(q + lanes), kc, a1);
      a2 = simd::fma(batch::load_aligned(q + 2 * lanes), kc, a2);
      a3 = simd::fma(batch::load_aligned(q + 3 * lanes), kc, a3);
    }
    out[0] += reduce(w, a0, a1, a2, a3);
  }
};

}  // namespace phasekv::kernels
