#pragma once
// A whole model's compressed KV cache behind one front door: built from a model_spec (layer kinds
// as data, models/layer_kind.hpp), one sequence table for every layer, and a step that appends
// and reads layer by layer, all or nothing.
//
//   model_cache model(presets::deepseek_v4_flash(), {.pages = 4096});
//   sequence_id s = model.create();
//   model_step step = model.begin({s}, 1);              // pages for every kind, once
//   for (std::size_t l = 0; l < model.layers(); ++l) {
//     step.append(l, inputs[l]);                        // the layer's chunks and window rows
//     step.read(l, reads[l]);                           // its queries, over the new tokens too
//   }
//   step.commit();                                      // or abort(): the model as before begin()
//
// Memory: per layer kind one page-id allocator (page_allocator.hpp), and per sequence one page table
// shared by every layer of the kind — the kind's layers pool the same tokens with the same
// geometry, so entry e of every layer and stream lies in page table[e / page_size], slot
// e % page_size of that layer and stream's arena (page_arena.hpp). A fork retains each page once
// per kind, not once per layer; a layer's copy on write copies the page in each of the kind's
// arenas. Compressor states and raw windows (per layer and stream) live in one block per sequence
// and kind, shared by forks until a step writes it, so fork and free cost the same at 4 or 61
// layers; remove_suffix drops pages per kind and rolls the states back when they are next written.
//
// A step (begin → append/read per layer → commit) is all or nothing across the whole model:
// begin() reserves every page every kind needs (capacity_error leaves everything as it was);
// append(layer) checks every row before it writes, writes entries only into pages the step holds,
// and keeps what it overwrites in the layer's compressor states and windows; commit() publishes,
// and cannot fail once every layer was appended; abort() — or a step destroyed uncommitted —
// puts every layer back. Entries, window rows, outputs, LSE and selections are bit-identical to a
// paged_cache per layer driven with the same chunks (tests/test_model_front_door.cpp).
//
// Prefill reads: every position of a chunk reads its whole window — the cache's rows and the
// chunk's own. A chunk longer than the history allows for (n > history + 1 tokens) keeps its window
// rows and the window before them in a ring of its own until the step ends (n + window − 1 rows
// per layer and row), so a prefill needs no lifetime history: history is for rollback only.
//
// Errors name the field: "<model>.step.append: layer 3 rows[1].chunks[0]: …". Thread safety: each
// sequence has one writer at a time (a step holds its sequences until commit or abort; other
// calls naming them throw), steps over disjoint sequences may run in different threads, and reads
// of one layer run one at a time (each layer owns one reader's scratch).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/cache/page_allocator.hpp"
#include "phasekv/cache/page_arena.hpp"
#include "phasekv/cache/entry_io.hpp"
#include "phasekv/cache/cache_config.hpp"  // sequence_memory
#include "phasekv/cache/raw_window.hpp"
#include "phasekv/cache/sequence_table.hpp"
#include "phasekv/cache/sequence_view.hpp"
#include "phasekv/compress/pooling_registry.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/executor.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/models/layer_kind.hpp"
#include "phasekv/read/read_types.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace phasekv {

struct model_options {
  std::int64_t pages = 1024;             // page ids per layer kind: each layer and stream of the kind has
                                         // an arena of that many pages
  std::vector<std::int64_t> kind_pages;  // per kind, instead of `pages` (empty: `pages` for every kind)
  std::int64_t history = 0;              // tokens remove_suffix may roll back beyond the minimum
  page_memory* memory = nullptr;         // where the arenas live; null: system_page_memory()
};

// One sequence's part of a layer's append in a step (row i of the step: its i-th sequence).
struct layer_append {
  span<const token_chunk> chunks;   // one per stream of the layer's kind, in its order (none: window-only)
  span<const float> window_keys;    // tokens × window.kv_heads × key_channels
  span<const float> window_values;  // tokens × window.kv_heads × value_channels; empty when tied
};

// One read of a layer: a query of one of the step's sequences (or, outside a step, of `sequence`).
struct layer_read {
  std::size_t row = 0;           // in a step: the sequence's index in begin()'s list
  sequence_id sequence = 0;      // outside a step (model_cache::read): the sequence read
  read_request request;
  float* out = nullptr;          // [query_heads][value channels]
  float* lse = nullptr;          // optional [query_heads] (reader_config::lse)
  std::int32_t* selected_logical = nullptr;   // optional [top_k]
  std::int32_t* selected_physical = nullptr;  // optional [top_k]: page · page_size + slot of the key stream
  read_trace* trace = nullptr;                // optional
};

// What one model sequence occupies, per model layer and in total (the layers of a kind share its
// page table: each counts the pages of its own arenas).
struct model_memory {
  std::vector<sequence_memory> layers;
  sequence_memory total;
};

// Per layer kind: pages in use, and their bytes over every layer and stream of the kind.
struct model_pool_usage {
  struct kind_usage {
    std::string name;
    std::int64_t pages_used = 0, capacity = 0;
    std::int64_t bytes_used = 0, bytes_touched = 0, bytes_reserved = 0;
  };
  std::vector<kind_usage> kinds;
  kind_usage total;
};

class model_step;
namespace detail {
struct model_snapshot_access;  // models/model_snapshot.hpp
}  // namespace detail

class model_cache {
 public:
  // Builds every layer's streams from `poolings` (pooling_registry::builtins() when not given),
  // its arenas and its reader. Throws config_error naming the field for a spec, option or
  // pooling it cannot build, capacity_error when memory cannot be reserved.
  model_cache(model_spec spec, model_options options, const pooling_registry& poolings);
  explicit model_cache(model_spec spec, model_options options = {});
  model_cache(const model_cache&) = delete;
  model_cache& operator=(const model_cache&) = delete;
  ~model_cache() = default;

  const model_spec& spec() const noexcept { return spec_; }
  const model_options& options() const noexcept { return options_; }
  const std::string& name() const noexcept { return spec_.name; }
  std::size_t layers() const noexcept { return layers_.size(); }
  std::size_t kinds() const noexcept { return kinds_.size(); }
  const layer_kind& kind_of(std::size_t layer) const { return kinds_[layer_slot_of(layer, "kind_of").kind].spec; }
  // The read-side shape and the reader configuration of a layer (its streams from the roles).
  const layer_shape& shape(std::size_t layer) const { return layer_slot_of(layer, "shape").shape; }
  const reader_config& reader(std::size_t layer) const { return kinds_[layer_slot_of(layer, "reader").kind].spec.reader; }
  // A layer's stream (to ask its per-token sizes: payload_floats_per_token, …).
  const stream_kernel& stream(std::size_t layer, std::size_t k) const {
    const layer_slot& l = layer_slot_of(layer, "stream");
    if (k >= l.streams.size())
      detail::fail<input_error>(name() + ".stream(stream)", k, "must be below the layer's stream count " + std::to_string(l.streams.size()));
    return *l.streams[k];
  }

