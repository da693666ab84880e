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

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "phasekv/simd/batch.hpp"

namespace phasekv::kernels {

template <class Arch>
struct pool {
  using batch = xsimd::batch<float, Arch>;
  static constexpr std::int64_t lanes = static_cast<std::int64_t>(batch::size);

  // out[c] = Σ_i w[i] · x[i][c], c ∈ [0, channels). Four named accumulators hide FMA latency
  // (GCC spills an array of batches to the stack, see DESIGN.md §8).
  static void weighted_sum(const float* const* x, const float* w, std::int64_t slots, std::int64_t channels,
                           float* out) noexcept {
    std::int64_t c = 0;
    for (; c + 4 * lanes <= channels; c += 4 * lanes) {
      batch a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
      for (std::int64_t i = 0; i < slots; ++i) {
        const batch wi(w[i]);
        const float* xi = x[i] + c;
        a0 = xsimd::fma(wi, batch::load_unaligned(xi), a0);
        a1 = xsimd::fma(wi, batch::load_unaligned(xi + lanes), a1);
        a2 = xsimd::fma(wi, batch::load_unaligned(xi + 2 * lanes), a2);
        a3 = xsimd::fma(wi, batch::load_unaligned(xi + 3 * lanes), a3);
      }
      a0.store_unaligned(out + c);
      a1.store_unaligned(out + c + lanes);
      a2.store_unaligned(out + c + 2 * lanes);
      a3.store_unaligned(out + c + 3 * lanes);
    }
    for (; c + lanes <= channels; c += lanes) {
      batch a(0.0f);
      for (std::int64_t i = 0; i < slots; ++i) a = xsimd::fma(batch(w[i]), batch::load_unaligned(x[i] + c), a);
      a.store_unaligned(out + c);
    }
    for (; c < channels; ++c) {
      float a = 0.0f;
      for (std::int64_t i = 0; i < slots; ++i) a = std::fma(w[i], x[i][c], a);
      out[c] = a;
    }
  }

  // Per-channel softmax pooling. `weight_sums`, when not null, receives Σ_c α_i[c] per slot
  // (added to what it holds) for the diagnostics; `alpha_scratch` then needs slots·lanes floats.
  static void vector_gated(const float* const* x, const float* const* logit, const float* const* bias,
                           std::int64_t slots, std::int64_t channels, float* out, float* weight_sums,
                           float* alpha_scratch) noexcept {
    std::int64_t c = 0;
    for (; c + lanes <= channels; c += lanes) {
      batch m = batch::load_unaligned(logit[0] + c) + batch::load_unaligned(bias[0] + c);
      for (std::int64_t i = 1; i < slots; ++i)
        m = xsimd::max(m, batch::load_unaligned(logit[i] + c) + batch::load_unaligned(bias[i] + c));
      batch num(0.0f), den(0.0f);
      for (std::int64_t i = 0; i < slots; ++i) {
        const batch e = xsimd::exp(batch::load_unaligned(logit[i] + c) + batch::load_unaligned(bias[i] + c) - m);
        den += e;
        num = xsimd::fma(e, batch::load_unaligned(x[i] + c), num);
        if (weight_sums) e.store_unaligned(alpha_scratch + i * lanes);
      }
      (num / den).store_unaligned(out + c);
      if (weight_sums) {
        const batch inv = batch(1.0f) / den;
        for (std::int64_t i = 0; i < slots; ++i)
          weight_sums[i] += simd::reduce_add(batch::load_unaligned(alpha_scratch + i * lanes) * inv);
      }
    }
    for (; c < channels; ++c) {
      float m = logit[0][c] + bias[0][c];
      for (std::int64_t i = 1; i < slots; ++i) m = std::max(m, logit[i][c] + bias[i][c]);
      float num = 0.0f, den = 0.0f;
      for (std::int64_t i = 0; i < slots; ++i) {
        const float e = std::exp(logit[i][c] + bias[i][c] - m);
        den += e;
        num = std::fma(e, x[i][c], num);
      }
      out[c] = num / den;
      if (weight_sums)
        for (std::int64_t i = 0; i < slots; ++i) weight_sums[i] += std::exp(logit[i][c] + bias[i][c] - m) / den;
    }
  }

  // Σ x[c]² over a vector.
  static float sum_of_squares(const float* x, std::int64_t channels) noexcept {
    batch a(0.0f);
    std::int64_t c = 0;
    for (; c + lanes <= channels; c += lanes) {
      const batch v = batch::load_unaligned(x + c);
      a = xsimd::fma(v, v, a);
    }
    float s = simd::reduce_add(a);
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
