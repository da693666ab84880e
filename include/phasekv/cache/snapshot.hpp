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
inline constexpr std::size_t state_fields_bytes = 4 * 8;
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

namespace detail {

// The one place that reads and rebuilds a paged_cache's per-sequence record and a stream_state's
// private members (both name it a friend).
struct snapshot_access {
  // ---- sizes --------------------------------------------------------------------------------------

  // Bytes of each section of one sequence, in table order.
  template <class... C, class Sequence>
  static std::vector<std::uint64_t> section_bytes(const paged_cache<C...>& cache, const Sequence& s) {
    constexpr std::size_t streams = sizeof...(C);
    std::vector<std::uint64_t> bytes;
    bytes.reserve(2 * streams + 1);
    for (std::size_t k = 0; k < streams; ++k)
      bytes.push_back(static_cast<std::uint64_t>(s.states[k].entries()) *
                      static_cast<std::uint64_t>(cache.pools_[k]->layout().entry_stride_bytes));
    for (std::size_t k = 0; k < streams; ++k)
      bytes.push_back(snapshot_format::state_fields_bytes +
                      (s.states[k].payload_ring_.size() + s.states[k].logit_ring_.size()) * sizeof(float));
    bytes.push_back(s.window.saved_bytes());
    return bytes;
  }

  template <class... C>
  static std::size_t size(const paged_cache<C...>& cache, sequence_id id) {
    const auto& s = cache.find(id, "snapshot_size");
    std::uint64_t total = snapshot_format::header_bytes(sizeof...(C));
    for (std::uint64_t b : section_bytes(cache, s)) total += b;
    return static_cast<std::size_t>(total);
  }

  // ---- snapshot ---------------------------------------------------------------------------------------