  // How a layer's stream stores its entries (entry_stride_bytes: the bytes of one).
  const page_layout& layout(std::size_t layer, std::size_t k) const {
    const layer_slot& l = layer_slot_of(layer, "layout");
    if (k >= l.arenas.size())
      detail::fail<input_error>(name() + ".layout(stream)", k, "must be below the layer's stream count " + std::to_string(l.arenas.size()));
    return l.arenas[k].layout();
  }

  // ---- sequences (each touches every kind once; none allocates a page) ----------------------

  sequence_id create();
  sequence_id fork(sequence_id parent);
  void copy(sequence_id source, sequence_id destination);
  void remove_suffix(sequence_id id, std::int64_t p0);
  bool can_remove_suffix(sequence_id id, std::int64_t p0) const;
  void free(sequence_id id);
  void keep(sequence_id id);
  void clear();

  bool contains(sequence_id id) const { return table_.contains(id); }
  std::int64_t sequences() const { return table_.size(); }
  // The ids of every live sequence, in increasing order (creation order).
  std::vector<sequence_id> live_sequences() const { return table_.ids(); }
  std::int64_t tokens(sequence_id id) const { return find(id, "tokens").tokens; }

  // ---- the step ------------------------------------------------------------------------------

  // A step that appends tokens[i] tokens to sequences[i] (distinct, none in another open step):
  // every page every kind needs is reserved here. The step must be committed or aborted before
  // its sequences are used otherwise; destroying it uncommitted aborts it.
  model_step begin(span<const sequence_id> sequences, span<const std::int64_t> tokens);
  model_step begin(span<const sequence_id> sequences, std::int64_t tokens);
  model_step begin(std::initializer_list<sequence_id> sequences, std::int64_t tokens);

  // ---- reads and queries of committed sequences ------------------------------------------------

  // Reads of one layer over committed sequences (layer_read::sequence), as a batch on `ex`;
  // bit-identical to reading each alone. Every read is checked before any output is written.
  void read(std::size_t layer, span<const layer_read> reads, executor& ex = default_executor());
  // One sequence's memory in a layer as the reader reads it (for a host's own kernels); valid until
  // the sequence is next written (the reader refuses it after: view_stamp).
  sequence_view view(std::size_t layer, sequence_id id) const;
  // Entry j of a layer's stream, as fp32 (kv_heads × channels into out).
  void read_entry(std::size_t layer, std::size_t stream, sequence_id id, std::int64_t j, span<float> out) const;
  // The values a read sees for token t's window key row and value row (the key's when tied).
  void copy_window_key(std::size_t layer, sequence_id id, std::int64_t t, span<float> out) const {
    copy_window_row(layer, id, t, out, false, "copy_window_key");
  }
  void copy_window_value(std::size_t layer, sequence_id id, std::int64_t t, span<float> out) const {
    copy_window_row(layer, id, t, out, true, "copy_window_value");
  }
  // A layer's compressor state of a sequence: the state its next step continues from (a copy;
  // a rollback the block has not yet applied is applied to the copy).
  stream_state state(std::size_t layer, std::size_t stream, sequence_id id) const {
    const layer_slot& l = layer_slot_of(layer, "state");
    const sequence& s = find(id, "state");
    if (stream >= l.streams.size())
      detail::fail<input_error>(name() + ".state(stream)", stream, "must be below the layer's stream count " + std::to_string(l.streams.size()));
    stream_state copy = s.kinds[l.kind].states->layers[l.index].streams[stream];
    if (copy.tokens() > s.tokens) l.streams[stream]->truncate(copy, s.tokens);
    return copy;
  }
  // The stored bytes of entry j of a layer's stream (page_layout::entry_stride_bytes of them),
  // valid until the sequence is next written.
  span<const std::byte> entry_bytes(std::size_t layer, std::size_t stream, sequence_id id, std::int64_t j) const {
    const layer_slot& l = layer_slot_of(layer, "entry_bytes");
    const std::byte* stored = stored_entry(l, find(id, "entry_bytes"), stream, j, "entry_bytes");  // checks `stream` first
    return span<const std::byte>(stored, static_cast<std::size_t>(l.arenas[stream].layout().entry_stride_bytes));
  }
  // Tokens whose raw window rows a layer holds for a sequence: [window_first, tokens).
  std::int64_t window_first(std::size_t layer, sequence_id id) const {
    const layer_slot& l = layer_slot_of(layer, "window_first");
    const sequence& s = find(id, "window_first");
    const raw_window& w = s.kinds[l.kind].states->layers[l.index].window;
    return w.config().tokens > 0 ? std::min(w.first(), s.tokens) : s.tokens;
  }
  // Page ids of a sequence's table for a kind (shared by the kind's layers).
  std::vector<page_id> page_table(sequence_id id, std::size_t kind) const;
  model_memory memory(sequence_id id) const;
  model_pool_usage pool_usage() const;

 private:
  friend class model_step;
  friend struct detail::model_snapshot_access;

  struct kind_slot {
    layer_kind spec;                  // reader streams resolved
    std::vector<std::size_t> layers;  // model layers of this kind
    page_allocator ids;               // none for a window-only kind
    std::int64_t bytes_per_page = 0;  // over every layer and stream of the kind
  };
  struct layer_slot {
    std::size_t kind = 0, index = 0;  // its kind; its index among the kind's layers
    std::vector<std::unique_ptr<stream_kernel>> streams;
    std::vector<page_arena> arenas;   // per stream
    layer_shape shape;
    std::unique_ptr<sparse_reader> reader;
    std::unique_ptr<std::mutex> reader_mutex = std::make_unique<std::mutex>();
  };

  // A sequence's compressor states and raw window in one layer.
  struct layer_state {
    std::vector<stream_state> streams;
    raw_window window;
  };
  // Every layer of one kind for one sequence: shared by forks until one of them writes it. Its
  // `tokens` may run ahead of the sequence's after remove_suffix: the states are rolled back
  // when the block is next written (model_step::own).
  struct kind_states {
    std::int64_t tokens = 0;
    std::vector<layer_state> layers;
  };
  struct kind_record {
    std::vector<page_id> table;
    std::shared_ptr<kind_states> states;
  };
  struct sequence {
    std::int64_t tokens = 0;
    std::vector<kind_record> kinds;
    detail::write_count writes;
    bool in_step = false;  // under table_.mutex()
  };

  const layer_slot& layer_slot_of(std::size_t layer, const char* operation) const {
    if (layer >= layers_.size())
      detail::fail<input_error>(name() + "." + operation + "(layer)", layer,
                                "must be below the layer count " + std::to_string(layers_.size()));
    return layers_[layer];
  }
  // Entries a kind's page table covers at `tokens` tokens: none for a window-only kind, or one no
  // layer uses (it holds no pages).
  std::int64_t entries_of(std::size_t kind, std::int64_t tokens) const noexcept {
    const kind_slot& k = kinds_[kind];
    return k.spec.window_only() || k.layers.empty() ? 0 : k.spec.geom.completed_entries(tokens);
  }
  std::int64_t pages_of(std::size_t kind, std::int64_t tokens) const noexcept {
    const std::int64_t page = kinds_[kind].spec.page_size;
    return (entries_of(kind, tokens) + page - 1) / page;
  }

