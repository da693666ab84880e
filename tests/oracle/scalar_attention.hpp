#pragma once
// The scalar twin of phasekv's sparse-attention reader: docs/DESIGN.md §5 written out as plain
// loops in double precision, for the tests to hold the reader to. It uses nothing from the
// library (the RoPE twin comes from scalar_compressor.hpp, itself written from §3).
//
//   candidates      entries j < floor((t + 1 + lead) / S)                           (§2)
//   indexer         I_j = Σ_h w_h · max(0, q^I_h · k^I_j)
//   top-k           sort every candidate by (score descending, index ascending), keep min(k, n)
//   joint softmax   over a set of (logit ℓ_i, value v_i) plus an optional sink logit s:
//                     p_i = exp(ℓ_i) / (Σ_i exp(ℓ_i) + exp(s)),   p_sink = exp(s) / (…),
//                     out = Σ_i p_i · v_i                (max-subtracted, in double)
//   attention       logits scale · q·k;  query head h reads KV head h / (H_q / H_kv)   (GQA/MQA)
//   sparse read     one joint softmax over the selected entries and the window tokens
//   de-rotation     tied K/V: the last R channels of each output head rotated by −t (§3 RoPE)
//
// Shapes are row-major: a query is [query_heads][key_channels], a key vector (entry or window
// token) [kv_heads][key_channels], a value vector [kv_heads][value_channels].

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "oracle/scalar_compressor.hpp"
#include "phasekv/core/rope.hpp"

namespace phasekv_test {

struct attention_shape {
  std::int64_t query_heads = 1;
  std::int64_t kv_heads = 1;
  std::int64_t key_channels = 1;
  std::int64_t value_channels = 1;
};

// One head's joint softmax.
struct joint_softmax_result {
  std::vector<double> output;         // [channels]
  std::vector<double> probabilities;  // one per (logit, value) pair
  double sink_probability = 0.0;
};

// Σ p·v over pairs (logits[i], values[i][0 … channels)), with an optional sink logit that takes
// probability mass in the denominator only. No pairs and no sink: zero output, no mass.
inline joint_softmax_result joint_softmax(const std::vector<double>& logits, const std::vector<const double*>& values,
                                          std::int64_t channels, const double* sink = nullptr) {
  joint_softmax_result r;
  r.output.assign(static_cast<std::size_t>(channels), 0.0);
  r.probabilities.assign(logits.size(), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (double l : logits) m = std::max(m, l);
  if (sink) m = std::max(m, *sink);
  if (m == -std::numeric_limits<double>::infinity()) return r;  // nothing to attend to
  double denominator = sink ? std::exp(*sink - m) : 0.0;
  for (double l : logits) denominator += std::exp(l - m);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double p = std::exp(logits[i] - m) / denominator;
    r.probabilities[i] = p;
    for (std::int64_t c = 0; c < channels; ++c) r.output[static_cast<std::size_t>(c)] += p * values[i][c];
  }
  if (sink) r.sink_probability = std::exp(*sink - m) / denominator;
  return r;
}

inline double dot_product(const float* a, const float* b, std::int64_t n) {
  double s = 0.0;
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

// Plain causal attention of the query at position t over raw tokens 0 … t:
// keys[token][kv_heads][key_channels], values[token][kv_heads][value_channels]; out
// [query_heads][value_channels]. sinks: one logit per query head, or null. Written directly,
// without joint_softmax, so the dense control does not lean on another part of this file.
inline std::vector<double> causal_attention(const attention_shape& shape, const float* query,
                                            const std::vector<float>& keys, const std::vector<float>& values,
                                            std::int64_t t, double scale, const float* sinks = nullptr) {
  const std::int64_t group = shape.query_heads / shape.kv_heads;
  const std::int64_t ck = shape.key_channels, cv = shape.value_channels;
  std::vector<double> out(static_cast<std::size_t>(shape.query_heads * cv), 0.0);
  for (std::int64_t h = 0; h < shape.query_heads; ++h) {
    const std::int64_t g = h / group;
    std::vector<double> logit(static_cast<std::size_t>(t + 1));
    double m = sinks ? static_cast<double>(sinks[h]) : -std::numeric_limits<double>::infinity();
    for (std::int64_t s = 0; s <= t; ++s) {
      logit[static_cast<std::size_t>(s)] =
          scale * dot_product(query + h * ck, keys.data() + (s * shape.kv_heads + g) * ck, ck);
      m = std::max(m, logit[static_cast<std::size_t>(s)]);
    }
    double denominator = sinks ? std::exp(static_cast<double>(sinks[h]) - m) : 0.0;
    for (double l : logit) denominator += std::exp(l - m);
    for (std::int64_t s = 0; s <= t; ++s) {
      const double p = std::exp(logit[static_cast<std::size_t>(s)] - m) / denominator;
      for (std::int64_t c = 0; c < cv; ++c)
        out[static_cast<std::size_t>(h * cv + c)] +=
            p * values[static_cast<std::size_t>((s * shape.kv_heads + g) * cv + c)];
    }
  }
  return out;
}

// The lightning indexer: I_j = Σ_h w_h · max(0, q_h · k_j) for each key k_j (channels floats),
// queries [heads][channels], weights [heads].
inline std::vector<double> indexer_scores(const std::vector<float>& queries, const std::vector<float>& weights,
                                          const std::vector<std::vector<float>>& keys, std::int64_t channels) {
  const auto heads = static_cast<std::int64_t>(weights.size());
  std::vector<double> scores;
  for (const auto& k : keys) {
    double s = 0.0;
    for (std::int64_t h = 0; h < heads; ++h)
      s += static_cast<double>(weights[static_cast<std::size_t>(h)]) *
           std::max(0.0, dot_product(queries.data() + h * channels, k.data(), channels));
    scores.push_back(s);
  }
  return scores;
}

// Top-k by sorting everything: indices by score descending, then index ascending; min(k, n) kept.
template <class Score>
std::vector<std::int64_t> top_k_by_sort(const std::vector<Score>& scores, std::int64_t k) {
  std::vector<std::int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    const Score sa = scores[static_cast<std::size_t>(a)], sb = scores[static_cast<std::size_t>(b)];
    if (sa != sb) return sa > sb;
    return a < b;
  });
  order.resize(static_cast<std::size_t>(
      std::min<std::int64_t>(std::max<std::int64_t>(k, 0), static_cast<std::int64_t>(order.size()))));
  return order;
}

