#pragma once
// The checks of the read path, before it touches anything: a reader's or a selection's
// configuration against the layer's shape, and each request, view and stream against both.
// Whatever a read or a selection rejects is rejected here, by input_error naming the field
// ("reader: items[3].view.streams[1].pages[7]"), before any output is written — so a bad batch
// item changes nothing (docs/RELIABILITY.md lists every promise).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/cache/sequence_view.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/read/read_types.hpp"
#include "phasekv/read/reader_streams.hpp"
#include "phasekv/kernels/finite.hpp"

namespace phasekv {
namespace detail {

// "<name>: request.queries" for a single call, "<name>: items[3].request.queries" in a batch.
struct field_name {
  const std::string& name;
  std::ptrdiff_t item = -1;
  std::string operator()(const std::string& what) const {
    return name + ": " + (item < 0 ? std::string() : "items[" + std::to_string(item) + "].") + what;
  }
};

// ---- configurations ----------------------------------------------------------------------------

// Every stream of the shape: heads, channels and a storage the read path can decode.
inline void check_stream_shapes(const layer_shape& shape, const std::string& n) {
  const std::size_t streams = shape.streams.size();
  if (streams > 0) shape.geom.validate();  // a window-only layer pools nothing
  require(streams <= sequence_view::max_streams, n + ": shape.streams.size()", streams,
          "must lie in [0, " + std::to_string(sequence_view::max_streams) + "]");
  for (std::size_t k = 0; k < streams; ++k) {
    const stream_shape& st = shape.streams[k];
    const std::string f = n + ": shape.streams[" + std::to_string(k) + "]";
    require(st.kv_heads >= 1 && st.kv_heads <= limits::max_heads, f + ".kv_heads", st.kv_heads, "must lie in [1, 2^16]");
    require(st.channels >= 1 && st.channels <= limits::max_channels, f + ".channels", st.channels,
            "must lie in [1, 2^20]");
    require(is_valid(st.storage), f + ".storage", static_cast<int>(st.storage), "is not a storage_type");
    if (st.storage == storage_type::fp8_e4m3_block) {
      const std::int64_t rope = stored_rope_channels(st);
      require(rope >= 0 && rope <= st.channels, f + ".rope.channels", rope,
              "must lie in [0, channels = " + std::to_string(st.channels) +
                  "]: fp8_e4m3_block keeps the RoPE channels of a stream that applies RoPE in bf16");
    }
    if (st.storage == storage_type::fp4_e2m1_hadamard)
      require(is_fp4_channel_count(st.channels), f + ".channels", st.channels,
              "must be a power of two in [32, 1024] for fp4_e2m1_hadamard storage");
  }
}

// A selection's configuration (its own, or a reader's): the indexer stream and the precision its
// storage allows. Returns the indexer's channels (0 without an indexer).
inline std::int64_t check_selection_config(const layer_shape& shape, const selection_config& c) {
  const std::string& n = c.name;
  const std::size_t streams = shape.streams.size();
  require(c.precision == indexer_precision::f32 || c.precision == indexer_precision::bf16 ||
              c.precision == indexer_precision::fp4,
          n + ".precision", static_cast<int>(c.precision), "is not an indexer_precision");
  require(c.top_k >= 0, n + ".top_k", c.top_k, "must be non-negative (0 = no selection)");
  require(c.top_k <= std::numeric_limits<std::int32_t>::max(), n + ".top_k", c.top_k,
          "must be below 2^31 (selected entries are reported as 32-bit indices)");
  require(c.physical_stream < streams, n + ".physical_stream", c.physical_stream,
          "must name a stream of the cache (it has " + std::to_string(streams) + ")");
  if (c.indexer_stream == no_stream) {
    require(c.indexer_heads == 0, n + ".indexer_heads", c.indexer_heads,
            "must be 0 without an indexer stream (the host supplies the indices)");
    return 0;
  }
  require(c.indexer_stream < streams, n + ".indexer_stream", static_cast<long long>(c.indexer_stream),
          "must name a stream of the cache when top_k > 0, or be no_stream (the host supplies the indices)");
  const stream_shape& ix = shape.streams[c.indexer_stream];
  require(ix.kv_heads == 1, n + ": indexer stream kv_heads", ix.kv_heads, "must be 1");
  require(c.indexer_heads >= 1, n + ".indexer_heads", c.indexer_heads, "must be at least 1 when top_k > 0 with an indexer stream");
  require(c.indexer_heads <= limits::max_heads, n + ".indexer_heads", c.indexer_heads, "must be at most 2^16");
  if (c.precision == indexer_precision::bf16)
    require(ix.storage == storage_type::bf16, n + ".precision", "bf16",
            std::string("needs the indexer stream stored in bf16 (cache_config.stream_storage), not ") + to_string(ix.storage));
  if (c.precision == indexer_precision::fp4)
    require(ix.storage == storage_type::fp4_e2m1_hadamard, n + ".precision", "fp4",
            std::string("needs the indexer stream stored in fp4_e2m1_hadamard (cache_config.stream_storage), not ") +
                to_string(ix.storage));
  else
    require(ix.storage != storage_type::fp4_e2m1_hadamard, n + ".precision",
            c.precision == indexer_precision::bf16 ? "bf16" : "f32",
            "must be fp4 for an indexer stream stored in fp4_e2m1_hadamard (its keys are in the transformed basis)");
  return ix.channels;
}

// The sizes a valid (shape, reader config) pair implies.
struct read_dims {
  std::int64_t kv_heads = 0, key_channels = 0, value_channels = 0, indexer_channels = 0;
};

// A window-only layer (no compressed stream: DeepSeek-V4's compress ratio 0): the reader attends
// to the raw window alone, whose shape gives the dimensions; no stream, no selection.
inline read_dims check_window_only_config(const layer_shape& shape, const reader_config& config) {
  const std::string& n = config.name;
  const raw_window_config& w = shape.window;
  for (auto [index, what] : {std::pair<std::size_t, const char*>{config.key_stream, ".key_stream"},
                             {config.value_stream, ".value_stream"},
                             {config.indexer_stream, ".indexer_stream"}})
    require(index == no_stream, n + what, index, "must be no_stream: the layer is window-only (it has no stream)");
  require(config.top_k == 0, n + ".top_k", config.top_k, "must be 0: a window-only layer has no entries to select");
  require(w.tokens >= 1 && w.tokens <= (std::int64_t{1} << 32), n + ": shape.window.tokens", w.tokens,
          "must lie in [1, 2^32] in a window-only layer (it attends to nothing else)");
  w.validate(n + ": shape.window");
  read_dims d;
  d.kv_heads = w.kv_heads;
  d.key_channels = w.key_channels;
  d.value_channels = w.value_channels == 0 ? w.key_channels : w.value_channels;
  require(config.query_heads % d.kv_heads == 0, n + ".query_heads", config.query_heads,
          "must be a multiple of the window's kv_heads = " + std::to_string(d.kv_heads));
  if (config.derotate_output) {
    require(w.value_channels == 0, n + ".derotate_output", "true", "applies to a tied window only (value_channels = 0)");
    require(shape.window_rope.channels >= 2, n + ".derotate_output", "true",
            "needs the window keys' RoPE in shape.window_rope (rope.channels = " +
                std::to_string(shape.window_rope.channels) + ")");
    shape.window_rope.validate(n + ": shape.window_rope", d.key_channels);
  }
  return d;
}

inline read_dims check_reader_config(const layer_shape& shape, const reader_config& given) {
  check_stream_shapes(shape, given.name);
  const reader_config config = resolve_reader_streams(shape.streams, given, given.name);
  const std::string& n = config.name;
  const std::size_t streams = shape.streams.size();
  require(config.query_heads >= 1, n + ".query_heads", config.query_heads, "must be at least 1");
  require(config.query_heads <= limits::max_heads, n + ".query_heads", config.query_heads, "must be at most 2^16");
  require(std::isfinite(config.scale) && config.scale >= 0.0f, n + ".scale", config.scale,
          "must be finite and non-negative (0 = 1/sqrt(channels))");
  require(config.lse == lse_convention::with_sink || config.lse == lse_convention::flashmla, n + ".lse",
          static_cast<int>(config.lse), "is not an lse_convention");
  if (streams == 0) return check_window_only_config(shape, config);
  require(config.key_stream < streams, n + ".key_stream", config.key_stream,
          "must name a stream of the cache (it has " + std::to_string(streams) + ")");
  require(config.value_stream < streams, n + ".value_stream", config.value_stream,
          "must name a stream of the cache (it has " + std::to_string(streams) + ")");
  read_dims d;
  // Without selection (top_k = 0) the indexer fields are unused; with it, they are a selection's.
  require(config.precision == indexer_precision::f32 || config.precision == indexer_precision::bf16 ||
              config.precision == indexer_precision::fp4,
          n + ".precision", static_cast<int>(config.precision), "is not an indexer_precision");
  require(config.top_k >= 0, n + ".top_k", config.top_k, "must be non-negative (0 = no selection)");
  if (config.top_k > 0) d.indexer_channels = check_selection_config(shape, selection_of(config));
  const stream_shape& keys = shape.streams[config.key_stream];
  const stream_shape& values = shape.streams[config.value_stream];
  // FP4 entries are indexer keys in the transformed basis (format/fp4.hpp): nothing to attend to.
  for (const auto& [field, stream] : {std::pair<const char*, const stream_shape*>{".key_stream", &keys}, {".value_stream", &values}})
    require(stream->storage != storage_type::fp4_e2m1_hadamard, n + field, "'" + stream->name + "'",
            "is stored as fp4_e2m1_hadamard, which only the FP4 indexer reads (attention needs another storage type)");
  d.kv_heads = keys.kv_heads;
  d.key_channels = keys.channels;
  d.value_channels = values.channels;
  require(values.kv_heads == d.kv_heads, n + ".value_stream kv_heads", values.kv_heads,
          "must equal the key stream's kv_heads = " + std::to_string(d.kv_heads));
  require(config.query_heads % d.kv_heads == 0, n + ".query_heads", config.query_heads,
          "must be a multiple of the key stream's kv_heads = " + std::to_string(d.kv_heads));
  const raw_window_config& w = shape.window;
  require(w.tokens >= 0 && w.tokens <= (std::int64_t{1} << 32), n + ": shape.window.tokens", w.tokens,
          "must lie in [0, 2^32]");
  if (w.tokens > 0) {
    require(w.kv_heads == d.kv_heads, n + ": shape window.kv_heads", w.kv_heads,
            "must equal the key stream's kv_heads = " + std::to_string(d.kv_heads));
    require(w.key_channels == d.key_channels, n + ": shape window.key_channels", w.key_channels,
            "must equal the key stream's channels = " + std::to_string(d.key_channels));
    const std::int64_t wv = w.value_channels == 0 ? w.key_channels : w.value_channels;
    require(wv == d.value_channels, n + ": shape window value channels", wv,
            "must equal the value stream's channels = " + std::to_string(d.value_channels));
  }
  if (config.derotate_output) {
    require(config.key_stream == config.value_stream, n + ".derotate_output", "true",
            "applies to tied K/V only (key_stream == value_stream)");
    // A stream's rope config means something only when its policy rotates the entries.
    require(keys.applies_rope, n + ".derotate_output", "true",
            "needs a key stream whose policy applies RoPE (stream '" + keys.name + "' rotates nothing)");
    require(keys.rope.channels >= 2, n + ".derotate_output", "true",
            "needs RoPE channels in the key stream's config (rope.channels = " + std::to_string(keys.rope.channels) + ")");
    keys.rope.validate(n + ": shape.streams[" + std::to_string(config.key_stream) + "].rope", keys.channels);
  }
  return d;
}

// ---- requests ----------------------------------------------------------------------------------

// A caller's span of `expected` values: not null unless empty, and of that size.
inline void require_span_size(std::size_t size, const void* data, std::int64_t expected, const std::string& field,
                              const char* shape) {
  if (data == nullptr && size != 0) fail<input_error>(field + ".data()", "null", "must not be null when the size is not 0");
  if (static_cast<std::int64_t>(size) != expected)
    fail<input_error>(field + ".size()", size, "must be " + std::to_string(expected) + " (" + shape + ")");
}

// Non-finite inputs would turn into a silently wrong selection (a NaN score ranks anywhere) or an
// all-NaN output, so they are rejected; a sink of −inf is allowed: it means "no sink". One
// vectorised pass that only looks further when something is not finite (about a microsecond for
// DeepSeek-V4's 64 × 512 queries).
inline void require_finite(span<const float> values, const std::string& field, bool allow_minus_infinity) {
  if (kernels::all_finite(values.data(), static_cast<std::int64_t>(values.size()))) return;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float v = values[i];
    if (std::isfinite(v) || (allow_minus_infinity && v == -std::numeric_limits<float>::infinity())) continue;
    fail<input_error>(field + "[" + std::to_string(i) + "]", v,
                      allow_minus_infinity ? "must be finite or −inf (no sink)" : "must be finite");
  }
}

// The indexer inputs of a selection: sizes, finiteness, the request's top_k.
// `scoring`: the indexer runs (an indexer stream, top_k > 0, no host indices); else its inputs are empty.
inline void check_selection_request(const selection_config& c, std::int64_t indexer_channels, const selection_request& r,
                                    bool scoring, const field_name& field, const std::string& prefix) {
  require_span_size(r.indexer_queries.size(), r.indexer_queries.data(), scoring ? c.indexer_heads * indexer_channels : 0,
                    field(prefix + "indexer_queries"),
                    "indexer_heads × indexer channels; empty without an indexer or with host indices");
  require_span_size(r.indexer_weights.size(), r.indexer_weights.data(), scoring ? c.indexer_heads : 0,
                    field(prefix + "indexer_weights"), "indexer_heads; empty without an indexer or with host indices");
  if (r.top_k < -1 || r.top_k > c.top_k)
    fail<input_error>(field(prefix + "top_k"), r.top_k,
                      "must lie in [0, top_k = " + std::to_string(c.top_k) + "], or be -1 (the configuration's)");
  require_finite(r.indexer_queries, field(prefix + "indexer_queries"), false);
  require_finite(r.indexer_weights, field(prefix + "indexer_weights"), false);
}

// ---- views -------------------------------------------------------------------------------------

inline std::string geometry_text(const geometry& g) {
  return "stride " + std::to_string(g.stride) + ", window " + std::to_string(g.window) + ", origin " +
         std::to_string(g.origin) + (g.anchor == anchor_mode::block_start ? "" : ", another anchor");
}

// What every read of a view needs: current, a token at position t, the shape's streams and geometry.
inline void check_view_common(const sequence_view& v, std::int64_t t, const layer_shape& shape, const field_name& field,
                              const std::string& position_field) {
  if (v.stamp.current && !v.stamp.current(v.stamp.owner, v.stamp.sequence, v.stamp.writes))
    fail<input_error>(field("view"), "stale",
                      "its sequence (" + std::to_string(v.stamp.sequence) +
                          ") was freed or written since view_of(): take a new view");
  if (v.tokens <= 0) fail<input_error>(field("view.tokens"), v.tokens, "is empty: append the query's token first");
  // A host-built view may claim any count: bounded, every position formula (visible_entries adds
  // lead + 1) stays far from overflow.
  if (v.tokens > limits::max_tokens)
    fail<input_error>(field("view.tokens"), v.tokens, "must be at most 2^48 (limits::max_tokens)");
  if (t < 0 || t >= v.tokens)
    fail<input_error>(field(position_field), t,
                      "must lie in [0, tokens = " + std::to_string(v.tokens) +
                          "): the query's own token must be appended before it reads");
  if (v.stream_count != shape.streams.size())
    fail<input_error>(field("view.stream_count"), v.stream_count,
                      "must be the layer's stream count, " + std::to_string(shape.streams.size()));
  if (v.geom.stride != 0 && !(v.geom == shape.geom))
    fail<input_error>(field("view.geom"), geometry_text(v.geom),
                      "must be the reader's, " + geometry_text(shape.geom) + ": the entries were pooled with another geometry");
}

// Stream k of the view: the shape's element in a packed NHD layout, and a page table whose first
// pages — those holding entries [0, candidates) — name pages of the arena.
inline void check_stream(const sequence_view& v, std::size_t k, std::int64_t candidates, const layer_shape& shape,
                         const field_name& field) {
  const stream_view& s = v.streams[k];
  const stream_shape& st = shape.streams[k];
  const page_layout& l = s.layout;
  const std::string f = "view.streams[" + std::to_string(k) + "]";
  auto bad = [&](const std::string& what, auto value, const std::string& why) {
    fail<input_error>(field(f + "." + what), value, why);
  };
  if (l.storage != st.storage) bad("layout.storage", to_string(l.storage), std::string("must be the stream's ") + to_string(st.storage));
  if (l.kv_heads != st.kv_heads) bad("layout.kv_heads", l.kv_heads, "must be the stream's " + std::to_string(st.kv_heads));
  if (l.channels != st.channels) bad("layout.channels", l.channels, "must be the stream's " + std::to_string(st.channels));
  const bool fp8 = st.storage == storage_type::fp8_e4m3_block, blocks = is_block_storage(st.storage);
  const std::int64_t rope = fp8 ? stored_rope_channels(st) : 0;
  if (l.rope_channels != rope)
    bad("layout.rope_channels", l.rope_channels,
        fp8 ? "must be the stream's RoPE channels, " + std::to_string(rope) + " (kept in bf16)"
            : std::string("must be 0 (only fp8_e4m3_block keeps RoPE channels apart)"));
  const page_layout packed = page_layout::packed(st.storage, st.kv_heads, st.channels, rope);
  const std::int64_t e = packed.element_bytes;
  if (l.element_bytes != e) bad("layout.element_bytes", l.element_bytes, "must be " + std::to_string(e));
  if (l.page_size < 1 || l.page_size > limits::max_tokens) bad("layout.page_size", l.page_size, "must lie in [1, 2^48]");
  if (l.head_stride != packed.head_stride || l.head_stride_bytes != packed.head_stride_bytes)
    bad("layout.head_stride", l.head_stride,
        blocks ? std::string(fp8 ? "must be the fp8" : "must be the fp4") + " head's bytes = " +
                     std::to_string(packed.head_stride) + " (packed heads)"
               : "must be channels = " + std::to_string(l.channels) + " (packed heads)");
  if (l.entry_stride != packed.entry_stride || l.entry_stride_bytes != packed.entry_stride_bytes)
    bad("layout.entry_stride", l.entry_stride,
        (blocks ? "must be kv_heads × head bytes = " : "must be kv_heads × channels = ") +
            std::to_string(packed.entry_stride) + " (packed entries)");
  std::int64_t payload = 0;
  if (!product_within(l.page_size, l.entry_stride_bytes, limits::max_bytes, payload) || l.page_stride_bytes < payload ||
      l.page_stride_bytes % e != 0 || l.page_stride * e != l.page_stride_bytes)
    bad("layout.page_stride_bytes", l.page_stride_bytes,
        "must hold page_size entries (" + std::to_string(payload) + " bytes), a whole number of elements, page_stride = bytes / element");
  std::int64_t arena = 0;
  if (s.capacity < 0 || !product_within(s.capacity, l.page_stride_bytes, limits::max_bytes, arena))
    bad("capacity", s.capacity, "must be non-negative and the arena at most 2^48 bytes");
  if (s.entries < candidates)
    bad("entries", s.entries, "must be at least the " + std::to_string(candidates) +
                                  " entries a query at request.position may see (geometry.visible_entries)");
  const std::int64_t pages = (candidates + l.page_size - 1) / l.page_size;
  if (static_cast<std::int64_t>(s.pages.size()) < pages)
    bad("pages.size()", s.pages.size(), "must cover the " + std::to_string(candidates) + " entries read (" +
                                            std::to_string(pages) + " pages)");
  if (pages == 0) return;
  if (s.pages.data() == nullptr) bad("pages.data()", "null", "must not be null when pages are read");
  if (s.base == nullptr) bad("base", "null", "must point to page 0 of the stream's arena");
  if (reinterpret_cast<std::uintptr_t>(s.base) % static_cast<std::uintptr_t>(e) != 0)
    bad("base", "misaligned", "must be aligned to the element size " + std::to_string(e));
  for (std::int64_t p = 0; p < pages; ++p) {
    const page_id id = s.pages[static_cast<std::size_t>(p)];
    if (id < 0 || id >= s.capacity)
      bad("pages[" + std::to_string(p) + "]", id, "must lie in [0, capacity = " + std::to_string(s.capacity) + ")");
  }
}

// Physical ids (page · page_size + slot) of stream k fit the 32-bit outputs.
inline void check_physical_ids(const sequence_view& v, std::size_t k, const std::string& field) {
  const stream_view& s = v.streams[k];
  std::int64_t slots = 0;
  if (!product_within(s.capacity, s.layout.page_size, std::numeric_limits<std::int32_t>::max(), slots))
    fail<input_error>(field, "non-null",
                      "needs the stream's capacity × page_size = " + std::to_string(s.capacity) + " × " +
                          std::to_string(s.layout.page_size) + " below 2^31 (32-bit indices)");
}

// The raw window ring of the view holds the tokens a read at position t attends to.
inline void check_window(const sequence_view& v, std::int64_t t, const raw_window_config& cfg, const field_name& field) {
  if (cfg.tokens == 0) return;
  const window_view& w = v.window;
  auto bad = [&](const char* what, auto value, const std::string& why) {
    fail<input_error>(field(std::string("view.window.") + what), value, why);
  };
  const std::int64_t value_channels = cfg.value_channels == 0 ? cfg.key_channels : cfg.value_channels;
  if (w.storage != cfg.precision)
    bad("storage", to_string(w.storage), std::string("must be the layer's window precision, ") + to_string(cfg.precision));
  if (cfg.precision == storage_type::fp8_e4m3_block) {
    if (w.rope_channels != cfg.rope_channels) bad("rope_channels", w.rope_channels, "must be the layer's " + std::to_string(cfg.rope_channels));
    if (w.key_bytes == nullptr) bad("key_bytes", "null", "must point to the window ring's FP8 key rows");
    if (w.value_bytes == nullptr) bad("value_bytes", "null", "must point to the window ring's FP8 value rows (the keys when tied)");
    if (cfg.value_channels == 0 && w.value_bytes != w.key_bytes)
      bad("value_bytes", "not key_bytes", "must equal key_bytes: the layer's window is tied (its values are the keys)");
  } else {
    if (w.keys == nullptr) bad("keys", "null", "must point to the window ring's key rows");
    if (w.values == nullptr) bad("values", "null", "must point to the window ring's value rows (the keys when tied)");
  }
  if (w.kv_heads != cfg.kv_heads) bad("kv_heads", w.kv_heads, "must be the layer's " + std::to_string(cfg.kv_heads));
  if (w.key_channels != cfg.key_channels) bad("key_channels", w.key_channels, "must be the layer's " + std::to_string(cfg.key_channels));
  if (w.value_channels != value_channels)
    bad("value_channels", w.value_channels, "must be the layer's " + std::to_string(value_channels));
  if (w.rows < 1 || w.rows > limits::max_tokens) bad("rows", w.rows, "must lie in [1, 2^48]");
  if (w.first < 0 || w.first > w.tokens || w.tokens - w.first > w.rows)
    bad("first", w.first, "must lie in [max(0, tokens − rows), tokens] (tokens = " + std::to_string(w.tokens) +
                              ", rows = " + std::to_string(w.rows) + ")");
  if (w.tokens <= t) bad("tokens", w.tokens, "must exceed request.position = " + std::to_string(t));
  const std::int64_t first = std::max<std::int64_t>(0, t - cfg.tokens + 1);
  if (first < w.first)
    fail<input_error>(field("request.position"), t,
                      "needs window tokens from " + std::to_string(first) + ", but the cache keeps only tokens from " +
                          std::to_string(w.first));
}

// Host-supplied indices (read_request.indices): entry ids a query at the position may see, or
// −1 (padding), each id at most once — attending to an entry twice would count its mass twice.
inline void check_host_indices(span<const std::int32_t> indices, std::int64_t candidates, const std::string& field) {
  std::vector<std::int32_t> sorted;
  sorted.reserve(indices.size());
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const std::int32_t j = indices[i];
    if (j == -1) continue;
    if (j < 0 || j >= candidates)
      fail<input_error>(field + "[" + std::to_string(i) + "]", j,
                        "must be −1 (padding) or an entry id in [0, " + std::to_string(candidates) +
                            "), the entries a query at request.position may see");
    sorted.push_back(j);
  }
  std::sort(sorted.begin(), sorted.end());
  const auto repeat = std::adjacent_find(sorted.begin(), sorted.end());
  if (repeat != sorted.end())
    fail<input_error>(field, "entry " + std::to_string(*repeat) + " twice", "must name each entry at most once");
}

