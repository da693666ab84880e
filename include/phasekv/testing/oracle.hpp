#pragma once
// The conformance kit's double-precision oracles (conformance.hpp): docs/DESIGN.md §2 (geometry),
// §3 (compression) and §5 (reading) written out as plain loops in double, from the definitions.
// They use nothing of the library but its configuration structs and policy tags, so a kernel and
// its oracle share no code that could be wrong in the same way.
//
//   slot i of entry j   token t = (j+1)·S − W − lead + i, lead = (S − origin) mod S; padding when t < 0
//   view of slot i      floor((W − 1 − i) / S) (per_branch) or i (per_slot)
//   mean                K̂ = (1/n) Σ_real x_i
//   fixed weights       α_i = p_i / Σ_real p   (all 0 when that sum is 0)
//   gates               s_i = logit_i + bias_i, α = softmax over the real slots (vector gates: per
//                       channel; scalar gates: one for all channels), K̂ = Σ α_i ⊙ x_i
//   your own pooling    the oracle you pass (pooling_oracle), given the window in double
//   RMSNorm             x · 1/sqrt(mean(x²) + eps) · w                          (after pooling)
//   RoPE                last R channels, θ_k = base^(−2k/R) (YaRN-scaled), pair (a, b) turned by
//                       p·θ_k; before pooling at each slot's token, after pooling (after RMSNorm)
//                       at the entry's anchor; a host table's cos/sin when the config has one
//   attention           ℓ = scale · q·k over the selected entries and the window tokens, one
//                       softmax with an optional sink in the denominator, out = Σ p·v; query head
//                       h reads KV head h / (H_q / H_kv); tied K/V with RoPE: the output's last R
//                       channels turned back by −t
//   lightning indexer   I_j = Σ_h w_h · max(0, q_h · k_j)   (bf16 precision: q rounded to bf16)
//
// Storage (format/storage.hpp, fp8.hpp, fp4.hpp): what a stored value may differ from the fp32 value
// the write path produced, from each format's rounding rule — round to nearest with p stored
// mantissa bits is within half a unit in the last place, 2^−(p+1) relative:
//
//   f32                 exact
//   bf16 (7 bits)       |x − q| ≤ 2^−8·|x|
//   f16 (10 bits)       |x − q| ≤ max(2^−11·|x|, 2^−25)           (subnormals: half of 2^−24)
//   fp8_e4m3_block      per block of 64 with amax = max(max|x|, 1e−4) and scale s < 2·amax/448:
//                       |x − q| ≤ max(2^−4·|x|, 2^−10·s) (3 mantissa bits; subnormal step 2^−9·s);
//                       the RoPE channels as bf16
//   fp4_e2m1_hadamard   on y = C^−1/2·H_C·x, per block of 32 with s < 2·amax(y)/6: e2m1's steps are
//                       0.5 below 2, 1 below 4, 2 below 6 (in units of s), so
//                       |y − q| ≤ max(|y|/4, s/4)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "phasekv/compress/policies.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/rope.hpp"
#include "phasekv/detail/text.hpp"
#include "phasekv/format/storage.hpp"

namespace phasekv::testing {

// ---- pooling ---------------------------------------------------------------------------------

// One entry's window for one KV head, as a pooling oracle sees it: the real slots' inputs in
// double (the exact values of the fp32 or bf16 inputs; RoPE before pooling already applied).
struct oracle_window {
  std::int64_t entry = 0;           // j
  std::int64_t head = 0;            // KV head
  std::int64_t channels = 0;        // C
  std::int64_t window = 0;          // W; the real slots are [first_slot, W)
  std::int64_t first_slot = 0;
  std::int64_t first_position = 0;  // token of slot first_slot
  std::vector<std::vector<double>> payload;  // [count()][C]
  std::vector<std::vector<double>> logits;   // [count()][gate channels] (empty without gates)

