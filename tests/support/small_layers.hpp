#pragma once
// Two small layers whose snapshots are short enough to flip every bit of, shared by the snapshot
// tests, the fault-injection tests and the snapshot fuzz harness:
//   - gated: mean-pooled keys (3 channels) and vector-gated, RMS-normed values (2 channels), a
//     raw window with separate values, in any storage type;
//   - precise: DeepSeek-V4's precision at the smallest channel counts its formats take — FP8 K/V
//     (64 channels, 8 RoPE channels in bf16), FP4 indexer keys (32) and an FP8 raw window.
// Both: page size 2, history 1, a two-token window; S = 2, so an odd token count leaves a token
// pending in the compressor. populate() gives a cache the sequences a restore lands among.

#include <cstdint>
#include <string>
#include <vector>

#include "support/configs.hpp"
#include "support/tokens.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"

namespace phasekv_test {

using small_mean = phasekv::stream_compressor<phasekv::compressor_policy<phasekv::mean_pool>>;
using small_gated =
    phasekv::stream_compressor<phasekv::compressor_policy<phasekv::vector_gated_pool, phasekv::no_rope, phasekv::rms_norm>>;
using gated_cache = phasekv::paged_cache<small_mean, small_gated>;
using precise_cache = phasekv::paged_cache<small_mean, small_mean>;

// What both caches share: two-entry pages, history 1, a two-token window of one head.
inline phasekv::cache_config small_config(const std::string& name, std::int64_t pages, std::int64_t key_channels,
                                          std::int64_t value_channels) {
  return cache_of(name, 2, pages, 1, phasekv::raw_window_config{2, 1, key_channels, value_channels});
}

inline gated_cache::layer gated_layer() {
  const phasekv::geometry g{2, 3};
  return gated_cache::layer(small_mean(g, stream_of("keys", phasekv::stream_role::key, 3)),
                            small_gated(g, stream_of("values", phasekv::stream_role::value, 2)));
}

inline phasekv::cache_config gated_config(const std::string& name, std::int64_t pages,
                                          phasekv::storage_type storage = phasekv::storage_type::f32) {
  phasekv::cache_config c = small_config(name, pages, 3, 2);
  c.storage = storage;
  return c;
}

inline precise_cache::layer precise_layer() {
  const phasekv::geometry g{2, 2};
  return precise_cache::layer(small_mean(g, stream_of("kv", phasekv::stream_role::key_value, 64)),
                              small_mean(g, stream_of("indexer", phasekv::stream_role::indexer, 32)));
}

inline phasekv::cache_config precise_config(const std::string& name, std::int64_t pages) {
  phasekv::cache_config c = small_config(name, pages, 64, 0);
  c.stream_storage = {phasekv::storage_type::fp8_e4m3_block, phasekv::storage_type::fp4_e2m1_hadamard};
  c.window.precision = phasekv::storage_type::fp8_e4m3_block;
  c.window.rope_channels = 8;
  return c;
}

// A forked pair (7 tokens, and a fork one token further: its last page copied on write) and a
// hole in the free list (a 3-token sequence, freed). Returns the pair's ids.
template <class Cache>
std::vector<phasekv::sequence_id> populate(Cache& cache) {
  const phasekv::sequence_id x = cache.create();
  append_tokens(cache, x, 7, 1u);
  const phasekv::sequence_id y = cache.fork(x);
  append_tokens(cache, y, 1, 2u);
  const phasekv::sequence_id z = cache.create();
  append_tokens(cache, z, 3, 3u);
  cache.free(z);
  return {x, y};
}

}  // namespace phasekv_test
