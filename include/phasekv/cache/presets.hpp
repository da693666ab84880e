#pragma once
// Cache configurations of published models, next to their compressor presets
// (compress/presets.hpp) and reader presets (read/presets.hpp). Capacities are the host's choice.
//
// Two kinds per DeepSeek layer: the default keeps every stream in fp32 (what phasekv checks
// against its double-precision oracles); the *_precision_cache variants store entries the way
// DeepSeek-V4's reference code does — the K/V stream as FP8 (storage_type::fp8_e4m3_block:
// e4m3fn codes with UE8M0 scales, the 64 RoPE channels in bf16; format/fp8.hpp) and the indexer
// keys as FP4 (deepseek_v4_indexer_storage()), read by the *_precision_reader presets of
// read/presets.hpp — and the raw window's rows rounded to the same FP8 values as the entries
// (raw_window_config::precision; DeepSeek-V4 quantizes its window tokens like its entries).

#include <cstdint>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/format/storage.hpp"

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

// The same per layer kind, named after it (stream 0: K/V; CSA stream 1: indexer keys).
inline cache_config deepseek_v4_csa_cache(std::int64_t pages, std::int64_t history = 0) {
  cache_config c = deepseek_v4_cache(pages, history);
  c.name = "dsv4.csa";
  return c;
}

inline cache_config deepseek_v4_hca_cache(std::int64_t pages, std::int64_t history = 0) {
  cache_config c = deepseek_v4_cache(pages, history);
  c.name = "dsv4.hca";
  return c;
}

// V4.1's CSA layer (S = 2, W = 4): the window and pages as V4's (our assumption).
inline cache_config deepseek_v4_1_csa_cache(std::int64_t pages, std::int64_t history = 0) {
  cache_config c = deepseek_v4_cache(pages, history);
  c.name = "dsv4.1.csa";
  return c;
}

// How the lightning indexer's compressed keys are stored in the precision caches: as DeepSeek-V4
// runs its indexer (fp4_act_quant after a Hadamard transform), storage_type::fp4_e2m1_hadamard —
// 64 bytes of e2m1 codes and 4 UE8M0 scales per 128-channel key (format/fp4.hpp), 68 bytes
// instead of 512. Keys stored so are read only by indexer_precision::fp4, which the matching
// reader presets set (read/presets.hpp: deepseek_v4_csa_precision_reader and its V4.1 twin).
inline storage_type deepseek_v4_indexer_storage() { return storage_type::fp4_e2m1_hadamard; }

// The raw window of the precision caches: FP8 values, the 64 RoPE channels in bf16.
inline raw_window_config deepseek_v4_precision_window() {
  raw_window_config w = deepseek_v4_cache(1).window;
  w.precision = storage_type::fp8_e4m3_block;
  w.rope_channels = 64;
  return w;
}

// DeepSeek-V4 precision: the K/V stream in FP8, 584 bytes per 512-channel entry instead of 2048,
// read bit-identically to fp32 entries holding the dequantized values; the CSA layers' indexer
// keys in FP4. Per compressed token of a CSA layer: 584 + 68 = 652 bytes against 2048 + 512.
inline cache_config deepseek_v4_csa_precision_cache(std::int64_t pages, std::int64_t history = 0) {
  cache_config c = deepseek_v4_csa_cache(pages, history);
  c.window = deepseek_v4_precision_window();
  c.name = "dsv4.csa.precision";
  c.stream_storage = {storage_type::fp8_e4m3_block, deepseek_v4_indexer_storage()};
  return c;
}

inline cache_config deepseek_v4_hca_precision_cache(std::int64_t pages, std::int64_t history = 0) {
  cache_config c = deepseek_v4_hca_cache(pages, history);
  c.window = deepseek_v4_precision_window();
  c.name = "dsv4.hca.precision";
  c.stream_storage = {storage_type::fp8_e4m3_block};  // no indexer
  return c;
}

inline cache_config deepseek_v4_1_csa_precision_cache(std::int64_t pages, std::int64_t history = 0) {
  cache_config c = deepseek_v4_1_csa_cache(pages, history);
  c.window = deepseek_v4_precision_window();
  c.name = "dsv4.1.csa.precision";
  c.stream_storage = {storage_type::fp8_e4m3_block, deepseek_v4_indexer_storage()};
  return c;
}

}  // namespace phasekv::presets