  std::int64_t count() const noexcept { return window - first_slot; }
  std::int64_t slot(std::int64_t k) const noexcept { return first_slot + k; }
  std::int64_t position(std::int64_t k) const noexcept { return first_position + k; }
};

// What a pooling oracle returns for one head.
struct pooled_head {
  std::vector<double> values;        // [C]: the pooled entry, before RMSNorm and RoPE after pooling
  std::vector<double> slot_weights;  // [W] per-slot weights (0 for padding), or empty: not compared
  // The size of the terms the entry is summed from, the yardstick of the tolerance (0: the
  // largest |value| and the largest |input| of the window).
  double scale = 0.0;
};

// A pooling of your own, in double: what the kit holds your policy's pool() to.
using pooling_oracle = std::function<pooled_head(const oracle_window&)>;

namespace oracle_detail {

template <class Pooling>
constexpr bool is_builtin_v = std::is_same_v<Pooling, mean_pool> || std::is_same_v<Pooling, fixed_weight_pool> ||
                              std::is_same_v<Pooling, gated_pool<gate_width::vector>> ||
                              std::is_same_v<Pooling, gated_pool<gate_width::scalar>>;

inline std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace oracle_detail

// The oracle of a built-in pooling (mean, fixed weights, vector or scalar gates) with its
// parameters (slot_bias [kv_heads][W][G], slot_profile [W]); slot weights are the channel mean of α.
template <class Pooling>
pooling_oracle builtin_pooling_oracle(const stream_params& params) {
  static_assert(oracle_detail::is_builtin_v<Pooling>, "builtin_pooling_oracle: not a built-in pooling");
  return [params](const oracle_window& w) {
    const std::int64_t n = w.count(), C = w.channels, W = w.window;
    pooled_head out;
    out.values.assign(static_cast<std::size_t>(C), 0.0);
    out.slot_weights.assign(static_cast<std::size_t>(W), 0.0);
    // alpha[k][c]: the weight of real slot k in channel c.
    std::vector<std::vector<double>> alpha(static_cast<std::size_t>(n), std::vector<double>(static_cast<std::size_t>(C), 0.0));
    if constexpr (std::is_same_v<Pooling, mean_pool>) {
      for (auto& a : alpha) std::fill(a.begin(), a.end(), 1.0 / static_cast<double>(n));
    } else if constexpr (std::is_same_v<Pooling, fixed_weight_pool>) {
      double total = 0.0;
      for (std::int64_t k = 0; k < n; ++k) total += params.slot_profile[static_cast<std::size_t>(w.slot(k))];
      if (total > 0.0)
        for (std::int64_t k = 0; k < n; ++k)
          std::fill(alpha[k].begin(), alpha[k].end(), params.slot_profile[static_cast<std::size_t>(w.slot(k))] / total);
    } else {
      constexpr bool vector = std::is_same_v<Pooling, gated_pool<gate_width::vector>>;
      const std::int64_t G = vector ? C : 1;
      for (std::int64_t g = 0; g < G; ++g) {
        std::vector<double> s(static_cast<std::size_t>(n));
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t k = 0; k < n; ++k) {
          const double bias = params.slot_bias.empty()
                                  ? 0.0
                                  : params.slot_bias[static_cast<std::size_t>((w.head * W + w.slot(k)) * G + g)];
          s[static_cast<std::size_t>(k)] = w.logits[static_cast<std::size_t>(k)][static_cast<std::size_t>(g)] + bias;
          m = std::max(m, s[static_cast<std::size_t>(k)]);
        }
        double den = 0.0;
        for (std::int64_t k = 0; k < n; ++k) den += std::exp(s[static_cast<std::size_t>(k)] - m);
        for (std::int64_t k = 0; k < n; ++k) {
          const double a = std::exp(s[static_cast<std::size_t>(k)] - m) / den;
          if constexpr (vector) alpha[k][g] = a;
          else std::fill(alpha[k].begin(), alpha[k].end(), a);
        }
      }
    }
    for (std::int64_t c = 0; c < C; ++c) {
      double sum = 0.0, magnitude = 0.0;
      for (std::int64_t k = 0; k < n; ++k) {
        sum += alpha[k][c] * w.payload[k][c];
        magnitude += alpha[k][c] * std::abs(w.payload[k][c]);
      }
      out.values[static_cast<std::size_t>(c)] = sum;
      out.scale = std::max(out.scale, magnitude);
    }
    for (std::int64_t k = 0; k < n; ++k) {
      double sum = 0.0;
      for (std::int64_t c = 0; c < C; ++c) sum += alpha[k][c];
      out.slot_weights[static_cast<std::size_t>(w.slot(k))] = sum / static_cast<double>(C);
    }
    return out;
  };
}

// ---- RoPE ------------------------------------------------------------------------------------

// θ_k from base and YaRN, in double (core/rope.hpp's header states the formulas), or a host
// table's cos/sin; rotates the last R channels of a vector.
class oracle_rope {
 public:
  oracle_rope() = default;
  explicit oracle_rope(const rope_config& rope) : rope_(rope) {
    const double r = static_cast<double>(rope.channels);
    for (std::int64_t k = 0; k < rope.channels / 2; ++k)
      theta_.push_back(std::pow(rope.base, -2.0 * static_cast<double>(k) / r));
    if (rope.yarn.enabled && !theta_.empty()) {
      const double pi = std::acos(-1.0);
      const double context = static_cast<double>(rope.yarn.original_context);
      auto dim = [&](double rotations) { return r * std::log(context / (2.0 * pi * rotations)) / (2.0 * std::log(rope.base)); };
      const double low = std::max(std::floor(dim(rope.yarn.beta_fast)), 0.0);
      double high = std::min(std::ceil(dim(rope.yarn.beta_slow)), r - 1.0);
      if (high < low) high = low;  // every pair would be interpolated: keep them all
      if (high == low) high += 0.001;
      for (std::size_t k = 0; k < theta_.size(); ++k) {
        const double ramp = std::min(1.0, std::max(0.0, (static_cast<double>(k) - low) / (high - low)));
        theta_[k] = theta_[k] / rope.yarn.factor * ramp + theta_[k] * (1.0 - ramp);
      }
    }
  }

