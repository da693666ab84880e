#pragma once
// Model snapshots: one sequence of a model_cache, every layer, as bytes — and those bytes restored
// into another model cache of the same spec (another process or node, page size, page count,
// history, memory, or a lossless wider storage), every later step bit-identical to never having
// moved. What a disaggregated engine moves from its prefill node to its decode node.
//
//   std::vector<std::byte> bytes = snapshot(model, seq);     // or snapshot_into(model, seq, buffer)
//   sequence_id moved = restore(decode_model, bytes);        // a new sequence
//
// The bytes (docs/SNAPSHOT.md, "Model snapshots") are a checksummed container — preamble, the
// sequence's tokens, per layer the offset and length of its part — around one layer snapshot per
// layer, each in the format of a paged_cache's (cache/snapshot.hpp: fingerprint, sections,
// CRC-32C), so each layer is checked against the destination's layer as a single-layer restore
// checks it. restore() reads and checks every layer, then reserves each kind's pages once (the
// layers of a kind share them), then copies the entries while checking their checksums: any
// failure — bytes it cannot accept (input_error naming the layer and field), a kind without the
// pages (capacity_error), memory (capacity_error) — leaves the destination exactly as it was.
//
// Thread safety: snapshot() reads one sequence (like the cache's const queries); restore() adds a
// new sequence and may run concurrently with calls on other sequences.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/cache/snapshot.hpp"
#include "phasekv/format/detail/byte_io.hpp"
#include "phasekv/detail/crc32c.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/models/model_cache.hpp"

namespace phasekv {

namespace detail {

namespace model_snapshot_format {
inline constexpr unsigned char magic[8] = {0x89, 'P', 'K', 'V', 'M', 'O', 'D', 'L'};
inline constexpr std::uint32_t version = 1;
inline constexpr std::size_t preamble_bytes = 32;
// Preamble, tokens and layer count, an (offset, bytes) pair per layer, reserved word and CRC.
constexpr std::size_t header_bytes(std::size_t layers) noexcept { return preamble_bytes + 16 + 16 * layers + 8; }
static_assert(header_bytes(0) == 56, "the header size docs/SNAPSHOT.md states");
}  // namespace model_snapshot_format

// What the snapshot functions need of a model_cache's insides.
struct model_snapshot_access {
  using sf = snapshot_format::layer_source;

  static snapshot_format::fingerprint layer_print(const model_cache& m, std::size_t l) {
    const model_cache::layer_slot& layer = m.layers_[l];
    const layer_kind& kind = m.kinds_[layer.kind].spec;
    const geometry g = kind.window_only() ? geometry{0, 0, 0, anchor_mode::block_start} : kind.geom;
    snapshot_format::fingerprint f = snapshot_format::layer_fingerprint(g, m.options_.history, kind.window);
    for (std::size_t k = 0; k < layer.streams.size(); ++k) {
      f.streams.push_back(snapshot_format::stream_fingerprint_of(*layer.streams[k], kind.streams[k].storage));
    }
    return f;
  }

  // Every layer's part of sequence `id`. States a rollback has not yet reached (remove_suffix rolls
  // them back lazily) are rolled back in copies kept in `kept` (reserved: pointers stay valid).
  struct sources {
    std::int64_t tokens = 0;
    std::vector<sf> layers;
    std::vector<stream_state> kept_states;
    std::vector<raw_window> kept_windows;
  };
  static sources sources_of(const model_cache& m, sequence_id id, const char* operation) {
    const model_cache::sequence& s = m.find(id, operation);
    sources out;
    out.tokens = s.tokens;
    std::size_t states = 0;
    for (const auto& layer : m.layers_) states += layer.streams.size();
    out.kept_states.reserve(states);
    out.kept_windows.reserve(m.layers_.size());
    for (std::size_t l = 0; l < m.layers_.size(); ++l) {
      const model_cache::layer_slot& layer = m.layers_[l];
      const model_cache::kind_record& record = s.kinds[layer.kind];
      const model_cache::layer_state& st = record.states->layers[layer.index];
      const bool ahead = record.states->tokens != s.tokens;
      sf src;
      src.print = layer_print(m, l);
      src.print.tokens = static_cast<std::uint64_t>(s.tokens);
      for (std::size_t k = 0; k < layer.streams.size(); ++k) {
        const stream_state* state = &st.streams[k];
        if (ahead) {
          out.kept_states.push_back(*state);
          layer.streams[k]->truncate(out.kept_states.back(), s.tokens);
          state = &out.kept_states.back();
        }
        src.streams.push_back({layer.arenas[k].layout(), layer.arenas[k].base(), record.table.data(), state});
      }
      src.window = &st.window;
      if (ahead) {
        out.kept_windows.push_back(st.window);
        out.kept_windows.back().roll_back(s.tokens);
        src.window = &out.kept_windows.back();
      }
      out.layers.push_back(std::move(src));
    }
    return out;
  }

