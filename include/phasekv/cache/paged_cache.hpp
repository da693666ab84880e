#pragma once
// The paged compressed cache of one layer: a page pool per stream, and per
// sequence a page table per stream, the compressors' pending state and the raw local window.
//
//   paged_cache<K, V> cache(layer_compressor<K, V>(keys, values), config);
//   sequence_id s = cache.create();
//   cache.append(s, {key_chunk, value_chunk}, window_keys, window_values);
//   sequence_id beam = cache.fork(s);          // shares every page; O(pages)
//   cache.remove_suffix(beam, p0);             // roll back to tokens [0, p0)
//
// Entry e of a stream lives in page table[e / page_size], slot e % page_size. Full pages are
// immutable: fork() shares all pages by reference count, and a sequence that writes into a
// last page someone else also holds first copies it (copy on write), so forks never see each
// other's entries. Operations follow llama.cpp's vocabulary where they overlap: create ~ a new
// seq_id, copy ~ seq_cp, remove_suffix ~ seq_rm(seq, p0, -1), keep ~ seq_keep, clear.
//
// Raw window: the last `window.tokens` tokens' key (and value) vectors as the host hands them
// over — already RoPE'd at their own positions — kept in a ring of window.tokens + history
// rows, fp32 or FP8 (raw_window.hpp). `history` extra tokens of compressor inputs and window rows
// let remove_suffix roll back that far; rolling back further throws, since the inputs it would
// need are gone.
//
// Errors: every operation checks what a caller can get wrong first and throws input_error
// (unknown sequence, bad range, chunk shape) or capacity_error (a pool is full) with the cache
// exactly as it was (strong guarantee).
//
// Thread safety: each sequence has one writer at a time — every call naming a sequence, except
// the const queries, writes it. Calls on different sequences may run concurrently from several
// threads: the sequence table is guarded by a mutex (held only to look up, add or drop a
// sequence, never during compression), and the page pools are internally synchronised. Const
// queries of a sequence may run concurrently with each other, not with that sequence's writer.
//
// Lifetimes: a sequence_id lives until free/keep/clear drops it, and carries a per-cache tag, so
// another cache's id is rejected as unknown. References from page_table()/state() and a
// paged_view live until the next call that writes that sequence (the cache, for a paged_view);
// a sequence_view from view_of() carries a stamp that the reader checks (sequence_view.hpp).
// Allocation failures keep the strong guarantee too (tests/fault); docs/RELIABILITY.md.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/cache/cache_config.hpp"
#include "phasekv/cache/page_plan.hpp"
#include "phasekv/cache/page_pool.hpp"
#include "phasekv/cache/raw_window.hpp"
#include "phasekv/cache/sequence_table.hpp"
#include "phasekv/cache/sequence_view.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/executor.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/core/types.hpp"
#include "phasekv/kernels/finite.hpp"

namespace phasekv {

template <class... Compressors>
class paged_cache {
 public:
  using layer = layer_compressor<Compressors...>;
  static constexpr std::size_t stream_count = layer::stream_count;
  using chunks = typename layer::chunks;

  paged_cache(layer compressors, cache_config config) : layer_(std::move(compressors)), config_(std::move(config)) {
    config_.validate();
    detail::require(config_.stream_storage.empty() || config_.stream_storage.size() == stream_count,
                    config_.name + ".stream_storage.size()", config_.stream_storage.size(),
                    "must be 0 or the number of streams, " + std::to_string(stream_count));
    detail::require(config_.shared_pools.empty() || config_.shared_pools.size() == stream_count,
                    config_.name + ".shared_pools.size()", config_.shared_pools.size(),
                    "must be 0 or the number of streams, " + std::to_string(stream_count));
    pools_.reserve(stream_count);
    for (std::size_t k = 0; k < stream_count; ++k) {
      page_pool_config p;
      p.name = config_.name + ".pool[" + std::to_string(k) + "]";
      p.page_size = config_.page_size;
      p.kv_heads = stream_shape(k).first;
      p.channels = stream_shape(k).second;
      p.storage = config_.stream_storage.empty() ? config_.storage : config_.stream_storage[k];
      p.rope_channels = p.storage == storage_type::fp8_e4m3_block ? stored_rope_channels(k) : 0;
      if (p.storage == storage_type::fp4_e2m1_hadamard && stream_role_of(k) != stream_role::indexer)
        detail::fail<config_error>(config_.name + (config_.stream_storage.empty() ? std::string(".storage")
                                                                                   : ".stream_storage[" + std::to_string(k) + "]"),
                                   to_string(p.storage),
                                   "is for indexer streams only (their keys are scored in the transformed basis, never "
                                   "attended to); stream " + std::to_string(k) + " has another role");
      p.capacity = config_.pages;
      p.memory = config_.memory;
      const bool shared = !config_.shared_pools.empty() && config_.shared_pools[k] != nullptr;
      if (shared) {
        require_layout(k, p, config_.shared_pools[k]->config());
        pools_.push_back(config_.shared_pools[k]);
      } else {
        pools_.push_back(std::make_shared<page_pool>(std::move(p)));
      }
    }
    // The pending inputs of every stream: caught here, not on the first create().
    for_each_stream([&](std::size_t, const auto& c) {
      detail::checked_product(c.geom().window + config_.history,
                              c.payload_floats_per_token() + c.logit_floats_per_token(), limits::max_bytes / 4,
                              config_.name + ".history", config_.history,
                              "the input ring of stream '" + c.config().name + "' (floats)");
    });
  }

