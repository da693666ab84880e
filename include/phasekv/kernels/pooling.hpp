#pragma once
// The inner loops of pooling: one entry, one head, a run of channels. Each slot's payload (and
// gate logits) arrive as a row pointer, so the same kernel reads tokens from the caller's chunk
// and from the pending ring without copying them together first.
//
//   shared weights (mean pool, fixed weights, scalar gates):   out[c] = Σ_i w_i · x_i[c]
//   vector gates:  m = max_i s_i[c],  e_i = exp(s_i[c] − m),  out[c] = Σ_i e_i x_i[c] / Σ_i e_i
//                  with s_i = logit_i + bias_i; the max-subtraction keeps exp finite for any logits.
//
// Accumulation order is fixed (slots ascending), which is what makes streaming bit-identical:
// the same tokens give the same entry however they were chunked.
//
// A prefill reads every input row once, a few KB at a time from 2·W rows per entry: streams too
// short for the hardware prefetchers to run far ahead when the rows come from memory. So the
// kernels can also take the rows of the *next* entry (`ahead`, may be empty) and prefetch them
// one cache line per channel step, about an entry's compute time before they are needed. That
// pays when the input comes from memory, and costs when it is still in the L3, where the
// hardware keeps up and the prefetches only take issue slots (bench/RESULTS.md, "Prefill
// compression"). The caller decides (prefetch_min_bytes).
//
// Payload and logit rows are fp32 or bf16 bits (std::uint16_t), each kernel a template on the
// row types. A bf16 row is loaded by widening (detail/simd/bf16.hpp: exact), and everything after the
// load is the same code, so a kernel on bf16 rows gives bit for bit what it gives on their fp32
// widenings — while a prefill reads half the input bytes. Bias rows are always fp32.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "phasekv/detail/simd/batch.hpp"
#include "phasekv/detail/simd/bf16.hpp"
#include "phasekv/detail/simd/exp.hpp"
#include "phasekv/detail/simd/prefetch.hpp"
#include "phasekv/detail/simd/unroll.hpp"

namespace phasekv::kernels {

using simd::unroll;

// Chunks with at least this many input bytes are prefetched as above. Smaller ones were most
// likely written by the host just before the append and still sit in its last-level cache
// (32 MiB on the machine of bench/RESULTS.md; 16 MiB leaves room for everything else there).
inline constexpr std::int64_t prefetch_min_bytes = std::int64_t{16} << 20;

using simd::line_floats;
using simd::prefetch;
using simd::prefetch_row;
using simd::to_float;

template <class Arch>
struct pool {
  using batch = xsimd::batch<float, Arch>;
  static constexpr std::int64_t lanes = static_cast<std::int64_t>(batch::size);

  // lanes consecutive channels of a row (fp32, or bf16 widened exactly) as fp32.
  static batch load(const float* p) noexcept { return batch::load_unaligned(p); }
  static batch load(const std::uint16_t* p) noexcept { return simd::load<Arch>(p); }

  // out[c] = Σ_i w[i] · x[i][c], c ∈ [0, channels). Four named accumulators hide FMA latency
  // (GCC spills an array of batches to the stack).
  template <class X>
  static void weighted_sum(const X* const* x, const float* w, std::int64_t slots, std::int64_t channels,
                           float* out, const prefetch_row* ahead = nullptr, std::int64_t ahead_rows = 0) noexcept {
    std::int64_t c = 0;
    for (; c + 4 * lanes <= channels; c += 4 * lanes) {
      for (std::int64_t k = 0; k < ahead_rows; ++k) prefetch<4 * lanes>(ahead[k], c);
      batch a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
      for (std::int64_t i = 0; i < slots; ++i) {
        const batch wi(w[i]);
        const X* xi = x[i] + c;
        a0 = simd::fma(wi, load(xi), a0);
        a1 = simd::fma(wi, load(xi + lanes), a1);
        a2 = simd::fma(wi, load(xi + 2 * lanes), a2);
        a3 = simd::fma(wi, load(xi + 3 * lanes), a3);
      }
      a0.store_unaligned(out + c);
      a1.store_unaligned(out + c + lanes);
      a2.store_unaligned(out + c + 2 * lanes);
      a3.store_unaligned(out + c + 3 * lanes);
    }
    for (; c + lanes <= channels; c += lanes) {
      batch a(0.0f);
      for (std::int64_t i = 0; i < slots; ++i) a = simd::fma(batch(w[i]), load(x[i] + c), a);
      a.store_unaligned(out + c);
    }
    for (; c < channels; ++c) {
      float a = 0.0f;
      for (std::int64_t i = 0; i < slots; ++i) a = std::fma(w[i], to_float(x[i][c]), a);
      out[c] = a;
    }
  }

