#pragma once
// A DeepSeek-V4 CSA layer for the tests (FP8 entries, FP4 indexer keys, snapshots): its two
// streams with seeded random learned parameters, a small cache configuration, and random appends
// of the same tokens to two caches (a quantized one and its fp32 twin, whose entries are the
// oracle's input).

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/random_inputs.hpp"
#include "support/configs.hpp"
#include "support/request_inputs.hpp"
#include "support/tokens.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/models/deepseek_v4.hpp"

namespace phasekv_test {

using csa_stream = phasekv::stream_compressor<phasekv::presets::deepseek_v4_csa_policy>;
using csa_cache = phasekv::paged_cache<csa_stream, csa_stream>;

// A stream of the CSA preset (K/V or indexer config) with random slot bias and norm weight.
inline csa_stream make_csa_stream(phasekv::stream_config c, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const phasekv::geometry g = phasekv::presets::deepseek_v4_csa_layer.geom;
  phasekv::stream_params p;
  p.slot_bias = random_bias(rng, static_cast<std::size_t>(c.kv_heads * g.window * c.channels));
  p.norm_weight = random_norm_weight(rng, static_cast<std::size_t>(c.channels));
  return csa_stream(g, std::move(c), std::move(p));
}

// Both streams: K/V (512 channels) and indexer keys (128).
inline csa_cache::layer make_csa_layer() {
  return csa_cache::layer(
      make_csa_stream(phasekv::presets::deepseek_kv_stream(phasekv::presets::deepseek_v4_csa_layer), 1),
      make_csa_stream(*phasekv::presets::deepseek_indexer_stream(phasekv::presets::deepseek_v4_csa_layer), 2));
}

// `pages` pages of `page_size` entries per stream, stored as `storage`, a tied window of
// window_tokens, and `history` tokens of rollback.
inline phasekv::cache_config csa_config(const std::string& name, std::int64_t page_size,
                                        std::vector<phasekv::storage_type> storage, std::int64_t pages = 40,
                                        std::int64_t window_tokens = 16, std::int64_t history = 0) {
  phasekv::cache_config c = cache_of(name, page_size, pages, history, phasekv::raw_window_config{window_tokens, 1, 512, 0});
  c.stream_storage = std::move(storage);
  return c;
}

// The CSA reader preset (at DeepSeek-V4's precision: the FP4 indexer), selecting top_k, named
// "dsv4" in errors.
inline phasekv::reader_config dsv4_reader(std::int64_t top_k, bool precision) {
  phasekv::reader_config rc = precision
                                  ? phasekv::presets::deepseek_reader(phasekv::presets::deepseek_v4_csa_layer, true)
                                  : phasekv::presets::deepseek_reader(phasekv::presets::deepseek_v4_csa_layer);
  rc.name = "dsv4";
  rc.top_k = top_k;
  return rc;
}

// Queries of the CSA reader preset at `position`, drawn in this order: 64 heads of 512 channels
// and 64 indexer heads of 128, uniform in [−1, 1); 64 indexer weights in [0, weight_hi); 64
// sinks in [−1, 1).
inline request_inputs random_csa_query(std::mt19937& rng, std::int64_t position, float weight_hi) {
  request_inputs r;
  r.queries = random_uniform(rng, 64 * 512, -1.0f, 1.0f);
  r.indexer_queries = random_uniform(rng, 64 * 128, -1.0f, 1.0f);
  r.indexer_weights = random_uniform(rng, 64, 0.0f, weight_hi);
  r.sinks = random_uniform(rng, 64, -1.0f, 1.0f);
  r.request.position = position;
  r.point();
  return r;
}

// Tokens as the CSA tests draw them: payloads and window rows in [−1, 1), gate logits in [−2, 2).
inline constexpr token_draw csa_draw{-1.0f, 1.0f, -2.0f, 2.0f};

// Appends the same `tokens` random tokens (csa_draw) to sequence sa of a and sb of b.
inline void append_random(csa_cache& a, csa_cache& b, phasekv::sequence_id sa, phasekv::sequence_id sb,
                          std::int64_t tokens, std::mt19937& rng) {
  const token_inputs<2> in = random_tokens(a, tokens, rng, csa_draw);
  append(a, sa, in);
  append(b, sb, in);
}

// A sequence of a quantized cache and its twin in an fp32 cache, given the same tokens, and the
// forks of both.
struct twin_sequences {
  phasekv::sequence_id quantized, exact, quantized_fork, exact_fork;
};

// 55 tokens in chunks of 3, 1, 40, 9 and 2 (partial pages, and a chunk across several), then
// forks of both 6 tokens further (the partial last page copied on write).
inline twin_sequences fill_twins(csa_cache& quantized, csa_cache& exact, std::mt19937& rng) {
  twin_sequences s;
  s.quantized = quantized.create();
  s.exact = exact.create();
  for (std::int64_t n : {3, 1, 40, 9, 2}) append_random(quantized, exact, s.quantized, s.exact, n, rng);
  s.quantized_fork = quantized.fork(s.quantized);
  s.exact_fork = exact.fork(s.exact);
  append_random(quantized, exact, s.quantized_fork, s.exact_fork, 6, rng);
  return s;
}

}  // namespace phasekv_test