  const layer& compressors() const noexcept { return layer_; }
  const cache_config& config() const noexcept { return config_; }
  const page_pool& pool(std::size_t stream) const { return *pools_[check_stream(stream, "pool")]; }
  // The stream's pool as a shared handle: to share it with another cache (cache_config::shared_pools).
  const std::shared_ptr<page_pool>& shared_pool(std::size_t stream) const { return pools_[check_stream(stream, "shared_pool")]; }
  bool owns_pool(std::size_t stream) const {
    check_stream(stream, "owns_pool");
    return config_.shared_pools.empty() || config_.shared_pools[stream] == nullptr;
  }

  // The pages of a stream's pool this cache's sequences hold, each counted once however many of
  // them share it: the layer's part of a shared pool (with a pool of its own, its used_pages()).
  std::int64_t pages_held(std::size_t stream) const {
    check_stream(stream, "pages_held");
    std::vector<page_id> held;
    table_.for_each([&](sequence_id, const sequence& s) { held.insert(held.end(), s.tables[stream].begin(), s.tables[stream].end()); });
    std::sort(held.begin(), held.end());
    return static_cast<std::int64_t>(std::unique(held.begin(), held.end()) - held.begin());
  }
  // The raw window's ring rows (window.tokens + history, or 0), whether its keys are its values,
  // and whether it keeps its rows as FP8 heads (bytes) rather than floats.
  std::int64_t window_rows() const noexcept { return config_.window.tokens > 0 ? config_.window.tokens + config_.history : 0; }
  bool tied_window() const noexcept { return config_.window.value_channels == 0; }
  bool fp8_window() const noexcept { return config_.window.precision == storage_type::fp8_e4m3_block; }

  // ---- sequences -------------------------------------------------------------------------

  // A new, empty sequence. Throws capacity_error when its state and window cannot be allocated.
  sequence_id create() {
    auto record = std::make_unique<sequence>();
    record->states = layer_.make_state(config_.history);
    detail::allocate_or_fail([&] { record->window = raw_window(config_.window, config_.history); },
                             config_.name + ".window.tokens", config_.window.tokens,
                             raw_window::ring_bytes(config_.window, config_.history));
    return insert(std::move(record));
  }

  bool contains(sequence_id id) const { return table_.contains(id); }
  std::int64_t sequences() const { return table_.size(); }
  // The ids of every live sequence, in increasing order (creation order).
  std::vector<sequence_id> live_sequences() const { return table_.ids(); }

  // Appends the same new tokens to every stream (one chunk each) and to the raw window
  // (window_keys: tokens × window.kv_heads × key_channels; window_values likewise, empty when
  // the window is tied or absent). Returns the entries emitted per stream.
  std::int64_t append(sequence_id id, const chunks& in, span<const float> window_keys = {},
                      span<const float> window_values = {}, const append_options& options = {}) {
    sequence& s = find(id, "append");
    const std::int64_t tokens = in[0].tokens;
    check_window_input(window_keys, tokens, window_key_floats(config_.window), "window_keys");
    check_window_input(window_values, tokens, window_value_floats(config_.window), "window_values");
    layer_.check(s.states, in, options);  // a malformed chunk is an input_error, however full the pool
    if (options.check_finite) s.window.check_rows(window_keys, window_values, tokens, config_.name + ".append");

    // Every page this append needs in every stream, before anything changes.
    std::array<page_plan, stream_count> plans = reserve_pages(s, tokens);
    try {
      layer_.append(s.states, in, [&](std::size_t k, const entry_view& e) {
        if (options.check_finite) check_storable(k, e);
        pools_[k]->write_entry(plans[k].page_for(s.tables[k], e.index, config_.page_size), e.index % config_.page_size,
                              e.values);
      }, options);
    } catch (...) {
      for (std::size_t k = stream_count; k-- > 0;) plans[k].drop(*pools_[k]);
      throw;
    }
    // The views of this sequence go stale only now: a failed append wrote nothing they show.
    s.writes.bump();
    for (std::size_t k = 0; k < stream_count; ++k) plans[k].adopt(*pools_[k], s.tables[k]);
    s.window.write(window_keys, window_values, s.tokens, tokens);
    s.tokens += tokens;
    return layer_.geom().completed_entries(s.tokens) - layer_.geom().completed_entries(s.tokens - tokens);
  }

  // One sequence's part of a batched append: its chunks (one per stream, as append() takes them)
  // and raw window rows.
  struct append_item {
    sequence_id seq = 0;
    chunks in{};
    span<const float> window_keys = {};
    span<const float> window_values = {};
  };