  // The sequence table's check of every lookup: a sequence an open step holds is refused.
  struct not_in_step {
    const model_cache* model;
    void operator()(const sequence& s, sequence_id id, const char* operation) const {
      if (s.in_step)
        detail::fail<input_error>(model->name() + "." + operation + "(sequence)", id,
                                  "is in an open step: commit or abort it first");
    }
  };
  sequence& find(sequence_id id, const char* operation) { return table_.find(id, name(), operation, not_in_step{this}); }
  const sequence& find(sequence_id id, const char* operation) const {
    return table_.find(id, name(), operation, not_in_step{this});
  }

  std::shared_ptr<kind_states> fresh_states(std::size_t kind) const;
  void copy_window_row(std::size_t layer, sequence_id id, std::int64_t t, span<float> out, bool values,
                       const char* operation) const;
  // The stored bytes of entry j of a layer's stream for a sequence, its stream and index checked
  // (what entry_bytes and read_entry read).
  const std::byte* stored_entry(const layer_slot& l, const sequence& s, std::size_t stream, std::int64_t j,
                                const char* operation) const;
  void retain_pages(const sequence& s);
  void release_pages(sequence& s) noexcept;
  // Adds a record under a fresh id; if that throws, the record stays with the caller.
  sequence_id insert(std::unique_ptr<sequence>&& record) { return table_.insert(std::move(record)); }
  // A sequence's view of layer `layer` at `tokens` tokens over `table` (committed or a step's).
  sequence_view make_view(const layer_slot& layer, const sequence& s, const std::vector<page_id>* tables,
                          std::int64_t tokens, const raw_window* window = nullptr) const noexcept;
  static bool stamp_current(const void* owner, std::int64_t id, std::uint64_t writes);
  void run_reads(std::size_t layer, std::vector<read_item>& items, executor& ex);

  model_spec spec_;
  model_options options_;
  std::vector<kind_slot> kinds_;
  std::vector<layer_slot> layers_;
  detail::sequence_table<sequence> table_{"model cache"};
};

// One step of a model: see model_cache's header comment. Movable, not copyable.
class model_step {
 public:
  model_step(model_step&& other) noexcept { *this = std::move(other); }
  model_step& operator=(model_step&& other) noexcept;
  model_step(const model_step&) = delete;
  model_step& operator=(const model_step&) = delete;
  ~model_step() { abort(); }

  std::size_t rows() const noexcept { return rows_.size(); }
  bool open() const noexcept { return model_ != nullptr; }
  // The step's sequences and their new tokens.
  sequence_id sequence(std::size_t row) const { return rows_.at(row).id; }
  std::int64_t tokens(std::size_t row) const { return rows_.at(row).tokens; }

  // Appends one layer's new tokens for every row (inputs[i] for row i), the entries of each row
  // computed as a task on `ex`. All or nothing for the layer: a bad row is an input_error naming
  // it, and the step (and the model) stays as it was; the layer may then be appended again.
  void append(std::size_t layer, span<const layer_append> inputs, executor& ex = default_executor(),
              const append_options& options = {});
  void append(std::size_t layer, std::initializer_list<layer_append> inputs, executor& ex = default_executor(),
              const append_options& options = {}) {
    append(layer, span<const layer_append>(inputs.begin(), inputs.size()), ex, options);
  }
  // Reads of a layer appended in this step (layer_read::row names the sequence), over the cache and
  // the step's new tokens; bit-identical to reading each alone.
  void read(std::size_t layer, span<const layer_read> reads, executor& ex = default_executor());
  // Row `row`'s memory in `layer` as the reader reads it, new tokens included (for a host's own
  // kernels); valid until the step is committed or aborted.
  sequence_view view(std::size_t layer, std::size_t row) const;

  // Publishes every layer's new tokens. Throws input_error, changing nothing, while a layer was
  // not appended (a model's layers advance together); cannot fail otherwise.
  void commit();
  // Puts every layer back as it was before begin() (no-op on a closed step).
  void abort() noexcept;

 private:
  friend class model_cache;
  model_step() = default;

  struct kind_plan {
    std::vector<page_id> fresh;      // new pages, in the order allocated
    page_id copy = -1;               // a private copy of a shared last page, or -1
    std::vector<page_id> table;      // the table the step's views and commit use
    // What own() changed, for abort(): the block a fork shared (replaced by a copy), or the
    // counters of states rolled back in place.
    std::shared_ptr<model_cache::kind_states> shared;
    std::int64_t block_tokens = -1;  // ≥ 0 once rolled back in place
    std::vector<stream_state::undo_record> streams;  // [layer × stream]
    std::vector<raw_window::undo_record> windows;    // [layer]
  };
  struct step_row {
    sequence_id id = 0;
    model_cache::sequence* seq = nullptr;
    std::int64_t tokens = 0;
    std::vector<kind_plan> kinds;
  };
  // What append(layer) overwrote, per row: each stream's state and the window.
  struct layer_undo {
    bool appended = false;
    std::vector<std::vector<stream_state::undo_record>> streams;  // [row][stream]
    std::vector<raw_window::undo_record> windows;                 // [row]
    // A prefill chunk longer than the history allows for: its window rows and the window before
    // them, so that every position of the chunk reads its whole window (null: the ring suffices).
    std::vector<std::unique_ptr<raw_window>> staged;              // [row]
  };

  std::string field(const char* operation) const { return model_->name() + ".step." + operation; }
  void require_open(const char* operation) const {
    if (!model_) detail::fail<input_error>("step." + std::string(operation), "closed", "the step was committed or aborted");
  }
  void release_plans() noexcept;
  // Makes row r's block of kind k the sequence's own (a copy when a fork shares it) and rolls its
  // states back to the sequence's tokens (after remove_suffix), recording both for abort().
  void own(step_row& r, std::size_t k);

  model_cache* model_ = nullptr;
  std::vector<step_row> rows_;
  std::vector<layer_undo> layers_;
};

// ---- model_cache ---------------------------------------------------------------------------------

inline const pooling_registry& builtin_poolings() {
  static const pooling_registry registry = pooling_registry::builtins();
  return registry;
}

inline model_cache::model_cache(model_spec spec, model_options options) : model_cache(std::move(spec), std::move(options), builtin_poolings()) {}

