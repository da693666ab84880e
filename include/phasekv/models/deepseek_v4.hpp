#pragma once
// DeepSeek-V4 and V4.1's compressed attention layers, described once: the compressor, cache and
// reader presets of each layer kind are all built from `deepseek_v4_spec` and a `deepseek_layer`
// (its geometry, whether it has an indexer, its name), so the three agree by construction.
// Learned parameters (gate biases, norm weights) are the model's; these give shapes and maths.
// DeepSeek's checkpoint tensors map onto these streams with compress/deepseek_checkpoint.hpp.
//
// Two precisions per layer: fp32 (what phasekv checks against its double-precision oracles), and
// DeepSeek-V4's own — the K/V stream as FP8 (storage_type::fp8_e4m3_block: e4m3fn codes with
// UE8M0 scales, the RoPE channels in bf16; format/fp8.hpp), the indexer keys as FP4
// (fp4_e2m1_hadamard, format/fp4.hpp) read by indexer_precision::fp4, and the raw window's rows
// rounded to the same FP8 values (DeepSeek-V4 quantizes its window tokens like its entries).
// Capacities (pages, history) are the host's choice.

#include <cstdint>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/policies.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/rope.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/models/layer_kind.hpp"
#include "phasekv/read/read_types.hpp"

namespace phasekv::presets {

// What the two models share in every compressed layer.
struct deepseek_v4_spec {
  static constexpr std::int64_t kv_channels = 512;  // tied K/V: one stream read as keys and values
  static constexpr std::int64_t kv_heads = 1;
  static constexpr std::int64_t rope_channels = 64;  // the last 64 of each entry, RoPE'd after pooling
  static constexpr std::int64_t indexer_channels = 128;
  static constexpr std::int64_t query_heads = 64;    // V4-Flash
  static constexpr std::int64_t indexer_heads = 64;
  static constexpr std::int64_t top_k = 512;          // entries the indexer selects (CSA)
  static constexpr std::int64_t page_size = 64;       // entries a page: FlashMLA's page size
  static constexpr std::int64_t window_tokens = 128;  // raw tokens kept beside the entries
  static constexpr double norm_eps = 1e-6;
};

// Vector gates with a per-slot bias (the `ape` parameter), RMSNorm, RoPE after pooling: every
// DeepSeek-V4 compressed layer, CSA and HCA alike.
using deepseek_v4_csa_policy = compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>;
using deepseek_v4_hca_policy = deepseek_v4_csa_policy;
using deepseek_v4_1_csa_policy = deepseek_v4_csa_policy;

// One layer kind. Its configs' names derive from `model` and `kind` by a fixed scheme —
// "csa.kv", "dsv4.csa", "v4.1.csa.reader" — because a cache's name is part of its snapshots'
// identity: streams and readers are named "<kind>…" for V4 and "<model>.<kind>…" otherwise,
// caches "ds<model>.<kind>".
struct deepseek_layer {
  const char* model;  // "v4", "v4.1"
  const char* kind;   // "csa": an indexer selects top_k entries; "hca": every complete entry is read
  geometry geom;
  bool indexer;

