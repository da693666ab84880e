#pragma once
// The fingerprint of a snapshot (docs/SNAPSHOT.md, "Header"): what a sequence's bytes assume about
// the cache they came from — geometry, history, the raw window's shape, per stream its policies,
// shape, storage, RoPE, norm and learned parameters — with the codes that write each enum, and the
// rules by which a destination cache may take a snapshot ("Compatibility").
//
// cache/snapshot.hpp writes a fingerprint into every snapshot's header and, on restore, compares
// the snapshot's with the destination's (check_compatible), naming the first field that differs.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/compress/policies.hpp"
#include "phasekv/compress/policy_codes.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/format/detail/byte_io.hpp"
#include "phasekv/detail/crc32c.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/format/storage.hpp"

namespace phasekv {

namespace detail::snapshot_format {

// Bytes of the header's layer block and of one stream record.
inline constexpr std::size_t layer_bytes = 11 * 8;
inline constexpr std::size_t stream_bytes = 152;

// The name of `code` in a table whose entry i names code i + 1, for messages.
template <class Code, std::size_t N>
std::string name_in(Code code, const char* const (&names)[N]) {
  if (code >= 1 && code <= N) return names[code - 1];
  return "unknown (" + std::to_string(code) + ")";
}

inline std::string pooling_name(std::uint32_t code) {
  if (code & 0x80000000u) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", code);
    return std::string("a policy of the host's (identity 0x") + hex + ")";
  }
  static constexpr const char* names[] = {"mean", "vector gates", "scalar gates", "fixed weights"};
  return name_in(code, names);
}
inline std::string rope_name(std::uint32_t code) {
  static constexpr const char* names[] = {"none", "after pooling", "before pooling"};
  return name_in(code, names);
}
inline std::string norm_name(std::uint32_t code) {
  static constexpr const char* names[] = {"none", "RMSNorm"};
  return name_in(code, names);
}
inline std::string role_name(std::uint32_t code) {
  static constexpr const char* names[] = {"key", "value", "key_value", "indexer"};
  return name_in(code, names);
}
inline std::string inputs_name(std::uint32_t code) {
  static constexpr const char* names[] = {"per_branch", "per_slot"};
  return name_in(code, names);
}
inline std::string storage_name(std::uint32_t code) {
  static constexpr const char* names[] = {"f32", "bf16", "f16", "fp8_e4m3_block", "fp4_e2m1_hadamard"};
  return name_in(code, names);
}
// anchor_mode's codes start at 0 (the enum's values).
inline std::string anchor_name(std::uint64_t code) {
  return code <= 2 ? to_string(static_cast<anchor_mode>(code)) : "unknown (" + std::to_string(code) + ")";
}
inline std::string rope_layout_name(std::uint32_t code) {
  static constexpr const char* names[] = {"interleaved", "half_split"};
  return name_in(code, names);
}
inline storage_type storage_of(std::uint32_t code) noexcept { return static_cast<storage_type>(code - 1); }
inline std::uint32_t code_of(storage_type type) noexcept { return static_cast<std::uint32_t>(type) + 1; }


// A reserved u32, which must be 0; where() names it (called only on failure).
template <class Where>
void read_reserved(byte_reader& r, Where&& where) {
  const std::uint32_t v = r.u32();
  if (v != 0) fail<input_error>("snapshot: reserved field of " + std::string(where()), v, "must be 0");
}

// 0x and eight hex digits, for checksums in messages.
inline std::string hex(std::uint32_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s = "0x";
  for (int k = 7; k >= 0; --k) s += digits[(v >> (4 * k)) & 0xFu];
  return s;
}

// A real with every digit it needs to be read back exactly.
inline std::string number(double v) {
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.17g", v);
  return buffer;
}

// ---- the fingerprint --------------------------------------------------------------------------

struct parameter_digest {
  std::uint64_t floats = 0;
  std::uint32_t crc = 0;
  bool operator==(const parameter_digest& o) const noexcept { return floats == o.floats && crc == o.crc; }
  bool operator!=(const parameter_digest& o) const noexcept { return !(*this == o); }
};

inline parameter_digest digest(const std::vector<float>& values) noexcept {
  return {values.size(), crc32c(values.data(), values.size() * sizeof(float))};
}

struct stream_fingerprint {
  std::uint32_t pooling = 0, rope = 0, norm = 0, role = 0;
  std::int64_t channels = 0, kv_heads = 0;
  std::uint32_t inputs = 0, storage = 0;
  std::int64_t rope_channels = 0;
  double rope_base = 0.0;
  std::uint32_t rope_layout = 0, yarn_enabled = 0;
  double yarn_factor = 0.0;
  std::int64_t yarn_original_context = 0;
  double yarn_beta_fast = 0.0, yarn_beta_slow = 0.0;
  double norm_eps = 0.0;
  parameter_digest slot_bias, norm_weight, slot_profile;
  std::string name;  // the destination's stream name, for messages (not part of the format)
};

struct fingerprint {
  std::uint64_t tokens = 0;  // of the sequence (snapshot only)
  std::int64_t stride = 0, window = 0, origin = 0;
  std::uint64_t anchor = 0;
  std::int64_t history = 0;
  std::int64_t window_tokens = 0, window_kv_heads = 0, window_key_channels = 0, window_value_channels = 0;
  std::vector<stream_fingerprint> streams;
};

// A stream's record from its configuration, learned parameters, policy codes and storage.
inline stream_fingerprint stream_fingerprint_from(const stream_config& config, const stream_params& params,
                                                  std::uint32_t pooling, std::uint32_t rope, std::uint32_t norm,
                                                  storage_type storage) {
  stream_fingerprint f;
  f.pooling = pooling;
  f.rope = rope;
  f.norm = norm;
  f.role = static_cast<std::uint32_t>(config.role) + 1;
  f.channels = config.channels;
  f.kv_heads = config.kv_heads;
  f.inputs = static_cast<std::uint32_t>(config.inputs) + 1;
  f.storage = code_of(storage);
  if (rope != rope_code<no_rope>()) {
    f.rope_channels = config.rope.channels;
    f.rope_base = config.rope.base;
    f.rope_layout = static_cast<std::uint32_t>(config.rope.layout) + 1;
    if (config.rope.yarn.enabled) {
      f.yarn_enabled = 1;
      f.yarn_factor = config.rope.yarn.factor;
      f.yarn_original_context = config.rope.yarn.original_context;
      f.yarn_beta_fast = config.rope.yarn.beta_fast;
      f.yarn_beta_slow = config.rope.yarn.beta_slow;
    }
  }
  if (norm == norm_code<rms_norm>()) f.norm_eps = config.norm_eps;
  f.slot_bias = digest(params.slot_bias);
  f.norm_weight = digest(params.norm_weight);
  f.slot_profile = digest(params.slot_profile);
  f.name = config.name;
  return f;
}

// Whether a compressor reports its policy's codes at run time (erased_stream: rope() and norm() as
// rope_placement and entry_norm, whose orders are those of the code tables) rather than as types.
template <class C, class = void>
struct codes_at_run_time : std::false_type {};
template <class C>
struct codes_at_run_time<C, std::void_t<decltype(std::declval<const C&>().pooling_identity())>> : std::true_type {};

// The same record for a typed stream and for an erased one of the same policy, so a snapshot of
// either restores into the other.
template <class Compressor>
stream_fingerprint stream_fingerprint_of(const Compressor& c, storage_type storage) {
  if constexpr (codes_at_run_time<Compressor>::value) {
    return stream_fingerprint_from(c.config(), c.params(), c.pooling_identity(),
                                   static_cast<std::uint32_t>(c.rope()) + 1, static_cast<std::uint32_t>(c.norm()) + 1,
                                   storage);
  } else {
    using policy = typename Compressor::policy;
    return stream_fingerprint_from(c.config(), c.params(), pooling_identity(c.pool()),
                                   rope_code<typename policy::rope>(), norm_code<typename policy::norm>(), storage);
  }
}

inline void write_parameter(byte_writer& w, const parameter_digest& d) {
  w.u64(d.floats);
  w.u32(d.crc);
  w.u32(0);
}

inline void write_fingerprint(byte_writer& w, const fingerprint& f) {
  w.u64(f.tokens);
  w.u64(f.streams.size());
  w.i64(f.stride);
  w.i64(f.window);
  w.i64(f.origin);
  w.u64(f.anchor);
  w.i64(f.history);
  w.i64(f.window_tokens);
  w.i64(f.window_kv_heads);
  w.i64(f.window_key_channels);
  w.i64(f.window_value_channels);
  for (const stream_fingerprint& s : f.streams) {
    w.u32(s.pooling);
    w.u32(s.rope);
    w.u32(s.norm);
    w.u32(s.role);
    w.i64(s.channels);
    w.i64(s.kv_heads);
    w.u32(s.inputs);
    w.u32(s.storage);
    w.i64(s.rope_channels);
    w.f64(s.rope_base);
    w.u32(s.rope_layout);
    w.u32(s.yarn_enabled);
    w.f64(s.yarn_factor);
    w.i64(s.yarn_original_context);
    w.f64(s.yarn_beta_fast);
    w.f64(s.yarn_beta_slow);
    w.f64(s.norm_eps);
    write_parameter(w, s.slot_bias);
    write_parameter(w, s.norm_weight);
    write_parameter(w, s.slot_profile);
  }
}

inline parameter_digest read_parameter(byte_reader& r, std::size_t stream, const char* name) {
  parameter_digest d;
  d.floats = r.u64();
  d.crc = r.u32();
  read_reserved(r, [&] { return "stream " + std::to_string(stream) + " " + name; });
  return d;
}

// The layer block and `streams` stream records (the caller read the stream count already).
inline fingerprint read_fingerprint(byte_reader& r, std::size_t streams) {
  fingerprint f;
  f.tokens = r.u64();
  (void)r.u64();  // the stream count
  f.stride = r.i64();
  f.window = r.i64();
  f.origin = r.i64();
  f.anchor = r.u64();
  f.history = r.i64();
  f.window_tokens = r.i64();
  f.window_kv_heads = r.i64();
  f.window_key_channels = r.i64();
  f.window_value_channels = r.i64();
  f.streams.resize(streams);
  for (std::size_t k = 0; k < streams; ++k) {
    stream_fingerprint& s = f.streams[k];
    s.pooling = r.u32();
    s.rope = r.u32();
    s.norm = r.u32();
    s.role = r.u32();
    s.channels = r.i64();
    s.kv_heads = r.i64();
    s.inputs = r.u32();
    s.storage = r.u32();
    s.rope_channels = r.i64();
    s.rope_base = r.f64();
    s.rope_layout = r.u32();
    s.yarn_enabled = r.u32();
    s.yarn_factor = r.f64();
    s.yarn_original_context = r.i64();
    s.yarn_beta_fast = r.f64();
    s.yarn_beta_slow = r.f64();
    s.norm_eps = r.f64();
    s.slot_bias = read_parameter(r, k, "slot_bias");
    s.norm_weight = read_parameter(r, k, "norm_weight");
    s.slot_profile = read_parameter(r, k, "slot_profile");
  }
  return f;
}

[[noreturn]] inline void mismatch(const std::string& field, const std::string& theirs, const std::string& ours) {
  throw input_error("snapshot: " + field + " " + theirs + " does not match the cache's " + ours);
}

// Throws input_error naming the first field of the snapshot's fingerprint `s` the cache's `c`
// cannot take (docs/SNAPSHOT.md, "Compatibility"). Messages are built only on failure:
// this runs for every restore.
inline void check_compatible(const fingerprint& s, const fingerprint& c) {
  constexpr std::size_t layer_field = static_cast<std::size_t>(-1);
  const auto name = [&](std::size_t k, const char* field) -> std::string {
    if (k == layer_field) return field;
    return "stream " + std::to_string(k) + " (" + c.streams[k].name + ") " + field;
  };
  const auto same = [&](std::size_t k, const char* field, auto theirs, auto ours, auto show) {
    if (theirs != ours) mismatch(name(k, field), show(theirs), show(ours));
  };
  const auto same_real = [&](std::size_t k, const char* field, double theirs, double ours) {
    if (bits_as<std::uint64_t>(theirs) != bits_as<std::uint64_t>(ours)) mismatch(name(k, field), number(theirs), number(ours));
  };
  const auto integer = [](auto v) { return std::to_string(v); };
  const auto parameter = [](const parameter_digest& d) {
    return "(" + std::to_string(d.floats) + " floats, CRC-32C " + hex(d.crc) + ")";
  };
  constexpr std::size_t L = layer_field;
  same(L, "stride", s.stride, c.stride, integer);
  same(L, "window", s.window, c.window, integer);
  same(L, "origin", s.origin, c.origin, integer);
  same(L, "anchor", s.anchor, c.anchor, anchor_name);
  same(L, "stream count", s.streams.size(), c.streams.size(), integer);
  same(L, "window.tokens", s.window_tokens, c.window_tokens, integer);
  same(L, "window.kv_heads", s.window_kv_heads, c.window_kv_heads, integer);
  same(L, "window.key_channels", s.window_key_channels, c.window_key_channels, integer);
  same(L, "window.value_channels", s.window_value_channels, c.window_value_channels, integer);
  for (std::size_t k = 0; k < s.streams.size(); ++k) {
    const stream_fingerprint &a = s.streams[k], &b = c.streams[k];
    same(k, "pooling", a.pooling, b.pooling, pooling_name);
    same(k, "RoPE placement", a.rope, b.rope, rope_name);
    same(k, "norm", a.norm, b.norm, norm_name);
    same(k, "role", a.role, b.role, role_name);
    same(k, "channels", a.channels, b.channels, integer);
    same(k, "kv_heads", a.kv_heads, b.kv_heads, integer);
    same(k, "inputs", a.inputs, b.inputs, inputs_name);
    same(k, "rope.channels", a.rope_channels, b.rope_channels, integer);
    same_real(k, "rope.base", a.rope_base, b.rope_base);
    same(k, "rope.layout", a.rope_layout, b.rope_layout, rope_layout_name);
    same(k, "rope.yarn.enabled", a.yarn_enabled, b.yarn_enabled, integer);
    same_real(k, "rope.yarn.factor", a.yarn_factor, b.yarn_factor);
    same(k, "rope.yarn.original_context", a.yarn_original_context, b.yarn_original_context, integer);
    same_real(k, "rope.yarn.beta_fast", a.yarn_beta_fast, b.yarn_beta_fast);
    same_real(k, "rope.yarn.beta_slow", a.yarn_beta_slow, b.yarn_beta_slow);
    same_real(k, "norm_eps", a.norm_eps, b.norm_eps);
    same(k, "slot_bias", a.slot_bias, b.slot_bias, parameter);
    same(k, "norm_weight", a.norm_weight, b.norm_weight, parameter);
    same(k, "slot_profile", a.slot_profile, b.slot_profile, parameter);
    if (a.storage < 1 || a.storage > 5) fail<input_error>("snapshot: " + name(k, "storage"), a.storage, "is not a storage type");
    if (a.storage != b.storage && a.storage == code_of(storage_type::fp4_e2m1_hadamard))
      throw input_error("snapshot: " + name(k, "entries are stored as ") + storage_name(a.storage) +
                        "; the cache stores " + storage_name(b.storage) +
                        " (FP4 indexer keys hold the keys in the transformed basis: they restore only as fp4_e2m1_hadamard)");
    if (a.storage != b.storage && b.storage != code_of(storage_type::f32))
      throw input_error("snapshot: " + name(k, "entries are stored as ") + storage_name(a.storage) +
                        "; the cache stores " + storage_name(b.storage) +
                        ", a lossy conversion (restore converts only to the same type, or to f32)");
  }
  // The source's history may differ (restore re-lays the rings); it only has to be a history.
  if (s.history < 0 || s.history > limits::max_history)
    fail<input_error>("snapshot: history", s.history, "must lie in [0, 2^40]");
}


template <class Cache, std::size_t... K>
void fingerprint_streams(const Cache& cache, fingerprint& f, std::index_sequence<K...>) {
  ((f.streams[K] = stream_fingerprint_of(cache.compressors().template stream<K>(), cache.pool(K).layout().storage)), ...);
}

// A layer's block of the fingerprint (no streams, tokens 0): its geometry, the history its rings
// keep and the raw window's shape.
inline fingerprint layer_fingerprint(const geometry& g, std::int64_t history, const raw_window_config& window) {
  fingerprint f;
  f.stride = g.stride;
  f.window = g.window;
  f.origin = g.origin;
  f.anchor = static_cast<std::uint64_t>(g.anchor);
  f.history = history;
  if (window.tokens > 0) {
    f.window_tokens = window.tokens;
    f.window_kv_heads = window.kv_heads;
    f.window_key_channels = window.key_channels;
    f.window_value_channels = window.value_channels;
  }
  return f;
}

// The fingerprint of a paged_cache (tokens 0: the caller sets a sequence's).
template <class Cache>
fingerprint fingerprint_of(const Cache& cache) {
  fingerprint f = layer_fingerprint(cache.compressors().geom(), cache.config().history, cache.config().window);
  f.streams.resize(Cache::stream_count);
  fingerprint_streams(cache, f, std::make_index_sequence<Cache::stream_count>{});
  return f;
}

}  // namespace detail::snapshot_format
}  // namespace phasekv