  // An engine's decode step for this layer: appends to B distinct sequences in one call, the
  // entries of each computed as a task on `ex`. All or nothing: every item is checked and every
  // page reserved (in item order, as B single appends would take them) before any entry is
  // computed; a bad item (input_error naming "items[3]"), a full pool (capacity_error) or a
  // failing entry leaves every sequence and pool as it was. Bit-identical to B single appends in
  // item order, on any executor.
  void append_batch(span<const append_item> items, executor& ex = default_executor(), const append_options& options = {}) {
    const std::size_t count = items.size();
    std::vector<sequence*> seqs(count);
    auto item_error = [&](std::size_t i, const std::exception& e) {
      detail::fail<input_error>(config_.name + ".append_batch: items[" + std::to_string(i) + "]", items[i].seq, e.what());
    };
    for (std::size_t i = 0; i < count; ++i) {
      const append_item& it = items[i];
      try {
        seqs[i] = &find(it.seq, "append_batch");
        check_window_input(it.window_keys, it.in[0].tokens, window_key_floats(config_.window), "window_keys");
        check_window_input(it.window_values, it.in[0].tokens, window_value_floats(config_.window), "window_values");
        layer_.check(seqs[i]->states, it.in, options);
        if (options.check_finite)
          seqs[i]->window.check_rows(it.window_keys, it.window_values, it.in[0].tokens, config_.name + ".append_batch");
      } catch (const input_error& e) {
        item_error(i, e);
      }
      for (std::size_t j = 0; j < i; ++j)
        if (seqs[j] == seqs[i])
          detail::fail<input_error>(config_.name + ".append_batch: items[" + std::to_string(i) + "].seq", it.seq,
                                    "repeats items[" + std::to_string(j) + "].seq: one item per sequence");
    }
    // Every page of every item, in item order; on failure all are given back in reverse order.
    std::vector<std::array<page_plan, stream_count>> plans(count);
    auto drop_all = [&](std::size_t through) noexcept {
      for (std::size_t i = through; i-- > 0;)
        for (std::size_t k = stream_count; k-- > 0;) plans[i][k].drop(*pools_[k]);
    };
    for (std::size_t i = 0; i < count; ++i) {
      try {
        plans[i] = reserve_pages(*seqs[i], items[i].in[0].tokens);
      } catch (...) {
        drop_all(i);
        throw;
      }
    }
    // The entries, one task per item: each writes only its own planned pages and its own state's
    // scratch. States advance only after every task succeeded.
    auto emit = [&](std::int64_t task) {
      const auto i = static_cast<std::size_t>(task);
      sequence& s = *seqs[i];
      layer_.emit(s.states, items[i].in, [&](std::size_t k, const entry_view& e) {
        if (options.check_finite) check_storable(k, e);
        pools_[k]->write_entry(plans[i][k].page_for(s.tables[k], e.index, config_.page_size), e.index % config_.page_size,
                               e.values);
      }, options);
    };
    try {
      ex.for_each(static_cast<std::int64_t>(count), emit);
    } catch (...) {
      drop_all(count);
      throw;
    }
    for (std::size_t i = 0; i < count; ++i) {
      sequence& s = *seqs[i];
      const std::int64_t tokens = items[i].in[0].tokens;
      s.writes.bump();
      for (std::size_t k = 0; k < stream_count; ++k) plans[i][k].adopt(*pools_[k], s.tables[k]);
      layer_.commit(s.states, items[i].in);
      s.window.write(items[i].window_keys, items[i].window_values, s.tokens, tokens);
      s.tokens += tokens;
    }
  }

  // Entries the host pooled itself (its own compressor or kernels, on any device): `tokens` new
  // tokens, and per stream the entries they complete — entries_after(id, tokens) of them,
  // kv_heads × channels fp32 each, head-major — stored in the stream's storage exactly as the
  // write path stores its own (rounded to bf16/f16, FP8/FP4 quantized); the raw window rows as
  // append() takes them. The same checks (check_finite: non-finite entries and values the
  // storage cannot hold) and the same guarantee: a failure leaves the sequence and the pools as
  // they were. The streams' states advance without inputs (stream_compressor::skip), so a later
  // append() continues only where no entry pools a skipped token (W = S, at an entry boundary);
  // otherwise the sequence goes on with append_entries. Returns the entries stored per stream.
  std::int64_t append_entries(sequence_id id, std::int64_t tokens, const std::array<span<const float>, stream_count>& entries,
                              span<const float> window_keys = {}, span<const float> window_values = {},
                              const append_options& options = {}) {
    sequence& s = find(id, "append_entries");
    layer_.check_skip(s.states, tokens);
    check_window_input(window_keys, tokens, window_key_floats(config_.window), "window_keys");
    check_window_input(window_values, tokens, window_value_floats(config_.window), "window_values");
    if (options.check_finite) s.window.check_rows(window_keys, window_values, tokens, config_.name + ".append_entries");
    const std::int64_t first = s.states[0].entries();
    const std::int64_t count = layer_.geom().completed_entries(s.states[0].tokens() + tokens) - first;
    for (std::size_t k = 0; k < stream_count; ++k) {
      const auto [heads, channels] = stream_shape(k);
      const std::int64_t floats = heads * channels;
      const std::string field = config_.name + ".append_entries: entries[" + std::to_string(k) + "]";
      if (entries[k].data() == nullptr && !entries[k].empty())
        detail::fail<input_error>(field + ".data()", "null", "must not be null when the size is not 0");
      std::int64_t want = 0;
      if (!detail::product_within(count, floats, limits::max_bytes, want) || static_cast<std::int64_t>(entries[k].size()) != want)
        detail::fail<input_error>(field + ".size()", entries[k].size(),
                                  "must be the " + std::to_string(count) + " entries these tokens complete × kv_heads × channels = " +
                                      std::to_string(count) + " × " + std::to_string(floats));
      if (options.check_finite && !kernels::all_finite(entries[k].data(), static_cast<std::int64_t>(entries[k].size())))
        for (std::size_t i = 0; i < entries[k].size(); ++i)
          if (!std::isfinite(entries[k][i]))
            detail::fail<input_error>(field + "[" + std::to_string(i) + "]", entries[k][i],
                                      "must be finite (append_options.check_finite is on)");
      for (std::int64_t j = 0; j < count && options.check_finite; ++j) {
        entry_view e;
        e.index = first + j;
        e.kv_heads = heads;
        e.channels = channels;
        e.values = entries[k].data() + j * floats;
        check_storable(k, e);
      }
    }
    std::array<page_plan, stream_count> plans = reserve_pages(s, tokens);
    // Nothing below can fail: the pages are held, the entries checked.
    s.writes.bump();
    for (std::size_t k = 0; k < stream_count; ++k) {
      const auto [heads, channels] = stream_shape(k);
      for (std::int64_t j = 0; j < count; ++j) {
        const std::int64_t e = first + j;
        pools_[k]->write_entry(plans[k].page_for(s.tables[k], e, config_.page_size), e % config_.page_size,
                               entries[k].data() + j * heads * channels);
      }
    }
    for (std::size_t k = 0; k < stream_count; ++k) plans[k].adopt(*pools_[k], s.tables[k]);
    layer_.skip(s.states, tokens);
    s.window.write(window_keys, window_values, s.tokens, tokens);
    s.tokens += tokens;
    return count;
  }

