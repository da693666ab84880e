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
// cache/snapshot_fingerprint.hpp, the little-endian fields in format/detail/byte_io.hpp.
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
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot_fingerprint.hpp"
#include "phasekv/format/detail/byte_io.hpp"
#include "phasekv/detail/crc32c.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/detail/limits.hpp"
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

// One layer of a sequence as a snapshot writes it: the fingerprint (its tokens set), per stream its
// pages (the layout, the arena's base and the page table) and compressor state, and the raw window.
struct layer_source {
  struct stream {
    page_layout layout;
    const std::byte* base = nullptr;
    const page_id* pages = nullptr;
    const stream_state* state = nullptr;
  };
  fingerprint print;
  std::vector<stream> streams;
  const raw_window* window = nullptr;
};

// A paged_cache's sequence as a layer_source.
template <class Cache>
layer_source source_of(const Cache& cache, sequence_id id, const char* operation) {
  const typename Cache::sequence_parts parts = cache.parts(id, operation);
  layer_source src;
  src.print = fingerprint_of(cache);
  src.print.tokens = static_cast<std::uint64_t>(parts.tokens);
  for (std::size_t k = 0; k < Cache::stream_count; ++k)
    src.streams.push_back({cache.pool(k).layout(), cache.pool(k).base(), parts.tables[k]->data(), parts.states[k]});
  src.window = parts.window;
  return src;
}

// Bytes of each section of a layer, in table order: the entries as their pages store them, the
// states' and the window's own sections.
inline std::vector<std::uint64_t> section_bytes(const layer_source& src) {
  const std::size_t streams = src.streams.size();
  std::vector<std::uint64_t> bytes;
  bytes.reserve(2 * streams + 1);
  for (const auto& s : src.streams)
    bytes.push_back(static_cast<std::uint64_t>(s.state->entries()) * static_cast<std::uint64_t>(s.layout.entry_stride_bytes));
  for (const auto& s : src.streams) bytes.push_back(s.state->saved_bytes());
  bytes.push_back(src.window->saved_bytes());
  return bytes;
}

inline std::size_t layer_size(const layer_source& src) {
  std::uint64_t total = header_bytes(src.streams.size());
  for (std::uint64_t b : section_bytes(src)) total += b;
  return static_cast<std::size_t>(total);
}

inline std::size_t write_layer(const layer_source& src, span<std::byte> out) {
  static_assert(host_little_endian, "phasekv snapshots need a little-endian host");
  const std::size_t streams = src.streams.size();
  const std::vector<std::uint64_t> bytes = section_bytes(src);
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
    const layer_source::stream& s = src.streams[k];
    const std::int64_t page_size = s.layout.page_size, entries = s.state->entries();
    w.restart_checksum();
    for (std::int64_t first = 0, page = 0; first < entries; first += page_size, ++page)
      w.bytes(s.base + s.pages[page] * s.layout.page_stride_bytes,
              static_cast<std::size_t>(std::min(page_size, entries - first) * s.layout.entry_stride_bytes));
    table[k] = {entries_section, static_cast<std::uint32_t>(k), bytes[k], w.checksum()};
  }
  for (std::size_t k = 0; k < streams; ++k) {  // compressor states
    const stream_state& state = *src.streams[k].state;
    w.restart_checksum();
    state.state_write(w);
    table[streams + k] = {state_section, static_cast<std::uint32_t>(k), bytes[streams + k], w.checksum(),
                          state.host_fed() ? host_fed_flag : 0u};
  }
  w.restart_checksum();  // the raw window
  src.window->state_write(w);
  table[2 * streams] = {window_section, no_stream_index, bytes[2 * streams], w.checksum()};

  byte_writer h(base, header);  // its checksum runs from byte 0
  h.bytes(magic, sizeof magic);
  h.u32(version);
  h.u32(static_cast<std::uint32_t>(header));
  h.u64(total);
  h.u32(0);
  h.u32(h.checksum());  // of bytes [0, 28)
  write_fingerprint(h, src.print);
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

template <class Cache>
std::size_t size(const Cache& cache, sequence_id id) {
  return layer_size(source_of(cache, id, "snapshot_size"));
}

template <class Cache>
std::size_t write(const Cache& cache, sequence_id id, span<std::byte> out) {
  return write_layer(source_of(cache, id, "snapshot"), out);
}

// ---- restore ---------------------------------------------------------------------------------------

