#pragma once
// The built-in poolings written as pooling policies of the host's (compress/policies.hpp, "Your
// own pooling"), on the library's own kernels: what the extension point can express, and what it
// costs. Each twin gives the entries and slot weights of its built-in, bit for bit
// (tests/test_compress_point_twins.cpp), and bench/bench_write.cpp times each against its
// built-in in the same run (run_all: *_point_over_fused).
//
//   mean_twin            α_i = 1/n                                  out = Σ_i α_i x_i
//   fixed_twin           α_i = p_i / Σ_real p (0 if that sum is 0)
//   scalar_gated_twin    α_i = softmax_i(logit_i + b_i), one logit per token
//   vector_gated_twin    per channel: α_i[c] = softmax_i(logit_i[c] + b_i[c])
//
// The learned bias b is the built-ins' stream_params::slot_bias layout, [kv_heads][W][gates], held
// by the twin (a policy of the host's keeps its own parameters). The twins declare
// reads_bf16_rows, so bf16 inputs reach them in place as they reach the built-ins; what the point
// does not give them is the next entry's rows to prefetch. RoPE before pooling is the built-ins'
// only.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <phasekv/compress/policies.hpp>
#include <phasekv/kernels/pooling.hpp>
#include <phasekv/core/error.hpp>
#include <phasekv/core/span.hpp>
#include <phasekv/detail/simd/bf16.hpp>

namespace phasekv_examples {

namespace twin_detail {
using kernel = phasekv::kernels::pool<phasekv::simd::default_arch>;

// f(payload rows, logit rows) with the row types the point handed over (fp32 or bf16 in place).
template <class F>
void with_rows(const phasekv::window_rows& w, F&& f) {
  if (w.payload_bf16) {
    if (w.logits_bf16) f(w.payload_bf16, w.logits_bf16);
    else f(w.payload_bf16, w.logits);
  } else {
    if (w.logits_bf16) f(w.payload, w.logits_bf16);
    else f(w.payload, w.logits);
  }
}

// Σ_i w_i x_i over the window's real rows, as the built-ins' shared-weight path pools; w[i] is
// also the slot weight of real slot i.
inline void shared_weight_pool(const phasekv::window_rows& w, const float* weights, float* out) {
  with_rows(w, [&](const auto* const* x, const auto*) { kernel::weighted_sum(x, weights, w.count(), w.channels, out); });
  if (w.slot_weights)
    for (std::int64_t k = 0; k < w.count(); ++k) w.slot_weights[k] += weights[k];
}

}  // namespace twin_detail

struct mean_twin {
  static constexpr const char* name = "mean_twin";
  static constexpr std::uint32_t version = 1;
  static constexpr bool reads_bf16_rows = true;
  static constexpr std::int64_t gate_channels(std::int64_t) { return 0; }

  void pool(const phasekv::window_rows& w, float* out) const {
    thread_local std::vector<float> weights;
    weights.assign(static_cast<std::size_t>(w.count()), 1.0f / static_cast<float>(w.count()));
    twin_detail::shared_weight_pool(w, weights.data(), out);
  }
};

struct fixed_twin {
  static constexpr const char* name = "fixed_twin";
  static constexpr std::uint32_t version = 1;
  static constexpr bool reads_bf16_rows = true;
  static constexpr std::int64_t gate_channels(std::int64_t) { return 0; }

  fixed_twin() = default;
  explicit fixed_twin(std::vector<float> profile) : profile_(std::move(profile)) {}
  phasekv::span<const float> parameters() const { return {profile_.data(), profile_.size()}; }

  void pool(const phasekv::window_rows& w, float* out) const {
    if (static_cast<std::int64_t>(profile_.size()) != w.window)
      phasekv::detail::fail<phasekv::input_error>("fixed_twin.profile.size()", profile_.size(),
                                                  "must equal the window " + std::to_string(w.window));
    thread_local std::vector<float> weights;
    weights.resize(static_cast<std::size_t>(w.count()));
    double sum = 0.0;
    for (std::int64_t k = 0; k < w.count(); ++k) sum += profile_[static_cast<std::size_t>(w.slot(k))];
    const double inv = sum > 0.0 ? 1.0 / sum : 0.0;
    for (std::int64_t k = 0; k < w.count(); ++k)
      weights[static_cast<std::size_t>(k)] = static_cast<float>(profile_[static_cast<std::size_t>(w.slot(k))] * inv);
    twin_detail::shared_weight_pool(w, weights.data(), out);
  }