// One query's read over explicit lists: entry keys/values ([kv_heads][channels] each; values
// may be the keys themselves for tied K/V) and window-token keys/values, all in one joint
// softmax per query head.
struct sparse_read_result {
  std::vector<double> output;                           // [query_heads][value_channels]
  std::vector<std::vector<double>> entry_probability;   // [query_heads][entries]
  std::vector<std::vector<double>> window_probability;  // [query_heads][window tokens]
  std::vector<double> sink_probability;                 // [query_heads]
  // Means over query heads, as the reader's trace reports them.
  std::vector<double> entry_mass;
  std::vector<double> window_token_mass;
  double window_mass = 0.0;
  double sink_mass = 0.0;
};

inline sparse_read_result sparse_read(const attention_shape& shape, const std::vector<float>& query, double scale,
                                      const std::vector<std::vector<float>>& entry_keys,
                                      const std::vector<std::vector<float>>& entry_values,
                                      const std::vector<std::vector<float>>& window_keys,
                                      const std::vector<std::vector<float>>& window_values,
                                      const std::vector<float>& sinks = {}) {
  const std::int64_t group = shape.query_heads / shape.kv_heads;
  const std::int64_t ck = shape.key_channels, cv = shape.value_channels;
  const std::size_t n = entry_keys.size(), m = window_keys.size();
  sparse_read_result r;
  r.entry_mass.assign(n, 0.0);
  r.window_token_mass.assign(m, 0.0);
  for (std::int64_t h = 0; h < shape.query_heads; ++h) {
    const std::int64_t g = h / group;
    std::vector<double> logits;
    std::vector<std::vector<double>> value_rows;
    auto add = [&](const std::vector<float>& key, const std::vector<float>& value) {
      logits.push_back(scale * dot_product(query.data() + h * ck, key.data() + g * ck, ck));
      value_rows.emplace_back(value.begin() + g * cv, value.begin() + (g + 1) * cv);
    };
    for (std::size_t i = 0; i < n; ++i) add(entry_keys[i], entry_values[i]);
    for (std::size_t i = 0; i < m; ++i) add(window_keys[i], window_values[i]);
    std::vector<const double*> pointers;
    for (const auto& v : value_rows) pointers.push_back(v.data());
    const double sink = sinks.empty() ? 0.0 : static_cast<double>(sinks[static_cast<std::size_t>(h)]);
    const joint_softmax_result j = joint_softmax(logits, pointers, cv, sinks.empty() ? nullptr : &sink);
    r.output.insert(r.output.end(), j.output.begin(), j.output.end());
    r.entry_probability.emplace_back(j.probabilities.begin(), j.probabilities.begin() + static_cast<std::ptrdiff_t>(n));
    r.window_probability.emplace_back(j.probabilities.begin() + static_cast<std::ptrdiff_t>(n), j.probabilities.end());
    r.sink_probability.push_back(j.sink_probability);
    for (std::size_t i = 0; i < n; ++i) r.entry_mass[i] += j.probabilities[i] / static_cast<double>(shape.query_heads);
    for (std::size_t i = 0; i < m; ++i) {
      r.window_token_mass[i] += j.probabilities[n + i] / static_cast<double>(shape.query_heads);
      r.window_mass += j.probabilities[n + i] / static_cast<double>(shape.query_heads);
    }
    r.sink_mass += j.sink_probability / static_cast<double>(shape.query_heads);
  }
  return r;
}

// Tied K/V with RoPE: rotates the last R channels of every output head back by the query
// position (angle −t·θ_k), in double.
inline void derotate_heads(std::vector<double>& output, std::int64_t heads, std::int64_t channels,
                           const phasekv::rope_config& rope, std::int64_t position) {
  const std::vector<double> theta = oracle_detail::rope_frequencies(rope);
  for (std::int64_t h = 0; h < heads; ++h)
    oracle_detail::rotate(output.data() + h * channels, channels, rope, theta, -static_cast<double>(position));
}

}  // namespace phasekv_test