  // Turns x[channels − R, channels) by position·θ_k (sign −1: back). A table's row `position`
  // when the config has one (the caller keeps position inside it).
  void rotate(double* x, std::int64_t channels, double position, double sign = 1.0) const {
    const std::int64_t R = rope_.channels, pairs = R / 2, first = channels - R;
    for (std::int64_t k = 0; k < pairs; ++k) {
      const bool interleaved = rope_.layout == rope_layout::interleaved;
      double& a = x[first + (interleaved ? 2 * k : k)];
      double& b = x[first + (interleaved ? 2 * k + 1 : k + pairs)];
      double c, s;
      if (rope_.table) {
        const auto row = static_cast<std::size_t>(position) * static_cast<std::size_t>(pairs) + static_cast<std::size_t>(k);
        c = rope_.table->cos[row];
        s = rope_.table->sin[row];
      } else {
        const double angle = position * theta_[static_cast<std::size_t>(k)];
        c = std::cos(angle);
        s = std::sin(angle);
      }
      s *= sign;
      const double a0 = a, b0 = b;
      a = a0 * c - b0 * s;
      b = a0 * s + b0 * c;
    }
  }
  // The same turn by an angle difference alone (no table): by delta·θ_k.
  void turn(double* x, std::int64_t channels, double delta) const {
    const std::int64_t R = rope_.channels, pairs = R / 2, first = channels - R;
    const bool interleaved = rope_.layout == rope_layout::interleaved;
    for (std::int64_t k = 0; k < pairs; ++k) {
      double& a = x[first + (interleaved ? 2 * k : k)];
      double& b = x[first + (interleaved ? 2 * k + 1 : k + pairs)];
      const double angle = delta * theta_[static_cast<std::size_t>(k)];
      const double c = std::cos(angle), s = std::sin(angle), a0 = a, b0 = b;
      a = a0 * c - b0 * s;
      b = a0 * s + b0 * c;
    }
  }

