#pragma once
// A full, comparable dump of a paged_cache: everything a caller can observe through its public
// queries. Two dumps are equal exactly when no query could tell the caches apart, so "a failed
// call left the cache as it was" is `dump(before) == dump(after)`.
//
// Per live sequence (in id order): tokens, window_first, memory() figures, and per stream the
// entry count, the compressor state (counters and pending inputs, via stream_state's ==), the
// page table and every entry's values (read_entry, as bits); the raw window rows it holds. Per
// pool: used pages and every page's reference count. Lines of text, so a mismatch can be shown
// as the first line that differs.

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "phasekv/compress/stream_state.hpp"
#include "phasekv/core/span.hpp"

namespace phasekv_test {

struct cache_dump {
  std::vector<std::string> lines;
  // Stream states compared whole (counters and pending inputs), alongside the lines.
  std::vector<phasekv::stream_state> states;

  friend bool operator==(const cache_dump& a, const cache_dump& b) { return a.lines == b.lines && a.states == b.states; }
  friend bool operator!=(const cache_dump& a, const cache_dump& b) { return !(a == b); }
};

// The first line where a and b differ, or "" when they are equal.
inline std::string first_difference(const cache_dump& a, const cache_dump& b) {
  const std::size_t n = std::min(a.lines.size(), b.lines.size());
  for (std::size_t i = 0; i < n; ++i)
    if (a.lines[i] != b.lines[i]) return "line " + std::to_string(i) + ": '" + a.lines[i] + "' vs '" + b.lines[i] + "'";
  if (a.lines.size() != b.lines.size())
    return "line counts " + std::to_string(a.lines.size()) + " vs " + std::to_string(b.lines.size());
  if (a.states != b.states) return "a stream state's pending inputs differ";
  return "";
}

namespace detail {
// Each value's fp32 bits in lowercase hex without leading zeros, then a space. Written out by
// hand: dumps run once or twice per fuzz input, and an ostringstream per row was a tenth of it.
inline std::string hex_bits(const float* values, std::size_t count) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(count * 9);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, values + i, sizeof bits);
    char reversed[8];
    int n = 0;
    do {
      reversed[n++] = digits[bits & 15u];
      bits >>= 4;
    } while (bits != 0);
    while (n > 0) out += reversed[--n];
    out += ' ';
  }
  return out;
}
}  // namespace detail

template <class Cache>
cache_dump dump(const Cache& cache) {
  cache_dump d;
  auto line = [&](std::ostringstream& out) { d.lines.push_back(out.str()); };
  for (std::size_t k = 0; k < Cache::stream_count; ++k) {
    const auto& pool = cache.pool(k);
    std::ostringstream out;
    out << "pool " << k << " used " << pool.used_pages() << " refcounts";
    for (std::int64_t p = 0; p < pool.capacity(); ++p) out << ' ' << pool.refcount(static_cast<std::int32_t>(p));
    line(out);
  }
  // Sequences by rank in creation order, not by id: ids carry a per-cache tag, and dumps of two
  // caches built the same way must compare equal.
  std::int64_t rank = 0;
  for (auto id : cache.live_sequences()) {
    const auto m = cache.memory(id);
    {
      std::ostringstream out;
      out << "sequence #" << rank++ << " tokens " << cache.tokens(id) << " window_first " << cache.window_first(id)
          << " memory " << m.tokens << ' ' << m.entries << ' ' << m.pages << ' ' << m.shared_pages << ' '
          << m.page_bytes << ' ' << m.entry_bytes << ' ' << m.state_bytes << ' ' << m.uncompressed_bytes;
      line(out);
    }
    for (std::size_t k = 0; k < Cache::stream_count; ++k) {
      const auto& state = cache.state(id, k);
      const auto entries = cache.entries(id, k);
      std::ostringstream out;
      out << "  stream " << k << " entries " << entries << " state " << state.tokens() << ' ' << state.entries() << ' '
          << state.ring_rows() << " pages";
      for (auto p : cache.page_table(id, k)) out << ' ' << p;
      line(out);
      const auto& pool = cache.pool(k);
      // read_entry writes kv_heads × channels floats (entry_stride counts bytes for FP8/FP4,
      // fewer than the floats of a 32-channel FP4 key).
      std::vector<float> row(static_cast<std::size_t>(pool.layout().values_per_entry()));
      for (std::int64_t j = 0; j < entries; ++j) {
        cache.read_entry(id, k, j, row.data());
        std::ostringstream e;
        e << "    entry " << j << ' ' << detail::hex_bits(row.data(), row.size());
        line(e);
      }
      d.states.push_back(state);  // pending inputs, compared through stream_state's ==
    }
    const auto& cfg = cache.config().window;
    const std::int64_t keys = cfg.tokens > 0 ? cfg.kv_heads * cfg.key_channels : 0;
    const std::int64_t values = cfg.tokens > 0 ? cfg.kv_heads * (cfg.value_channels ? cfg.value_channels : cfg.key_channels) : 0;
    std::vector<float> key(static_cast<std::size_t>(keys)), value(static_cast<std::size_t>(values));
    for (std::int64_t t = cache.window_first(id); t < cache.tokens(id); ++t) {
      cache.copy_window_key(id, t, phasekv::span<float>(key.data(), key.size()));  // either precision
      cache.copy_window_value(id, t, phasekv::span<float>(value.data(), value.size()));
      std::ostringstream out;
      out << "  window " << t << " k " << detail::hex_bits(key.data(), key.size()) << " v "
          << detail::hex_bits(value.data(), value.size());
      line(out);
    }
  }
  return d;
}

}  // namespace phasekv_test
