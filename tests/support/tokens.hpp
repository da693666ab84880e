#pragma once
// Random tokens for a layer and its raw window, and the fixture that appends them to a cache: what
// tests need when a sequence must hold tokens but no particular values.
//
// random_tokens draws from one generator in one fixed order — stream by stream its payload (then,
// with token_draw::decades, one magnitude per token) and its gate logits; then the window's key
// rows and its untied value rows — each value uniform in its range. The order is part of the
// contract: a test that records a seed's tokens (or replays a fuzz input) gets the same values.
// A stream whose policy reads no logits, or a layer without a window (or with a tied one), draws
// nothing for them.

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "support/random_inputs.hpp"
#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/cache/raw_window.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/core/types.hpp"

namespace phasekv_test {

// f(k, stream k) for every stream of a layer, in order.
template <class Layer, class F, std::size_t... K>
void each_stream(const Layer& layer, F&& f, std::index_sequence<K...>) {
  (f(K, layer.template stream<K>()), ...);
}
template <class Layer, class F>
void each_stream(const Layer& layer, F&& f) {
  each_stream(layer, f, std::make_index_sequence<Layer::stream_count>{});
}

// How values are drawn.
struct token_draw {
  float lo = -1.0f, hi = 1.0f;                // payloads and window rows
  float logit_lo = -1.0f, logit_hi = 1.0f;    // gate logits
  float decades = 0.0f;  // > 0: each token's payload times 10^u, u uniform in [−decades, decades)
};

// The inputs of `tokens` tokens, token-major: per stream its payload and logits, and the window's
// key and value rows.
template <std::size_t N>
struct token_inputs {
  std::int64_t tokens = 0;
  std::array<std::vector<float>, N> payload, logits;
  std::vector<float> window_keys, window_values;

  // The chunks an append takes (views of this object's vectors).
  std::array<phasekv::token_chunk, N> chunks() const {
    std::array<phasekv::token_chunk, N> c;
    for (std::size_t k = 0; k < N; ++k) c[k] = phasekv::token_chunk{tokens, payload[k], logits[k]};
    return c;
  }

  // Tokens [first, first + n) of these.
  token_inputs slice(std::int64_t first, std::int64_t n) const {
    const auto part = [&](const std::vector<float>& v) {
      const std::size_t per = tokens > 0 ? v.size() / static_cast<std::size_t>(tokens) : 0;
      return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(first) * per),
                                v.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(first + n) * per));
    };
    token_inputs out;
    out.tokens = n;
    for (std::size_t k = 0; k < N; ++k) {
      out.payload[k] = part(payload[k]);
      out.logits[k] = part(logits[k]);
    }
    out.window_keys = part(window_keys);
    out.window_values = part(window_values);
    return out;
  }

  // `more` after these tokens.
  void extend(const token_inputs& more) {
    const auto cat = [](std::vector<float>& a, const std::vector<float>& b) { a.insert(a.end(), b.begin(), b.end()); };
    for (std::size_t k = 0; k < N; ++k) {
      cat(payload[k], more.payload[k]);
      cat(logits[k], more.logits[k]);
    }
    cat(window_keys, more.window_keys);
    cat(window_values, more.window_values);
    tokens += more.tokens;
  }
};

template <class Layer>
token_inputs<Layer::stream_count> random_tokens(const Layer& layer, const phasekv::raw_window_config& window,
                                                std::int64_t tokens, std::mt19937& rng, const token_draw& draw = {}) {
  const auto count = [tokens](std::int64_t per) { return static_cast<std::size_t>(tokens * per); };
  token_inputs<Layer::stream_count> in;
  in.tokens = tokens;
  each_stream(layer, [&](std::size_t k, const auto& c) {
    const std::int64_t per = c.payload_floats_per_token();
    in.payload[k] = random_uniform(rng, count(per), draw.lo, draw.hi);
    if (draw.decades > 0.0f) {
      std::uniform_real_distribution<float> decade(-draw.decades, draw.decades);
      for (std::int64_t t = 0; t < tokens; ++t) {
        const float m = std::pow(10.0f, decade(rng));
        for (std::int64_t i = 0; i < per; ++i) in.payload[k][static_cast<std::size_t>(t * per + i)] *= m;
      }
    }
    in.logits[k] = random_uniform(rng, count(c.logit_floats_per_token()), draw.logit_lo, draw.logit_hi);
  });
  in.window_keys = random_uniform(rng, count(phasekv::window_key_floats(window)), draw.lo, draw.hi);
  in.window_values = random_uniform(rng, count(phasekv::window_value_floats(window)), draw.lo, draw.hi);
  return in;
}

// The inputs of `tokens` tokens for a cache's streams and window.
template <class Cache>
token_inputs<Cache::stream_count> random_tokens(const Cache& cache, std::int64_t tokens, std::mt19937& rng,
                                                const token_draw& draw = {}) {
  return random_tokens(cache.compressors(), cache.config().window, tokens, rng, draw);
}

template <class Cache, std::size_t N>
void append(Cache& cache, phasekv::sequence_id id, const token_inputs<N>& in) {
  cache.append(id, in.chunks(), in.window_keys, in.window_values);
}

// Appends `tokens` random tokens to sequence `id`, drawn from `rng` or from a generator seeded by `seed`.
template <class Cache>
void append_tokens(Cache& cache, phasekv::sequence_id id, std::int64_t tokens, std::mt19937& rng,
                   const token_draw& draw = {}) {
  append(cache, id, random_tokens(cache, tokens, rng, draw));
}
template <class Cache>
void append_tokens(Cache& cache, phasekv::sequence_id id, std::int64_t tokens, unsigned seed, const token_draw& draw = {}) {
  std::mt19937 rng(seed);
  append_tokens(cache, id, tokens, rng, draw);
}

}  // namespace phasekv_test
