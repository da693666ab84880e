#pragma once
// The scalar twin of phasekv::stream_compressor: docs/DESIGN.md §2 (geometry) and §3 (compression)
// written out as plain loops in double precision, for the tests to hold the kernel to.
//
// It deliberately uses nothing from the library but the configuration structs and the policy
// tags: every position, view, frequency and weight is recomputed here from the definitions.
//
//   lead            = (S − origin) mod S                       (virtual padding tokens, §2)
//   slot i of j     = token t = (j+1)·S − W − lead + i;  t < 0 is padding
//   entry j         complete once token (j+1)·S − 1 − lead is appended
//   view of slot i  = floor((W − 1 − i) / S) (per_branch)  or  i (per_slot)
//   mean pool       K̂ = (1/n) Σ_real x_i
//   fixed weights   α_i = p_i / Σ_real p   (all zero when that sum is 0)
//   gated pool      s_i = logit_i + bias_i,  α = softmax over real slots (max-subtracted),
//                   K̂ = Σ α_i ⊙ x_i       (per channel for vector gates, shared for scalar)
//   RMSNorm         x · 1/sqrt(mean(x²) + eps) · w                (after pooling)
//   RoPE            last R channels, θ_k = base^(−2k/R) (YaRN-scaled), angle p·θ_k;
//                   before pool at each slot's token t, after pool (and after RMSNorm) at the
//                   entry's anchor position.
//   slot weights    per head and slot, mean over channels of α (0 for padding).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "phasekv/compress/policies.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/rope.hpp"