  // Per-channel softmax pooling. `weight_sums`, when not null, receives Σ_c α_i[c] per slot
  // (added to what it holds) for the diagnostics; `alpha_scratch` then needs slots·lanes floats.
  //
  // Up to 8 slots the slot count is a template parameter, and each channel batch loads every
  // slot's logit, bias and payload once and keeps the W logits in registers through the max, the
  // exps and the sums (tiling over 2–8 channel batches, slots outermost, gains nothing). Larger
  // windows take two passes per channel batch — max, then exp-and-accumulate — reloading the
  // logits from L1. Both run the sums in ascending slot order from 0 with the same exp, so either
  // gives the same entry, bit for bit.

  template <class X, class L>
  static void vector_gated(const X* const* x, const L* const* logit, const float* const* bias,
                           std::int64_t slots, std::int64_t channels, float* out, float* weight_sums,
                           float* alpha_scratch, const prefetch_row* ahead = nullptr,
                           std::int64_t ahead_rows = 0) noexcept {
    std::int64_t c = 0;
    switch (slots) {
      case 1: c = vector_gated_unrolled<1>(x, logit, bias, channels, out, weight_sums, ahead, ahead_rows); break;
      case 2: c = vector_gated_unrolled<2>(x, logit, bias, channels, out, weight_sums, ahead, ahead_rows); break;
      case 3: c = vector_gated_unrolled<3>(x, logit, bias, channels, out, weight_sums, ahead, ahead_rows); break;
      case 4: c = vector_gated_unrolled<4>(x, logit, bias, channels, out, weight_sums, ahead, ahead_rows); break;
      case 5: c = vector_gated_unrolled<5>(x, logit, bias, channels, out, weight_sums, ahead, ahead_rows); break;
      case 6: c = vector_gated_unrolled<6>(x, logit, bias, channels, out, weight_sums, ahead, ahead_rows); break;
      case 7: c = vector_gated_unrolled<7>(x, logit, bias, channels, out, weight_sums, ahead, ahead_rows); break;
      case 8: c = vector_gated_unrolled<8>(x, logit, bias, channels, out, weight_sums, ahead, ahead_rows); break;
      default:
        c = vector_gated_two_pass(x, logit, bias, slots, channels, out, weight_sums, alpha_scratch, ahead, ahead_rows);
    }
    // The last channels % lanes channels, one at a time (libm's exp: few enough not to matter).
    for (; c < channels; ++c) {
      float m = to_float(logit[0][c]) + bias[0][c];
      for (std::int64_t i = 1; i < slots; ++i) m = std::max(m, to_float(logit[i][c]) + bias[i][c]);
      float num = 0.0f, den = 0.0f;
      for (std::int64_t i = 0; i < slots; ++i) {
        const float e = std::exp(to_float(logit[i][c]) + bias[i][c] - m);
        den += e;
        num = std::fma(e, to_float(x[i][c]), num);
      }
      out[c] = num / den;
      if (weight_sums)
        for (std::int64_t i = 0; i < slots; ++i)
          weight_sums[i] += std::exp(to_float(logit[i][c]) + bias[i][c] - m) / den;
    }
  }

  // The whole batches of vector_gated for exactly N slots; returns where the tail starts.
  template <std::int64_t N, class X, class L>
  static std::int64_t vector_gated_unrolled(const X* const* x, const L* const* logit,
                                            const float* const* bias, std::int64_t channels, float* out,
                                            float* weight_sums, const prefetch_row* ahead,
                                            std::int64_t ahead_rows) noexcept {
    std::int64_t c = 0;
    for (; c + lanes <= channels; c += lanes) {
      for (std::int64_t k = 0; k < ahead_rows; ++k) prefetch<lanes>(ahead[k], c);
      batch s[N];
      unroll<N>([&](auto i) { s[i] = load(logit[i] + c) + batch::load_unaligned(bias[i] + c); });
      batch m = s[0];
      unroll<N - 1>([&](auto i) { m = xsimd::max(m, s[i + 1]); });
      unroll<N>([&](auto i) { s[i] = simd::exp_bounded_above(s[i] - m); });
      // den = 0 + e_0 + e_1 + …, num = fma(e_i, x_i, …) from 0, as in the two-pass path. The
      // first term is an fma from 0 too, not a product: GCC contracts a product into whatever
      // it meets after inlining, and inlining differs between instantiations (fp32 or bf16
      // rows), which made bf16 rows pool differently from their widenings (seen at W = 6).
      batch den = s[0];
      batch num = simd::fma(s[0], load(x[0] + c), batch(0.0f));
      unroll<N - 1>([&](auto i) {
        den += s[i + 1];
        num = simd::fma(s[i + 1], load(x[i + 1] + c), num);
      });
      (num / den).store_unaligned(out + c);
      if (weight_sums) {
        const batch inv = batch(1.0f) / den;
        // (An fma from 0 for the same reason: a bare product could be contracted into the sum.)
        unroll<N>([&](auto i) { weight_sums[i] += simd::reduce_add(simd::fma(s[i], inv, batch(0.0f))); });
      }
    }
    return c;
  }