  template <class... C>
  static std::size_t write(const paged_cache<C...>& cache, sequence_id id, span<std::byte> out) {
    static_assert(host_little_endian, "phasekv snapshots need a little-endian host");
    namespace format = snapshot_format;
    constexpr std::size_t streams = sizeof...(C);
    const auto& s = cache.find(id, "snapshot");
    const std::vector<std::uint64_t> bytes = section_bytes(cache, s);
    const std::size_t header = format::header_bytes(streams);
    std::uint64_t total = header;
    for (std::uint64_t b : bytes) total += b;
    if (out.data() == nullptr && out.size() != 0)
      fail<input_error>("snapshot: out.data()", "null", "must not be null when the size is " + std::to_string(out.size()));
    if (out.size() < total)
      fail<input_error>("snapshot: out.size()", out.size(),
                        "must be at least the snapshot's " + std::to_string(total) + " bytes (snapshot_size)");

    auto* base = reinterpret_cast<unsigned char*>(out.data());
    std::vector<format::section> table(2 * streams + 1);
    byte_writer w(base + header, static_cast<std::size_t>(total) - header);

    for (std::size_t k = 0; k < streams; ++k) {  // entries, page after page
      const page_pool& pool = *cache.pools_[k];
      const std::int64_t page_size = pool.layout().page_size, entries = s.states[k].entries();
      w.restart_checksum();
      for (std::int64_t first = 0, page = 0; first < entries; first += page_size, ++page)
        w.bytes(pool.data(s.tables[k][static_cast<std::size_t>(page)]),
                static_cast<std::size_t>(std::min(page_size, entries - first) * pool.layout().entry_stride_bytes));
      table[k] = {format::entries_section, static_cast<std::uint32_t>(k), bytes[k], w.checksum()};
    }
    for (std::size_t k = 0; k < streams; ++k) {  // compressor states
      const stream_state& state = s.states[k];
      w.restart_checksum();
      w.i64(state.tokens_);
      w.i64(state.entries_);
      w.i64(state.ring_rows_);
      w.i64(state.intact_from_);
      w.floats(state.payload_ring_.data(), state.payload_ring_.size());
      w.floats(state.logit_ring_.data(), state.logit_ring_.size());
      table[streams + k] = {format::state_section, static_cast<std::uint32_t>(k), bytes[streams + k], w.checksum(),
                            state.host_fed_ ? format::host_fed_flag : 0u};
    }
    {  // raw window
      w.restart_checksum();
      s.window.state_write(w);
      table[2 * streams] = {format::window_section, format::no_stream_index, bytes[2 * streams], w.checksum()};
    }

    format::fingerprint f = format::fingerprint_of(cache);
    f.tokens = static_cast<std::uint64_t>(s.tokens);
    byte_writer h(base, header);  // its checksum runs from byte 0
    h.bytes(format::magic, sizeof format::magic);
    h.u32(format::version);
    h.u32(static_cast<std::uint32_t>(header));
    h.u64(total);
    h.u32(0);
    h.u32(h.checksum());  // of bytes [0, 28)
    format::write_fingerprint(h, f);
    h.u64(table.size());
    for (const format::section& t : table) {
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

  // ---- restore ----------------------------------------------------------------------------------------

  // The parts of a snapshot restore() has located and verified before changing anything.
  struct parsed {
    snapshot_format::fingerprint print;
    std::vector<snapshot_format::section> table;
    std::vector<const unsigned char*> starts;  // of each section
  };

  // Framing, checksums of the preamble and header, fingerprint and section table.
  template <class... C>
  static parsed parse(const paged_cache<C...>& cache, span<const std::byte> in) {
    namespace format = snapshot_format;
    using detail::fail;
    constexpr std::size_t streams = sizeof...(C);
    if (in.data() == nullptr && in.size() != 0)
      fail<input_error>("snapshot: bytes.data()", "null", "must not be null when the size is " + std::to_string(in.size()));
    const auto* p = reinterpret_cast<const unsigned char*>(in.data());
    const std::size_t size = in.size();

    const std::size_t magic_seen = std::min(size, sizeof format::magic);
    if (magic_seen > 0 && std::memcmp(p, format::magic, magic_seen) != 0)
      throw input_error("snapshot: bad magic: these bytes are not a phasekv snapshot");
    if (size < format::preamble_bytes)
      throw input_error("snapshot: truncated at byte " + std::to_string(size) + " of at least " +
                        std::to_string(format::preamble_bytes) + " (the preamble)");
    byte_reader pre(p + 8, p + format::preamble_bytes, "snapshot");
    const std::uint32_t version = pre.u32();
    const std::uint32_t header = pre.u32();
    const std::uint64_t total = pre.u64();
    const std::uint32_t reserved = pre.u32();
    const std::uint32_t stored_preamble_crc = pre.u32();
    const std::uint32_t preamble_crc = crc32c(p, 28);
    if (stored_preamble_crc != preamble_crc)
      throw input_error("snapshot: preamble checksum mismatch (stored " + format::hex(stored_preamble_crc) +
                        ", computed " + format::hex(preamble_crc) + "): the first 32 bytes are corrupt");
    if (version != format::version)
      throw input_error("snapshot: format version " + std::to_string(version) +
                        " is not supported (this build reads version " + std::to_string(format::version) + ")");
    if (reserved != 0) fail<input_error>("snapshot: reserved field of the preamble", reserved, "must be 0");
    if (header < format::header_bytes(0) || header > total)
      fail<input_error>("snapshot: header_bytes", header,
                        "must lie in [" + std::to_string(format::header_bytes(0)) + ", total_bytes = " +
                            std::to_string(total) + "]");
    if (size < total)
      throw input_error("snapshot: truncated at byte " + std::to_string(size) + " of " + std::to_string(total));
    if (size > total)
      throw input_error("snapshot: " + std::to_string(size - total) + " bytes follow the end of the snapshot (" +
                        std::to_string(total) + " bytes)");
    const std::uint32_t stored_header_crc = byte_reader(p + header - 4, p + header, "snapshot").u32();
    const std::uint32_t header_crc = crc32c(p, header - 4);
    if (stored_header_crc != header_crc)
      throw input_error("snapshot: header checksum mismatch (stored " + format::hex(stored_header_crc) + ", computed " +
                        format::hex(header_crc) + ")");

    // The header is intact: its fields are what the writer wrote.
    byte_reader r(p + format::preamble_bytes, p + header, "snapshot");
    const std::uint64_t snapshot_streams = byte_reader(p + format::preamble_bytes + 8, p + header, "snapshot").u64();
    if (snapshot_streams > format::max_streams || header != format::header_bytes(snapshot_streams))
      fail<input_error>("snapshot: header_bytes", header,
                        "does not fit the " + std::to_string(snapshot_streams) + " streams the header declares");
    parsed out;
    out.print = format::read_fingerprint(r, static_cast<std::size_t>(snapshot_streams));
    format::fingerprint mine = snapshot_format::fingerprint_of(cache);
    mine.tokens = out.print.tokens;
    format::check_compatible(out.print, mine);

    const std::uint64_t count = r.u64();
    if (count != 2 * streams + 1)
      fail<input_error>("snapshot: section count", count, "must be " + std::to_string(2 * streams + 1));
    out.table.resize(static_cast<std::size_t>(count));
    out.starts.resize(static_cast<std::size_t>(count));
    const unsigned char* at = p + header;
    for (std::size_t i = 0; i < out.table.size(); ++i) {
      format::section& t = out.table[i];
      t.kind = r.u32();
      t.stream = r.u32();
      t.bytes = r.u64();
      t.crc = r.u32();
      t.flags = r.u32();
      const std::uint32_t kind = i < streams ? format::entries_section
                                 : i < 2 * streams ? format::state_section
                                                   : format::window_section;
      if (t.flags != 0 && (kind != format::state_section || t.flags != format::host_fed_flag))
        fail<input_error>("snapshot: section " + std::to_string(i) + " flags", t.flags,
                          kind == format::state_section ? "must be 0 or 1 (host-fed)" : "must be 0 (reserved)");
      const std::uint32_t stream = i < 2 * streams ? static_cast<std::uint32_t>(i % streams) : format::no_stream_index;
      if (t.kind != kind || t.stream != stream)
        throw input_error("snapshot: section " + std::to_string(i) + " is kind " + std::to_string(t.kind) +
                          " of stream " + std::to_string(t.stream) + ", expected " +
                          format::section_name(i, kind, stream));
      if (t.bytes > static_cast<std::uint64_t>(p + total - at))
        throw input_error("snapshot: " + format::section_name(i, kind, stream) + " of " + std::to_string(t.bytes) +
                          " bytes runs past the end of the snapshot (" + std::to_string(total) + " bytes)");
      out.starts[i] = at;
      at += t.bytes;
    }
    format::read_reserved(r, [] { return "the header"; });
    if (at != p + total)
      throw input_error("snapshot: the sections end at byte " + std::to_string(at - p) + ", total_bytes is " +
                        std::to_string(total));
    return out;
  }

  static void verify(const parsed& in, std::size_t i) {
    const snapshot_format::section& t = in.table[i];
    const std::uint32_t crc = crc32c(in.starts[i], static_cast<std::size_t>(t.bytes));
    if (crc != t.crc) checksum_mismatch(i, t, crc);
  }

  [[noreturn]] static void checksum_mismatch(std::size_t i, const snapshot_format::section& t, std::uint32_t crc) {
    throw input_error("snapshot: " + snapshot_format::section_name(i, t.kind, t.stream) + " checksum mismatch (stored " +
                      snapshot_format::hex(t.crc) + ", computed " + snapshot_format::hex(crc) + ")");
  }

  // Section i must have `expected` bytes (`fits`: the product was representable); why() says
  // what they hold (called only on failure).
  template <class Why>
  static void expect_bytes(const parsed& in, std::size_t i, std::uint64_t expected, bool fits, Why&& why) {
    const snapshot_format::section& t = in.table[i];
    if (!fits || t.bytes != expected)
      throw input_error("snapshot: " + snapshot_format::section_name(i, t.kind, t.stream) + " has " +
                        std::to_string(t.bytes) + " bytes, " +
                        (fits ? "expected " + std::to_string(expected) : std::string("far fewer than")) + " (" +
                        why() + ")");
  }

  // Copies the rows of tokens [first, tokens) from a ring of `from_rows` rows to one of `to_rows`
  // rows (token t in row t mod rows), `per_row` floats each.
  static void re_ring(const unsigned char* from, std::int64_t from_rows, float* to, std::int64_t to_rows,
                      std::int64_t per_row, std::int64_t first, std::int64_t tokens) noexcept {
    const auto row_bytes = static_cast<std::size_t>(per_row) * sizeof(float);
    if (row_bytes == 0) return;
    for (std::int64_t t = first; t < tokens; ++t)
      std::memcpy(to + floor_mod(t, to_rows) * per_row, from + static_cast<std::size_t>(floor_mod(t, from_rows)) * row_bytes,
                  row_bytes);
  }

  // restore(), with std::bad_alloc (at any point: nothing has changed then) as capacity_error,
  // as the cache reports memory it cannot get.
  template <class... C>
  static sequence_id restore(paged_cache<C...>& cache, span<const std::byte> in) {
    try {
      return restore_unguarded(cache, in);
    } catch (const std::bad_alloc&) {
      throw capacity_error("snapshot: restoring into " + cache.config().name +
                           ": memory for the sequence's compressor state, raw window or page tables could not be "
                           "allocated (the cache is unchanged)");
    }
  }

  template <class... C>
  static sequence_id restore_unguarded(paged_cache<C...>& cache, span<const std::byte> in) {
    static_assert(host_little_endian, "phasekv snapshots need a little-endian host");
    namespace format = snapshot_format;
    using cache_t = paged_cache<C...>;
    using record_t = typename cache_t::sequence;
    constexpr std::size_t streams = sizeof...(C);

    const parsed in_parts = parse(cache, in);
    const format::fingerprint& print = in_parts.print;
    const geometry& g = cache.compressors().geom();
    const cache_config& config = cache.config();

    // Token count and the lengths every section must have.
    if (print.tokens > static_cast<std::uint64_t>(limits::max_tokens))
      fail<input_error>("snapshot: tokens", print.tokens, "must be at most 2^48");
    const auto tokens = static_cast<std::int64_t>(print.tokens);
    const std::int64_t entries = g.completed_entries(tokens);
    const std::int64_t source_ring_rows = g.window + print.history;  // history in [0, 2^40]: checked
    for (std::size_t k = 0; k < streams; ++k) {
      std::uint64_t expected = 0;
      const std::int64_t elements = print.streams[k].channels * print.streams[k].kv_heads;
      const bool fits = format::multiply(static_cast<std::uint64_t>(entries),
                                         static_cast<std::uint64_t>(source_layout(print.streams[k]).entry_stride_bytes),
                                         expected);
      expect_bytes(in_parts, k, expected, fits, [&] {
        return std::to_string(entries) + " entries of " + std::to_string(elements) + " " +
               format::storage_name(print.streams[k].storage) + " elements";
      });
    }
    std::array<std::int64_t, streams> payload_floats{}, logit_floats{};
    cache.for_each_stream([&](std::size_t k, const auto& c) {
      payload_floats[k] = c.payload_floats_per_token();
      logit_floats[k] = c.logit_floats_per_token();
    });
    for (std::size_t k = 0; k < streams; ++k) {
      std::uint64_t ring = 0;
      const bool fits = format::multiply(static_cast<std::uint64_t>(source_ring_rows),
                                         static_cast<std::uint64_t>(payload_floats[k] + logit_floats[k]) * 4, ring);
      expect_bytes(in_parts, streams + k, format::state_fields_bytes + ring, fits, [&] {
        return std::to_string(source_ring_rows) + " ring rows of " +
               std::to_string(payload_floats[k] + logit_floats[k]) + " floats";
      });
    }
    // The window's shape is the destination's (compatible); its rows follow the source's history.
    const std::int64_t window_floats = window_key_floats(config.window) + window_value_floats(config.window);
    const std::int64_t source_window_rows = print.window_tokens > 0 ? print.window_tokens + print.history : 0;
    {
      std::uint64_t rows_bytes = 0;
      const bool fits = format::multiply(static_cast<std::uint64_t>(source_window_rows),
                                         static_cast<std::uint64_t>(window_floats) * 4, rows_bytes);
      expect_bytes(in_parts, 2 * streams, raw_window::saved_fields_bytes + rows_bytes, fits, [&] {
        return std::to_string(source_window_rows) + " window rows of " + std::to_string(window_floats) + " floats";
      });
    }

    // The small sections: verify, then check their counts fit together.
    for (std::size_t i = streams; i < 2 * streams + 1; ++i) verify(in_parts, i);
    struct state_fields {
      std::int64_t tokens, entries, ring_rows, intact_from;
    };
    std::array<state_fields, streams> states{};
    for (std::size_t k = 0; k < streams; ++k) {
      const unsigned char* start = in_parts.starts[streams + k];
      byte_reader r(start, start + format::state_fields_bytes, "snapshot");
      state_fields& f = states[k];
      f.tokens = r.i64();
      f.entries = r.i64();
      f.ring_rows = r.i64();
      f.intact_from = r.i64();
      const auto where = [k] { return "snapshot: stream " + std::to_string(k) + " compressor state: "; };
      if (f.tokens != tokens)
        fail<input_error>(where() + "tokens", f.tokens, "must equal the sequence's " + std::to_string(tokens));
      if (f.entries != entries)
        fail<input_error>(where() + "entries", f.entries,
                          "must equal completed_entries(" + std::to_string(tokens) + ") = " + std::to_string(entries));
      if (f.ring_rows != source_ring_rows)
        fail<input_error>(where() + "ring_rows", f.ring_rows,
                          "must be window + history = " + std::to_string(source_ring_rows));
      // The ring holds at most its rows' worth of tokens. A state whose entries the host
      // computed (append_entries) may hold none of the inputs its next entry needs, up to
      // intact_from = tokens: append() then refuses to continue it (stream_compressor::continues).
      const std::int64_t lowest = std::max<std::int64_t>(0, tokens - f.ring_rows);
      if (f.intact_from < lowest || f.intact_from > tokens)
        fail<input_error>(where() + "intact_from", f.intact_from,
                          "must lie in [" + std::to_string(lowest) + ", " + std::to_string(tokens) +
                              "] (within the ring)");
      // A host-fed state (skip()) keeps no inputs: intact_from = tokens > 0.
      if (in_parts.table[streams + k].flags == format::host_fed_flag && (tokens == 0 || f.intact_from != tokens))
        fail<input_error>(where() + "intact_from", f.intact_from,
                          "must equal tokens = " + std::to_string(tokens) + " > 0 in a host-fed state");
    }
    raw_window::saved_fields window_fields;
    {
      byte_reader r(in_parts.starts[2 * streams], in_parts.starts[2 * streams] + raw_window::saved_fields_bytes,
                    "snapshot");
      window_fields = raw_window::read_fields(r);
      raw_window::check_saved(config.window, window_fields, source_window_rows, tokens);
    }

    // Build the new record (allocations only: nothing visible changes yet).
    auto record = std::make_unique<record_t>();
    record->states = cache.compressors().make_state(config.history);
    record->tokens = tokens;
    for (std::size_t k = 0; k < streams; ++k) {
      stream_state& state = record->states[k];
      const state_fields& f = states[k];
      const unsigned char* payload = in_parts.starts[streams + k] + format::state_fields_bytes;
      const unsigned char* logits =
          payload + static_cast<std::size_t>(f.ring_rows * payload_floats[k]) * sizeof(float);
      state.tokens_ = tokens;
      state.entries_ = entries;
      state.host_fed_ = in_parts.table[streams + k].flags == format::host_fed_flag;
      if (state.ring_rows_ == f.ring_rows) {  // equal histories: the rings verbatim
        state.intact_from_ = f.intact_from;
        if (!state.payload_ring_.empty())
          std::memcpy(state.payload_ring_.data(), payload, state.payload_ring_.size() * sizeof(float));
        if (!state.logit_ring_.empty())
          std::memcpy(state.logit_ring_.data(), logits, state.logit_ring_.size() * sizeof(float));
      } else {
        state.intact_from_ = std::max(f.intact_from, tokens - state.ring_rows_);
        re_ring(payload, f.ring_rows, state.payload_ring_.data(), state.ring_rows_, payload_floats[k],
                state.intact_from_, tokens);
        re_ring(logits, f.ring_rows, state.logit_ring_.data(), state.ring_rows_, logit_floats[k],
                state.intact_from_, tokens);
      }
    }
    {
      const unsigned char* start = in_parts.starts[2 * streams];
      byte_reader r(start + raw_window::saved_fields_bytes, start + in_parts.table[2 * streams].bytes, "snapshot");
      record->window = raw_window(config.window, config.history);
      record->window.state_read(r, window_fields, tokens);
    }

    // Page ids, reserved so that nothing below allocates memory until the sequence table does.
    std::array<std::vector<page_id>, streams> pages;
    std::vector<std::uint16_t> bounce;  // a page of 16-bit entries, for unaligned conversions
    for (std::size_t k = 0; k < streams; ++k) {
      const std::int64_t page_size = cache.pools_[k]->layout().page_size;
      pages[k].resize(static_cast<std::size_t>((entries + page_size - 1) / page_size));
      record->tables[k].reserve(pages[k].size());
      if (format::storage_of(print.streams[k].storage) != cache.pools_[k]->layout().storage &&
          is_row_storage(format::storage_of(print.streams[k].storage)))
        bounce.resize(std::max(bounce.size(), static_cast<std::size_t>(page_size * cache.pools_[k]->layout().entry_stride)));
    }

    // All pages, all-or-nothing across the streams.
    std::size_t allocated = 0;
    try {
      for (; allocated < streams; ++allocated) {
        page_pool& pool = *cache.pools_[allocated];
        try {
          pool.allocate(static_cast<std::int64_t>(pages[allocated].size()), pages[allocated].data());
        } catch (const capacity_error& e) {
          throw capacity_error("snapshot: restoring " + std::to_string(entries) + " entries of stream " +
                               std::to_string(allocated) + " needs " + std::to_string(pages[allocated].size()) +
                               " pages: " + e.what());
        }
      }
    } catch (...) {
      release_reversed(cache, pages, allocated);
      throw;
    }

    try {
      for (std::size_t k = 0; k < streams; ++k) {
        copy_entries(*cache.pools_[k], pages[k], entries, source_layout(print.streams[k]), in_parts.starts[k], bounce,
                     in_parts, k);
        record->tables[k].assign(pages[k].begin(), pages[k].end());  // within the reserved capacity
      }
      return cache.insert(std::move(record));  // leaves the record with us if it throws
    } catch (...) {
      release_reversed(cache, pages, streams);
      throw;
    }
  }

  // Entries from a verified-length section into the new pages, checking the section's CRC on the
  // way; a mismatch throws (the caller releases the pages).
  // `from` is the packed layout of the snapshot's entries (source_layout).
  static void copy_entries(page_pool& pool, const std::vector<page_id>& pages, std::int64_t entries,
                           const page_layout& from, const unsigned char* src, std::vector<std::uint16_t>& bounce,
                           const parsed& in, std::size_t section_index) {
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

  // The entries of a snapshot's stream as the section holds them: packed, in its storage type.
  static page_layout source_layout(const snapshot_format::stream_fingerprint& f) noexcept {
    const storage_type storage = snapshot_format::storage_of(f.storage);
    return page_layout::packed(storage, f.kv_heads, f.channels,
                               storage == storage_type::fp8_e4m3_block ? f.rope_channels : 0);
  }

  // Releases the first `streams` streams' new pages, last allocated first, so each pool's free
  // list is exactly as it was before the allocation.
  template <class... C, std::size_t N>
  static void release_reversed(paged_cache<C...>& cache, const std::array<std::vector<page_id>, N>& pages,
                               std::size_t streams) noexcept {
    for (std::size_t k = streams; k-- > 0;) {
      try {
        for (std::size_t i = pages[k].size(); i-- > 0;) cache.pools_[k]->release(pages[k][i]);
      } catch (...) {  // the pages were just allocated to nobody else: release cannot fail
      }
    }
  }
};

}  // namespace detail

// ---- the interface ---------------------------------------------------------------------------------

// Bytes snapshot() writes for a sequence (throws input_error for an unknown sequence).
template <class... Compressors>
std::size_t snapshot_size(const paged_cache<Compressors...>& cache, sequence_id id) {
  return detail::snapshot_access::size(cache, id);
}

// Writes the snapshot of a sequence into `out` (at least snapshot_size() bytes; its alignment
// does not matter) and returns the bytes written. The fast path: no allocation, one pass over
// the entries.
template <class... Compressors>
std::size_t snapshot_into(const paged_cache<Compressors...>& cache, sequence_id id, span<std::byte> out) {
  return detail::snapshot_access::write(cache, id, out);
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
  return detail::snapshot_access::restore(cache, bytes);
}

}  // namespace phasekv