  std::string prefix() const { return std::string(model) == "v4" ? kind : std::string(model) + "." + kind; }
  std::string cache_name() const { return std::string("ds") + model + "." + kind; }
};

// CSA: S = 4, W = 8, two branches (one projection per branch).
inline constexpr deepseek_layer deepseek_v4_csa_layer{"v4", "csa", geometry{4, 8, 0, anchor_mode::block_start}, true};
// HCA: S = W = 128 (one branch, no overlap), no indexer.
inline constexpr deepseek_layer deepseek_v4_hca_layer{"v4", "hca", geometry{128, 128, 0, anchor_mode::block_start},
                                                      false};
// V4.1's CSA uses S = 2; the window is our assumption (W = 2S, overlapping as in V4's CSA). V4's
// reference Compressor turns the overlap on only for ratio 4 (`overlap = compress_ratio == 4`):
// if V4.1 kept that line its S = 2 windows would not overlap (W = S = 2) — check against V4.1's
// own code before loading its weights (deepseek::coff() of this geometry is 2: it expects ape
// [2][1024] and 1024-row projections). Heads, indexer, top-k, window and pages: V4's (also our
// assumption: only the stride is published).
inline constexpr deepseek_layer deepseek_v4_1_csa_layer{"v4.1", "csa", geometry{2, 4, 0, anchor_mode::block_start},
                                                        true};

// The compressed layer of a checkpoint's compress ratio (config.json's `compress_ratios`): 4 → V4's
// CSA, 128 → HCA, 2 → V4.1's CSA. Any other ratio is a config_error naming `field` and the ratio;
// 0, a window-only layer, has no compressed stream (deepseek_window_kind describes it).
inline deepseek_layer deepseek_layer_of(int compress_ratio, const std::string& field = "compress_ratio") {
  switch (compress_ratio) {
    case 4: return deepseek_v4_csa_layer;
    case 128: return deepseek_v4_hca_layer;
    case 2: return deepseek_v4_1_csa_layer;
  }
  detail::fail(field, compress_ratio,
               "is not a compressed DeepSeek-V4 layer's (4: CSA, 128: HCA, 2: V4.1's CSA; 0 is window-only)");
}

// Interleaved RoPE at the block start on the last 64 channels, base 160000, YaRN-scaled ×16 from
// a 65536-token original context.
inline rope_config deepseek_v4_compressed_rope() {
  rope_config r;
  r.channels = deepseek_v4_spec::rope_channels;
  r.base = 160000.0;
  r.layout = rope_layout::interleaved;
  r.yarn.enabled = true;
  r.yarn.factor = 16.0;
  r.yarn.original_context = 65536;
  r.yarn.beta_fast = 32.0;
  r.yarn.beta_slow = 1.0;
  return r;
}

// The layer's tied K/V stream: one head of 512 channels, per-branch inputs.
inline stream_config deepseek_kv_stream(const deepseek_layer& layer) {
  stream_config c;
  c.name = layer.prefix() + ".kv";
  c.role = stream_role::key_value;
  c.channels = deepseek_v4_spec::kv_channels;
  c.kv_heads = deepseek_v4_spec::kv_heads;
  c.inputs = input_layout::per_branch;
  c.rope = deepseek_v4_compressed_rope();
  c.norm_eps = deepseek_v4_spec::norm_eps;
  return c;
}

// The lightning indexer's compressed keys: 128 channels, the K/V stream's geometry, pooling, norm
// and RoPE. Where its RoPE channels sit in the real model is our reading, not a published fact:
// the last 64 here. Empty for a layer without an indexer.
inline std::optional<stream_config> deepseek_indexer_stream(const deepseek_layer& layer) {
  if (!layer.indexer) return std::nullopt;
  stream_config c = deepseek_kv_stream(layer);
  c.name = layer.prefix() + ".indexer";
  c.role = stream_role::indexer;
  c.channels = deepseek_v4_spec::indexer_channels;
  return c;
}

// How the indexer keys are stored at DeepSeek-V4's precision: as it runs its indexer
// (fp4_act_quant after a Hadamard transform) — 64 bytes of e2m1 codes and 4 UE8M0 scales per
// 128-channel key, 68 bytes instead of 512, read only by indexer_precision::fp4.
inline storage_type deepseek_v4_indexer_storage() { return storage_type::fp4_e2m1_hadamard; }

// The raw window: the last 128 tokens' tied K/V (already RoPE'd by the host); at DeepSeek-V4's
// precision FP8 values with the 64 RoPE channels in bf16.
inline raw_window_config deepseek_window(bool precision) {
  raw_window_config w;
  w.tokens = deepseek_v4_spec::window_tokens;
  w.kv_heads = deepseek_v4_spec::kv_heads;
  w.key_channels = deepseek_v4_spec::kv_channels;
  w.value_channels = 0;  // tied
  if (precision) {
    w.precision = storage_type::fp8_e4m3_block;
    w.rope_channels = deepseek_v4_spec::rope_channels;
  }
  return w;
}

// The layer's cache (stream 0: K/V; a CSA layer's stream 1: indexer keys), `pages` per stream. At
// DeepSeek-V4's precision a 512-channel entry takes 584 bytes instead of 2048, read bit-identically
// to fp32 entries holding the dequantized values; a CSA layer's compressed token 584 + 68 bytes.
inline cache_config deepseek_cache(const deepseek_layer& layer, std::int64_t pages, std::int64_t history = 0,
                                   bool precision = false) {
  cache_config c;
  c.name = layer.cache_name() + (precision ? ".precision" : "");
  c.page_size = deepseek_v4_spec::page_size;
  c.pages = pages;
  c.history = history;
  c.window = deepseek_window(precision);
  if (precision) {
    c.stream_storage = {storage_type::fp8_e4m3_block};
    if (layer.indexer) c.stream_storage.push_back(deepseek_v4_indexer_storage());
  }
  return c;
}

// The layer's reader: 64 query heads over the tied K/V head (stream 0), an attention sink per
// head, the output's RoPE channels rotated back by the query position; a CSA layer's indexer (64
// heads on stream 1) chooses the top 512 entries, in FP4 at DeepSeek-V4's precision (queries
// Hadamard-transformed and quantized to e2m1 like the keys, scores as exact integer dot
// products). Attention reads FP8 entries directly: the K/V side needs no setting.
inline reader_config deepseek_reader(const deepseek_layer& layer, bool precision = false) {
  reader_config r;
  r.name = layer.prefix() + (precision ? ".precision" : "") + ".reader";
  r.query_heads = deepseek_v4_spec::query_heads;
  r.key_stream = 0;
  r.value_stream = 0;
  r.sink = true;
  r.derotate_output = true;
  if (layer.indexer) {
    r.indexer_stream = 1;
    r.top_k = deepseek_v4_spec::top_k;
    r.indexer_heads = deepseek_v4_spec::indexer_heads;
    if (precision) r.precision = indexer_precision::fp4;
  } else {
    r.indexer_stream = no_stream;
    r.top_k = 0;
    r.indexer_heads = 0;
  }
  return r;
}

// Everything one layer needs, consistent by construction.
struct deepseek_layer_preset {
  geometry geom;
  stream_config kv;
  std::optional<stream_config> indexer;
  cache_config cache;
  reader_config reader;
};

inline deepseek_layer_preset deepseek_preset(const deepseek_layer& layer, std::int64_t pages, std::int64_t history = 0,
                                             bool precision = false) {
  return {layer.geom, deepseek_kv_stream(layer), deepseek_indexer_stream(layer),
          deepseek_cache(layer, pages, history, precision), deepseek_reader(layer, precision)};
}

// --- Whole models, as data (models/layer_kind.hpp, models/model_cache.hpp) -------------------------

// One compressed layer kind: the K/V stream (and a CSA layer's indexer keys), its window, its
// reader — the same facts as deepseek_preset(), with the streams' policy named for the registry.
inline layer_kind deepseek_kind(const deepseek_layer& layer, bool precision = false) {
  layer_kind k;
  k.name = layer.prefix();
  k.geom = layer.geom;
  const auto stream = [&](stream_config c, storage_type storage) {
    stream_spec st;
    st.config = std::move(c);
    st.pooling = "vector_gates";
    st.rope = rope_placement::after_pool;
    st.norm = entry_norm::rms;
    st.storage = storage;
    return st;
  };
  k.streams.push_back(stream(deepseek_kv_stream(layer), precision ? storage_type::fp8_e4m3_block : storage_type::f32));
  if (layer.indexer)
    k.streams.push_back(
        stream(*deepseek_indexer_stream(layer), precision ? deepseek_v4_indexer_storage() : storage_type::f32));
  k.window = deepseek_window(precision);
  k.page_size = deepseek_v4_spec::page_size;
  k.reader = deepseek_reader(layer, precision);
  return k;
}

// A window-only layer (compress ratio 0): the last 128 tokens' tied K/V and nothing else, read
// with the sink and the output rotated back. Its window keys' RoPE is taken to be the compressed
// layers' (our assumption: check the checkpoint's rope settings for ratio-0 layers).
inline layer_kind deepseek_window_kind(bool precision = false) {
  layer_kind k;
  k.name = "swa";
  k.window = deepseek_window(precision);
  k.window_rope = deepseek_v4_compressed_rope();
  k.reader = reader_config{};
  k.reader.query_heads = deepseek_v4_spec::query_heads;
  k.reader.sink = true;
  k.reader.derotate_output = true;
  return k;
}

// The model from its checkpoint's per-layer compress ratios (config.json's `compress_ratios`):
// 0 → window-only, 4 → CSA, 128 → HCA (V4), 2 → V4.1's CSA. Each kind appears once, in order of
// first use; a ratio it does not know is a config_error naming the layer.
inline model_spec deepseek_v4_model(const std::vector<int>& compress_ratios, bool precision = false,
                                    const std::string& name = "dsv4") {
  model_spec m;
  m.name = name + (precision ? ".precision" : "");
  std::vector<int> seen;
  for (std::size_t l = 0; l < compress_ratios.size(); ++l) {
    const int ratio = compress_ratios[l];
    std::size_t kind = seen.size();
    for (std::size_t k = 0; k < seen.size(); ++k)
      if (seen[k] == ratio) kind = k;
    if (kind == seen.size()) {
      if (ratio == 0)
        m.kinds.push_back(deepseek_window_kind(precision));
      else
        m.kinds.push_back(
            deepseek_kind(deepseek_layer_of(ratio, name + ": compress_ratios[" + std::to_string(l) + "]"), precision));
      seen.push_back(ratio);
    }
    m.layers.push_back({kind, {}});
  }
  return m;
}

// A DeepSeek-V4-shaped model of `layers` layers for tests and benchmarks: two window-only layers,
// then CSA and HCA alternating (the published checkpoints list their own ratios: use
// deepseek_v4_model with them).
inline model_spec deepseek_v4_shaped(std::size_t layers, bool precision = false) {
  std::vector<int> ratios;
  for (std::size_t l = 0; l < layers; ++l) ratios.push_back(l < 2 ? 0 : l % 2 == 0 ? 4 : 128);
  return deepseek_v4_model(ratios, precision);
}

// DeepSeek's indexer scales its per-head weights by index_head_dim^-0.5 · index_heads^-0.5 before
// the weighted ReLU sum (read_request::indexer_weights takes the scaled weights): the factor, and
// the weights scaled in place.
inline float deepseek_indexer_weight_scale() {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(deepseek_v4_spec::indexer_channels)) /
                            std::sqrt(static_cast<double>(deepseek_v4_spec::indexer_heads)));
}
inline void deepseek_scale_indexer_weights(span<float> weights) {
  const float scale = deepseek_indexer_weight_scale();
  for (float& w : weights) w *= scale;
}

}  // namespace phasekv::presets
