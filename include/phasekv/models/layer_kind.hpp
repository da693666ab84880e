#pragma once
// A model as data: its layer kinds and which kind each layer is — what model_cache is built from.
//
// A layer kind is every fact the layers of one kind share: the geometry their entries are pooled
// with, per compressed stream its role, pooling id (pooling_registry), RoPE placement, norm, shape
// and storage; the raw window; the page size; and the reader's settings. A kind with no stream is
// window-only (DeepSeek-V4's compress ratio 0: the layer attends to its raw window alone). The
// layers of a kind differ only in their learned parameters (model_layer::params), so they share
// one page table per sequence (vLLM's KV-cache group; llama.cpp's per-kind DeepSeek-V4 cache).
//
// Roles are authoritative: the reader's key, value and indexer streams follow from them
// (resolve_reader_streams). A kind states its reader's other settings in `reader`; stream indices
// it leaves at from_roles, or names ones that agree with the roles.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/compress/pooling_registry.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/rope.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/read/read_types.hpp"
#include "phasekv/read/reader_streams.hpp"

namespace phasekv {

// One compressed stream of a layer kind.
struct stream_spec {
  stream_config config;                        // name, role, channels, kv_heads, inputs, rope, norm_eps
  std::string pooling = "mean";                // a pooling_registry id
  rope_placement rope = rope_placement::none;  // where config.rope applies
  entry_norm norm = entry_norm::none;
  storage_type storage = storage_type::f32;    // fp4_e2m1_hadamard: indexer streams only
};

struct layer_kind {
  std::string name = "kind";
  geometry geom{4, 4, 0, anchor_mode::block_start};  // ignored by a window-only kind
  std::vector<stream_spec> streams;                  // empty: a window-only kind
  raw_window_config window;
  rope_config window_rope;                           // a window-only kind's window keys' RoPE (derotate_output)
  std::int64_t page_size = 64;                       // entries per page
  reader_config reader;                              // streams follow the roles; query_heads 0:
                                                     // no reader (the host reads view() itself)

  bool window_only() const noexcept { return streams.empty(); }
};

// One layer: its kind, and per stream of that kind its learned parameters (empty: the defaults
// for every stream).
struct model_layer {
  std::size_t kind = 0;
  std::vector<stream_params> params;
};

struct model_spec {
  std::string name = "model";
  std::vector<layer_kind> kinds;
  std::vector<model_layer> layers;  // in the model's order

  // Layers of the same kind, built from `kinds` and one kind per layer.
  static std::vector<model_layer> layers_of(const std::vector<std::size_t>& kind_of_layer) {
    std::vector<model_layer> out;
    out.reserve(kind_of_layer.size());
    for (std::size_t k : kind_of_layer) out.push_back({k, {}});
    return out;
  }
};

// The reader's key, value and indexer streams from the kind's stream roles, as a reader reads
// them (read/reader_streams.hpp): from_roles follows the roles, an index named instead must agree.
inline reader_config resolve_reader_streams(const std::vector<stream_spec>& streams, reader_config config,
                                            const std::string& field) {
  std::vector<stream_shape> shapes(streams.size());
  for (std::size_t k = 0; k < streams.size(); ++k) {
    shapes[k].name = streams[k].config.name;
    shapes[k].role = streams[k].config.role;
  }
  return resolve_reader_streams(shapes, std::move(config), field);
}

// Throws config_error naming the field ("<model>.kinds[1].streams[0].channels") for a spec no
// model cache can be built from; what depends on the pooling registry is checked when it is built.
inline void validate(const model_spec& spec) {
  using detail::require;
  const std::string& n = spec.name;
  require(!spec.kinds.empty(), n + ".kinds.size()", 0, "must be at least 1");
  require(!spec.layers.empty(), n + ".layers.size()", 0, "must be at least 1");
  for (std::size_t k = 0; k < spec.kinds.size(); ++k) {
    const layer_kind& kind = spec.kinds[k];
    const std::string f = n + ".kinds[" + std::to_string(k) + "]";
    require(kind.streams.size() <= sequence_view::max_streams, f + ".streams.size()", kind.streams.size(),
            "must be at most " + std::to_string(sequence_view::max_streams));
    if (!kind.window_only()) kind.geom.validate();
    require(kind.page_size >= 1 && kind.page_size <= (std::int64_t{1} << 20), f + ".page_size", kind.page_size,
            "must lie in [1, 2^20]");
    kind.window.validate(f + ".window");
    require(!kind.window_only() || kind.window.tokens > 0, f + ".window.tokens", kind.window.tokens,
            "must be at least 1 in a window-only kind (it attends to nothing else)");
    for (std::size_t s = 0; s < kind.streams.size(); ++s) {
      const stream_spec& st = kind.streams[s];
      const std::string sf = f + ".streams[" + std::to_string(s) + "]";
      require(is_valid(st.storage), sf + ".storage", static_cast<int>(st.storage), "is not a storage_type");
      require(st.storage != storage_type::fp4_e2m1_hadamard || st.config.role == stream_role::indexer, sf + ".storage",
              to_string(st.storage), "is for indexer streams only (their keys are scored, never attended to)");
      require(st.rope == rope_placement::none || st.rope == rope_placement::after_pool || st.rope == rope_placement::before_pool,
              sf + ".rope", static_cast<int>(st.rope), "is not a rope_placement");
      require(st.norm == entry_norm::none || st.norm == entry_norm::rms, sf + ".norm", static_cast<int>(st.norm),
              "is not an entry_norm");
      for (std::size_t o = 0; o < s; ++o)
        require(kind.streams[o].config.name != st.config.name, sf + ".config.name", "'" + st.config.name + "'",
                "repeats streams[" + std::to_string(o) + "]'s: stream names identify them in errors and snapshots");
    }
    if (kind.reader.query_heads != 0) resolve_reader_streams(kind.streams, kind.reader, f + ".reader");
  }
  for (std::size_t l = 0; l < spec.layers.size(); ++l) {
    const model_layer& layer = spec.layers[l];
    const std::string f = n + ".layers[" + std::to_string(l) + "]";
    require(layer.kind < spec.kinds.size(), f + ".kind", layer.kind,
            "must name one of the " + std::to_string(spec.kinds.size()) + " kinds");
    const std::size_t streams = spec.kinds[layer.kind].streams.size();
    require(layer.params.empty() || layer.params.size() == streams, f + ".params.size()", layer.params.size(),
            "must be 0 (defaults) or the kind's stream count, " + std::to_string(streams));
  }
}

}  // namespace phasekv