  // Entries an append of `tokens` more tokens to sequence `id` completes (in every stream).
  std::int64_t entries_after(sequence_id id, std::int64_t tokens) const {
    const sequence& s = find(id, "entries_after");
    return layer_.geom().completed_entries(s.states[0].tokens() + std::max<std::int64_t>(tokens, 0)) - s.states[0].entries();
  }

  // The stored bytes of entry j of a stream (page_layout::element_bytes of them, in the pool's
  // storage: FP8 heads, FP4 blocks, 16-bit or fp32 values), valid until the sequence is written.
  span<const std::byte> entry_bytes(sequence_id id, std::size_t stream, std::int64_t j) const {
    const sequence& s = find(id, "entry_bytes");
    const std::size_t k = check_stream(stream, "entry_bytes");
    const std::int64_t n = s.states[k].entries();
    if (j < 0 || j >= n)
      detail::fail<input_error>(config_.name + ".entry_bytes(entry)", j, "must lie in [0, " + std::to_string(n) + ")");
    const page_layout& l = pools_[k]->layout();
    const std::byte* page = pools_[k]->data(s.tables[k][static_cast<std::size_t>(j / config_.page_size)]);
    return span<const std::byte>(page + (j % config_.page_size) * l.entry_stride_bytes,
                                 static_cast<std::size_t>(l.entry_stride_bytes));
  }

  // A new sequence equal to `parent`, sharing all of its pages.
  sequence_id fork(sequence_id parent) {
    auto record = std::make_unique<sequence>(find(parent, "fork"));
    retain_pages(*record);
    try {
      return insert(std::move(record));
    } catch (...) {
      release_pages(*record);  // insert() leaves the record with us when it throws
      throw;
    }
  }

  // Makes `destination` (an existing sequence) a fork of `source` (llama.cpp's seq_cp).
  void copy(sequence_id source, sequence_id destination) {
    if (source == destination)
      detail::fail<input_error>(config_.name + ".copy(destination)", destination, "must differ from source");
    const sequence& from = find(source, "copy");
    sequence& to = find(destination, "copy");
    sequence replacement(from);
    replacement.writes.n = to.writes.get() + 1;  // to's views are stale; from's stay current
    retain_pages(replacement);
    release_pages(to);
    to = std::move(replacement);
  }

  // Forgets tokens [p0, end) and the entries they completed (llama.cpp's seq_rm(seq, p0, -1)).
  // Throws if the inputs needed to continue from p0 — the pending compressor inputs, and the
  // raw window tokens [p0 − window.tokens, p0) — are no longer kept (see cache_config.history).
  void remove_suffix(sequence_id id, std::int64_t p0) {
    sequence& s = find(id, "remove_suffix");
    if (p0 < 0 || p0 > s.tokens)
      detail::fail<input_error>(config_.name + ".remove_suffix(p0)", p0,
                                "must lie in [0, tokens = " + std::to_string(s.tokens) + "]");
    if (p0 == s.tokens) return;
    if (!can_roll_back(s, p0)) {
      bool inputs = true;
      for_each_stream([&](std::size_t k, const auto& c) { inputs = inputs && c.can_truncate(s.states[k], p0); });
      detail::fail<input_error>(
          config_.name + ".remove_suffix(p0)", p0,
          "rolls back further than the kept history allows (tokens = " + std::to_string(s.tokens) +
              ", history = " + std::to_string(config_.history) + "): " +
              (inputs ? "the raw window rows of tokens from " +
                            std::to_string(std::max<std::int64_t>(0, p0 - config_.window.tokens)) +
                            " are gone (the window keeps tokens from " + std::to_string(s.window.first()) + ")"
                      : std::string("the compressor inputs needed to continue are gone")));
    }
    const std::int64_t kept_entries = layer_.geom().completed_entries(p0);
    const std::int64_t kept_pages = (kept_entries + config_.page_size - 1) / config_.page_size;
    s.writes.bump();
    for_each_stream([&](std::size_t k, const auto& c) {
      c.truncate(s.states[k], p0);
      for (std::size_t i = static_cast<std::size_t>(kept_pages); i < s.tables[k].size(); ++i) pools_[k]->release(s.tables[k][i]);
      s.tables[k].resize(static_cast<std::size_t>(kept_pages));
    });
    s.tokens = p0;
    s.window.roll_back(p0);
  }

