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

#include "phasekv/core/error.hpp"

#include "phasekv/simd/intrinsics.hpp"  // before Eigen, which includes the intrinsics too
#include <Eigen/Core>

namespace phasekv {

class softmax_state {
 public:
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  softmax_state() = default;
  softmax_state(std::int64_t heads, std::int64_t channels) { reset(heads, channels); }

  void reset(std::int64_t heads, std::int64_t channels) {
    m_.setConstant(heads, -std::numeric_limits<float>::infinity());
    d_.setZero(heads);
    o_.setZero(heads, channels);
  }

  std::int64_t heads() const noexcept { return m_.size(); }
  std::int64_t channels() const noexcept { return o_.cols(); }
  bool empty(std::int64_t h) const noexcept { return d_[h] == 0.0f; }
  float max_logit(std::int64_t h) const noexcept { return m_[h]; }
  float denominator(std::int64_t h) const noexcept { return d_[h]; }
  const matrix& accumulator() const noexcept { return o_; }

  // The state of a block of keys at once: logits (heads × keys) are turned in place into
  // exp(ℓ − m) per row, and values (keys × channels) weighted by them. Rows of logits that are
  // all −∞ (every key masked) stay empty.
  template <class Values>
  void assign_block(matrix& logits, const Values& values) {
    for (Eigen::Index h = 0; h < logits.rows(); ++h) {
      const float m = logits.cols() > 0 ? logits.row(h).maxCoeff() : -std::numeric_limits<float>::infinity();
      m_[h] = m;
      if (m == -std::numeric_limits<float>::infinity()) {
        logits.row(h).setZero();
        d_[h] = 0.0f;
        continue;
      }
      logits.row(h) = (logits.row(h).array() - m).exp().matrix();
      d_[h] = logits.row(h).sum();
    }
    if (logits.cols() > 0) o_.noalias() = logits * values;
    else o_.setZero();
  }

  // The state of a block computed elsewhere (attention_kernel.hpp): m[h] and d[h] per head.
  // Returns the accumulator (heads × channels, row-major), left unset for the caller to fill.
  float* assign(std::int64_t heads, std::int64_t channels, const float* m, const float* d) {
    m_ = Eigen::Map<const Eigen::VectorXf>(m, heads);
    d_ = Eigen::Map<const Eigen::VectorXf>(d, heads);
    o_.resize(heads, channels);
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
    for (Eigen::Index h = 0; h < heads; ++h) {
      if (lse[h] == -inf || lse[h] == inf) continue;
      m_[h] = lse[h];
      d_[h] = 1.0f;
      // o_ is row-major, so a row is contiguous (a plain copy: GCC 12 warns falsely about
      // Eigen's packet path when it sees a 4-channel row inlined).
      std::copy(out + h * channels, out + (h + 1) * channels, o_.row(h).data());
    }
  }

  // ln of head h's whole softmax denominator, ln(d·e^m + e^sink): the log-sum-exp of its logits,
  // with the sink's (if any). −∞ for a head with no keys and no sink.
  float log_denominator(std::int64_t h, const float* sink_logits) const noexcept {
    const float sink = sink_logits ? sink_logits[h] : -std::numeric_limits<float>::infinity();
    if (d_[h] == 0.0f) return sink;
    if (sink == -std::numeric_limits<float>::infinity()) return m_[h] + std::log(d_[h]);
    const float m = std::max(m_[h], sink);
    return m + std::log(d_[h] * std::exp(m_[h] - m) + std::exp(sink - m));
  }

  // This ← this ∪ other (same heads and channels).
  void merge(const softmax_state& other) noexcept {
    for (Eigen::Index h = 0; h < m_.size(); ++h) {
      if (other.d_[h] == 0.0f) continue;
      if (d_[h] == 0.0f) {
        m_[h] = other.m_[h];
        d_[h] = other.d_[h];
        o_.row(h) = other.o_.row(h);
        continue;
      }
      const float m = std::max(m_[h], other.m_[h]);
      const float a = std::exp(m_[h] - m), b = std::exp(other.m_[h] - m);
      m_[h] = m;
      d_[h] = d_[h] * a + other.d_[h] * b;
      o_.row(h) = o_.row(h) * a + other.o_.row(h) * b;
    }
  }

  // Per head: the factor that turns exp(ℓ − m) of this state into a final probability, given
  // an optional sink logit per head — 1 / (d + exp(sink − m)) in this state's frame.
  float normaliser(std::int64_t h, const float* sink_logits) const noexcept {
    // A sink of −inf takes no mass: the same as no sink (and no −inf − (−inf) below).
    if (!sink_logits || sink_logits[h] == -std::numeric_limits<float>::infinity())
      return d_[h] > 0.0f ? 1.0f / d_[h] : 0.0f;
    const float m = std::max(m_[h], sink_logits[h]);
    const float total = (d_[h] > 0.0f ? d_[h] * std::exp(m_[h] - m) : 0.0f) + std::exp(sink_logits[h] - m);
    return std::exp(m_[h] - m) / total;
  }

  // out (heads × channels, row-major) = Σ p·v with the sinks (if any) in the denominators;
  // zeros for a head with no keys.
  void finish(float* out, const float* sink_logits = nullptr) const noexcept {
    for (Eigen::Index h = 0; h < m_.size(); ++h) {
      const float scale = d_[h] > 0.0f ? normaliser(h, sink_logits) : 0.0f;
      Eigen::Map<Eigen::RowVectorXf>(out + h * o_.cols(), o_.cols()) = o_.row(h) * scale;
    }
  }

 private:
  Eigen::VectorXf m_;
  Eigen::VectorXf d_;
  matrix o_;
};

}  // namespace phasekv