inline model_cache::model_cache(model_spec spec, model_options options, const pooling_registry& poolings)
    : spec_(std::move(spec)), options_(std::move(options)) {
  using detail::require;
  validate(spec_);
  const std::string& n = spec_.name;
  require(options_.pages >= 1 && options_.pages <= std::numeric_limits<page_id>::max(), n + ": options.pages", options_.pages,
          "must lie in [1, 2^31 − 1]");
  require(options_.kind_pages.empty() || options_.kind_pages.size() == spec_.kinds.size(), n + ": options.kind_pages.size()",
          options_.kind_pages.size(), "must be 0 or the number of kinds, " + std::to_string(spec_.kinds.size()));
  for (std::size_t k = 0; k < options_.kind_pages.size(); ++k)
    require(options_.kind_pages[k] >= 1 && options_.kind_pages[k] <= std::numeric_limits<page_id>::max(),
            n + ": options.kind_pages[" + std::to_string(k) + "]", options_.kind_pages[k], "must lie in [1, 2^31 − 1]");
  require(options_.history >= 0 && options_.history <= limits::max_history, n + ": options.history", options_.history,
          "must lie in [0, 2^40]");

  kinds_.resize(spec_.kinds.size());
  for (std::size_t k = 0; k < kinds_.size(); ++k) {
    kind_slot& kind = kinds_[k];
    kind.spec = spec_.kinds[k];
    if (kind.spec.reader.query_heads != 0)
      kind.spec.reader = resolve_reader_streams(kind.spec.streams, kind.spec.reader, n + ".kinds[" + std::to_string(k) + "].reader");
    if (kind.spec.reader.name == "reader") kind.spec.reader.name = n + "." + kind.spec.name + ".reader";
    const std::int64_t pages = options_.kind_pages.empty() ? options_.pages : options_.kind_pages[k];
    if (!kind.spec.window_only())
      detail::allocate_or_fail([&] { kind.ids = page_allocator(n + "." + kind.spec.name + ".pages", pages); },
                               n + ": options.pages", pages, pages * 8);
    if (kind.spec.window.tokens > 0)
      detail::checked_product(kind.spec.window.tokens + options_.history,
                              kind.spec.window.kv_heads * (kind.spec.window.key_channels + kind.spec.window.value_channels),
                              limits::max_bytes / 4, n + ": options.history", options_.history,
                              "the raw window ring of kind '" + kind.spec.name + "' (floats, with history)");
  }
  layers_.resize(spec_.layers.size());
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    layer_slot& layer = layers_[l];
    const model_layer& ml = spec_.layers[l];
    kind_slot& kind = kinds_[ml.kind];
    layer.kind = ml.kind;
    layer.index = kind.layers.size();
    kind.layers.push_back(l);
    const layer_kind& lk = kind.spec;
    const std::string lf = n + ".layers[" + std::to_string(l) + "]";
    layer.shape.geom = lk.geom;  // unused by a window-only kind's reader
    layer.shape.window = lk.window;
    layer.shape.window_rope = lk.window_rope;
    for (std::size_t s = 0; s < lk.streams.size(); ++s) {
      const stream_spec& ss = lk.streams[s];
      stream_build b;
      b.geom = lk.geom;
      b.config = ss.config;
      b.params = ml.params.empty() ? stream_params{} : ml.params[s];
      b.rope = ss.rope;
      b.norm = ss.norm;
      b.layer = l;
      layer.streams.push_back(poolings.make(ss.pooling, b, n + ".kinds[" + std::to_string(ml.kind) + "].streams[" +
                                                               std::to_string(s) + "].pooling"));
      const stream_kernel& kernel = *layer.streams.back();
      detail::checked_product(lk.geom.window + options_.history,
                              kernel.payload_floats_per_token() + kernel.logit_floats_per_token(), limits::max_bytes / 4,
                              n + ": options.history", options_.history,
                              "the input ring of stream '" + ss.config.name + "' (floats)");
      page_pool_config pc;
      pc.name = lf + "." + ss.config.name;
      pc.page_size = lk.page_size;
      pc.kv_heads = ss.config.kv_heads;
      pc.channels = ss.config.channels;
      pc.storage = ss.storage;
      pc.rope_channels = ss.storage == storage_type::fp8_e4m3_block && ss.rope != rope_placement::none ? ss.config.rope.channels : 0;
      pc.capacity = kind.ids.capacity();
      pc.memory = options_.memory;
      pc.validate();
      layer.arenas.emplace_back(pc);
      if (layer.index == 0) kind.bytes_per_page += layer.arenas.back().bytes_per_page();
      stream_shape st;
      st.name = ss.config.name;
      st.role = ss.config.role;
      st.kv_heads = ss.config.kv_heads;
      st.channels = ss.config.channels;
      st.storage = ss.storage;
      st.applies_rope = ss.rope != rope_placement::none;
      st.rope = ss.config.rope;
      layer.shape.streams.push_back(std::move(st));
    }
    if (lk.reader.query_heads != 0) layer.reader = std::make_unique<sparse_reader>(layer.shape, lk.reader);
  }
}

inline std::shared_ptr<model_cache::kind_states> model_cache::fresh_states(std::size_t k) const {
  const kind_slot& kind = kinds_[k];
  auto block = std::make_shared<kind_states>();
  block->layers.resize(kind.layers.size());
  for (std::size_t i = 0; i < kind.layers.size(); ++i) {
    const layer_slot& layer = layers_[kind.layers[i]];
    layer_state& st = block->layers[i];
    st.streams.reserve(layer.streams.size());
    for (const auto& stream : layer.streams) st.streams.push_back(stream->make_state(options_.history));
    st.window = raw_window(kind.spec.window, options_.history);
  }
  return block;
}

inline sequence_id model_cache::create() {
  std::unique_ptr<sequence> record;
  try {
    record = std::make_unique<sequence>();
    record->kinds.resize(kinds_.size());
    for (std::size_t k = 0; k < kinds_.size(); ++k) record->kinds[k].states = fresh_states(k);
  } catch (const std::bad_alloc&) {
    throw capacity_error(name() + ".create: the compressor states and raw windows of " + std::to_string(layers_.size()) +
                         " layers could not be allocated");
  }
  return insert(std::move(record));
}

inline void model_cache::retain_pages(const sequence& s) {
  std::size_t k = 0, i = 0;
  try {
    for (k = 0; k < kinds_.size(); ++k)
      for (i = 0; i < s.kinds[k].table.size(); ++i) kinds_[k].ids.retain(s.kinds[k].table[i]);
  } catch (...) {
    for (std::size_t undo = 0; undo <= k && undo < kinds_.size(); ++undo) {
      const std::size_t n = undo < k ? s.kinds[undo].table.size() : i;
      for (std::size_t r = 0; r < n; ++r) kinds_[undo].ids.release(s.kinds[undo].table[r]);
    }
    throw;
  }
}

inline void model_cache::release_pages(sequence& s) noexcept {
  for (std::size_t k = 0; k < kinds_.size(); ++k) {
    for (page_id p : s.kinds[k].table) {
      try {
        kinds_[k].ids.release(p);
      } catch (...) {  // a page the sequence holds is allocated: release cannot fail
      }
    }
    s.kinds[k].table.clear();
  }
}

inline sequence_id model_cache::fork(sequence_id parent) {
  const sequence& from = find(parent, "fork");
  std::unique_ptr<sequence> record;
  try {
    record = std::make_unique<sequence>(from);  // page tables and shared state blocks: no layer is copied
  } catch (const std::bad_alloc&) {
    throw capacity_error(name() + ".fork: the new sequence's page tables could not be allocated");
  }
  record->in_step = false;
  retain_pages(*record);
  try {
    return insert(std::move(record));
  } catch (...) {
    release_pages(*record);
    throw;
  }
}

