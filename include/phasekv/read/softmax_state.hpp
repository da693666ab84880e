#pragma once
// The online-softmax partial state of a group of query heads. For one head and a
// set of keys with logits ℓ_i and values v_i:
//
//   m = max_i ℓ_i,   d = Σ_i exp(ℓ_i − m),   o = Σ_i exp(ℓ_i − m) · v_i
//
// Two states over disjoint sets merge exactly (up to rounding) into the state of their union:
//
//   m = max(m_a, m_b),  d = d_a·e^(m_a−m) + d_b·e^(m_b−m),  o = o_a·e^(m_a−m) + o_b·e^(m_b−m)
//
// so the compressed part and the window part of a read — or any split of either — are computed
// separately and merged. The empty set is m = −∞, d = 0, o = 0 and merges as the identity
// (no exp(−∞ − (−∞)) is ever formed). An attention sink adds exp(sink − m) to the denominator
// only: it takes probability mass without contributing a value.
//
// A finished read is the pair (out, lse): out = o / D, lse = ln D with D = d·e^m (+ e^sink), the
// softmax's full denominator. It is again a state — m = lse, d = 1, o = out — since that state's
// denominator d·e^m = D and numerator o·e^m = Σ exp(ℓ)·v are the read's own; so finished reads of
// disjoint key sets (an engine's attention branches) merge exactly (assign_normalised, merge,
// finish).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/detail/simd/batch.hpp"

namespace phasekv {

class softmax_state {
 public:
  softmax_state() = default;
  softmax_state(std::int64_t heads, std::int64_t channels) { reset(heads, channels); }

  void reset(std::int64_t heads, std::int64_t channels) {
    channels_ = channels;
    m_.assign(static_cast<std::size_t>(heads), -std::numeric_limits<float>::infinity());
    d_.assign(static_cast<std::size_t>(heads), 0.0f);
    o_.assign(static_cast<std::size_t>(heads * channels), 0.0f);
  }

  std::int64_t heads() const noexcept { return static_cast<std::int64_t>(m_.size()); }
  std::int64_t channels() const noexcept { return channels_; }
  bool empty(std::int64_t h) const noexcept { return d_[static_cast<std::size_t>(h)] == 0.0f; }
  float max_logit(std::int64_t h) const noexcept { return m_[static_cast<std::size_t>(h)]; }
  float denominator(std::int64_t h) const noexcept { return d_[static_cast<std::size_t>(h)]; }
  // Head h's o: Σ exp(ℓ − m) · v over its keys (channels floats).
  span<const float> accumulator(std::int64_t h) const noexcept {
    return span<const float>(o_.data() + h * channels_, static_cast<std::size_t>(channels_));
  }

  // The state of a block of `keys` keys at once: logits (heads × keys, row-major) are turned in
  // place into exp(ℓ − m) per row, and values (keys × channels, row-major) weighted by them. Rows
  // of logits that are all −∞ (every key masked) stay empty. The plain form of what the reader's
  // kernels compute (kernels/attention.hpp), for states built outside a read.
  void assign_block(float* logits, std::int64_t keys, const float* values) {
    for (std::int64_t h = 0; h < heads(); ++h) {
      float* row = logits + h * keys;
      const float m = keys > 0 ? *std::max_element(row, row + keys) : -std::numeric_limits<float>::infinity();
      m_[static_cast<std::size_t>(h)] = m;
      float* o = o_.data() + h * channels_;
      std::fill(o, o + channels_, 0.0f);
      if (m == -std::numeric_limits<float>::infinity()) {
        std::fill(row, row + keys, 0.0f);
        d_[static_cast<std::size_t>(h)] = 0.0f;
        continue;
      }
      float d = 0.0f;
      for (std::int64_t i = 0; i < keys; ++i) d += row[i] = std::exp(row[i] - m);
      d_[static_cast<std::size_t>(h)] = d;
      for (std::int64_t i = 0; i < keys; ++i)
        for (std::int64_t c = 0; c < channels_; ++c) o[c] += row[i] * values[i * channels_ + c];
    }
  }

  // The state of a block computed elsewhere (kernels/attention.hpp): m[h] and d[h] per head.
  // Returns the accumulator (heads × channels, row-major), left unset for the caller to fill.
  float* assign(std::int64_t heads, std::int64_t channels, const float* m, const float* d) {
    channels_ = channels;
    m_.assign(m, m + heads);
    d_.assign(d, d + heads);
    o_.resize(static_cast<std::size_t>(heads * channels));
    return o_.data();
  }