  static snapshot_format::layer_destination destination(const model_cache& m, std::size_t l) {
    const model_cache::layer_slot& layer = m.layers_[l];
    const layer_kind& kind = m.kinds_[layer.kind].spec;
    snapshot_format::layer_destination d;
    d.print = layer_print(m, l);
    d.geom = kind.window_only() ? geometry{0, 0, 0, anchor_mode::block_start} : kind.geom;
    d.history = m.options_.history;
    d.window = kind.window;
    for (std::size_t k = 0; k < layer.streams.size(); ++k) {
      d.ring_floats.push_back(layer.streams[k]->payload_floats_per_token() + layer.streams[k]->logit_floats_per_token());
      d.layouts.push_back(layer.arenas[k].layout());
    }
    const std::int64_t history = m.options_.history;
    d.make_state = [&layer, history](std::size_t k) { return layer.streams[k]->make_state(history); };
    return d;
  }

  // A new sequence from every layer's checked parts: each kind's pages allocated once (all or
  // nothing), each layer's entries copied into them (checksums checked), then the sequence added.
  static sequence_id adopt(model_cache& m, std::int64_t tokens, std::vector<snapshot_format::restored_layer>& layers) {
    auto record = std::make_unique<model_cache::sequence>();
    record->tokens = tokens;
    record->kinds.resize(m.kinds_.size());
    for (std::size_t k = 0; k < m.kinds_.size(); ++k) {
      auto block = std::make_shared<model_cache::kind_states>();
      block->tokens = tokens;
      block->layers.resize(m.kinds_[k].layers.size());
      record->kinds[k].states = std::move(block);
      record->kinds[k].table.resize(static_cast<std::size_t>(m.pages_of(k, tokens)));
    }
    std::size_t allocated = 0;
    try {
      for (; allocated < m.kinds_.size(); ++allocated) {
        auto& table = record->kinds[allocated].table;
        try {
          m.kinds_[allocated].ids.allocate(static_cast<std::int64_t>(table.size()), table.data());
        } catch (const capacity_error& e) {
          throw capacity_error("snapshot: restoring " + std::to_string(tokens) + " tokens into kind '" +
                               m.kinds_[allocated].spec.name + "' needs " + std::to_string(table.size()) +
                               " pages: " + e.what());
        }
      }
      for (std::size_t l = 0; l < m.layers_.size(); ++l) {
        model_cache::layer_slot& layer = m.layers_[l];
        const auto& table = record->kinds[layer.kind].table;
        for (std::size_t k = 0; k < layer.streams.size(); ++k)
          layers[l].copy_entries(k, layer.arenas[k].layout(), layer.arenas[k].base(), table);
        model_cache::layer_state& st = record->kinds[layer.kind].states->layers[layer.index];
        st.streams = std::move(layers[l].states);
        st.window = std::move(layers[l].window);
      }
      return m.insert(std::move(record));  // leaves the record with us if it throws
    } catch (...) {
      for (std::size_t k = allocated; k-- > 0;) {
        const auto& table = record->kinds[k].table;
        m.kinds_[k].ids.release_reversed(table.data(), table.size());
      }
      throw;
    }
  }
};

}  // namespace detail

// Bytes snapshot() writes for a model sequence (input_error for an unknown sequence).
inline std::size_t snapshot_size(const model_cache& model, sequence_id id) {
  const auto src = detail::model_snapshot_access::sources_of(model, id, "snapshot_size");
  std::size_t total = detail::model_snapshot_format::header_bytes(src.layers.size());
  for (const auto& layer : src.layers) total += detail::snapshot_format::layer_size(layer);
  return total;
}

// Writes the snapshot of a model sequence into `out` (at least snapshot_size() bytes) and returns
// the bytes written.
inline std::size_t snapshot_into(const model_cache& model, sequence_id id, span<std::byte> out) {
  namespace f = detail::model_snapshot_format;
  const auto src = detail::model_snapshot_access::sources_of(model, id, "snapshot");
  const std::size_t layers = src.layers.size(), header = f::header_bytes(layers);
  std::vector<std::uint64_t> sizes;
  std::uint64_t total = header;
  for (const auto& layer : src.layers) {
    sizes.push_back(detail::snapshot_format::layer_size(layer));
    total += sizes.back();
  }
  if (out.data() == nullptr && out.size() != 0)
    detail::fail<input_error>("snapshot: out.data()", "null", "must not be null when the size is " + std::to_string(out.size()));
  if (out.size() < total)
    detail::fail<input_error>("snapshot: out.size()", out.size(),
                              "must be at least the model snapshot's " + std::to_string(total) + " bytes (snapshot_size)");
  auto* base = reinterpret_cast<unsigned char*>(out.data());
  std::uint64_t at = header;
  for (std::size_t l = 0; l < layers; ++l) {
    detail::snapshot_format::write_layer(src.layers[l], span<std::byte>(out.data() + at, static_cast<std::size_t>(sizes[l])));
    at += sizes[l];
  }
  byte_writer h(base, header);
  h.bytes(f::magic, sizeof f::magic);
  h.u32(f::version);
  h.u32(static_cast<std::uint32_t>(header));
  h.u64(total);
  h.u32(0);
  h.u32(h.checksum());  // of bytes [0, 28)
  h.u64(static_cast<std::uint64_t>(src.tokens));
  h.u64(layers);
  at = header;
  for (std::size_t l = 0; l < layers; ++l) {
    h.u64(at);
    h.u64(sizes[l]);
    at += sizes[l];
  }
  h.u32(0);
  h.u32(h.checksum());  // of bytes [0, header − 4)
  return static_cast<std::size_t>(total);
}

inline std::vector<std::byte> snapshot(const model_cache& model, sequence_id id) {
  const std::size_t size = snapshot_size(model, id);
  std::vector<std::byte> out;
  detail::allocate_or_fail([&] { out.resize(size); }, "snapshot: bytes of sequence", id, static_cast<std::int64_t>(size));
  snapshot_into(model, id, span<std::byte>(out.data(), out.size()));
  return out;
}

// Restores a model snapshot into `model` as a new sequence and returns its id; see the header
// comment for what is checked and the guarantee.
inline sequence_id restore(model_cache& model, span<const std::byte> bytes) {
  namespace f = detail::model_snapshot_format;
  static_assert(host_little_endian, "phasekv snapshots need a little-endian host");
  if (bytes.data() == nullptr && bytes.size() != 0)
    detail::fail<input_error>("snapshot: bytes.data()", "null", "must not be null when the size is " + std::to_string(bytes.size()));
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t size = bytes.size();
  const detail::snapshot_format::preamble pre = detail::snapshot_format::read_preamble(p, size, f::magic, f::version, "model snapshot ", [&] {
    const bool layer = size >= sizeof f::magic && std::memcmp(p, detail::snapshot_format::magic, sizeof f::magic) == 0;
    return std::string(layer ? "snapshot: these bytes are a layer's snapshot (a paged_cache's), not a model's: restore them into a paged_cache"
                             : "snapshot: bad magic: these bytes are not a phasekv model snapshot");
  });
  const std::uint32_t header = pre.header;
  const std::uint64_t total = pre.total;
  const std::size_t layers = model.layers();
  if (header != f::header_bytes(layers))
    detail::fail<input_error>("snapshot: header_bytes", header,
                              "must be " + std::to_string(f::header_bytes(layers)) + " for the model's " + std::to_string(layers) +
                                  " layers (a snapshot of a model with another layer count?)");
  if (header > total) detail::fail<input_error>("snapshot: header_bytes", header, "must be at most total_bytes = " + std::to_string(total));
  detail::snapshot_format::check_framing(p, size, header, total);
  byte_reader r(p + f::preamble_bytes, p + header, "snapshot");
  const std::uint64_t tokens = r.u64();
  const std::uint64_t count = r.u64();
  if (count != layers) detail::fail<input_error>("snapshot: layers", count, "must be the model's " + std::to_string(layers));
  if (tokens > static_cast<std::uint64_t>(limits::max_tokens)) detail::fail<input_error>("snapshot: tokens", tokens, "must be at most 2^48");
  std::vector<std::pair<std::uint64_t, std::uint64_t>> parts(layers);
  std::uint64_t at = header;
  for (std::size_t l = 0; l < layers; ++l) {
    parts[l].first = r.u64();
    parts[l].second = r.u64();
    if (parts[l].first != at || parts[l].second > total - at)
      detail::fail<input_error>("snapshot: layer " + std::to_string(l) + " offset", parts[l].first,
                                "must be " + std::to_string(at) + ", its part within the snapshot's " + std::to_string(total) + " bytes");
    at += parts[l].second;
  }
  if (at != total)
    throw input_error("snapshot: the layers end at byte " + std::to_string(at) + ", total_bytes is " + std::to_string(total));
  detail::snapshot_format::read_reserved(r, [] { return "the model header"; });

  try {
    // Every layer read and checked before the model changes.
    std::vector<detail::snapshot_format::restored_layer> read;
    read.reserve(layers);
    for (std::size_t l = 0; l < layers; ++l) {
      try {
        read.push_back(detail::snapshot_format::read_layer(
            span<const std::byte>(bytes.data() + parts[l].first, static_cast<std::size_t>(parts[l].second)),
            detail::model_snapshot_access::destination(model, l)));
      } catch (const input_error& e) {
        throw input_error("layer " + std::to_string(l) + " (" + model.kind_of(l).name + "): " + e.what());
      }
      if (read.back().tokens != static_cast<std::int64_t>(tokens))
        detail::fail<input_error>("snapshot: layer " + std::to_string(l) + " tokens", read.back().tokens,
                                  "must be the model snapshot's " + std::to_string(tokens));
    }
    return detail::model_snapshot_access::adopt(model, static_cast<std::int64_t>(tokens), read);
  } catch (const std::bad_alloc&) {
    throw capacity_error("snapshot: restoring into " + model.name() +
                         ": memory for the sequence's compressor states, raw windows or page tables could not be "
                         "allocated (the model is unchanged)");
  }
}

}  // namespace phasekv