inline void model_cache::copy(sequence_id source, sequence_id destination) {
  if (source == destination)
    detail::fail<input_error>(name() + ".copy(destination)", destination, "must differ from source");
  const sequence& from = find(source, "copy");
  sequence& to = find(destination, "copy");
  sequence replacement(from);
  replacement.in_step = false;
  replacement.writes.n = to.writes.get() + 1;  // views of `to` are stale; those of `from` stay current
  retain_pages(replacement);
  release_pages(to);
  to = std::move(replacement);
}

inline bool model_cache::can_remove_suffix(sequence_id id, std::int64_t p0) const {
  const sequence& s = find(id, "can_remove_suffix");
  if (p0 < 0 || p0 > s.tokens) return false;
  // The layers of a kind advance in lockstep (a step appends the same tokens to every one), so
  // their states' counters and rings agree: the kind's first layer answers for all of them, and a
  // rollback costs the same at 4 layers as at 61.
  for (std::size_t k = 0; k < kinds_.size(); ++k) {
    if (kinds_[k].layers.empty()) continue;  // a kind no layer uses
    const layer_state& first = s.kinds[k].states->layers.front();
    const layer_slot& layer = layers_[kinds_[k].layers.front()];
    for (std::size_t st = 0; st < layer.streams.size(); ++st)
      if (!layer.streams[st]->can_truncate(first.streams[st], p0)) return false;
    if (!first.window.can_roll_back(p0)) return false;
  }
  return true;
}

inline void model_cache::remove_suffix(sequence_id id, std::int64_t p0) {
  sequence& s = find(id, "remove_suffix");
  if (p0 < 0 || p0 > s.tokens)
    detail::fail<input_error>(name() + ".remove_suffix(p0)", p0, "must lie in [0, tokens = " + std::to_string(s.tokens) + "]");
  if (p0 == s.tokens) return;
  if (!can_remove_suffix(id, p0))
    detail::fail<input_error>(name() + ".remove_suffix(p0)", p0,
                              "rolls back further than the kept history allows (tokens = " + std::to_string(s.tokens) +
                                  ", history = " + std::to_string(options_.history) +
                                  "): the compressor inputs or raw window rows needed to continue are gone");
  s.writes.bump();
  for (std::size_t k = 0; k < kinds_.size(); ++k) {
    auto& table = s.kinds[k].table;
    const auto kept = static_cast<std::size_t>(pages_of(k, p0));
    for (std::size_t i = kept; i < table.size(); ++i) kinds_[k].ids.release(table[i]);
    table.resize(kept);
  }
  s.tokens = p0;  // the states roll back when next written (model_step::own)
}

inline void model_cache::free(sequence_id id) { release_pages(*table_.erase(id, name(), "free", not_in_step{this})); }

inline void model_cache::keep(sequence_id id) {
  for (auto& r : table_.erase_all_but(id, name(), "keep", not_in_step{this})) release_pages(*r);
}

inline void model_cache::clear() {
  for (auto& entry : table_.erase_all("clear", not_in_step{this})) release_pages(*entry.second);
}

inline bool model_cache::stamp_current(const void* owner, std::int64_t id, std::uint64_t writes) {
  const auto& self = *static_cast<const model_cache*>(owner);
  std::lock_guard<std::mutex> lock(self.table_.mutex());
  const sequence* s = self.table_.lookup_locked(id);
  return s != nullptr && !s->in_step && s->writes.get() == writes;
}

inline sequence_view model_cache::make_view(const layer_slot& layer, const sequence& s, const std::vector<page_id>* tables,
                                            std::int64_t tokens, const raw_window* window) const noexcept {
  const kind_slot& kind = kinds_[layer.kind];
  sequence_view v;
  v.tokens = tokens;
  v.stream_count = layer.streams.size();
  if (!kind.spec.window_only()) v.geom = kind.spec.geom;
  const std::int64_t entries = entries_of(layer.kind, tokens);
  for (std::size_t k = 0; k < layer.streams.size(); ++k) {
    stream_view& sv = v.streams[k];
    sv.base = layer.arenas[k].base();
    sv.layout = layer.arenas[k].layout();
    sv.capacity = layer.arenas[k].capacity();
    sv.pages = span<const page_id>(tables->data(), tables->size());
    sv.entries = entries;
  }
  v.window = (window ? *window : s.kinds[layer.kind].states->layers[layer.index].window).view(tokens);
  v.window.first = std::min(v.window.first, tokens);  // a rollback not yet applied to the ring (model_step::own)
  return v;
}

inline sequence_view model_cache::view(std::size_t layer, sequence_id id) const {
  const layer_slot& l = layer_slot_of(layer, "view");
  std::lock_guard<std::mutex> lock(table_.mutex());
  const sequence& s = table_.find_locked(id, name(), "view", not_in_step{this});
  sequence_view v = make_view(l, s, &s.kinds[l.kind].table, s.tokens);
  v.stamp = {this, &stamp_current, id, s.writes.get()};
  return v;
}

inline void model_cache::run_reads(std::size_t layer, std::vector<read_item>& items, executor& ex) {
  layer_slot& l = layers_[layer];
  if (!l.reader)
    detail::fail<input_error>(name() + ".read: layer", layer,
                              "has no reader (its kind's reader.query_heads is 0): read its view() with your own kernels");
  std::lock_guard<std::mutex> lock(*l.reader_mutex);
  l.reader->set_executor(ex);
  l.reader->read_batch(span<const read_item>(items.data(), items.size()));
}

inline void model_cache::read(std::size_t layer, span<const layer_read> reads, executor& ex) {
  layer_slot_of(layer, "read");
  std::vector<sequence_view> views(reads.size());
  std::vector<read_item> items(reads.size());
  for (std::size_t i = 0; i < reads.size(); ++i) {
    views[i] = view(layer, reads[i].sequence);
    if (views[i].tokens == 0)
      detail::fail<input_error>(name() + ".read: reads[" + std::to_string(i) + "].sequence", reads[i].sequence,
                                "is empty: append the query's token first");
    items[i] = {&views[i], reads[i].request, reads[i].out, reads[i].lse, reads[i].selected_logical, reads[i].selected_physical,
                reads[i].trace};
  }
  run_reads(layer, items, ex);
}

inline void model_cache::read_entry(std::size_t layer, std::size_t stream, sequence_id id, std::int64_t j, span<float> out) const {
  const layer_slot& l = layer_slot_of(layer, "read_entry");
  const std::byte* stored = stored_entry(l, find(id, "read_entry"), stream, j, "read_entry");
  const page_layout& layout = l.arenas[stream].layout();
  if (out.size() != static_cast<std::size_t>(layout.values_per_entry()) || out.data() == nullptr)
    detail::fail<input_error>(name() + ".read_entry: out.size()", out.size(), "must be kv_heads × channels = " + std::to_string(layout.values_per_entry()));
  load_entries(layout, stored, 1, out.data());
}

