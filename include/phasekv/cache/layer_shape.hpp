#pragma once
// What a reader needs to know about a layer before it sees any sequence: the
// geometry its entries were pooled with, per stream the shape of one entry and whether the
// entries carry RoPE, and the raw window's shape. Data only: paged_cache::shape() fills it from
// its compressors and pools, and a host that keeps its KV memory in its own arena fills it by
// hand from its model config. A sequence's memory is described separately, per read
// (sequence_view.hpp).
//
//   layer_shape shape;
//   shape.geom = presets::deepseek_v4_csa_layer.geom;
//   shape.streams = {{"kv", stream_role::key_value, 1, 512, storage_type::f32, true, kv_rope},
//                    {"indexer", stream_role::indexer, 1, 128, storage_type::f32, false, {}}};
//   shape.window = raw_window_config{128, 1, 512, 0};
//   sparse_reader reader(shape, reader_config{...});

#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/format/storage.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/rope.hpp"

namespace phasekv {

// The raw local window a sequence keeps next to its compressed entries.
//
// precision: f32 keeps the rows as the host hands them over. fp8_e4m3_block stores each head of
// each row in DeepSeek-V4's FP8 format (format/fp8.hpp: e4m3 codes with a UE8M0 scale per 64
// channels, the last rope_channels of a key head in bf16; value heads of an untied window have no
// RoPE channels) — the model quantizes its raw window as its entries. The ring then holds those
// bytes (584 a row for DeepSeek-V4), quantized once, on append; the reader dequantizes them in its
// attention kernel as it does FP8 entries (sequence_view.hpp's window_view, cache/raw_window.hpp).
// rope_channels is 0 unless the precision is FP8.
struct raw_window_config {
  std::int64_t tokens = 0;          // N_win; 0 keeps no window
  std::int64_t kv_heads = 1;
  std::int64_t key_channels = 0;
  std::int64_t value_channels = 0;  // 0: tied K/V, the keys are also the values
  storage_type precision = storage_type::f32;  // f32 or fp8_e4m3_block
  std::int64_t rope_channels = 0;   // fp8_e4m3_block: the last ones of a key head, kept in bf16

  static constexpr std::int64_t max_tokens = std::int64_t{1} << 32;

  // Throws config_error naming `field`.<member> (a cache's: "<cache>.window").
  void validate(const std::string& field = "window") const {
    using detail::require;
    require(tokens >= 0 && tokens <= max_tokens, field + ".tokens", tokens, "must lie in [0, 2^32]");
    if (tokens == 0) return;
    require(kv_heads >= 1 && kv_heads <= limits::max_heads, field + ".kv_heads", kv_heads, "must lie in [1, 2^16]");
    require(key_channels >= 1 && key_channels <= limits::max_channels, field + ".key_channels", key_channels,
            "must lie in [1, 2^20]");
    require(value_channels >= 0 && value_channels <= limits::max_channels, field + ".value_channels", value_channels,
            "must lie in [0, 2^20] (0 = tied K/V)");
    require(precision == storage_type::f32 || precision == storage_type::fp8_e4m3_block, field + ".precision",
            static_cast<int>(precision), "must be f32 or fp8_e4m3_block");
    require(precision == storage_type::fp8_e4m3_block ? rope_channels >= 0 && rope_channels <= key_channels
                                                      : rope_channels == 0,
            field + ".rope_channels", rope_channels,
            precision == storage_type::fp8_e4m3_block ? "must lie in [0, window.key_channels]"
                                                      : "must be 0 unless window.precision is fp8_e4m3_block");
  }
};

// One stream's entries: kv_heads × channels elements of `storage`, and whether the policy that
// wrote them rotated them by RoPE (only then does `rope` mean anything). fp8_e4m3_block entries
// keep the last stored_rope_channels() channels of each head in bf16; fp4_e2m1_hadamard entries
// (an indexer stream's only) hold every channel transformed and quantized (format/fp4.hpp).
struct stream_shape {
  std::string name = "stream";
  stream_role role = stream_role::key_value;
  std::int64_t kv_heads = 1;
  std::int64_t channels = 0;
  storage_type storage = storage_type::f32;
  bool applies_rope = false;
  rope_config rope;
};

// The RoPE channels an fp8_e4m3_block stream keeps in bf16 (format/fp8.hpp): its rope channels
// when its policy applies RoPE, else 0; 0 for every other storage type. paged_cache gives its
// pools the same (page_pool_config::rope_channels).
inline std::int64_t stored_rope_channels(const stream_shape& s) noexcept {
  return s.storage == storage_type::fp8_e4m3_block && s.applies_rope ? s.rope.channels : 0;
}

// No stream: a window-only layer (DeepSeek-V4's compress ratio 0), which reads its raw window alone;
// window_rope is the RoPE its window keys carry (for reader_config::derotate_output; a layer with
// streams rotates back by its key stream's).
struct layer_shape {
  geometry geom;
  std::vector<stream_shape> streams;
  raw_window_config window;
  rope_config window_rope;
};

}  // namespace phasekv
