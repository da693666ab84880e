#pragma once
// The data of a read, without the reader: its configuration, one request, the trace of what it
// looked at, and one item of a batched read. Diagnostics that consume traces (read_attribution)
// and hosts that only fill requests need only these types, not the read path's engine.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/cache/sequence_view.hpp"
#include "phasekv/detail/enum_name.hpp"
#include "phasekv/core/span.hpp"

namespace phasekv {

// Streams of a layer: "none" for an absent indexer; "from the roles" for a model's layer kind,
// whose reader takes its streams from their stream_role (models/layer_kind.hpp).
inline constexpr std::size_t no_stream = static_cast<std::size_t>(-1);
inline constexpr std::size_t from_roles = static_cast<std::size_t>(-2);

// What the lightning indexer multiplies: fp32 queries and keys (widened from the indexer
// stream's storage), or — bf16 — queries rounded to bf16 against keys stored in bf16
// (kernels/indexer_bf16.hpp): products exact, sums in fp32, twice the throughput with AVX512-BF16
// and half the key bytes; or — fp4 — DeepSeek-V4's FP4 indexer: queries Hadamard-transformed and
// quantized to e2m1 like the keys, which must be stored as fp4_e2m1_hadamard (format/fp4.hpp),
// scored with exact integer dot products (kernels/indexer_fp4.hpp; AVX-512 VNNI where present), a
// 68-byte key instead of 512. Attention itself always runs in fp32.
enum class indexer_precision { f32, bf16, fp4 };

// What a read reports as its log-sum-exp (read_item::lse), for a host that merges branches:
//   with_sink — ln(Σ exp ℓ + exp(sink)): (out, lse) is an exact softmax state; −inf when empty.
//   flashmla  — FlashMLA's sparse decode: ln Σ exp ℓ over the keys only (the sink only rescales
//               the output), +inf for a query that sees no key.
// The output is the same under both.
enum class lse_convention { with_sink, flashmla };

struct reader_config {
  std::string name = "reader";
  std::int64_t query_heads = 1;
  float scale = 0.0f;            // logit scale; 0 means 1/sqrt(key channels)
  // The streams read (read/reader_streams.hpp): from_roles follows the layer's stream roles; an
  // index named instead must agree with its stream's role. no_stream: no indexer (the host selects).
  std::size_t key_stream = from_roles;
  std::size_t value_stream = from_roles;  // = key_stream for tied K/V
  std::size_t indexer_stream = from_roles;
  std::int64_t top_k = 0;        // 0: attend to every candidate; > 0 needs an indexer stream
  std::int64_t indexer_heads = 0;
  // bf16: the indexer stream must be stored in bf16; fp4: in fp4_e2m1_hadamard (and a stream
  // stored so needs fp4).
  indexer_precision precision = indexer_precision::f32;
  bool sink = false;             // read_request.sinks holds one logit per query head
  bool derotate_output = false;  // tied K/V with RoPE: rotate the output back by the query position
  lse_convention lse = lse_convention::with_sink;
};

// The selection stage on its own (selection.hpp): which entries a query reads. A reader's is
// selection_of(its config); indexer_stream = no_stream with top_k > 0 is a selection the host
// makes itself (read_request::indices).
struct selection_config {
  std::string name = "selection";
  std::size_t indexer_stream = no_stream;
  std::int64_t indexer_heads = 0;
  indexer_precision precision = indexer_precision::f32;
  std::int64_t top_k = 0;            // entries selected (at most)
  std::size_t physical_stream = 0;   // the stream whose pages physical ids index (a reader's key stream)
};

inline selection_config selection_of(const reader_config& c) {
  return {c.name, c.indexer_stream, c.indexer_heads, c.precision, c.top_k, c.key_stream};
}

// One query's selection: its position and indexer inputs.
struct selection_request {
  std::int64_t position = 0;           // t: the query token, already appended
  span<const float> indexer_queries;   // [indexer_heads][indexer channels]
  span<const float> indexer_weights;   // [indexer_heads]
  std::int64_t top_k = -1;             // in [0, selection_config::top_k]; −1 takes the config's
};

// What the ids in read_request::indices count.
enum class index_kind : std::uint8_t {
  logical,   // the sequence's entry ids j, in [0, entries a query at the position may see)
  physical,  // FlashMLA's sparse-decode ids: page · page_size + slot in the key stream's pages, as
             // read_item::selected_physical returns them; translated through the sequence's page
             // table, and an id of a page the sequence does not hold is an input_error
};

inline const char* to_string(index_kind kind) noexcept {
  return phasekv::detail::enum_name(kind, {"logical", "physical"});
}

struct read_request {
  std::int64_t position = 0;             // t: the query token, already appended
  span<const float> queries;             // [query_heads][key channels], RoPE'd at t
  span<const float> indexer_queries;     // [indexer_heads][indexer channels] (top_k > 0)
  span<const float> indexer_weights;     // [indexer_heads] (top_k > 0)
  span<const float> sinks;               // [query_heads] (sink)
  // Entries this read selects, in [0, reader_config::top_k]; −1 takes the config's top_k. With
  // selection on, 0 reads the window (and sink) alone. Without selection (config top_k = 0), only
  // −1 or 0.
  std::int64_t top_k = -1;
  // Entries the host selected (FlashMLA's sparse-decode `indices`): when not empty, the read
  // attends to these, in this order, and runs no indexer (indexer inputs empty). At most the
  // config's top_k ids, −1 for padding; only the first top_k (above) are read, so top_k is the
  // per-sequence length. A reader without an indexer stream (indexer_stream = no_stream,
  // top_k > 0) reads only such selections. `indices_kind` says what the ids count: logical entry
  // ids (the default), or physical ids as the reader's own selected_physical gives them — the two
  // coincide only by accident, so a host that feeds one back as the other must say which.
  span<const std::int32_t> indices = {};
  index_kind indices_kind = index_kind::logical;
};

// What one read looked at, for the diagnostics. Masses are means over query heads; for each
// head the entries, the window and the sink together hold probability 1 (0 for a query that sees
// nothing — no entry, no window token, no sink — whose output is then all zeros).
struct read_trace {
  std::int64_t candidates = 0;
  std::vector<std::int64_t> selected;  // entry ids in rank order (index order without an indexer)
  std::vector<float> scores;           // their indexer scores (empty without an indexer)
  std::vector<float> entry_mass;       // attention mass per selected entry
  std::int64_t window_first = 0;       // window tokens read: [window_first, position]
  std::vector<float> window_token_mass;
  float window_mass = 0.0f;
  float sink_mass = 0.0f;
};

// One sequence of a batched read (read_batch). Outputs are the caller's memory; null optional
// outputs are not written.
struct read_item {
  const sequence_view* view = nullptr;
  read_request request;
  float* out = nullptr;                        // [query_heads][value channels]
  float* lse = nullptr;                        // optional, [query_heads]: see the header comment
  std::int32_t* selected_logical = nullptr;    // optional, [top_k]: entry ids in rank order, −1 padded
  std::int32_t* selected_physical = nullptr;   // optional, [top_k]: key-stream page · page_size + slot, −1 padded
  read_trace* trace = nullptr;                 // optional
};

}  // namespace phasekv