namespace phasekv_test {

struct oracle_entry {
  std::int64_t index = 0;
  std::int64_t anchor = 0;
  std::vector<double> values;        // [kv_heads][channels]
  std::vector<double> slot_weights;  // [kv_heads][window]
  // [kv_heads] the size of the terms the entry was summed from, for tolerances:
  // max_c Σ_i α_i[c]·|x_i[c]|, times the RMSNorm factor 1/rms·|w_c| when there is one.
  std::vector<double> term_scale;
};

namespace oracle_detail {

// Floor division for possibly negative positions (C++ '/' truncates towards zero).
inline std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

template <class Pooling>
constexpr bool is_vector_gate = std::is_same_v<Pooling, phasekv::gated_pool<phasekv::gate_width::vector>>;
template <class Pooling>
constexpr bool is_scalar_gate = std::is_same_v<Pooling, phasekv::gated_pool<phasekv::gate_width::scalar>>;

// RoPE frequencies θ_k = base^(−2k/R), k ∈ [0, R/2), then YaRN (rope.hpp header comment):
//   d(r) = R·ln(L / (2π·r)) / (2·ln base),  low = max(floor(d(beta_fast)), 0),
//   high = min(ceil(d(beta_slow)), R − 1), raised to low when below it (where DeepSeek's code
//   would interpolate every pair, §3 keeps them all), +0.001 when equal to low,
//   ramp_k = clamp((k − low)/(high − low), 0, 1),  θ_k ← θ_k/factor·ramp_k + θ_k·(1 − ramp_k).
inline std::vector<double> rope_frequencies(const phasekv::rope_config& rope) {
  const std::int64_t rotated = rope.channels;
  const double r = static_cast<double>(rotated);
  std::vector<double> theta;
  for (std::int64_t k = 0; k < rotated / 2; ++k)
    theta.push_back(std::pow(rope.base, -2.0 * static_cast<double>(k) / r));
  if (rope.yarn.enabled && !theta.empty()) {
    const double pi = std::acos(-1.0);
    const double context = static_cast<double>(rope.yarn.original_context);
    const double d_fast = r * std::log(context / (2.0 * pi * rope.yarn.beta_fast)) / (2.0 * std::log(rope.base));
    const double d_slow = r * std::log(context / (2.0 * pi * rope.yarn.beta_slow)) / (2.0 * std::log(rope.base));
    const double low = std::max(std::floor(d_fast), 0.0);
    double high = std::min(std::ceil(d_slow), r - 1.0);
    if (high < low) high = low;
    if (high == low) high += 0.001;
    for (std::size_t k = 0; k < theta.size(); ++k) {
      double ramp = (static_cast<double>(k) - low) / (high - low);
      ramp = std::min(1.0, std::max(0.0, ramp));
      theta[k] = theta[k] / rope.yarn.factor * ramp + theta[k] * (1.0 - ramp);
    }
  }
  return theta;
}

// Rotates the last R channels of x[0 .. channels) by position·θ_k, pair by pair (§3):
// interleaved pairs (2k, 2k+1), half-split pairs (k, k + R/2);  a' = a·cos − b·sin,
// b' = a·sin + b·cos.
inline void rotate(double* x, std::int64_t channels, const phasekv::rope_config& rope,
                   const std::vector<double>& theta, double position) {
  const std::int64_t rotated = rope.channels;
  const std::int64_t first = channels - rotated;
  const std::int64_t pairs = rotated / 2;
  for (std::int64_t k = 0; k < pairs; ++k) {
    std::int64_t ia, ib;
    if (rope.layout == phasekv::rope_layout::interleaved) {
      ia = first + 2 * k;
      ib = first + 2 * k + 1;
    } else {
      ia = first + k;
      ib = first + k + pairs;
    }
    const double angle = position * theta[static_cast<std::size_t>(k)];
    const double c = std::cos(angle), s = std::sin(angle);
    const double a = x[ia], b = x[ib];
    x[ia] = a * c - b * s;
    x[ib] = a * s + b * c;
  }
}

}  // namespace oracle_detail

// Views per token (stream_config.hpp input layout): ceil(W/S) branches, or W slots.
inline std::int64_t oracle_views(const phasekv::geometry& geom, const phasekv::stream_config& config) {
  if (config.inputs == phasekv::input_layout::per_branch) return (geom.window + geom.stride - 1) / geom.stride;
  return geom.window;
}

// Logits per (token, view): C for vector gates, 1 for scalar gates, 0 for ungated pooling.
template <class Policy>
std::int64_t oracle_gate_channels(const phasekv::stream_config& config) {
  using pooling = typename Policy::pooling;
  if constexpr (oracle_detail::is_vector_gate<pooling>) return config.channels;
  else if constexpr (oracle_detail::is_scalar_gate<pooling>) return 1;
  else return 0;
}

template <class Policy>
std::int64_t oracle_payload_floats(const phasekv::geometry& geom, const phasekv::stream_config& config) {
  return config.kv_heads * oracle_views(geom, config) * config.channels;
}
template <class Policy>
std::int64_t oracle_logit_floats(const phasekv::geometry& geom, const phasekv::stream_config& config) {
  return config.kv_heads * oracle_views(geom, config) * oracle_gate_channels<Policy>(config);
}

// Every complete entry after `tokens` tokens (0 … tokens−1) of payload/logits in the layout of
// stream_config.hpp: payload[t][head][view][channel], logits[t][head][view][gate channel].
template <class Policy>
std::vector<oracle_entry> oracle_compress(const phasekv::geometry& geom, const phasekv::stream_config& config,
                                          const phasekv::stream_params& params, const std::vector<float>& payload,
                                          const std::vector<float>& logits, std::int64_t tokens) {
  using pooling = typename Policy::pooling;
  using rope_placement = typename Policy::rope;
  constexpr bool vector_gate = oracle_detail::is_vector_gate<pooling>;
  constexpr bool scalar_gate = oracle_detail::is_scalar_gate<pooling>;
  constexpr bool gated = vector_gate || scalar_gate;
  constexpr bool mean = std::is_same_v<pooling, phasekv::mean_pool>;
  constexpr bool fixed = std::is_same_v<pooling, phasekv::fixed_weight_pool>;
  static_assert(mean || fixed || gated, "unknown pooling policy");
  constexpr bool rope_before = std::is_same_v<rope_placement, phasekv::rope_before_pool>;
  constexpr bool rope_after = std::is_same_v<rope_placement, phasekv::rope_after_pool>;
  constexpr bool norm = std::is_same_v<typename Policy::norm, phasekv::rms_norm>;

  const std::int64_t S = geom.stride, W = geom.window, heads = config.kv_heads, C = config.channels;
  const std::int64_t lead = (S - geom.origin) % S;
  const std::int64_t views = oracle_views(geom, config);
  const std::int64_t G = oracle_gate_channels<Policy>(config);

  // The oracle trusts its caller (the tests) but not blindly: a wrong size is a test bug.
  if (static_cast<std::int64_t>(payload.size()) < tokens * heads * views * C)
    throw std::logic_error("oracle_compress: payload too short");
  if (static_cast<std::int64_t>(logits.size()) < tokens * heads * views * G)
    throw std::logic_error("oracle_compress: logits too short");

  const std::vector<double> theta =
      (rope_before || rope_after) ? oracle_detail::rope_frequencies(config.rope) : std::vector<double>{};

  // §2: entry j is complete once token (j+1)·S − 1 − lead has arrived, i.e. (j+1)·S − lead ≤ tokens.
  std::vector<oracle_entry> out;
  for (std::int64_t j = 0; (j + 1) * S - lead <= tokens; ++j) {
    oracle_entry e;
    e.index = j;
    const std::int64_t first_token = (j + 1) * S - W - lead;  // slot 0 (may be negative)
    const std::int64_t block_start = j * S - lead;
    const std::int64_t block_end = (j + 1) * S - 1 - lead;
    // §2 anchor position: block start (default), block end, or the floor of the window's midpoint.
    switch (geom.anchor) {
      case phasekv::anchor_mode::block_start: e.anchor = block_start; break;
      case phasekv::anchor_mode::block_end: e.anchor = block_end; break;
      case phasekv::anchor_mode::window_centre: e.anchor = oracle_detail::floor_div(first_token + block_end, 2); break;
    }
    e.values.assign(static_cast<std::size_t>(heads * C), 0.0);
    e.slot_weights.assign(static_cast<std::size_t>(heads * W), 0.0);
    e.term_scale.assign(static_cast<std::size_t>(heads), 0.0);

    for (std::int64_t h = 0; h < heads; ++h) {
      // Gather the window: x[i][c] for each slot, the token's payload in the slot's view.
      std::vector<bool> real(static_cast<std::size_t>(W));
      std::vector<std::vector<double>> x(static_cast<std::size_t>(W), std::vector<double>(static_cast<std::size_t>(C), 0.0));
      std::vector<std::vector<double>> s(static_cast<std::size_t>(W), std::vector<double>(static_cast<std::size_t>(G), 0.0));
      std::int64_t n_real = 0;
      for (std::int64_t i = 0; i < W; ++i) {
        const std::int64_t t = first_token + i;
        real[i] = t >= 0;  // §2: slots whose token would be negative are padding
        if (!real[i]) continue;
        ++n_real;
        const std::int64_t view = config.inputs == phasekv::input_layout::per_branch ? (W - 1 - i) / S : i;
        for (std::int64_t c = 0; c < C; ++c)
          x[i][c] = payload[static_cast<std::size_t>(((t * heads + h) * views + view) * C + c)];
        // §3 rope_before_pool: rotate each token's payload at its own position.
        if constexpr (rope_before) oracle_detail::rotate(x[i].data(), C, config.rope, theta, static_cast<double>(t));
        // §3 gated pool: s_i = host logit + learned per-slot bias (bias indexed by slot, not view).
        if constexpr (gated) {
          for (std::int64_t g = 0; g < G; ++g) {
            const double logit = logits[static_cast<std::size_t>(((t * heads + h) * views + view) * G + g)];
            const double bias =
                params.slot_bias.empty() ? 0.0 : params.slot_bias[static_cast<std::size_t>((h * W + i) * G + g)];
            s[i][g] = logit + bias;
          }
        }
      }

      // alpha[i][c]: the weight of slot i in channel c (0 for padding).
      std::vector<std::vector<double>> alpha(static_cast<std::size_t>(W), std::vector<double>(static_cast<std::size_t>(C), 0.0));
      if constexpr (mean) {
        // §3 mean pool: K̂ = (1/n) Σ over the n real slots.
        for (std::int64_t i = 0; i < W; ++i)
          if (real[i])
            for (std::int64_t c = 0; c < C; ++c) alpha[i][c] = 1.0 / static_cast<double>(n_real);
      } else if constexpr (fixed) {
        // §3 fixed weights, renormalised over the real slots: α_i = p_i / Σ_real p (0 if that sum is 0).
        double total = 0.0;
        for (std::int64_t i = 0; i < W; ++i)
          if (real[i]) total += params.slot_profile[static_cast<std::size_t>(i)];
        if (total > 0.0)
          for (std::int64_t i = 0; i < W; ++i)
            if (real[i])
              for (std::int64_t c = 0; c < C; ++c) alpha[i][c] = params.slot_profile[static_cast<std::size_t>(i)] / total;
      } else {
        // §3 gated pool: α = softmax over the real slots of s, max-subtracted; vector gates have
        // one softmax per channel, scalar gates one softmax (gate channel 0) for all channels.
        for (std::int64_t g = 0; g < G; ++g) {
          double m = -std::numeric_limits<double>::infinity();
          for (std::int64_t i = 0; i < W; ++i)
            if (real[i]) m = std::max(m, s[i][g]);
          double denom = 0.0;
          for (std::int64_t i = 0; i < W; ++i)
            if (real[i]) denom += std::exp(s[i][g] - m);
          for (std::int64_t i = 0; i < W; ++i) {
            if (!real[i]) continue;
            const double a = std::exp(s[i][g] - m) / denom;
            if constexpr (vector_gate) alpha[i][g] = a;
            else
              for (std::int64_t c = 0; c < C; ++c) alpha[i][c] = a;
          }
        }
      }

      // §3: K̂[c] = Σ_i α_i[c] · x_i[c].
      double* v = &e.values[static_cast<std::size_t>(h * C)];
      std::vector<double> magnitude(static_cast<std::size_t>(C), 0.0);  // Σ α|x|, for term_scale
      for (std::int64_t c = 0; c < C; ++c) {
        double sum = 0.0;
        for (std::int64_t i = 0; i < W; ++i) {
          sum += alpha[i][c] * x[i][c];
          magnitude[c] += alpha[i][c] * std::abs(x[i][c]);
        }
        v[c] = sum;
      }

      // §3 post-pool, step 1: RMSNorm x · 1/sqrt(mean(x²) + eps) · w over the head's channels.
      if constexpr (norm) {
        double mean_square = 0.0;
        for (std::int64_t c = 0; c < C; ++c) mean_square += v[c] * v[c];
        mean_square /= static_cast<double>(C);
        const double inv_rms = 1.0 / std::sqrt(mean_square + config.norm_eps);
        for (std::int64_t c = 0; c < C; ++c) {
          const double w = params.norm_weight.empty() ? 1.0 : params.norm_weight[static_cast<std::size_t>(c)];
          v[c] = v[c] * inv_rms * w;
          magnitude[c] *= inv_rms * std::abs(w);
        }
      }
      for (std::int64_t c = 0; c < C; ++c) e.term_scale[h] = std::max(e.term_scale[h], magnitude[c]);

      // §3 post-pool, step 2: RoPE on the last R channels at the entry's anchor position.
      if constexpr (rope_after) oracle_detail::rotate(v, C, config.rope, theta, static_cast<double>(e.anchor));

      // §6 realised per-slot weight: mean over channels of α.
      for (std::int64_t i = 0; i < W; ++i) {
        double sum = 0.0;
        for (std::int64_t c = 0; c < C; ++c) sum += alpha[i][c];
        e.slot_weights[static_cast<std::size_t>(h * W + i)] = sum / static_cast<double>(C);
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

// --- Comparing a kernel's entry with the oracle's ---------------------------------------------
//
// Tolerance: the kernel computes in fp32, the oracle in double, so the right yardstick is fp32
// rounding of the terms that were summed, not of the (possibly cancelled) result. Per head,
//   |kernel[c] − oracle[c]| ≤ rel · (|oracle[c]| + scale_h),
//   scale_h = max(max_c |oracle[c]|, term_scale_h),
// a floor relative to the entry's size and to the size of the terms it was summed from, so a
// channel (or a one-channel head) that cancelled to ~0 is not held to a relative bound fp32
// cannot meet. Slot weights lie in [0, 1] and sum to 1 per head: compared absolutely.
struct oracle_tolerance {
  double values_rel = 1e-5;
  double weights_abs = 1e-5;
};

// Returns "" when the kernel's entry matches, else a description of the first mismatch.
// `values` is [heads][channels], `slot_weights` [heads][window] or nullptr to skip them.
inline std::string oracle_mismatch(const oracle_entry& expected, std::int64_t heads, std::int64_t channels,
                                   std::int64_t window, const float* values, const float* slot_weights,
                                   const oracle_tolerance& tol = {}) {
  std::ostringstream msg;
  msg.precision(9);
  for (std::int64_t h = 0; h < heads; ++h) {
    double scale = expected.term_scale.empty() ? 0.0 : expected.term_scale[static_cast<std::size_t>(h)];
    for (std::int64_t c = 0; c < channels; ++c)
      scale = std::max(scale, std::abs(expected.values[static_cast<std::size_t>(h * channels + c)]));
    for (std::int64_t c = 0; c < channels; ++c) {
      const std::size_t k = static_cast<std::size_t>(h * channels + c);
      const double want = expected.values[k];
      const double got = values[k];
      const double bound = tol.values_rel * (std::abs(want) + scale);
      if (!std::isfinite(got) || !(std::abs(got - want) <= bound)) {
        msg << "entry " << expected.index << " head " << h << " channel " << c << ": kernel " << got << ", oracle "
            << want << " (|diff| " << std::abs(got - want) << " > bound " << bound << ")";
        return msg.str();
      }
    }
  }
  if (slot_weights != nullptr) {
    for (std::int64_t k = 0; k < heads * window; ++k) {
      const double want = expected.slot_weights[static_cast<std::size_t>(k)];
      const double got = slot_weights[k];
      if (!std::isfinite(got) || !(std::abs(got - want) <= tol.weights_abs)) {
        msg << "entry " << expected.index << " head " << k / window << " slot " << k % window
            << ": kernel weight " << got << ", oracle " << want;
        return msg.str();
      }
    }
  }
  return "";
}

// Compares every entry a sink collected (anything with size(), index(k), anchor(k), values(k)
// and slot_weights(k), e.g. phasekv::entry_buffer) with the oracle's; "" when all match.
template <class Buffer>
std::string oracle_mismatch_all(const std::vector<oracle_entry>& expected, const Buffer& got, std::int64_t heads,
                                std::int64_t channels, std::int64_t window, bool compare_weights,
                                const oracle_tolerance& tol = {}) {
  std::ostringstream msg;
  if (got.size() != expected.size()) {
    msg << "kernel emitted " << got.size() << " entries, oracle " << expected.size();
    return msg.str();
  }
  for (std::size_t k = 0; k < expected.size(); ++k) {
    if (got.index(k) != expected[k].index || got.anchor(k) != expected[k].anchor) {
      msg << "entry #" << k << ": kernel index/anchor " << got.index(k) << "/" << got.anchor(k) << ", oracle "
          << expected[k].index << "/" << expected[k].anchor;
      return msg.str();
    }
    const float* weights = compare_weights ? got.slot_weights(k) : nullptr;
    if (compare_weights && weights == nullptr) return "kernel gave no slot weights";
    std::string m = oracle_mismatch(expected[k], heads, channels, window, got.values(k), weights, tol);
    if (!m.empty()) return m;
  }
  return "";
}

}  // namespace phasekv_test