  // Whether remove_suffix(id, p0) would succeed (a multi-layer cache checks every layer first).
  bool can_remove_suffix(sequence_id id, std::int64_t p0) const {
    const sequence& s = find(id, "can_remove_suffix");
    return p0 >= 0 && p0 <= s.tokens && (p0 == s.tokens || can_roll_back(s, p0));
  }

  // Drops a sequence and its page references.
  void free(sequence_id id) { release_pages(*table_.erase(id, config_.name, "free")); }

  // Drops every sequence but `id` (llama.cpp's seq_keep).
  void keep(sequence_id id) {
    for (auto& r : table_.erase_all_but(id, config_.name, "keep")) release_pages(*r);
  }

  // Drops every sequence.
  void clear() {
    for (auto& entry : table_.erase_all("clear")) release_pages(*entry.second);
  }

  // ---- queries ---------------------------------------------------------------------------

  std::int64_t tokens(sequence_id id) const { return find(id, "tokens").tokens; }
  std::int64_t entries(sequence_id id, std::size_t stream) const {
    return find(id, "entries").states[check_stream(stream, "entries")].entries();
  }
  const std::vector<page_id>& page_table(sequence_id id, std::size_t stream) const {
    return find(id, "page_table").tables[check_stream(stream, "page_table")];
  }
  const stream_state& state(sequence_id id, std::size_t stream) const {
    return find(id, "state").states[check_stream(stream, "state")];
  }

  // Entry j of a stream, converted to fp32: kv_heads × channels floats into out.
  void read_entry(sequence_id id, std::size_t stream, std::int64_t j, float* out) const {
    const sequence& s = find(id, "read_entry");
    const std::int64_t n = s.states[check_stream(stream, "read_entry")].entries();
    if (j < 0 || j >= n)
      detail::fail<input_error>(config_.name + ".read_entry(entry)", j,
                                "must lie in [0, entries = " + std::to_string(n) + ")");
    pools_[stream]->read_entry(s.tables[stream][static_cast<std::size_t>(j / config_.page_size)], j % config_.page_size,
                              out);
  }

  // Tokens whose raw window rows are held: [window_first, tokens). That is the last
  // window.tokens tokens plus up to `history` older ones, so queries at earlier positions than
  // tokens − 1 (chunked prefill) still find their window.
  std::int64_t window_first(sequence_id id) const {
    const sequence& s = find(id, "window_first");
    return config_.window.tokens > 0 ? s.window.first() : s.tokens;
  }
  // Token t's window key (kv_heads × key_channels) and value (or its key when tied), in an f32
  // window. An FP8 window's rows are bytes: window_key_bytes/window_value_bytes, or their values
  // through copy_window_key/copy_window_value.
  const float* window_key(sequence_id id, std::int64_t t) const {
    const sequence& s = find(id, "window_key");
    require_window_precision(storage_type::f32, "window_key");
    return s.window.key(window_row(s, t));
  }
  const float* window_value(sequence_id id, std::int64_t t) const {
    const sequence& s = find(id, "window_value");
    require_window_precision(storage_type::f32, "window_value");
    return s.window.value(window_row(s, t));
  }
  // Token t's FP8 window key row (kv_heads heads of fp8_head_layout::of(key_channels,
  // rope_channels) bytes) and value row (the key row when tied).
  const std::byte* window_key_bytes(sequence_id id, std::int64_t t) const {
    const sequence& s = find(id, "window_key_bytes");
    require_window_precision(storage_type::fp8_e4m3_block, "window_key_bytes");
    return s.window.key_bytes(window_row(s, t));
  }
  const std::byte* window_value_bytes(sequence_id id, std::int64_t t) const {
    const sequence& s = find(id, "window_value_bytes");
    require_window_precision(storage_type::fp8_e4m3_block, "window_value_bytes");
    return s.window.value_bytes(window_row(s, t));
  }
  // The values a read sees for token t's window key (kv_heads × key_channels floats into out) and
  // value (kv_heads × value channels, the key's when tied), in either precision.
  void copy_window_key(sequence_id id, std::int64_t t, span<float> out) const {
    copy_window_row(id, t, false, out, "copy_window_key");
  }
  void copy_window_value(sequence_id id, std::int64_t t, span<float> out) const {
    copy_window_row(id, t, !tied_window(), out, "copy_window_value");
  }

  sequence_memory memory(sequence_id id) const {
    const sequence& s = find(id, "memory");
    sequence_memory m;
    m.tokens = s.tokens;
    for (std::size_t k = 0; k < stream_count; ++k) {
      const page_pool& pool = *pools_[k];
      const std::int64_t entry_bytes = pool.layout().entry_stride_bytes;
      m.entries += s.states[k].entries();
      m.pages += static_cast<std::int64_t>(s.tables[k].size());
      for (page_id p : s.tables[k]) m.shared_pages += pool.refcount(p) > 1 ? 1 : 0;
      m.page_bytes += static_cast<std::int64_t>(s.tables[k].size()) * pool.bytes_per_page();
      m.entry_bytes += s.states[k].entries() * entry_bytes;
      m.uncompressed_bytes += s.tokens * entry_bytes;
      m.state_bytes += static_cast<std::int64_t>(s.states[k].bytes());
    }
    m.state_bytes += static_cast<std::int64_t>(s.window.bytes());
    return m;
  }

