#pragma once
// Sequence snapshots: one sequence of a paged_cache as bytes, and those bytes restored into
// another cache — in another process, another page pool, another storage type when that is
// lossless — so that every later append and read is bit-identical to never having moved. This is
// what a disaggregated engine needs to move a prefilled sequence from a prefill node to a decode
// node.
//
//   std::vector<std::byte> bytes = snapshot(prefill_cache, seq);           // or snapshot_into()
//   sequence_id moved = restore(decode_cache, bytes);                      // a new sequence
//
// docs/SNAPSHOT.md specifies the format (every field, its checks, the flags word, the checksums,
// versions), what a destination must share with the source, and the order in which restore
// checks the bytes. This file is the interface and the framing: the preamble, the section table,
// the checksums and restore's order; the fingerprint and its compatibility rules are in
// cache/snapshot_fingerprint.hpp, the little-endian fields in core/byte_io.hpp.
//
// restore() throws input_error for bytes it cannot accept and capacity_error when a pool lacks the
// pages or memory cannot be allocated, in every case with the cache exactly as it was. Every
// single-bit error is detected (each byte lies in one CRC-32C-protected range).
//
// Thread safety: snapshot() reads one sequence — like the cache's const queries it may run
// concurrently with other readers of that sequence, not with its writer. restore() adds a new
// sequence; it may run concurrently with calls on other sequences.
//
// Speed: a snapshot copies each page's entries and computes their checksum in one pass
// (crc32c_copy), and restore copies them into the new pages the same way, so both run close to
// memcpy of the same bytes (bench/bench_cache.cpp: BM_snapshot, BM_restore).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot_fingerprint.hpp"
#include "phasekv/core/byte_io.hpp"
#include "phasekv/core/crc32c.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/limits.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/format/storage.hpp"