inline const std::byte* model_cache::stored_entry(const layer_slot& l, const sequence& s, std::size_t stream, std::int64_t j,
                                                  const char* operation) const {
  if (stream >= l.streams.size())
    detail::fail<input_error>(name() + "." + operation + "(stream)", stream,
                              "must be below the layer's stream count " + std::to_string(l.streams.size()));
  const std::int64_t n = entries_of(l.kind, s.tokens);
  if (j < 0 || j >= n)
    detail::fail<input_error>(name() + "." + operation + "(entry)", j, "must lie in [0, entries = " + std::to_string(n) + ")");
  const page_layout& layout = l.arenas[stream].layout();
  const page_id page = s.kinds[l.kind].table[static_cast<std::size_t>(j / layout.page_size)];
  return l.arenas[stream].entry(page, j % layout.page_size);
}

inline void model_cache::copy_window_row(std::size_t layer, sequence_id id, std::int64_t t, span<float> out, bool values,
                                         const char* operation) const {
  const layer_slot& l = layer_slot_of(layer, operation);
  const sequence& s = find(id, operation);
  const raw_window& w = s.kinds[l.kind].states->layers[l.index].window;
  const std::int64_t first = std::min(w.first(), s.tokens);  // a rollback not yet applied to the ring
  if (w.config().tokens == 0 || t < first || t >= s.tokens)
    detail::fail<input_error>(name() + "." + operation + ": window token", t,
                              "must lie in the raw window [" + std::to_string(first) + ", " + std::to_string(s.tokens) + ")");
  const std::int64_t floats = values && !w.tied() ? w.value_floats() : w.key_floats();
  if (out.size() != static_cast<std::size_t>(floats) || out.data() == nullptr)
    detail::fail<input_error>(name() + "." + operation + ": out.size()", out.size(), "must be " + std::to_string(floats));
  if (values)
    w.copy_value(t % w.rows(), out.data());
  else
    w.copy_key(t % w.rows(), out.data());
}

inline std::vector<page_id> model_cache::page_table(sequence_id id, std::size_t kind) const {
  const sequence& s = find(id, "page_table");
  if (kind >= kinds_.size())
    detail::fail<input_error>(name() + ".page_table(kind)", kind, "must be below the kind count " + std::to_string(kinds_.size()));
  return s.kinds[kind].table;
}

inline model_memory model_cache::memory(sequence_id id) const {
  const sequence& s = find(id, "memory");
  model_memory m;
  m.layers.resize(layers_.size());
  m.total.tokens = s.tokens;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const layer_slot& layer = layers_[l];
    const kind_slot& kind = kinds_[layer.kind];
    const auto& table = s.kinds[layer.kind].table;
    const layer_state& st = s.kinds[layer.kind].states->layers[layer.index];
    sequence_memory& r = m.layers[l];
    r.tokens = s.tokens;
    const std::int64_t entries = entries_of(layer.kind, s.tokens);
    for (std::size_t k = 0; k < layer.streams.size(); ++k) {
      const page_arena& arena = layer.arenas[k];
      r.entries += entries;
      r.pages += static_cast<std::int64_t>(table.size());
      for (page_id p : table) r.shared_pages += kind.ids.refcount(p) > 1 ? 1 : 0;
      r.page_bytes += static_cast<std::int64_t>(table.size()) * arena.bytes_per_page();
      r.entry_bytes += entries * arena.layout().entry_stride_bytes;
      r.uncompressed_bytes += s.tokens * arena.layout().entry_stride_bytes;
      r.state_bytes += static_cast<std::int64_t>(st.streams[k].bytes());
    }
    r.state_bytes += static_cast<std::int64_t>(st.window.bytes());
    m.total.entries += r.entries;
    m.total.pages += r.pages;
    m.total.shared_pages += r.shared_pages;
    m.total.page_bytes += r.page_bytes;
    m.total.entry_bytes += r.entry_bytes;
    m.total.state_bytes += r.state_bytes;
    m.total.uncompressed_bytes += r.uncompressed_bytes;
  }
  return m;
}

inline model_pool_usage model_cache::pool_usage() const {
  model_pool_usage u;
  u.total.name = name();
  for (const kind_slot& kind : kinds_) {
    model_pool_usage::kind_usage k;
    k.name = kind.spec.name;
    if (!kind.spec.window_only()) {
      const std::int64_t page_bytes = kind.bytes_per_page * static_cast<std::int64_t>(kind.layers.size());
      k.capacity = kind.ids.capacity();
      k.pages_used = kind.ids.used_pages();
      k.bytes_used = k.pages_used * page_bytes;
      k.bytes_touched = kind.ids.pages_touched() * page_bytes;
      k.bytes_reserved = k.capacity * page_bytes;
    }
    u.total.pages_used += k.pages_used;
    u.total.capacity += k.capacity;
    u.total.bytes_used += k.bytes_used;
    u.total.bytes_touched += k.bytes_touched;
    u.total.bytes_reserved += k.bytes_reserved;
    u.kinds.push_back(std::move(k));
  }
  return u;
}

// ---- the step ------------------------------------------------------------------------------------

inline model_step model_cache::begin(std::initializer_list<sequence_id> sequences, std::int64_t tokens) {
  return begin(span<const sequence_id>(sequences.begin(), sequences.size()), tokens);
}

inline model_step model_cache::begin(span<const sequence_id> sequences, std::int64_t tokens) {
  std::vector<std::int64_t> each(sequences.size(), tokens);
  return begin(sequences, span<const std::int64_t>(each.data(), each.size()));
}

