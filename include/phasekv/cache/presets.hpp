#pragma once
// Cache configurations of published models, next to their compressor presets
// (compress/presets.hpp) and reader presets (read/presets.hpp). Capacities are the host's choice.

#include <cstdint>

#include "phasekv/cache/paged_cache.hpp"

namespace phasekv::presets {

// A DeepSeek-V4 CSA or HCA layer: the raw window holds the last 128 tokens' 512-channel tied K/V
// (already RoPE'd by the host), entries sit 64 to a page (FlashMLA's page size), `pages` per
// stream. The CSA layer has two streams (K/V and indexer keys), the HCA layer one.
inline cache_config deepseek_v4_cache(std::int64_t pages, std::int64_t history = 0) {
  cache_config c;
  c.name = "dsv4";
  c.page_size = 64;
  c.pages = pages;
  c.history = history;
  c.window.tokens = 128;
  c.window.kv_heads = 1;
  c.window.key_channels = 512;
  c.window.value_channels = 0;  // tied
  return c;
}

}  // namespace phasekv::presets