  template <class X, class L>
  static std::int64_t vector_gated_two_pass(const X* const* x, const L* const* logit,
                                            const float* const* bias, std::int64_t slots, std::int64_t channels,
                                            float* out, float* weight_sums, float* alpha_scratch,
                                            const prefetch_row* ahead, std::int64_t ahead_rows) noexcept {
    std::int64_t c = 0;
    for (; c + lanes <= channels; c += lanes) {
      for (std::int64_t k = 0; k < ahead_rows; ++k) prefetch<lanes>(ahead[k], c);
      batch m = load(logit[0] + c) + batch::load_unaligned(bias[0] + c);
      for (std::int64_t i = 1; i < slots; ++i) m = xsimd::max(m, load(logit[i] + c) + batch::load_unaligned(bias[i] + c));
      batch num(0.0f), den(0.0f);
      for (std::int64_t i = 0; i < slots; ++i) {
        const batch e = simd::exp_bounded_above(load(logit[i] + c) + batch::load_unaligned(bias[i] + c) - m);
        den += e;
        num = simd::fma(e, load(x[i] + c), num);
        if (weight_sums) e.store_unaligned(alpha_scratch + i * lanes);
      }
      (num / den).store_unaligned(out + c);
      if (weight_sums) {
        const batch inv = batch(1.0f) / den;
        for (std::int64_t i = 0; i < slots; ++i)
          weight_sums[i] += simd::reduce_add(simd::fma(batch::load_unaligned(alpha_scratch + i * lanes), inv, batch(0.0f)));
      }
    }
    return c;
  }

  // Σ x[c]² over a vector. Four accumulators: with one, the FMA latency chain (C/lanes steps of
  // 4 cycles) would make the RMSNorm a visible part of a gated entry.
  static float sum_of_squares(const float* x, std::int64_t channels) noexcept {
    batch a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
    std::int64_t c = 0;
    for (; c + 4 * lanes <= channels; c += 4 * lanes) {
      const batch v0 = batch::load_unaligned(x + c), v1 = batch::load_unaligned(x + c + lanes);
      const batch v2 = batch::load_unaligned(x + c + 2 * lanes), v3 = batch::load_unaligned(x + c + 3 * lanes);
      a0 = simd::fma(v0, v0, a0);
      a1 = simd::fma(v1, v1, a1);
      a2 = simd::fma(v2, v2, a2);
      a3 = simd::fma(v3, v3, a3);
    }
    for (; c + lanes <= channels; c += lanes) {
      const batch v = batch::load_unaligned(x + c);
      a0 = simd::fma(v, v, a0);
    }
    float s = simd::reduce_add((a0 + a1) + (a2 + a3));
    for (; c < channels; ++c) s = std::fma(x[c], x[c], s);
    return s;
  }

  // x[c] ← x[c] · scale · w[c]   (w may be null: ones)
  static void scale(float* x, float s, const float* w, std::int64_t channels) noexcept {
    std::int64_t c = 0;
    const batch sb(s);
    if (w) {
      for (; c + lanes <= channels; c += lanes)
        (batch::load_unaligned(x + c) * sb * batch::load_unaligned(w + c)).store_unaligned(x + c);
      for (; c < channels; ++c) x[c] = x[c] * s * w[c];
    } else {
      for (; c + lanes <= channels; c += lanes) (batch::load_unaligned(x + c) * sb).store_unaligned(x + c);
      for (; c < channels; ++c) x[c] = x[c] * s;
    }
  }
};

}  // namespace phasekv::kernels