inline model_step model_cache::begin(span<const sequence_id> sequences, span<const std::int64_t> tokens) {
  const auto f = [&] { return name() + ".begin"; };
  if (tokens.size() != sequences.size())
    detail::fail<input_error>(f() + ": tokens.size()", tokens.size(), "must be sequences.size() = " + std::to_string(sequences.size()));
  model_step step;
  step.rows_.resize(sequences.size());
  step.layers_.resize(layers_.size());
  // The sequences, held for the step (all or none).
  {
    std::lock_guard<std::mutex> lock(table_.mutex());
    for (std::size_t i = 0; i < sequences.size(); ++i) {
      sequence& s = table_.find_locked(sequences[i], name(), "begin", not_in_step{this});
      for (std::size_t j = 0; j < i; ++j)
        if (step.rows_[j].id == sequences[i])
          detail::fail<input_error>(f() + ": sequences[" + std::to_string(i) + "]", sequences[i],
                                    "repeats sequences[" + std::to_string(j) + "]: one row per sequence");
      const std::int64_t have = s.tokens;
      if (tokens[i] < 0 || tokens[i] > limits::max_tokens - have)
        detail::fail<input_error>(f() + ": tokens[" + std::to_string(i) + "]", tokens[i],
                                  "must lie in [0, 2^48 − " + std::to_string(have) + " tokens already appended]");
      step.rows_[i] = {sequences[i], &s, tokens[i], {}};
    }
    for (auto& r : step.rows_) r.seq->in_step = true;
  }
  step.model_ = this;  // from here the step's destructor gives everything back
  // Every block the step writes made the sequence's own, and every page it needs reserved.
  for (auto& r : step.rows_) {
    r.kinds.resize(kinds_.size());
    for (std::size_t k = 0; k < kinds_.size(); ++k) {
      step.own(r, k);
      const kind_slot& kind = kinds_[k];
      if (kind.spec.window_only()) continue;
      model_step::kind_plan& plan = r.kinds[k];
      const auto& table = r.seq->kinds[k].table;
      const std::int64_t before = entries_of(k, r.seq->tokens), page = kind.spec.page_size;
      const std::int64_t pages_after = pages_of(k, r.seq->tokens + r.tokens);
      plan.table = table;
      plan.table.reserve(static_cast<std::size_t>(pages_after));
      if (entries_of(k, r.seq->tokens + r.tokens) == before) continue;
      const bool copy = before % page != 0 && kind.ids.refcount(table.back()) > 1;  // a shared, partial last page
      std::vector<page_id> fresh(static_cast<std::size_t>(pages_after - static_cast<std::int64_t>(table.size())) + (copy ? 1 : 0));
      kinds_[k].ids.allocate(static_cast<std::int64_t>(fresh.size()), fresh.data());
      plan.fresh = std::move(fresh);
      if (copy) {
        plan.copy = plan.fresh.back();
        for (std::size_t l : kind.layers)
          for (const page_arena& arena : layers_[l].arenas) arena.copy_entries(table.back(), plan.copy, before % page);
        plan.table.back() = plan.copy;
      }
      plan.table.insert(plan.table.end(), plan.fresh.begin(), plan.fresh.end() - (copy ? 1 : 0));
    }
  }
  return step;
}

inline model_step& model_step::operator=(model_step&& other) noexcept {
  if (this == &other) return *this;
  abort();
  model_ = other.model_;
  rows_ = std::move(other.rows_);
  layers_ = std::move(other.layers_);
  other.model_ = nullptr;
  return *this;
}

inline void model_step::release_plans() noexcept {
  for (std::size_t i = rows_.size(); i-- > 0;)
    for (std::size_t k = rows_[i].kinds.size(); k-- > 0;) {
      const kind_plan& plan = rows_[i].kinds[k];
      model_->kinds_[k].ids.release_reversed(plan.fresh.data(), plan.fresh.size());
    }
}

inline void model_step::abort() noexcept {
  if (!model_) return;
  for (std::size_t l = layers_.size(); l-- > 0;) {
    layer_undo& undo = layers_[l];
    if (!undo.appended) continue;
    const auto& slot = model_->layers_[l];
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      auto& st = rows_[i].seq->kinds[slot.kind].states->layers[slot.index];
      for (std::size_t k = 0; k < st.streams.size(); ++k) st.streams[k].restore(undo.streams[i][k]);
      st.window.restore(undo.windows[i]);
    }
  }
  for (std::size_t i = rows_.size(); i-- > 0;)
    for (std::size_t k = rows_[i].kinds.size(); k-- > 0;) {
      kind_plan& plan = rows_[i].kinds[k];
      auto& record = rows_[i].seq->kinds[k];
      if (plan.shared) {
        record.states = std::move(plan.shared);  // the copy is dropped
      } else if (plan.block_tokens >= 0) {
        model_cache::kind_states& block = *record.states;
        std::size_t u = 0;
        for (std::size_t l = 0; l < block.layers.size(); ++l) {
          for (stream_state& st : block.layers[l].streams) st.restore(plan.streams[u++]);
          block.layers[l].window.restore(plan.windows[l]);
        }
        block.tokens = plan.block_tokens;
      }
    }
  release_plans();
  {
    std::lock_guard<std::mutex> lock(model_->table_.mutex());
    for (auto& r : rows_) r.seq->in_step = false;
  }
  model_ = nullptr;
  rows_.clear();
  layers_.clear();
}

inline void model_step::own(step_row& r, std::size_t k) {
  model_cache::kind_record& record = r.seq->kinds[k];
  kind_plan& plan = r.kinds[k];
  // Only this sequence's writer can add holders to its block, so a count of 1 stays 1.
  if (record.states.use_count() > 1) {
    auto copy = std::make_shared<model_cache::kind_states>(*record.states);
    plan.shared = std::exchange(record.states, std::move(copy));
  }
  model_cache::kind_states& block = *record.states;
  const std::int64_t tokens = r.seq->tokens;
  if (block.tokens == tokens) return;
  const model_cache::kind_slot& kind = model_->kinds_[k];
  if (!plan.shared) {  // rolled back in place: keep the counters (no rows change)
    std::size_t streams = 0;
    for (const auto& layer : block.layers) streams += layer.streams.size();
    plan.streams.resize(streams);
    plan.windows.resize(block.layers.size());
    std::size_t u = 0;
    for (std::size_t l = 0; l < block.layers.size(); ++l) {
      for (const stream_state& st : block.layers[l].streams) st.save(0, plan.streams[u++]);
      block.layers[l].window.save(tokens, 0, plan.windows[l]);
    }
    plan.block_tokens = block.tokens;
  }
  for (std::size_t l = 0; l < block.layers.size(); ++l) {
    const model_cache::layer_slot& layer = model_->layers_[kind.layers[l]];
    for (std::size_t st = 0; st < layer.streams.size(); ++st) layer.streams[st]->truncate(block.layers[l].streams[st], tokens);
    block.layers[l].window.roll_back(tokens);
  }
  block.tokens = tokens;
}

inline void model_step::commit() {
  require_open("commit");
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    if (layers_[l].appended) continue;
    bool any = false;
    for (const auto& r : rows_) any = any || r.tokens > 0;
    if (any)
      detail::fail<input_error>(field("commit") + ": layer", l,
                                "was not appended in this step: every layer takes the step's tokens before commit");
  }
  for (auto& r : rows_) {
    model_cache::sequence& s = *r.seq;
    s.writes.bump();
    for (std::size_t k = 0; k < r.kinds.size(); ++k) {
      kind_plan& plan = r.kinds[k];
      auto& record = s.kinds[k];
      if (plan.copy >= 0) model_->kinds_[k].ids.release_reversed(&record.table.back(), 1);  // our holder of the shared page
      if (!model_->kinds_[k].spec.window_only()) record.table.swap(plan.table);
      plan.fresh.clear();
      plan.shared.reset();
      record.states->tokens += r.tokens;
    }
    s.tokens += r.tokens;
  }
  {
    std::lock_guard<std::mutex> lock(model_->table_.mutex());
    for (auto& r : rows_) r.seq->in_step = false;
  }
  model_ = nullptr;
  rows_.clear();
  layers_.clear();
}