// Physical ids (index_kind::physical: page · page_size + slot in `keys`' pages, −1 padding) as
// the sequence's logical entry ids into `out`: page p at position r of the sequence's page table
// holds entries r · page_size … Each id must name a page of the table, and an entry a query at the
// position may see (below `candidates`); an input_error names the id otherwise. A page appears
// once in a table, so the translation is one-to-one.
inline void physical_to_logical(span<const std::int32_t> ids, const stream_view& keys, std::int64_t candidates,
                                std::vector<std::int32_t>& out, const std::string& field) {
  const std::int64_t page_size = keys.layout.page_size;
  std::vector<std::pair<page_id, std::int64_t>> position;  // (page, its index in the table), by page
  position.reserve(keys.pages.size());
  for (std::size_t r = 0; r < keys.pages.size(); ++r) position.emplace_back(keys.pages[r], static_cast<std::int64_t>(r));
  std::sort(position.begin(), position.end());
  out.assign(ids.size(), -1);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int32_t id = ids[i];
    if (id == -1) continue;
    const std::string at = field + "[" + std::to_string(i) + "]";
    if (id < 0 || page_size <= 0)
      fail<input_error>(at, id, "must be −1 (padding) or a physical id page · page_size + slot (indices_kind = physical)");
    const page_id page = static_cast<page_id>(id / page_size);
    const auto hit = std::lower_bound(position.begin(), position.end(), std::make_pair(page, std::int64_t{0}));
    if (hit == position.end() || hit->first != page)
      fail<input_error>(at, id,
                        "is a physical id of page " + std::to_string(page) + " (page_size " + std::to_string(page_size) +
                            "), which is not in the sequence's page table (indices_kind = physical)");
    const std::int64_t logical = hit->second * page_size + id % page_size;
    if (logical >= candidates)
      fail<input_error>(at, id,
                        "names entry " + std::to_string(logical) + " of the sequence, which a query at request.position "
                        "cannot see (it sees entries [0, " + std::to_string(candidates) + "); indices_kind = physical)");
    out[i] = static_cast<std::int32_t>(logical);
  }
}

}  // namespace detail
}  // namespace phasekv