namespace phasekv {

namespace detail::snapshot_format {

inline constexpr unsigned char magic[8] = {0x89, 'P', 'K', 'V', 'S', 'N', 'A', 'P'};
inline constexpr std::uint32_t version = 1;
inline constexpr std::size_t preamble_bytes = 32;
inline constexpr std::size_t section_entry_bytes = 24;
inline constexpr std::uint32_t no_stream_index = 0xFFFFFFFFu;
// More streams than any layer has; bounds the header a corrupt count could describe.
inline constexpr std::uint64_t max_streams = 1024;

enum section_kind : std::uint32_t { entries_section = 1, state_section = 2, window_section = 3 };

constexpr std::size_t header_bytes(std::size_t streams) noexcept {
  return preamble_bytes + layer_bytes + streams * stream_bytes + 8 + (2 * streams + 1) * section_entry_bytes + 8;
}
static_assert(header_bytes(0) == 160 && header_bytes(1) == 360, "the header size docs/SNAPSHOT.md states");

// a · b, or false when it does not fit in 63 bits (a count a corrupt field made absurd).
inline bool multiply(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  constexpr std::uint64_t limit = std::uint64_t{1} << 62;
  if (a != 0 && b > limit / a) return false;
  out = a * b;
  return true;
}

struct section {
  std::uint32_t kind = 0;
  std::uint32_t stream = 0;
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
  std::uint32_t flags = 0;  // a compressor-state section's: bit 0 host-fed; 0 for the others
};
inline constexpr std::uint32_t host_fed_flag = 1;

inline std::string section_name(std::size_t index, std::uint32_t kind, std::uint32_t stream) {
  std::string what = kind == entries_section ? "stream " + std::to_string(stream) + " entries"
                     : kind == state_section ? "stream " + std::to_string(stream) + " compressor state"
                                             : "raw window";
  return "section " + std::to_string(index) + " (" + what + ")";
}

}  // namespace detail::snapshot_format

namespace detail::snapshot_format {

// ---- snapshot -------------------------------------------------------------------------------------

// Bytes of each section of a sequence, in table order: the entries as their pools store them, the
// states' and the window's own sections.
template <class Cache>
std::vector<std::uint64_t> section_bytes(const Cache& cache, const typename Cache::sequence_parts& parts) {
  constexpr std::size_t streams = Cache::stream_count;
  std::vector<std::uint64_t> bytes;
  bytes.reserve(2 * streams + 1);
  for (std::size_t k = 0; k < streams; ++k)
    bytes.push_back(static_cast<std::uint64_t>(parts.states[k]->entries()) *
                    static_cast<std::uint64_t>(cache.pool(k).layout().entry_stride_bytes));
  for (std::size_t k = 0; k < streams; ++k) bytes.push_back(parts.states[k]->saved_bytes());
  bytes.push_back(parts.window->saved_bytes());
  return bytes;
}

template <class Cache>
std::size_t size(const Cache& cache, sequence_id id) {
  const std::vector<std::uint64_t> bytes = section_bytes(cache, cache.parts(id, "snapshot_size"));
  std::uint64_t total = header_bytes(Cache::stream_count);
  for (std::uint64_t b : bytes) total += b;
  return static_cast<std::size_t>(total);
}

template <class Cache>
std::size_t write(const Cache& cache, sequence_id id, span<std::byte> out) {
  static_assert(host_little_endian, "phasekv snapshots need a little-endian host");
  constexpr std::size_t streams = Cache::stream_count;
  const typename Cache::sequence_parts parts = cache.parts(id, "snapshot");
  const std::vector<std::uint64_t> bytes = section_bytes(cache, parts);
  const std::size_t header = header_bytes(streams);
  std::uint64_t total = header;
  for (std::uint64_t b : bytes) total += b;
  if (out.data() == nullptr && out.size() != 0)
    fail<input_error>("snapshot: out.data()", "null", "must not be null when the size is " + std::to_string(out.size()));
  if (out.size() < total)
    fail<input_error>("snapshot: out.size()", out.size(),
                      "must be at least the snapshot's " + std::to_string(total) + " bytes (snapshot_size)");

  // The sections first, each checksummed while it is copied; then the header that lists them.
  auto* base = reinterpret_cast<unsigned char*>(out.data());
  std::vector<section> table(2 * streams + 1);
  byte_writer w(base + header, static_cast<std::size_t>(total) - header);
  for (std::size_t k = 0; k < streams; ++k) {  // entries, page after page
    const page_pool& pool = cache.pool(k);
    const std::vector<page_id>& pages = *parts.tables[k];
    const std::int64_t page_size = pool.layout().page_size, entries = parts.states[k]->entries();
    w.restart_checksum();
    for (std::int64_t first = 0, page = 0; first < entries; first += page_size, ++page)
      w.bytes(pool.data(pages[static_cast<std::size_t>(page)]),
              static_cast<std::size_t>(std::min(page_size, entries - first) * pool.layout().entry_stride_bytes));
    table[k] = {entries_section, static_cast<std::uint32_t>(k), bytes[k], w.checksum()};
  }
  for (std::size_t k = 0; k < streams; ++k) {  // compressor states
    const stream_state& state = *parts.states[k];
    w.restart_checksum();
    state.state_write(w);
    table[streams + k] = {state_section, static_cast<std::uint32_t>(k), bytes[streams + k], w.checksum(),
                          state.host_fed() ? host_fed_flag : 0u};
  }
  w.restart_checksum();  // the raw window
  parts.window->state_write(w);
  table[2 * streams] = {window_section, no_stream_index, bytes[2 * streams], w.checksum()};

  fingerprint f = fingerprint_of(cache);
  f.tokens = static_cast<std::uint64_t>(parts.tokens);
  byte_writer h(base, header);  // its checksum runs from byte 0
  h.bytes(magic, sizeof magic);
  h.u32(version);
  h.u32(static_cast<std::uint32_t>(header));
  h.u64(total);
  h.u32(0);
  h.u32(h.checksum());  // of bytes [0, 28)
  write_fingerprint(h, f);
  h.u64(table.size());
  for (const section& t : table) {
    h.u32(t.kind);
    h.u32(t.stream);
    h.u64(t.bytes);
    h.u32(t.crc);
    h.u32(t.flags);
  }
  h.u32(0);
  h.u32(h.checksum());  // of bytes [0, header − 4)
  return static_cast<std::size_t>(total);
}

// ---- restore ---------------------------------------------------------------------------------------

// The parts of a snapshot restore() has located and verified before changing anything.
struct parsed {
  fingerprint print;
  std::vector<section> table;
  std::vector<const unsigned char*> starts;  // of each section
};

// Framing, checksums of the preamble and header, fingerprint and section table.
template <class Cache>
parsed parse(const Cache& cache, span<const std::byte> in) {
  constexpr std::size_t streams = Cache::stream_count;
  if (in.data() == nullptr && in.size() != 0)
    fail<input_error>("snapshot: bytes.data()", "null", "must not be null when the size is " + std::to_string(in.size()));
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  const std::size_t size = in.size();

  const std::size_t magic_seen = std::min(size, sizeof magic);
  if (magic_seen > 0 && std::memcmp(p, magic, magic_seen) != 0)
    throw input_error("snapshot: bad magic: these bytes are not a phasekv snapshot");
  if (size < preamble_bytes)
    throw input_error("snapshot: truncated at byte " + std::to_string(size) + " of at least " +
                      std::to_string(preamble_bytes) + " (the preamble)");
  byte_reader pre(p + 8, p + preamble_bytes, "snapshot");
  const std::uint32_t stored_version = pre.u32();
  const std::uint32_t header = pre.u32();
  const std::uint64_t total = pre.u64();
  const std::uint32_t reserved = pre.u32();
  const std::uint32_t stored_preamble_crc = pre.u32();
  const std::uint32_t preamble_crc = crc32c(p, 28);
  if (stored_preamble_crc != preamble_crc)
    throw input_error("snapshot: preamble checksum mismatch (stored " + hex(stored_preamble_crc) +
                      ", computed " + hex(preamble_crc) + "): the first 32 bytes are corrupt");
  if (stored_version != version)
    throw input_error("snapshot: format version " + std::to_string(stored_version) +
                      " is not supported (this build reads version " + std::to_string(version) + ")");
  if (reserved != 0) fail<input_error>("snapshot: reserved field of the preamble", reserved, "must be 0");
  if (header < header_bytes(0) || header > total)
    fail<input_error>("snapshot: header_bytes", header,
                      "must lie in [" + std::to_string(header_bytes(0)) + ", total_bytes = " +
                          std::to_string(total) + "]");
  if (size < total)
    throw input_error("snapshot: truncated at byte " + std::to_string(size) + " of " + std::to_string(total));
  if (size > total)
    throw input_error("snapshot: " + std::to_string(size - total) + " bytes follow the end of the snapshot (" +
                      std::to_string(total) + " bytes)");
  const std::uint32_t stored_header_crc = byte_reader(p + header - 4, p + header, "snapshot").u32();
  const std::uint32_t header_crc = crc32c(p, header - 4);
  if (stored_header_crc != header_crc)
    throw input_error("snapshot: header checksum mismatch (stored " + hex(stored_header_crc) + ", computed " +
                      hex(header_crc) + ")");

  // The header is intact: its fields are what the writer wrote.
  byte_reader r(p + preamble_bytes, p + header, "snapshot");
  const std::uint64_t snapshot_streams = byte_reader(p + preamble_bytes + 8, p + header, "snapshot").u64();
  if (snapshot_streams > max_streams || header != header_bytes(snapshot_streams))
    fail<input_error>("snapshot: header_bytes", header,
                      "does not fit the " + std::to_string(snapshot_streams) + " streams the header declares");
  parsed out;
  out.print = read_fingerprint(r, static_cast<std::size_t>(snapshot_streams));
  fingerprint mine = fingerprint_of(cache);
  mine.tokens = out.print.tokens;
  check_compatible(out.print, mine);

  const std::uint64_t count = r.u64();
  if (count != 2 * streams + 1)
    fail<input_error>("snapshot: section count", count, "must be " + std::to_string(2 * streams + 1));
  out.table.resize(static_cast<std::size_t>(count));
  out.starts.resize(static_cast<std::size_t>(count));
  const unsigned char* at = p + header;
  for (std::size_t i = 0; i < out.table.size(); ++i) {
    section& t = out.table[i];
    t = section{r.u32(), r.u32(), r.u64(), r.u32(), r.u32()};  // a braced list reads left to right
    const std::uint32_t kind = i < streams ? entries_section
                               : i < 2 * streams ? state_section
                                                 : window_section;
    if (t.flags != 0 && (kind != state_section || t.flags != host_fed_flag))
      fail<input_error>("snapshot: section " + std::to_string(i) + " flags", t.flags,
                        kind == state_section ? "must be 0 or 1 (host-fed)" : "must be 0 (reserved)");
    const std::uint32_t stream = i < 2 * streams ? static_cast<std::uint32_t>(i % streams) : no_stream_index;
    if (t.kind != kind || t.stream != stream)
      throw input_error("snapshot: section " + std::to_string(i) + " is kind " + std::to_string(t.kind) +
                        " of stream " + std::to_string(t.stream) + ", expected " +
                        section_name(i, kind, stream));
    if (t.bytes > static_cast<std::uint64_t>(p + total - at))
      throw input_error("snapshot: " + section_name(i, kind, stream) + " of " + std::to_string(t.bytes) +
                        " bytes runs past the end of the snapshot (" + std::to_string(total) + " bytes)");
    out.starts[i] = at;
    at += t.bytes;
  }
  read_reserved(r, [] { return "the header"; });
  if (at != p + total)
    throw input_error("snapshot: the sections end at byte " + std::to_string(at - p) + ", total_bytes is " +
                      std::to_string(total));
  return out;
}

[[noreturn]] inline void checksum_mismatch(std::size_t i, const section& t, std::uint32_t crc) {
  throw input_error("snapshot: " + section_name(i, t.kind, t.stream) + " checksum mismatch (stored " +
                    hex(t.crc) + ", computed " + hex(crc) + ")");
}

// The checksum of section i, over all of it (the small sections are checked before use).
inline void verify(const parsed& in, std::size_t i) {
  const section& t = in.table[i];
  const std::uint32_t crc = crc32c(in.starts[i], static_cast<std::size_t>(t.bytes));
  if (crc != t.crc) checksum_mismatch(i, t, crc);
}

// Section i must have `expected` bytes (`fits`: the product was representable); why() says
// what they hold (called only on failure).
template <class Why>
void expect_bytes(const parsed& in, std::size_t i, std::uint64_t expected, bool fits, Why&& why) {
  const section& t = in.table[i];
  if (!fits || t.bytes != expected)
    throw input_error("snapshot: " + section_name(i, t.kind, t.stream) + " has " +
                      std::to_string(t.bytes) + " bytes, " +
                      (fits ? "expected " + std::to_string(expected) : std::string("far fewer than")) + " (" +
                      why() + ")");
}

// The entries of a snapshot's stream as the section holds them: packed, in its storage type.
inline page_layout source_layout(const stream_fingerprint& f) noexcept {
  const storage_type storage = storage_of(f.storage);
  return page_layout::packed(storage, f.kv_heads, f.channels, storage == storage_type::fp8_e4m3_block ? f.rope_channels : 0);
}

// Entries from a verified-length section into a stream's fresh pages, checking the section's CRC on
// the way; a mismatch throws (paged_cache::adopt then gives the pages back). `from` is the packed
// layout of the snapshot's entries; `bounce` holds a page of unaligned 16-bit entries.
inline void copy_entries(page_pool& pool, const std::vector<page_id>& pages, std::int64_t entries, const page_layout& from,
                         const unsigned char* src, std::vector<std::uint16_t>& bounce, const parsed& in,
                         std::size_t section_index) {
  const page_layout& layout = pool.layout();
  const std::int64_t page_size = layout.page_size;
  std::uint32_t crc = 0;
  for (std::size_t page = 0; page < pages.size(); ++page) {
    const std::int64_t n = std::min(page_size, entries - static_cast<std::int64_t>(page) * page_size);
    const auto bytes = static_cast<std::size_t>(n * from.entry_stride_bytes);
    std::byte* destination = pool.data(pages[page]);
    if (from.storage == layout.storage) {
      crc = crc32c_copy(destination, src, bytes, crc);
    } else {  // bf16/f16/fp8 into f32 (check_compatible allowed nothing else; fp4 only into fp4)
      crc = crc32c(src, bytes, crc);
      const void* row = src;
      // The 16-bit rows need aligned elements; fp8 blocks are read byte by byte.
      if (is_row_storage(from.storage) && reinterpret_cast<std::uintptr_t>(src) % alignof(std::uint16_t) != 0) {
        std::memcpy(bounce.data(), src, bytes);
        row = bounce.data();
      }
      load_entries(from, static_cast<const std::byte*>(row), n, reinterpret_cast<float*>(destination));
    }
    src += bytes;
  }
  if (crc != in.table[section_index].crc) checksum_mismatch(section_index, in.table[section_index], crc);
}

// Payload and logit floats per token of each stream: a compressor state's ring row.
template <class Cache, std::size_t... K>
std::array<std::int64_t, sizeof...(K)> ring_floats_of(const Cache& cache, std::index_sequence<K...>) {
  return {{(cache.compressors().template stream<K>().payload_floats_per_token() +
            cache.compressors().template stream<K>().logit_floats_per_token())...}};
}

template <class Cache>
sequence_id restore_unguarded(Cache& cache, span<const std::byte> in) {
  static_assert(host_little_endian, "phasekv snapshots need a little-endian host");
  constexpr std::size_t streams = Cache::stream_count;

  const parsed in_parts = parse(cache, in);
  const fingerprint& print = in_parts.print;
  const geometry& g = cache.compressors().geom();
  const cache_config& config = cache.config();
  const auto section_reader = [&](std::size_t i) {
    return byte_reader(in_parts.starts[i], in_parts.starts[i] + in_parts.table[i].bytes, "snapshot");
  };

  // Token count and the lengths every section must have.
  if (print.tokens > static_cast<std::uint64_t>(limits::max_tokens))
    fail<input_error>("snapshot: tokens", print.tokens, "must be at most 2^48");
  const auto tokens = static_cast<std::int64_t>(print.tokens);
  const std::int64_t entries = g.completed_entries(tokens);
  const std::int64_t source_ring_rows = g.window + print.history;  // history in [0, 2^40]: checked
  for (std::size_t k = 0; k < streams; ++k) {
    std::uint64_t expected = 0;
    const std::int64_t elements = print.streams[k].channels * print.streams[k].kv_heads;
    const bool fits = multiply(static_cast<std::uint64_t>(entries),
                               static_cast<std::uint64_t>(source_layout(print.streams[k]).entry_stride_bytes), expected);
    expect_bytes(in_parts, k, expected, fits, [&] {
      return std::to_string(entries) + " entries of " + std::to_string(elements) + " " +
             storage_name(print.streams[k].storage) + " elements";
    });
  }
  const std::array<std::int64_t, streams> ring_floats = ring_floats_of(cache, std::make_index_sequence<streams>{});
  for (std::size_t k = 0; k < streams; ++k) {
    std::uint64_t ring = 0;
    const bool fits = multiply(static_cast<std::uint64_t>(source_ring_rows), static_cast<std::uint64_t>(ring_floats[k]) * 4, ring);
    expect_bytes(in_parts, streams + k, stream_state::saved_fields_bytes + ring, fits, [&] {
      return std::to_string(source_ring_rows) + " ring rows of " + std::to_string(ring_floats[k]) + " floats";
    });
  }
  // The window's shape is the destination's (compatible); its rows follow the source's history.
  const std::int64_t window_floats = window_key_floats(config.window) + window_value_floats(config.window);
  const std::int64_t source_window_rows = print.window_tokens > 0 ? print.window_tokens + print.history : 0;
  {
    std::uint64_t rows_bytes = 0;
    const bool fits = multiply(static_cast<std::uint64_t>(source_window_rows), static_cast<std::uint64_t>(window_floats) * 4,
                               rows_bytes);
    expect_bytes(in_parts, 2 * streams, raw_window::saved_fields_bytes + rows_bytes, fits, [&] {
      return std::to_string(source_window_rows) + " window rows of " + std::to_string(window_floats) + " floats";
    });
  }

  // The small sections: verify, then check their fields fit together (each class checks its own).
  for (std::size_t i = streams; i < 2 * streams + 1; ++i) verify(in_parts, i);
  std::array<stream_state::saved_fields, streams> state_fields{};
  for (std::size_t k = 0; k < streams; ++k) {
    byte_reader r = section_reader(streams + k);
    state_fields[k] = stream_state::read_fields(r, in_parts.table[streams + k].flags == host_fed_flag);
    stream_state::check_saved(state_fields[k], tokens, entries, source_ring_rows,
                              [k] { return "snapshot: stream " + std::to_string(k) + " compressor state: "; });
  }
  byte_reader window_in = section_reader(2 * streams);
  const raw_window::saved_fields window_fields = raw_window::read_fields(window_in);
  raw_window::check_saved(config.window, window_fields, source_window_rows, tokens);

  // The new sequence's states and window, read from their sections (allocations only: nothing
  // visible changes yet), and a page of bounce buffer for unaligned 16-bit conversions.
  typename Cache::layer::states states = cache.compressors().make_state(config.history);
  for (std::size_t k = 0; k < streams; ++k) {
    byte_reader r = section_reader(streams + k);
    r.bytes(stream_state::saved_fields_bytes);
    states[k].state_read(r, state_fields[k]);
  }
  raw_window window(config.window, config.history);
  window.state_read(window_in, window_fields, tokens);
  std::vector<std::uint16_t> bounce;
  for (std::size_t k = 0; k < streams; ++k) {
    const page_layout& layout = cache.pool(k).layout();
    if (storage_of(print.streams[k].storage) != layout.storage && is_row_storage(storage_of(print.streams[k].storage)))
      bounce.resize(std::max(bounce.size(), static_cast<std::size_t>(layout.page_size * layout.entry_stride)));
  }

  // The pages, all or nothing, filled from the entry sections while their checksums are checked.
  return cache.adopt(
      tokens, std::move(states), std::move(window),
      [&](std::size_t k, page_pool& pool, const std::vector<page_id>& pages) {
        copy_entries(pool, pages, entries, source_layout(print.streams[k]), in_parts.starts[k], bounce, in_parts, k);
      },
      "snapshot");
}

template <class Cache>
sequence_id restore(Cache& cache, span<const std::byte> in) {
  try {
    return restore_unguarded(cache, in);
  } catch (const std::bad_alloc&) {
    throw capacity_error("snapshot: restoring into " + cache.config().name +
                         ": memory for the sequence's compressor state, raw window or page tables could not be "
                         "allocated (the cache is unchanged)");
  }
}

}  // namespace detail::snapshot_format

// ---- the interface ---------------------------------------------------------------------------------

// Bytes snapshot() writes for a sequence (throws input_error for an unknown sequence).
template <class... Compressors>
std::size_t snapshot_size(const paged_cache<Compressors...>& cache, sequence_id id) {
  return detail::snapshot_format::size(cache, id);
}

// Writes the snapshot of a sequence into `out` (at least snapshot_size() bytes; its alignment
// does not matter) and returns the bytes written. The fast path: no allocation, one pass over
// the entries.
template <class... Compressors>
std::size_t snapshot_into(const paged_cache<Compressors...>& cache, sequence_id id, span<std::byte> out) {
  return detail::snapshot_format::write(cache, id, out);
}

// The snapshot of a sequence as a new vector. (The vector's zero-filling is an extra pass over
// the bytes; snapshot_into() a reused buffer avoids it.)
template <class... Compressors>
std::vector<std::byte> snapshot(const paged_cache<Compressors...>& cache, sequence_id id) {
  const std::size_t size = snapshot_size(cache, id);
  std::vector<std::byte> out;
  detail::allocate_or_fail([&] { out.resize(size); }, "snapshot: bytes of sequence", id,
                           static_cast<std::int64_t>(size));
  snapshot_into(cache, id, span<std::byte>(out.data(), out.size()));
  return out;
}

// Restores a snapshot into `cache` as a new sequence and returns its id. Throws input_error for
// bytes it cannot accept and capacity_error when a pool lacks the pages, with the cache as it
// was (see the header comment for what is checked, in which order).
template <class... Compressors>
sequence_id restore(paged_cache<Compressors...>& cache, span<const std::byte> bytes) {
  return detail::snapshot_format::restore(cache, bytes);
}

}  // namespace phasekv