inline void model_step::append(std::size_t layer, span<const layer_append> inputs, executor& ex, const append_options& options) {
  require_open("append");
  model_cache& m = *model_;
  const auto& slot = m.layer_slot_of(layer, "step.append");
  // Messages are built only on failure: this runs for every layer of every decode step.
  const auto f = [&] { return field("append") + ": layer " + std::to_string(layer); };
  const auto rf = [&](std::size_t i) { return f() + " rows[" + std::to_string(i) + "]"; };
  if (layers_[layer].appended) detail::fail<input_error>(f(), "appended", "takes one append per step");
  if (inputs.size() != rows_.size())
    detail::fail<input_error>(f() + " inputs.size()", inputs.size(), "must be the step's rows, " + std::to_string(rows_.size()));
  const raw_window_config& wc = m.kinds_[slot.kind].spec.window;
  const std::size_t streams = slot.streams.size();
  // Every row checked before anything is written.
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    const layer_append& in = inputs[i];
    auto& st = rows_[i].seq->kinds[slot.kind].states->layers[slot.index];
    if (in.chunks.size() != streams || (in.chunks.data() == nullptr && streams != 0))
      detail::fail<input_error>(rf(i) + ".chunks.size()", in.chunks.size(), "must be the layer's stream count, " + std::to_string(streams));
    for (std::size_t k = 0; k < streams; ++k) {
      if (in.chunks[k].tokens != rows_[i].tokens)
        detail::fail<input_error>(rf(i) + ".chunks[" + std::to_string(k) + "].tokens", in.chunks[k].tokens,
                                  "must be the row's step tokens, " + std::to_string(rows_[i].tokens));
      try {
        slot.streams[k]->check(st.streams[k], in.chunks[k], options);
      } catch (const input_error& e) {
        detail::fail<input_error>(rf(i) + ".chunks[" + std::to_string(k) + "]", "rejected", e.what());
      }
    }
    detail::check_window_input(in.window_keys, rows_[i].tokens, window_key_floats(wc), [&] { return rf(i) + ".window_keys"; });
    detail::check_window_input(in.window_values, rows_[i].tokens, window_value_floats(wc), [&] { return rf(i) + ".window_values"; });
    if (options.check_finite) st.window.check_rows(in.window_keys, in.window_values, rows_[i].tokens, rf(i));
  }
  // What the commit below overwrites, saved first (allocations: nothing has changed if they fail).
  layer_undo undo;
  undo.streams.resize(rows_.size());
  undo.windows.resize(rows_.size());
  undo.staged.resize(rows_.size());
  const std::int64_t history = m.options_.history;
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    auto& st = rows_[i].seq->kinds[slot.kind].states->layers[slot.index];
    const std::int64_t t0 = rows_[i].seq->tokens, n = rows_[i].tokens;
    undo.streams[i].resize(streams);
    for (std::size_t k = 0; k < streams; ++k) st.streams[k].save(n, undo.streams[i][k]);
    st.window.save(t0, n, undo.windows[i]);
    // The ring keeps window.tokens + history rows: enough for every position of the chunk only
    // while n ≤ history + 1. Past that the chunk's reads go to a ring of its own, for the step.
    if (wc.tokens > 0 && n > history + 1) {
      undo.staged[i] = std::make_unique<raw_window>(wc, n - 1);
      const std::int64_t from = std::max({std::int64_t{0}, t0 - wc.tokens + 1, std::min(st.window.first(), t0)});
      undo.staged[i]->copy_rows(st.window, from, t0, from);
    }
  }
  // The entries, one task per row, into pages only the step holds; the states advance after all.
  auto emit = [&](std::int64_t task) {
    const auto i = static_cast<std::size_t>(task);
    const step_row& r = rows_[i];
    auto& st = r.seq->kinds[slot.kind].states->layers[slot.index];
    const auto& table = r.kinds[slot.kind].table;
    for (std::size_t k = 0; k < streams; ++k) {
      const page_arena& arena = slot.arenas[k];
      const page_layout& layout = arena.layout();
      auto store = [&](const entry_view& e) {
        if (options.check_finite)
          detail::check_storable(layout, e, [&] { return rf(i) + ": stream " + std::to_string(k) + " entry " + std::to_string(e.index); });
        store_entries(layout, e.values, 1, arena.entry(table[static_cast<std::size_t>(e.index / layout.page_size)], e.index % layout.page_size));
      };
      slot.streams[k]->emit(st.streams[k], inputs[i].chunks[k], options, entry_sink::of(store));
    }
  };
  ex.for_each(static_cast<std::int64_t>(rows_.size()), emit);
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    auto& st = rows_[i].seq->kinds[slot.kind].states->layers[slot.index];
    for (std::size_t k = 0; k < streams; ++k) slot.streams[k]->commit(st.streams[k], inputs[i].chunks[k]);
    const std::int64_t t0 = rows_[i].seq->tokens, n = rows_[i].tokens;
    if (raw_window* staged = undo.staged[i].get()) {
      staged->write(inputs[i].window_keys, inputs[i].window_values, t0, n);
      st.window.copy_rows(*staged, t0, t0 + n);  // the rows as stored: the same bits
    } else {
      st.window.write(inputs[i].window_keys, inputs[i].window_values, t0, n);
    }
  }
  undo.appended = true;
  layers_[layer] = std::move(undo);
}

inline sequence_view model_step::view(std::size_t layer, std::size_t row) const {
  require_open("view");
  const auto& slot = model_->layer_slot_of(layer, "step.view");
  if (row >= rows_.size())
    detail::fail<input_error>(field("view") + "(row)", row, "must be below the step's rows, " + std::to_string(rows_.size()));
  if (!layers_[layer].appended)
    detail::fail<input_error>(field("view") + ": layer", layer, "was not appended in this step yet");
  const auto& r = rows_[row];
  return model_->make_view(slot, *r.seq, &r.kinds[slot.kind].table, r.seq->tokens + r.tokens, layers_[layer].staged[row].get());
}

inline void model_step::read(std::size_t layer, span<const layer_read> reads, executor& ex) {
  require_open("read");
  model_->layer_slot_of(layer, "step.read");
  const auto f = [&] { return field("read") + ": layer " + std::to_string(layer); };
  if (!layers_[layer].appended) {
    bool any = false;
    for (const auto& r : rows_) any = any || r.tokens > 0;
    if (any) detail::fail<input_error>(f(), "not appended", "append the layer's new tokens in this step before reading it");
  }
  std::vector<sequence_view> views(reads.size());
  std::vector<read_item> items(reads.size());
  for (std::size_t i = 0; i < reads.size(); ++i) {
    if (reads[i].row >= rows_.size())
      detail::fail<input_error>(f() + " reads[" + std::to_string(i) + "].row", reads[i].row,
                                "must be below the step's rows, " + std::to_string(rows_.size()));
    const step_row& r = rows_[reads[i].row];
    const auto& slot = model_->layers_[layer];
    const raw_window* staged = layers_[layer].appended ? layers_[layer].staged[reads[i].row].get() : nullptr;
    views[i] = model_->make_view(slot, *r.seq, &r.kinds[slot.kind].table, r.seq->tokens + r.tokens, staged);
    items[i] = {&views[i], reads[i].request, reads[i].out, reads[i].lse, reads[i].selected_logical, reads[i].selected_physical,
                reads[i].trace};
  }
  model_->run_reads(layer, items, ex);
}

}  // namespace phasekv