  // CSR page tables of a batch of sequences for one stream (FlashInfer's convention), built from
  // the sequences' stream views.
  paged_view view(span<const sequence_id> batch, std::size_t stream) const {
    check_stream(stream, "view");
    paged_view v;
    v.base = pools_[stream]->base();
    v.layout = pools_[stream]->layout();
    v.rows.reserve(batch.size());
    for (sequence_id id : batch) v.rows.push_back(view_of(id, "view").streams[stream]);
    v.indptr.push_back(0);
    for (const stream_view& row : v.rows) {
      v.indices.insert(v.indices.end(), row.pages.begin(), row.pages.end());
      v.indptr.push_back(static_cast<std::int32_t>(v.indices.size()));
      v.last_page_len.push_back(row.entries == 0 ? 0 : static_cast<std::int32_t>((row.entries - 1) % config_.page_size + 1));
      v.entries.push_back(row.entries);
    }
    return v;
  }

  // The read-side shape of this layer (layer_shape.hpp): what sparse_reader is built from.
  layer_shape shape() const {
    layer_shape s;
    s.geom = layer_.geom();
    s.window = config_.window;
    for_each_stream([&](std::size_t k, const auto& c) {
      phasekv::stream_shape st;
      st.name = c.config().name;
      st.role = c.config().role;
      st.kv_heads = c.config().kv_heads;
      st.channels = c.config().channels;
      st.storage = pools_[k]->layout().storage;
      st.applies_rope = layer_.applies_rope(k);
      st.rope = c.config().rope;
      s.streams.push_back(std::move(st));
    });
    return s;
  }

  // One sequence's pages and window as a sequence_view (sequence_view.hpp), taken under one lock
  // of the sequence table. Valid until the next call that writes this sequence.
  sequence_view view_of(sequence_id id) const { return view_of(id, "view_of"); }

  // ---- a sequence in parts (snapshots: cache/snapshot.hpp, docs/SNAPSHOT.md) --------------------

  // Sequence id's record, read-only, under one lookup: its tokens, per stream its compressor state
  // and page table, and its raw window. `operation` names the caller in the message for an unknown
  // id. Valid until the next call that writes the sequence.
  struct sequence_parts {
    std::int64_t tokens = 0;
    std::array<const stream_state*, stream_count> states{};
    std::array<const std::vector<page_id>*, stream_count> tables{};
    const raw_window* window = nullptr;
  };
  sequence_parts parts(sequence_id id, const char* operation = "parts") const {
    const sequence& s = find(id, operation);
    sequence_parts p;
    p.tokens = s.tokens;
    for (std::size_t k = 0; k < stream_count; ++k) {
      p.states[k] = &s.states[k];
      p.tables[k] = &s.tables[k];
    }
    p.window = &s.window;
    return p;
  }

  // A new sequence from parts made elsewhere — what restore() does with a snapshot's sections:
  // `tokens` tokens; the streams' states, made by this cache's compressors (make_state) and read;
  // the raw window, made for this cache's window and history and read; and the entries, which
  // write_entries(k, pool, pages) puts into stream k's pages — completed_entries(tokens) of them,
  // in pages freshly allocated from `pool` that no sequence holds yet. All or nothing: every
  // stream's pages are allocated before any is written (capacity_error, "<what>: restoring …
  // needs … pages", when a pool lacks them), and if write_entries throws (a checksum mismatch) or
  // the sequence cannot be added, every page is given back, last allocated first — each pool's
  // free list is as it was — and the cache is unchanged. Parts that do not belong to this cache
  // are an input_error. Nothing here allocates but the page id arrays and the sequence table.
  template <class WriteEntries>
  sequence_id adopt(std::int64_t tokens, typename layer::states&& states, raw_window&& window,
                    WriteEntries&& write_entries, const std::string& what = "adopt") {
    check_parts(tokens, states, window, what);
    const std::int64_t entries = layer_.geom().completed_entries(tokens);
    auto record = std::make_unique<sequence>();
    record->states = std::move(states);
    record->window = std::move(window);
    record->tokens = tokens;
    // Page ids, reserved so that nothing below allocates memory until the sequence table does.
    std::array<std::vector<page_id>, stream_count> pages;
    for (std::size_t k = 0; k < stream_count; ++k) {
      pages[k].resize(static_cast<std::size_t>((entries + config_.page_size - 1) / config_.page_size));
      record->tables[k].reserve(pages[k].size());
    }
    std::size_t allocated = 0;
    try {
      for (; allocated < stream_count; ++allocated) {
        page_pool& pool = *pools_[allocated];
        try {
          pool.allocate(static_cast<std::int64_t>(pages[allocated].size()), pages[allocated].data());
        } catch (const capacity_error& e) {
          throw capacity_error(what + ": restoring " + std::to_string(entries) + " entries of stream " +
                               std::to_string(allocated) + " needs " + std::to_string(pages[allocated].size()) +
                               " pages: " + e.what());
        }
      }
      for (std::size_t k = 0; k < stream_count; ++k) {
        write_entries(k, *pools_[k], static_cast<const std::vector<page_id>&>(pages[k]));
        record->tables[k].assign(pages[k].begin(), pages[k].end());  // within the reserved capacity
      }
      return insert(std::move(record));  // leaves the record with us if it throws
    } catch (...) {
      release_reversed(pages, allocated);
      throw;
    }
  }

 private:
  static_assert(stream_count <= sequence_view::max_streams, "a sequence_view holds at most max_streams streams");

