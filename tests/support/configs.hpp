#pragma once
// Stream, cache and page pool configurations from the few fields a test sets; the rest keep their
// defaults (stream_config, cache_config, page_pool_config). A test adds what else it needs to the
// returned value.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/cache/page_layout.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/read/read_types.hpp"

namespace phasekv_test {

// A Config at its defaults but for the name its error messages start with.
template <class Config>
Config named(const std::string& name) {
  Config c;
  c.name = name;
  return c;
}

inline phasekv::stream_config stream_of(const std::string& name, phasekv::stream_role role, std::int64_t channels,
                                        std::int64_t kv_heads = 1,
                                        phasekv::input_layout inputs = phasekv::input_layout::per_branch) {
  // The members in their declaration order: no RoPE, norm_eps at its default.
  return phasekv::stream_config{name, role, channels, kv_heads, inputs, phasekv::rope_config{}};
}

// A key_value stream whose last rope_channels channels are rotated (base 10^4, when the policy
// applies RoPE).
inline phasekv::stream_config rotated_stream_of(const std::string& name, std::int64_t channels, std::int64_t kv_heads,
                                                phasekv::input_layout inputs, std::int64_t rope_channels) {
  phasekv::stream_config c = stream_of(name, phasekv::stream_role::key_value, channels, kv_heads, inputs);
  c.rope.channels = rope_channels;
  c.rope.base = 10000.0;
  return c;
}

// `pages` pages of `page_size` entries per stream, `history` tokens of rollback, and a raw window.
inline phasekv::cache_config cache_of(const std::string& name, std::int64_t page_size, std::int64_t pages,
                                      std::int64_t history = 0, phasekv::raw_window_config window = {}) {
  phasekv::cache_config c = named<phasekv::cache_config>(name);
  c.page_size = page_size;
  c.pages = pages;
  c.history = history;
  c.window = window;
  return c;
}

// A reader of `query_heads` heads whose streams follow the layer's roles, selecting nothing.
inline phasekv::reader_config reader_of(const std::string& name, std::int64_t query_heads) {
  phasekv::reader_config r = named<phasekv::reader_config>(name);
  r.query_heads = query_heads;
  return r;
}

// `capacity` pages of `page_size` entries of kv_heads × channels elements of `storage` (capacity 0:
// a configuration only a layout is computed from); an FP8 pool keeps `rope_channels` in bf16.
inline phasekv::page_pool_config pool_of(const std::string& name, std::int64_t page_size, std::int64_t kv_heads,
                                         std::int64_t channels, std::int64_t capacity,
                                         phasekv::storage_type storage = phasekv::storage_type::f32,
                                         std::int64_t rope_channels = 0) {
  phasekv::page_pool_config c = named<phasekv::page_pool_config>(name);
  c.page_size = page_size;
  c.kv_heads = kv_heads;
  c.channels = channels;
  c.capacity = capacity;
  c.storage = storage;
  c.rope_channels = rope_channels;
  return c;
}

}  // namespace phasekv_test