// The 32-byte preamble every snapshot format shares — magic, version, header_bytes, total_bytes, a
// reserved word, the CRC-32C of the first 28 bytes — checked in that order (`format` names the
// format in the version message: "" or "model snapshot "; bad_magic() the message for other bytes).
struct preamble {
  std::uint32_t header = 0;
  std::uint64_t total = 0;
};
template <class BadMagic>
preamble read_preamble(const unsigned char* p, std::size_t size, const unsigned char (&expected)[8], std::uint32_t want,
                       const char* format, BadMagic&& bad_magic) {
  const std::size_t magic_seen = std::min(size, sizeof expected);
  if (magic_seen > 0 && std::memcmp(p, expected, magic_seen) != 0) throw input_error(bad_magic());
  if (size < preamble_bytes)
    throw input_error("snapshot: truncated at byte " + std::to_string(size) + " of at least " +
                      std::to_string(preamble_bytes) + " (the preamble)");
  byte_reader pre(p + 8, p + preamble_bytes, "snapshot");
  const std::uint32_t stored_version = pre.u32();
  preamble out;
  out.header = pre.u32();
  out.total = pre.u64();
  const std::uint32_t reserved = pre.u32();
  const std::uint32_t stored_crc = pre.u32();
  const std::uint32_t crc = crc32c(p, 28);
  if (stored_crc != crc)
    throw input_error("snapshot: preamble checksum mismatch (stored " + hex(stored_crc) + ", computed " + hex(crc) +
                      "): the first 32 bytes are corrupt");
  if (stored_version != want)
    throw input_error(std::string("snapshot: ") + format + "format version " + std::to_string(stored_version) +
                      " is not supported (this build reads version " + std::to_string(want) + ")");
  if (reserved != 0) fail<input_error>("snapshot: reserved field of the preamble", reserved, "must be 0");
  return out;
}

// The bytes are exactly the snapshot (`total`), and its header (`header` bytes, a CRC-32C of the
// rest at its end) is intact. The caller checked header ≤ total.
inline void check_framing(const unsigned char* p, std::size_t size, std::uint32_t header, std::uint64_t total) {
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
}

// The parts of a snapshot restore() has located and verified before changing anything.
struct parsed {
  fingerprint print;
  std::vector<section> table;
  std::vector<const unsigned char*> starts;  // of each section
};