 private:
  rope_config rope_;
  std::vector<double> theta_;
};

// ---- entries ---------------------------------------------------------------------------------

struct oracle_entry {
  std::int64_t index = 0;
  std::int64_t anchor = 0;
  std::vector<double> values;        // [kv_heads][channels]
  std::vector<double> slot_weights;  // [kv_heads][window], empty when the pooling oracle gives none
  std::vector<double> scale;         // [kv_heads]: term size (pooled_head::scale, times the RMSNorm factor)
};

// Every entry complete after `tokens` tokens of inputs in stream_config.hpp's layout
// (payload[t][head][view][C], logits[t][head][view][G]), pooled by `pool` and finished by the
// policy's RMSNorm and RoPE.
template <class Policy>
std::vector<oracle_entry> oracle_entries(const geometry& geom, const stream_config& config, const stream_params& params,
                                         const pooling_oracle& pool, const float* payload, const float* logits,
                                         std::int64_t tokens) {
  using rope = typename Policy::rope;
  constexpr bool rope_before = std::is_same_v<rope, rope_before_pool>;
  constexpr bool rope_after = std::is_same_v<rope, rope_after_pool>;
  constexpr bool norm = std::is_same_v<typename Policy::norm, rms_norm>;
  const std::int64_t S = geom.stride, W = geom.window, H = config.kv_heads, C = config.channels;
  const std::int64_t lead = (S - geom.origin) % S;
  const std::int64_t views = config.inputs == input_layout::per_branch ? (W + S - 1) / S : W;
  const std::int64_t G = phasekv::gate_channels<typename Policy::pooling>(C);
  const oracle_rope turn = (rope_before || rope_after) ? oracle_rope(config.rope) : oracle_rope();

  std::vector<oracle_entry> out;
  for (std::int64_t j = 0; (j + 1) * S - lead <= tokens; ++j) {
    oracle_entry e;
    e.index = j;
    const std::int64_t first_token = (j + 1) * S - W - lead, block_start = j * S - lead, block_end = (j + 1) * S - 1 - lead;
    switch (geom.anchor) {
      case anchor_mode::block_start: e.anchor = block_start; break;
      case anchor_mode::block_end: e.anchor = block_end; break;
      case anchor_mode::window_centre: e.anchor = oracle_detail::floor_div(first_token + block_end, 2); break;
    }
    e.values.assign(static_cast<std::size_t>(H * C), 0.0);
    e.scale.assign(static_cast<std::size_t>(H), 0.0);
    for (std::int64_t h = 0; h < H; ++h) {
      oracle_window w;
      w.entry = j;
      w.head = h;
      w.channels = C;
      w.window = W;
      w.first_slot = std::max<std::int64_t>(0, -first_token);
      w.first_position = first_token + w.first_slot;
      for (std::int64_t i = w.first_slot; i < W; ++i) {
        const std::int64_t t = first_token + i;
        const std::int64_t view = config.inputs == input_layout::per_branch ? (W - 1 - i) / S : i;
        const float* x = payload + ((t * H + h) * views + view) * C;
        w.payload.emplace_back(x, x + C);
        if constexpr (rope_before) turn.rotate(w.payload.back().data(), C, static_cast<double>(t));
        if (G > 0) {
          const float* s = logits + ((t * H + h) * views + view) * G;
          w.logits.emplace_back(s, s + G);
        }
      }
      pooled_head p = pool(w);
      if (static_cast<std::int64_t>(p.values.size()) != C)
        throw std::invalid_argument(config.name + ": the pooling oracle returned " + std::to_string(p.values.size()) +
                                    " values for entry " + std::to_string(j) + ", expected channels = " +
                                    std::to_string(C));
      double scale = p.scale;
      if (scale <= 0.0) {
        for (double v : p.values) scale = std::max(scale, std::abs(v));
        for (const auto& row : w.payload)
          for (double v : row) scale = std::max(scale, std::abs(v));
      }
      double* v = e.values.data() + h * C;
      std::copy(p.values.begin(), p.values.end(), v);
      if constexpr (norm) {
        double mean_square = 0.0;
        for (std::int64_t c = 0; c < C; ++c) mean_square += v[c] * v[c];
        mean_square /= static_cast<double>(C);
        const double inv_rms = 1.0 / std::sqrt(mean_square + config.norm_eps);
        double weight_max = 0.0;
        for (std::int64_t c = 0; c < C; ++c) {
          const double wgt = params.norm_weight.empty() ? 1.0 : params.norm_weight[static_cast<std::size_t>(c)];
          v[c] *= inv_rms * wgt;
          weight_max = std::max(weight_max, std::abs(wgt));
        }
        scale *= inv_rms * weight_max;
      }
      if constexpr (rope_after) turn.rotate(v, C, static_cast<double>(e.anchor));
      e.scale[static_cast<std::size_t>(h)] = scale;
      if (!p.slot_weights.empty()) {
        if (e.slot_weights.empty()) e.slot_weights.assign(static_cast<std::size_t>(H * W), 0.0);
        std::copy(p.slot_weights.begin(), p.slot_weights.begin() + std::min<std::int64_t>(W, static_cast<std::int64_t>(p.slot_weights.size())),
                  e.slot_weights.begin() + h * W);
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

// "" when an entry (values [H][C], slot weights [H][W] or null) matches the oracle's within
// |got − want| ≤ rel · (|want| + scale_h), scale_h = max(max_c |want|, the head's term scale);
// slot weights within `weights_abs`. Else the first difference, named.
inline std::string entry_mismatch(const oracle_entry& want, std::int64_t heads, std::int64_t channels, std::int64_t window,
                                  const float* values, const float* slot_weights, double rel, double weights_abs) {
  phasekv::detail::classic_stream msg;
  msg.precision(9);
  for (std::int64_t h = 0; h < heads; ++h) {
    double scale = want.scale[static_cast<std::size_t>(h)];
    for (std::int64_t c = 0; c < channels; ++c) scale = std::max(scale, std::abs(want.values[static_cast<std::size_t>(h * channels + c)]));
    for (std::int64_t c = 0; c < channels; ++c) {
      const double w = want.values[static_cast<std::size_t>(h * channels + c)], g = values[h * channels + c];
      const double bound = rel * (std::abs(w) + scale);
      if (!(std::abs(g - w) <= bound)) {
        msg << "entry " << want.index << " head " << h << " channel " << c << ": " << g << ", oracle " << w
            << " (|difference| " << std::abs(g - w) << " > " << bound << ")";
        return msg.str();
      }
    }
  }
  if (slot_weights != nullptr && !want.slot_weights.empty())
    for (std::int64_t k = 0; k < heads * window; ++k) {
      const double w = want.slot_weights[static_cast<std::size_t>(k)], g = slot_weights[k];
      if (!(std::abs(g - w) <= weights_abs)) {
        msg << "entry " << want.index << " head " << k / window << " slot " << k % window << ": weight " << g
            << ", oracle " << w;
        return msg.str();
      }
    }
  return "";
}

// ---- attention -------------------------------------------------------------------------------

struct oracle_read_result {
  std::vector<double> out;  // [query_heads][value_channels]
  std::vector<double> lse;  // [query_heads]: ln(Σ exp ℓ + exp sink), −inf for nothing
};

// One query over explicit key and value rows ([kv_heads][channels] each), one joint softmax per
// query head with the sink (null: none) in the denominator only.
inline oracle_read_result oracle_read(std::int64_t query_heads, std::int64_t kv_heads, std::int64_t key_channels,
                                      std::int64_t value_channels, double scale, const float* queries, const float* sinks,
                                      const std::vector<const float*>& keys, const std::vector<const float*>& values) {
  oracle_read_result r;
  r.out.assign(static_cast<std::size_t>(query_heads * value_channels), 0.0);
  r.lse.assign(static_cast<std::size_t>(query_heads), -std::numeric_limits<double>::infinity());
  const std::int64_t group = query_heads / kv_heads;
  std::vector<double> logit(keys.size());
  for (std::int64_t h = 0; h < query_heads; ++h) {
    const std::int64_t g = h / group;
    double m = sinks ? static_cast<double>(sinks[h]) : -std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      double dot = 0.0;
      for (std::int64_t c = 0; c < key_channels; ++c)
        dot += static_cast<double>(queries[h * key_channels + c]) * static_cast<double>(keys[i][g * key_channels + c]);
      logit[i] = scale * dot;
      m = std::max(m, logit[i]);
    }
    if (m == -std::numeric_limits<double>::infinity()) continue;  // nothing to attend to
    double den = sinks ? std::exp(static_cast<double>(sinks[h]) - m) : 0.0;
    for (std::size_t i = 0; i < keys.size(); ++i) den += std::exp(logit[i] - m);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const double p = std::exp(logit[i] - m) / den;
      for (std::int64_t c = 0; c < value_channels; ++c)
        r.out[static_cast<std::size_t>(h * value_channels + c)] += p * static_cast<double>(values[i][g * value_channels + c]);
    }
    r.lse[static_cast<std::size_t>(h)] = m + std::log(den);
  }
  return r;
}

// The lightning indexer's score of each key row (channels floats): Σ_h w_h · max(0, q_h·k), with
// the queries rounded to bf16 (nearest, ties to even) when `bf16_queries`.
inline std::vector<double> oracle_indexer_scores(const float* queries, const float* weights, std::int64_t heads,
                                                 std::int64_t channels, const std::vector<const float*>& keys,
                                                 bool bf16_queries) {
  std::vector<double> q(static_cast<std::size_t>(heads * channels));
  for (std::size_t i = 0; i < q.size(); ++i) {
    float x = queries[i];
    if (bf16_queries && std::isfinite(x)) {
      std::uint32_t bits;
      std::memcpy(&bits, &x, 4);
      bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
      std::memcpy(&x, &bits, 4);
    }
    q[i] = x;
  }
  std::vector<double> scores;
  for (const float* k : keys) {
    double s = 0.0;
    for (std::int64_t h = 0; h < heads; ++h) {
      double dot = 0.0;
      for (std::int64_t c = 0; c < channels; ++c) dot += q[static_cast<std::size_t>(h * channels + c)] * static_cast<double>(k[c]);
      s += static_cast<double>(weights[h]) * std::max(0.0, dot);
    }
    scores.push_back(s);
  }
  return scores;
}

// ---- storage ---------------------------------------------------------------------------------

// "" when a head's stored values (as read back, fp32; for FP4 the dequantized transformed values)
// lie within the storage's documented error of the write path's fp32 values `x` (the header
// comment states each bound); else the first channel outside it.
inline std::string storage_mismatch(storage_type storage, const float* x, const float* stored, std::int64_t channels,
                                    std::int64_t rope_channels) {
  phasekv::detail::classic_stream msg;
  msg.precision(9);
  auto check = [&](std::int64_t c, double want, double bound) {
    if (std::abs(static_cast<double>(stored[c]) - want) <= bound) return true;
    msg << "channel " << c << ": stored " << stored[c] << ", from " << want << " (|difference| "
        << std::abs(static_cast<double>(stored[c]) - want) << " > " << bound << ", " << to_string(storage) << ")";
    return false;
  };
  const double bf16_rel = std::ldexp(1.0, -8), tiny = std::ldexp(1.0, -133);
  switch (storage) {
    case storage_type::f32:
      for (std::int64_t c = 0; c < channels; ++c)
        if (!check(c, x[c], 0.0)) return msg.str();
      return "";
    case storage_type::bf16:
      for (std::int64_t c = 0; c < channels; ++c)
        if (!check(c, x[c], std::max(bf16_rel * std::abs(x[c]), tiny))) return msg.str();
      return "";
    case storage_type::f16:
      for (std::int64_t c = 0; c < channels; ++c)
        if (!check(c, x[c], std::max(std::ldexp(std::abs(static_cast<double>(x[c])), -11), std::ldexp(1.0, -25))))
          return msg.str();
      return "";
    case storage_type::fp8_e4m3_block: {
      const std::int64_t n = channels - rope_channels;
      for (std::int64_t b = 0; b < n; b += 64) {
        const std::int64_t end = std::min(n, b + 64);
        double amax = 1e-4;
        for (std::int64_t c = b; c < end; ++c) amax = std::max(amax, std::abs(static_cast<double>(x[c])));
        const double s = 2.0 * amax / 448.0;
        for (std::int64_t c = b; c < end; ++c)
          if (!check(c, x[c], std::max(std::ldexp(std::abs(static_cast<double>(x[c])), -4), std::ldexp(s, -10))))
            return msg.str();
      }
      for (std::int64_t c = n; c < channels; ++c)
        if (!check(c, x[c], std::max(bf16_rel * std::abs(x[c]), tiny))) return msg.str();
      return "";
    }
    case storage_type::fp4_e2m1_hadamard: {
      // y = C^−1/2 · H_C · x: Sylvester's H[i][k] = (−1)^popcount(i & k), in double.
      std::vector<double> y(static_cast<std::size_t>(channels), 0.0);
      const double norm = 1.0 / std::sqrt(static_cast<double>(channels));
      for (std::int64_t i = 0; i < channels; ++i) {
        double sum = 0.0;
        for (std::int64_t k = 0; k < channels; ++k) {
          std::uint64_t both = static_cast<std::uint64_t>(i & k);
          int parity = 0;
          while (both) {
            parity ^= 1;
            both &= both - 1;
          }
          sum += parity ? -static_cast<double>(x[k]) : static_cast<double>(x[k]);
        }
        y[static_cast<std::size_t>(i)] = sum * norm;
      }
      for (std::int64_t b = 0; b < channels; b += 32) {
        const std::int64_t end = std::min(channels, b + 32);
        double amax = 6.0 * std::ldexp(1.0, -126);
        for (std::int64_t c = b; c < end; ++c) amax = std::max(amax, std::abs(y[static_cast<std::size_t>(c)]));
        const double s = 2.0 * amax / 6.0;
        for (std::int64_t c = b; c < end; ++c) {
          const double v = y[static_cast<std::size_t>(c)];
          if (!check(c, v, std::max(std::abs(v), s) / 4.0 + 1e-6 * amax)) return msg.str();
        }
      }
      return "";
    }
  }
  return "unknown storage type";
}

}  // namespace phasekv::testing