 private:
  std::vector<float> profile_;
};

// Gated twins: `bias` is [kv_heads][window][gates] (empty: zeros), gates = gate_channels(channels).
template <phasekv::gate_width Width>
class gated_twin {
 public:
  static constexpr const char* name = Width == phasekv::gate_width::vector ? "vector_gated_twin" : "scalar_gated_twin";
  static constexpr std::uint32_t version = 1;
  static constexpr bool reads_bf16_rows = true;
  static constexpr std::int64_t gate_channels(std::int64_t channels) {
    return Width == phasekv::gate_width::vector ? channels : 1;
  }

  gated_twin() = default;
  gated_twin(std::int64_t kv_heads, std::int64_t window, std::int64_t channels, std::vector<float> bias = {})
      : heads_(kv_heads), window_(window), gates_(gate_channels(channels)), bias_(std::move(bias)) {
    const std::int64_t size = heads_ * window_ * gates_;
    if (bias_.empty()) bias_.assign(static_cast<std::size_t>(size), 0.0f);
    if (static_cast<std::int64_t>(bias_.size()) != size)
      phasekv::detail::fail<phasekv::config_error>("gated_twin.bias.size()", bias_.size(),
                                                   "must be kv_heads × window × gate channels = " + std::to_string(size));
  }
  phasekv::span<const float> parameters() const { return {bias_.data(), bias_.size()}; }

  void pool(const phasekv::window_rows& w, float* out) const {
    if (w.window != window_ || w.head >= heads_ || gate_channels(w.channels) != gates_)
      phasekv::detail::fail<phasekv::input_error>("gated_twin.window", window_,
                                                  "built for another stream (window " + std::to_string(w.window) + ", head " +
                                                      std::to_string(w.head) + ", channels " + std::to_string(w.channels) + ")");
    const std::int64_t n = w.count();
    thread_local std::vector<const float*> bias_rows;
    bias_rows.resize(static_cast<std::size_t>(n));
    for (std::int64_t k = 0; k < n; ++k)
      bias_rows[static_cast<std::size_t>(k)] = bias_.data() + (w.head * window_ + w.slot(k)) * gates_;
    const float* const* b = bias_rows.data();

    if constexpr (Width == phasekv::gate_width::vector) {
      thread_local std::vector<float> alpha;  // the kernel's scratch for slot weights beyond 8 slots
      alpha.resize(static_cast<std::size_t>(n * twin_detail::kernel::lanes));
      twin_detail::with_rows(w, [&](const auto* const* x, const auto* const* logits) {
        twin_detail::kernel::vector_gated(x, logits, b, n, w.channels, out, w.slot_weights, alpha.data());
      });
      if (w.slot_weights)  // the kernel sums α over channels: their mean is the slot's weight
        for (std::int64_t k = 0; k < n; ++k) w.slot_weights[k] /= static_cast<float>(w.channels);
    } else {
      thread_local std::vector<float> weights;
      weights.resize(static_cast<std::size_t>(n));
      const auto s = [&](std::int64_t k) {  // s_k = logit_k + b_k, the logit widened if bf16
        return (w.logits_bf16 ? phasekv::simd::bf16_to_float(w.logits_bf16[k][0]) : w.logits[k][0]) + b[k][0];
      };
      float m = s(0);
      for (std::int64_t k = 1; k < n; ++k) m = std::max(m, s(k));
      float den = 0.0f;
      for (std::int64_t k = 0; k < n; ++k) den += (weights[static_cast<std::size_t>(k)] = std::exp(s(k) - m));
      for (float& a : weights) a /= den;
      twin_detail::shared_weight_pool(w, weights.data(), out);
    }
  }

 private:
  std::int64_t heads_ = 0, window_ = 0, gates_ = 0;
  std::vector<float> bias_;
};
using vector_gated_twin = gated_twin<phasekv::gate_width::vector>;
using scalar_gated_twin = gated_twin<phasekv::gate_width::scalar>;

}  // namespace phasekv_examples