  sequence_view view_of(sequence_id id, const char* operation) const {
    sequence_view v;
    std::lock_guard<std::mutex> lock(table_.mutex());
    const sequence& s = table_.find_locked(id, config_.name, operation);
    v.tokens = s.tokens;
    v.stream_count = stream_count;
    v.geom = layer_.geom();
    v.stamp = {this, &stamp_current, id, s.writes.get()};
    for (std::size_t k = 0; k < stream_count; ++k) {
      stream_view& sv = v.streams[k];
      sv.base = pools_[k]->base();
      sv.layout = pools_[k]->layout();
      sv.capacity = pools_[k]->capacity();
      sv.pages = span<const page_id>(s.tables[k].data(), s.tables[k].size());
      sv.entries = s.states[k].entries();
    }
    v.window = s.window.view(s.tokens);
    return v;
  }

  struct sequence {
    typename layer::states states;
    std::array<std::vector<page_id>, stream_count> tables;
    raw_window window;
    std::int64_t tokens = 0;
    detail::write_count writes;  // what a view's stamp records
  };

  // view_stamp::current for this cache's views: the sequence is live and written no further.
  static bool stamp_current(const void* owner, std::int64_t id, std::uint64_t writes) {
    const auto& self = *static_cast<const paged_cache*>(owner);
    std::lock_guard<std::mutex> lock(self.table_.mutex());
    const sequence* s = self.table_.lookup_locked(id);
    return s != nullptr && s->writes.get() == writes;
  }

  using page_plan = detail::page_plan;

  // Every page an append of `tokens` tokens to `s` needs, in every stream, with the page tables
  // grown to hold them, so that adopting the plans cannot fail (a grown table may have moved:
  // views of the sequence are stale from here, even if this fails). On failure nothing is held.
  std::array<page_plan, stream_count> reserve_pages(sequence& s, std::int64_t tokens) {
    std::array<page_plan, stream_count> plans;
    try {
      for (std::size_t k = 0; k < stream_count; ++k) {
        const std::int64_t before = s.states[k].entries();
        const std::int64_t after = layer_.geom().completed_entries(s.states[k].tokens() + std::max<std::int64_t>(tokens, 0));
        plans[k] = page_plan::reserve(*pools_[k], s.tables[k], before, after, config_.page_size);
        const page_id* table = s.tables[k].data();
        s.tables[k].reserve(s.tables[k].size() + plans[k].fresh.size());
        // A view of the sequence points into its page table: once the table has moved, the view
        // is stale even if this append then fails. Otherwise a failed append leaves it current.
        if (s.tables[k].data() != table) s.writes.bump();
      }
    } catch (...) {
      for (std::size_t k = stream_count; k-- > 0;) plans[k].drop(*pools_[k]);
      throw;
    }
    return plans;
  }

  // The pending compressor inputs and raw window rows a continuation from p0 needs are still kept.
  bool can_roll_back(const sequence& s, std::int64_t p0) const {
    bool ok = true;
    for_each_stream([&](std::size_t k, const auto& c) { ok = ok && c.can_truncate(s.states[k], p0); });
    return ok && s.window.can_roll_back(p0);
  }

  // Adds a holder to every page of `s`: all or nothing (retain fails only at the maximum count).
  void retain_pages(const sequence& s) {
    std::size_t k = 0, i = 0;
    try {
      for (k = 0; k < stream_count; ++k)
        for (i = 0; i < s.tables[k].size(); ++i) pools_[k]->retain(s.tables[k][i]);
    } catch (...) {
      for (std::size_t undo = 0; undo <= k && undo < stream_count; ++undo) {
        const std::size_t n = undo < k ? s.tables[undo].size() : i;
        for (std::size_t r = 0; r < n; ++r) pools_[undo]->release(s.tables[undo][r]);
      }
      throw;
    }
  }

  // Adds a record under a fresh id; if that throws, the record stays with the caller.
  sequence_id insert(std::unique_ptr<sequence>&& record) { return table_.insert(std::move(record)); }

  // adopt()'s parts must be this cache's: the states made by its compressors for `tokens` tokens,
  // the window made for its window and history.
  void check_parts(std::int64_t tokens, const typename layer::states& states, const raw_window& window,
                   const std::string& what) const {
    const std::string where = config_.name + "." + what;
    if (tokens < 0 || tokens > limits::max_tokens)
      detail::fail<input_error>(where + ": tokens", tokens, "must lie in [0, 2^48]");
    layer_.check_skip(states, 0);  // made by these compressors
    for (std::size_t k = 0; k < stream_count; ++k)
      if (states[k].tokens() != tokens || states[k].entries() != layer_.geom().completed_entries(tokens))
        detail::fail<input_error>(where + ": states[" + std::to_string(k) + "].tokens", states[k].tokens(),
                                  "must be the sequence's " + std::to_string(tokens) + " tokens, with their entries");
    const raw_window_config& a = window.config();
    const raw_window_config& b = config_.window;
    const bool same = a.tokens == b.tokens && (b.tokens == 0 || (a.kv_heads == b.kv_heads && a.key_channels == b.key_channels &&
                                                                  a.value_channels == b.value_channels &&
                                                                  a.precision == b.precision && a.rope_channels == b.rope_channels));
    if (!same || window.rows() != window_rows() || window.first() > tokens)
      detail::fail<input_error>(where + ": window.rows()", window.rows(),
                                "must be a raw window made for this cache's window and history (" +
                                    std::to_string(window_rows()) + " rows), holding at most its tokens");
  }