  // The state of a finished read: out (heads × channels, row-major) with its log-sum-exp per head
  // (the log of its whole softmax denominator, sink included). lse = −∞ is the empty state, and so
  // is +∞, FlashMLA's convention for a head that read nothing (lse_convention::flashmla). A NaN
  // lse, or a non-finite output row of a head that is not empty, is an input_error naming the
  // head, with the state unchanged: merged, it would turn every later state of that head into NaN.
  void assign_normalised(std::int64_t heads, std::int64_t channels, const float* out, const float* lse) {
    constexpr float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t h = 0; h < heads; ++h) {
      if (std::isnan(lse[h]))
        detail::fail<input_error>("softmax_state.assign_normalised: lse[" + std::to_string(h) + "]", lse[h],
                                  "must be a log-sum-exp, or ±inf for a head that read nothing");
      if (std::isinf(lse[h])) continue;
      for (std::int64_t c = 0; c < channels; ++c)
        if (!std::isfinite(out[h * channels + c]))
          detail::fail<input_error>("softmax_state.assign_normalised: out[" + std::to_string(h) + "][" + std::to_string(c) + "]",
                                    out[h * channels + c], "must be finite where lse is finite");
    }
    reset(heads, channels);
    for (std::int64_t h = 0; h < heads; ++h) {
      if (lse[h] == -inf || lse[h] == inf) continue;
      m_[static_cast<std::size_t>(h)] = lse[h];
      d_[static_cast<std::size_t>(h)] = 1.0f;
      std::copy(out + h * channels, out + (h + 1) * channels, o_.data() + h * channels);
    }
  }

  // ln of head h's whole softmax denominator, ln(d·e^m + e^sink): the log-sum-exp of its logits,
  // with the sink's (if any). −∞ for a head with no keys and no sink.
  float log_denominator(std::int64_t h, const float* sink_logits) const noexcept {
    const float sink = sink_logits ? sink_logits[h] : -std::numeric_limits<float>::infinity();
    const float d = denominator(h), mh = max_logit(h);
    if (d == 0.0f) return sink;
    if (sink == -std::numeric_limits<float>::infinity()) return mh + std::log(d);
    const float m = std::max(mh, sink);
    return m + std::log(d * std::exp(mh - m) + std::exp(sink - m));
  }

  // This ← this ∪ other (same heads and channels).
  void merge(const softmax_state& other) noexcept {
    for (std::size_t h = 0; h < m_.size(); ++h) {
      if (other.d_[h] == 0.0f) continue;
      float* o = o_.data() + static_cast<std::int64_t>(h) * channels_;
      const float* p = other.o_.data() + static_cast<std::int64_t>(h) * channels_;
      if (d_[h] == 0.0f) {
        m_[h] = other.m_[h];
        d_[h] = other.d_[h];
        std::copy(p, p + channels_, o);
        continue;
      }
      const float m = std::max(m_[h], other.m_[h]);
      const float a = std::exp(m_[h] - m), b = std::exp(other.m_[h] - m);
      m_[h] = m;
      d_[h] = d_[h] * a + other.d_[h] * b;
      scaled_sum(o, a, p, b, channels_);
    }
  }

  // Per head: the factor that turns exp(ℓ − m) of this state into a final probability, given
  // an optional sink logit per head — 1 / (d + exp(sink − m)) in this state's frame.
  float normaliser(std::int64_t h, const float* sink_logits) const noexcept {
    const float d = denominator(h), mh = max_logit(h);
    // A sink of −inf takes no mass: the same as no sink (and no −inf − (−inf) below).
    if (!sink_logits || sink_logits[h] == -std::numeric_limits<float>::infinity()) return d > 0.0f ? 1.0f / d : 0.0f;
    const float m = std::max(mh, sink_logits[h]);
    const float total = (d > 0.0f ? d * std::exp(mh - m) : 0.0f) + std::exp(sink_logits[h] - m);
    return std::exp(mh - m) / total;
  }

  // out (heads × channels, row-major) = Σ p·v with the sinks (if any) in the denominators;
  // zeros for a head with no keys.
  void finish(float* out, const float* sink_logits = nullptr) const noexcept {
    for (std::int64_t h = 0; h < heads(); ++h) {
      const float scale = denominator(h) > 0.0f ? normaliser(h, sink_logits) : 0.0f;
      scaled_copy(out + h * channels_, o_.data() + h * channels_, scale, channels_);
    }
  }

 private:
  // o ← o·a + p·b and out ← o·scale over n floats, a vector at a time: each element rounded as
  // the scalar expression rounds it, so the tail and the vectors agree.
  static void scaled_sum(float* o, float a, const float* p, float b, std::int64_t n) noexcept {
    using batch = simd::float_batch<simd::default_arch>;
    constexpr std::int64_t lanes = static_cast<std::int64_t>(batch::size);
    const batch va(a), vb(b);
    std::int64_t c = 0;
    for (; c + lanes <= n; c += lanes)
      (batch::load_unaligned(o + c) * va + batch::load_unaligned(p + c) * vb).store_unaligned(o + c);
    for (; c < n; ++c) o[c] = o[c] * a + p[c] * b;
  }
  static void scaled_copy(float* out, const float* o, float scale, std::int64_t n) noexcept {
    using batch = simd::float_batch<simd::default_arch>;
    constexpr std::int64_t lanes = static_cast<std::int64_t>(batch::size);
    const batch vs(scale);
    std::int64_t c = 0;
    for (; c + lanes <= n; c += lanes) (batch::load_unaligned(o + c) * vs).store_unaligned(out + c);
    for (; c < n; ++c) out[c] = o[c] * scale;
  }

  std::int64_t channels_ = 0;
  std::vector<float> m_, d_;  // per head
  std::vector<float> o_;      // heads × channels, row-major
};

}  // namespace phasekv