// Framing, checksums of the preamble and header, fingerprint (against the destination's, `mine`)
// and section table (2 · streams + 1 sections).
inline parsed parse(const fingerprint& destination, std::size_t streams, span<const std::byte> in) {
  if (in.data() == nullptr && in.size() != 0)
    fail<input_error>("snapshot: bytes.data()", "null", "must not be null when the size is " + std::to_string(in.size()));
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  const std::size_t size = in.size();

  const preamble pre = read_preamble(p, size, magic, version, "", [] {
    return std::string("snapshot: bad magic: these bytes are not a phasekv snapshot");
  });
  const std::uint32_t header = pre.header;
  const std::uint64_t total = pre.total;
  if (header < header_bytes(0) || header > total)
    fail<input_error>("snapshot: header_bytes", header,
                      "must lie in [" + std::to_string(header_bytes(0)) + ", total_bytes = " +
                          std::to_string(total) + "]");
  check_framing(p, size, header, total);

  // The header is intact: its fields are what the writer wrote.
  byte_reader r(p + preamble_bytes, p + header, "snapshot");
  const std::uint64_t snapshot_streams = byte_reader(p + preamble_bytes + 8, p + header, "snapshot").u64();
  if (snapshot_streams > max_streams || header != header_bytes(snapshot_streams))
    fail<input_error>("snapshot: header_bytes", header,
                      "does not fit the " + std::to_string(snapshot_streams) + " streams the header declares");
  parsed out;
  out.print = read_fingerprint(r, static_cast<std::size_t>(snapshot_streams));
  fingerprint mine = destination;
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

// Entries from a verified-length section into a stream's fresh pages (of `layout`, page p at base +
// p · page_stride_bytes), checking the section's CRC on the way; a mismatch throws (the caller then
// gives the pages back). `from` is the packed
// layout of the snapshot's entries; `bounce` holds a page of unaligned 16-bit entries.
inline void copy_entries(const page_layout& layout, std::byte* base, const std::vector<page_id>& pages, std::int64_t entries,
                         const page_layout& from, const unsigned char* src, std::vector<std::uint16_t>& bounce,
                         const parsed& in, std::size_t section_index) {
  const std::int64_t page_size = layout.page_size;
  std::uint32_t crc = 0;
  for (std::size_t page = 0; page < pages.size(); ++page) {
    const std::int64_t n = std::min(page_size, entries - static_cast<std::int64_t>(page) * page_size);
    const auto bytes = static_cast<std::size_t>(n * from.entry_stride_bytes);
    std::byte* destination = base + pages[page] * layout.page_stride_bytes;
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

// What a layer that takes a snapshot is: its fingerprint, geometry, history and window, per stream
// its ring row (payload + logit floats per token), page layout and fresh compressor state.
struct layer_destination {
  fingerprint print;
  geometry geom;
  std::int64_t history = 0;
  raw_window_config window;
  std::vector<std::int64_t> ring_floats;
  std::vector<page_layout> layouts;
  std::function<stream_state(std::size_t stream)> make_state;
};

// A snapshot layer read and checked: its sections located and verified, its states and window made
// (allocations only — nothing of the destination changes), a page of bounce buffer; the entries
// are copied by copy_entries into pages the caller allocates.
struct restored_layer {
  parsed in;
  std::int64_t tokens = 0, entries = 0;
  std::vector<stream_state> states;
  raw_window window;
  std::vector<std::uint16_t> bounce;

  // Stream k's entries into `pages` (fresh, of `layout` at `base`), checked against its CRC.
  void copy_entries(std::size_t k, const page_layout& layout, std::byte* base, const std::vector<page_id>& pages) {
    snapshot_format::copy_entries(layout, base, pages, entries, source_layout(in.print.streams[k]), in.starts[k], bounce, in, k);
  }
};

inline restored_layer read_layer(span<const std::byte> bytes, const layer_destination& d) {
  static_assert(host_little_endian, "phasekv snapshots need a little-endian host");
  const std::size_t streams = d.layouts.size();
  restored_layer out;
  out.in = parse(d.print, streams, bytes);
  const parsed& in_parts = out.in;
  const fingerprint& print = in_parts.print;
  const geometry& g = d.geom;
  const auto section_reader = [&](std::size_t i) {
    return byte_reader(in_parts.starts[i], in_parts.starts[i] + in_parts.table[i].bytes, "snapshot");
  };

  // Token count and the lengths every section must have.
  if (print.tokens > static_cast<std::uint64_t>(limits::max_tokens))
    fail<input_error>("snapshot: tokens", print.tokens, "must be at most 2^48");
  const auto tokens = static_cast<std::int64_t>(print.tokens);
  const std::int64_t entries = streams > 0 ? g.completed_entries(tokens) : 0;
  out.tokens = tokens;
  out.entries = entries;
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
  for (std::size_t k = 0; k < streams; ++k) {
    std::uint64_t ring = 0;
    const bool fits = multiply(static_cast<std::uint64_t>(source_ring_rows), static_cast<std::uint64_t>(d.ring_floats[k]) * 4, ring);
    expect_bytes(in_parts, streams + k, stream_state::saved_fields_bytes + ring, fits, [&] {
      return std::to_string(source_ring_rows) + " ring rows of " + std::to_string(d.ring_floats[k]) + " floats";
    });
  }
  // The window's shape is the destination's (compatible); its rows follow the source's history.
  const std::int64_t window_floats = window_key_floats(d.window) + window_value_floats(d.window);
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
  std::vector<stream_state::saved_fields> state_fields(streams);
  for (std::size_t k = 0; k < streams; ++k) {
    byte_reader r = section_reader(streams + k);
    state_fields[k] = stream_state::read_fields(r, in_parts.table[streams + k].flags == host_fed_flag);
    stream_state::check_saved(state_fields[k], tokens, entries, source_ring_rows,
                              [k] { return "snapshot: stream " + std::to_string(k) + " compressor state: "; });
  }
  byte_reader window_in = section_reader(2 * streams);
  const raw_window::saved_fields window_fields = raw_window::read_fields(window_in);
  raw_window::check_saved(d.window, window_fields, source_window_rows, tokens);

  // The new sequence's states and window, read from their sections (allocations only: nothing
  // visible changes yet), and a page of bounce buffer for unaligned 16-bit conversions.
  out.states.reserve(streams);
  for (std::size_t k = 0; k < streams; ++k) {
    out.states.push_back(d.make_state(k));
    byte_reader r = section_reader(streams + k);
    r.bytes(stream_state::saved_fields_bytes);
    out.states[k].state_read(r, state_fields[k]);
  }
  out.window = raw_window(d.window, d.history);
  out.window.state_read(window_in, window_fields, tokens);
  for (std::size_t k = 0; k < streams; ++k) {
    const page_layout& layout = d.layouts[k];
    if (storage_of(print.streams[k].storage) != layout.storage && is_row_storage(storage_of(print.streams[k].storage)))
      out.bounce.resize(std::max(out.bounce.size(), static_cast<std::size_t>(layout.page_size * layout.entry_stride)));
  }
  return out;
}

// A paged_cache as a snapshot's destination.
template <class Cache, std::size_t... K>
layer_destination destination_of(const Cache& cache, std::index_sequence<K...>) {
  layer_destination d;
  d.print = fingerprint_of(cache);
  d.geom = cache.compressors().geom();
  d.history = cache.config().history;
  d.window = cache.config().window;
  d.ring_floats = {(cache.compressors().template stream<K>().payload_floats_per_token() +
                    cache.compressors().template stream<K>().logit_floats_per_token())...};
  d.layouts = {cache.pool(K).layout()...};
  d.make_state = [&cache](std::size_t k) {
    stream_state s;
    ((k == K ? (s = cache.compressors().template stream<K>().make_state(cache.config().history), 0) : 0), ...);
    return s;
  };
  return d;
}

template <class Cache>
sequence_id restore_unguarded(Cache& cache, span<const std::byte> in) {
  constexpr std::size_t streams = Cache::stream_count;
  restored_layer layer = read_layer(in, destination_of(cache, std::make_index_sequence<streams>{}));
  typename Cache::layer::states states;
  for (std::size_t k = 0; k < streams; ++k) states[k] = std::move(layer.states[k]);
  // The pages, all or nothing, filled from the entry sections while their checksums are checked.
  return cache.adopt(
      layer.tokens, std::move(states), std::move(layer.window),
      [&](std::size_t k, page_pool& pool, const std::vector<page_id>& pages) {
        layer.copy_entries(k, pool.layout(), pool.base(), pages);
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