  // Gives back the pages of the first `streams` streams, last allocated first, so each pool's free
  // list is exactly as it was before they were allocated.
  void release_reversed(const std::array<std::vector<page_id>, stream_count>& pages, std::size_t streams) noexcept {
    for (std::size_t k = streams; k-- > 0;) {
      try {
        for (std::size_t i = pages[k].size(); i-- > 0;) pools_[k]->release(pages[k][i]);
      } catch (...) {  // the pages were just allocated to nobody else: release cannot fail
      }
    }
  }

  void release_pages(sequence& s) {
    for (std::size_t k = 0; k < stream_count; ++k) {
      for (page_id p : s.tables[k]) pools_[k]->release(p);
      s.tables[k].clear();
    }
  }

  void require_window_precision(storage_type want, const char* operation) const {
    if (config_.window.precision != want)
      detail::fail<input_error>(config_.name + "." + operation + ": window.precision", to_string(config_.window.precision),
                                want == storage_type::f32
                                    ? "must be f32 for float rows (an FP8 window's rows are bytes: "
                                      "window_key_bytes, or copy_window_key for their values)"
                                    : "must be fp8_e4m3_block for FP8 rows (an f32 window's rows are floats: window_key)");
  }
  void require_out_size(span<float> out, std::int64_t floats, const char* operation) const {
    if (out.size() != static_cast<std::size_t>(floats) || (out.data() == nullptr && floats != 0))
      detail::fail<input_error>(config_.name + "." + operation + ": out.size()", out.size(),
                                "must be " + std::to_string(floats) + " (window.kv_heads × channels)");
  }
  // Token t's key row (values = false) or untied value row, as floats into out.
  void copy_window_row(sequence_id id, std::int64_t t, bool values, span<float> out, const char* operation) const {
    const sequence& s = find(id, operation);
    const std::int64_t row = window_row(s, t);
    require_out_size(out, values ? s.window.value_floats() : s.window.key_floats(), operation);
    if (values)
      s.window.copy_value(row, out.data());
    else
      s.window.copy_key(row, out.data());
  }
  void check_storable(std::size_t k, const entry_view& e) const {
    detail::check_storable(pools_[k]->layout(), e, [&] {
      return config_.name + ".append: stream " + std::to_string(k) + " entry " + std::to_string(e.index);
    });
  }
  void check_window_input(span<const float> in, std::int64_t tokens, std::int64_t per_token, const char* what) const {
    detail::check_window_input(in, tokens, per_token, [&] { return config_.name + ".append: " + what; });
  }

  std::int64_t window_row(const sequence& s, std::int64_t t) const { return s.window.row_of(t, s.tokens, config_.name); }

  // A shared pool must hold the stream's pages exactly as a pool of its own would.
  void require_layout(std::size_t k, const page_pool_config& want, const page_pool_config& have) const {
    const std::string field = config_.name + ".shared_pools[" + std::to_string(k) + "]";
    const auto check = [&](const char* what, std::int64_t pool_value, std::int64_t stream_value) {
      if (pool_value != stream_value)
        detail::fail<config_error>(field, have.name,
                                  std::string("has ") + what + " = " + std::to_string(pool_value) + ", the stream needs " +
                                      std::to_string(stream_value));
    };
    check("page_size", have.page_size, want.page_size);
    check("kv_heads", have.kv_heads, want.kv_heads);
    check("channels", have.channels, want.channels);
    check("rope_channels", have.rope_channels, want.rope_channels);
    if (have.storage != want.storage)
      detail::fail<config_error>(field, have.name,
                                std::string("stores ") + to_string(have.storage) + ", the stream stores " +
                                    to_string(want.storage));
  }

  // The RoPE channels an fp8_e4m3_block pool of stream k keeps in bf16: the stream's rope
  // channels when its policy rotates entries, else none.
  std::int64_t stored_rope_channels(std::size_t k) const {
    std::int64_t channels = 0;
    for_each_stream([&](std::size_t i, const auto& c) {
      if (i == k && layer_.applies_rope(k)) channels = c.config().rope.channels;
    });
    return channels;
  }

  stream_role stream_role_of(std::size_t k) const {
    stream_role role = stream_role::key_value;
    for_each_stream([&](std::size_t i, const auto& c) {
      if (i == k) role = c.config().role;
    });
    return role;
  }

  std::pair<std::int64_t, std::int64_t> stream_shape(std::size_t k) const {
    std::pair<std::int64_t, std::int64_t> shape;
    for_each_stream([&](std::size_t i, const auto& c) {
      if (i == k) shape = {c.config().kv_heads, c.config().channels};
    });
    return shape;
  }

  template <class F>
  void for_each_stream(F&& f) const {
    for_each_impl(f, std::make_index_sequence<stream_count>{});
  }
  template <class F, std::size_t... K>
  void for_each_impl(F& f, std::index_sequence<K...>) const {
    (f(K, layer_.template stream<K>()), ...);
  }

  std::size_t check_stream(std::size_t stream, const char* operation) const {
    if (stream >= stream_count)
      detail::fail<input_error>(config_.name + "." + operation + "(stream)", stream,
                                "must be below the stream count " + std::to_string(stream_count));
    return stream;
  }

  sequence& find(sequence_id id, const char* operation) { return table_.find(id, config_.name, operation); }
  const sequence& find(sequence_id id, const char* operation) const { return table_.find(id, config_.name, operation); }

  layer layer_;
  cache_config config_;
  std::vector<std::shared_ptr<page_pool>> pools_;  // per stream; shared with other caches or its own
  detail::sequence_table<sequence> table_{"cache"};
};

}  // namespace phasekv
