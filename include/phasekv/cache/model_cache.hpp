#pragma once
// The compressed caches of a whole model: one paged_cache per layer (each with its own
// compressors, geometry and storage — a DeepSeek-V4 model mixes CSA layers, S = 4 with an
// indexer, and HCA layers, S = W = 128), behind one sequence table. A model sequence id names the
// sequence in every layer at once, and the sequence operations act on every layer:
//
//   model_cache<csa_cache, hca_cache> model(csa_layers, hca_layers);  // layer kinds, each a group
//   sequence_id s = model.create();                      // in every layer
//   model.append<0>(s, i, {kv_chunk, indexer_chunk}, window_keys);   // layer by layer, as the
//   model.append<1>(s, j, {hca_chunk}, hca_window_keys);             // forward pass runs
//   sequence_id beam = model.fork(s);                    // every layer shares s's pages
//   model.remove_suffix(beam, p0);                       // every layer rolls back, or none does
//
// Layers: each template argument is a layer kind (a paged_cache type) and each constructor
// argument the group of layers of that kind, a layer_spec (one layer) or a vector of them (any
// number: a model's 30 CSA layers differ in weights, not type). Layer i of kind K is layer<K>(i);
// the model numbers its layers kind after kind, in the order given (layer_index<K>(i)), and the
// host keeps its own mapping to the model's interleaving.
//
// Pools: each layer's cache_config says, per stream, whether the stream has a pool of its own or
// draws from a pool shared with other layers (cache_config::shared_pools) — as vLLM's layers
// share one block pool. Every DeepSeek-V4 layer's K/V entries have the same page layout (one
// head of 512 channels), so one pool can hold them all under one budget; a pool shared with
// another layer is still only ever written, retained and released by the layer that allocated a
// page. pool_usage() reports each distinct pool once, and per layer the pages it holds.
//
// Strong guarantee across layers: create, fork, copy, remove_suffix, keep, free and clear either
// take effect in every layer or throw with every layer exactly as it was (std::bad_alloc
// included). create/fork make the layers' sequences one by one and drop them again if a later
// layer fails; copy forks the source in every layer before it retires the destination's old
// sequences; remove_suffix checks every layer before it changes one. None of them allocates a
// page (forks share pages; a rollback only drops them), so layers sharing a pool cannot run out
// of pages part-way. Appends go to one layer at a time (a forward pass produces one layer's inputs
// at a time), each with paged_cache's guarantee.
//
// Reading: layer<K>(i) is the layer's paged_cache and layer_id(s, l) the sequence's id in model
// layer l (layer_id<K>(s, i) by kind) — what that layer's sparse_reader reads.
//
// Thread safety is paged_cache's: calls on different model sequences may run concurrently, each
// sequence has one writer at a time. The table of model ids has its own mutex.

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/core/error.hpp"

namespace phasekv {

// How to build one layer: its compressors and its cache configuration.
template <class Cache>
struct layer_spec {
  typename Cache::layer compressors;
  cache_config config;
};

// Every layer of one kind, in order: one layer_spec, or a vector of them.
template <class Cache>
struct layer_group {
  std::vector<layer_spec<Cache>> layers;
  layer_group(layer_spec<Cache> one) { layers.push_back(std::move(one)); }  // NOLINT: one layer converts
  layer_group(std::vector<layer_spec<Cache>> many) : layers(std::move(many)) {}  // NOLINT
};

// What one model sequence occupies, per model layer and in total.
struct model_memory {
  std::vector<sequence_memory> layers;
  sequence_memory total;  // sums of the layers' figures (tokens: the most of any layer)
};

// What the model's pools hold.
struct model_pool_usage {
  // The pages a layer's sequences hold, summed over its streams (a shared page counted once).
  struct layer_usage {
    std::int64_t pages_held = 0;
    std::int64_t bytes_held = 0;
  };
  struct pool_usage {
    std::string name;
    std::vector<std::size_t> layers;  // the model layers drawing from it
    std::int64_t pages_used = 0;
    std::int64_t bytes_used = 0;      // pages in use × page bytes
    std::int64_t bytes_touched = 0;   // pages ever handed out × page bytes (at most resident)
    std::int64_t bytes_reserved = 0;  // capacity × page bytes
  };
  std::vector<layer_usage> layers;  // by model layer
  std::vector<pool_usage> pools;    // each distinct pool once, in order of first use
  pool_usage total;                 // sums over the distinct pools
};

template <class... Kinds>
class model_cache {
 public:
  static constexpr std::size_t kind_count = sizeof...(Kinds);
  static_assert(kind_count >= 1, "a model needs at least one layer kind");
  template <std::size_t K>
  using kind = std::tuple_element_t<K, std::tuple<Kinds...>>;

  explicit model_cache(layer_group<Kinds>... groups, std::string name = "model") : name_(std::move(name)) {
    std::size_t k = 0;
    const auto check = [&](const auto& group) {
      detail::require(!group.layers.empty(), name_ + ".layers of kind " + std::to_string(k), 0,
                      "every layer kind needs at least one layer");
      ++k;
    };
    (check(groups), ...);
    build(std::index_sequence_for<Kinds...>{}, groups...);
  }

  model_cache(const model_cache&) = delete;
  model_cache& operator=(const model_cache&) = delete;

  // Layer i of kind K.
  template <std::size_t K>
  kind<K>& layer(std::size_t i = 0) {
    return *std::get<K>(layers_)[check_layer<K>(i, "layer")];
  }
  template <std::size_t K>
  const kind<K>& layer(std::size_t i = 0) const {
    return *std::get<K>(layers_)[check_layer<K>(i, "layer")];
  }
  // How many layers of kind K; all layers; the model index of layer i of kind K.
  template <std::size_t K>
  std::size_t layers_of() const noexcept {
    return std::get<K>(layers_).size();
  }
  std::size_t layer_count() const noexcept { return count_; }
  template <std::size_t K>
  std::size_t layer_index(std::size_t i) const {
    return offsets_[K] + check_layer<K>(i, "layer_index");
  }
  const std::string& name() const noexcept { return name_; }

  // ---- sequences ---------------------------------------------------------------------------

  // A new, empty sequence in every layer.
  sequence_id create() {
    return add([&](auto& cache, std::size_t) { return cache.create(); });
  }

  // A new sequence equal to `parent` in every layer, sharing all of its pages.
  sequence_id fork(sequence_id parent) {
    const layer_ids from = ids(parent, "fork");
    return add([&](auto& cache, std::size_t l) { return cache.fork(from[l]); });
  }

  // Makes `destination` a fork of `source` in every layer (llama.cpp's seq_cp).
  void copy(sequence_id source, sequence_id destination) {
    if (source == destination)
      detail::fail<input_error>(name_ + ".copy(destination)", destination, "must differ from source");
    const layer_ids from = ids(source, "copy");
    layer_ids old = ids(destination, "copy");
    require_held(destination, old, "copy");  // the old sequences are freed last: all must be there
    layer_ids forks = make_all([&](auto& cache, std::size_t l) { return cache.fork(from[l]); });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      table_.find(destination)->second.swap(forks);  // checked above; one writer per sequence
    }
    for_each_layer([&](auto& cache, std::size_t l) { cache.free(old[l]); });
  }

  // Forgets tokens [p0, end) in every layer (llama.cpp's seq_rm(seq, p0, -1)); throws before
  // anything changes unless every layer can roll back that far (see cache_config::history).
  void remove_suffix(sequence_id id, std::int64_t p0) {
    const layer_ids in = ids(id, "remove_suffix");
    require_held(id, in, "remove_suffix");
    for_each_layer([&](auto& cache, std::size_t l) {
      if (!cache.can_remove_suffix(in[l], p0))
        detail::fail<input_error>(name_ + ".remove_suffix(p0)", p0,
                                  "cannot roll back layer " + std::to_string(l) + " (" + cache.config().name +
                                      ", tokens = " + std::to_string(cache.tokens(in[l])) +
                                      "): past its tokens or its kept history");
    });
    for_each_layer([&](auto& cache, std::size_t l) { cache.remove_suffix(in[l], p0); });
  }

  // Drops a sequence from every layer.
  void free(sequence_id id) {
    layer_ids in;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = table_.find(id);
      if (it == table_.end()) fail_unknown(id, "free");
      require_held(id, it->second, "free");  // before anything changes: no layer is left orphaned
      in.swap(it->second);
      table_.erase(it);
    }
    for_each_layer([&](auto& cache, std::size_t l) { cache.free(in[l]); });
  }

  // Drops every sequence but `id` (llama.cpp's seq_keep).
  void keep(sequence_id id) {
    ids(id, "keep");
    std::vector<layer_ids> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& entry : table_)
        if (entry.first != id) require_held(entry.first, entry.second, "keep");
      dropped.reserve(table_.size());  // the only allocation: nothing is dropped if it fails
      for (auto it = table_.begin(); it != table_.end();) {
        if (it->first == id) {
          ++it;
          continue;
        }
        dropped.push_back(std::move(it->second));  // a move: cannot throw
        it = table_.erase(it);
      }
    }

    for (const layer_ids& in : dropped) for_each_layer([&](auto& cache, std::size_t l) { cache.free(in[l]); });
  }

  // Drops every sequence.
  void clear() {
    std::unordered_map<sequence_id, layer_ids> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      dropped.swap(table_);
    }
    for_each_layer([&](auto& cache, std::size_t) { cache.clear(); });
  }

  // Appends new tokens to layer i of kind K (see paged_cache::append); without i, to layer 0.
  template <std::size_t K>
  std::int64_t append(sequence_id id, std::size_t i, const typename kind<K>::chunks& in,
                      span<const float> window_keys = {}, span<const float> window_values = {},
                      const append_options& options = {}) {
    const std::size_t l = layer_index<K>(i);
    return layer<K>(i).append(ids(id, "append")[l], in, window_keys, window_values, options);
  }
  template <std::size_t K>
  std::int64_t append(sequence_id id, const typename kind<K>::chunks& in, span<const float> window_keys = {},
                      span<const float> window_values = {}, const append_options& options = {}) {
    return append<K>(id, 0, in, window_keys, window_values, options);
  }

  // A decode step's appends to layer i of kind K for B model sequences (items[b].seq: model ids),
  // as paged_cache::append_batch: all or nothing, bit-identical to B single appends.
  template <std::size_t K>
  void append_batch(std::size_t i, span<const typename kind<K>::append_item> items, executor& ex = default_executor(),
                    const append_options& options = {}) {
    const std::size_t l = layer_index<K>(i);
    std::vector<typename kind<K>::append_item> local(items.begin(), items.end());
    for (auto& item : local) item.seq = ids(item.seq, "append_batch")[l];
    layer<K>(i).append_batch(span<const typename kind<K>::append_item>(local.data(), local.size()), ex, options);
  }

  // ---- queries ---------------------------------------------------------------------------

  bool contains(sequence_id id) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return table_.count(id) != 0;
  }
  std::int64_t sequences() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<std::int64_t>(table_.size());
  }
  std::vector<sequence_id> live_sequences() const {
    std::vector<sequence_id> out;
    std::lock_guard<std::mutex> lock(mutex_);
    out.reserve(table_.size());
    for (const auto& entry : table_) out.push_back(entry.first);
    std::sort(out.begin(), out.end());
    return out;
  }
  // The sequence's id in model layer `l` (for that layer's paged_cache and reader).
  sequence_id layer_id(sequence_id id, std::size_t l) const {
    if (l >= count_)
      detail::fail<input_error>(name_ + ".layer_id(layer)", l, "must be below the layer count " + std::to_string(count_));
    return ids(id, "layer_id")[l];
  }
  // The sequence's id in layer i of kind K.
  template <std::size_t K>
  sequence_id layer_id(sequence_id id, std::size_t i) const {
    return ids(id, "layer_id")[layer_index<K>(i)];
  }

  model_memory memory(sequence_id id) const {
    const layer_ids in = ids(id, "memory");
    model_memory m;
    m.layers.resize(count_);
    for_each_layer([&](const auto& cache, std::size_t l) {
      const sequence_memory s = cache.memory(in[l]);
      m.layers[l] = s;
      m.total.tokens = std::max(m.total.tokens, s.tokens);
      m.total.entries += s.entries;
      m.total.pages += s.pages;
      m.total.shared_pages += s.shared_pages;
      m.total.page_bytes += s.page_bytes;
      m.total.entry_bytes += s.entry_bytes;
      m.total.state_bytes += s.state_bytes;
      m.total.uncompressed_bytes += s.uncompressed_bytes;
    });
    return m;
  }

  // Per layer the pages it holds; each distinct pool once; totals over the distinct pools. While
  // only this model draws from its pools, the layers' pages_held sum to total.pages_used.
  model_pool_usage pool_usage() const {
    model_pool_usage u;
    u.total.name = name_;
    u.layers.resize(count_);
    std::vector<const page_pool*> seen;
    for_each_layer([&](const auto& cache, std::size_t l) {
      for (std::size_t k = 0; k < std::decay_t<decltype(cache)>::stream_count; ++k) {
        const page_pool& pool = cache.pool(k);
        const std::int64_t held = cache.pages_held(k);
        u.layers[l].pages_held += held;
        u.layers[l].bytes_held += held * pool.bytes_per_page();
        const auto at = std::find(seen.begin(), seen.end(), &pool);
        if (at != seen.end()) {
          auto& layers = u.pools[static_cast<std::size_t>(at - seen.begin())].layers;
          if (layers.back() != l) layers.push_back(l);
          continue;
        }
        seen.push_back(&pool);
        model_pool_usage::pool_usage p;
        p.name = pool.name();
        p.layers.push_back(l);
        p.pages_used = pool.used_pages();
        p.bytes_used = pool.bytes_used();
        p.bytes_touched = pool.pages_touched() * pool.bytes_per_page();
        p.bytes_reserved = pool.bytes_reserved();
        u.total.pages_used += p.pages_used;
        u.total.bytes_used += p.bytes_used;
        u.total.bytes_touched += p.bytes_touched;
        u.total.bytes_reserved += p.bytes_reserved;
        u.pools.push_back(std::move(p));
      }
    });
    for (std::size_t l = 0; l < count_; ++l) u.total.layers.push_back(l);
    return u;
  }

 private:
  using layer_ids = std::vector<sequence_id>;  // by model layer

  template <std::size_t... K>
  void build(std::index_sequence<K...>, layer_group<Kinds>&... groups) {
    std::size_t offset = 0;
    const auto place = [&](auto& layers, auto& group, std::size_t kind_index) {
      offsets_[kind_index] = offset;
      layers.reserve(group.layers.size());
      for (auto& spec : group.layers) {
        using cache = typename std::decay_t<decltype(layers)>::value_type::element_type;
        layers.push_back(std::make_unique<cache>(std::move(spec.compressors), std::move(spec.config)));
      }
      offset += group.layers.size();
    };
    (place(std::get<K>(layers_), groups, K), ...);
    count_ = offset;
  }

  template <std::size_t K>
  std::size_t check_layer(std::size_t i, const char* operation) const {
    if (i >= std::get<K>(layers_).size())
      detail::fail<input_error>(name_ + "." + operation + "<" + std::to_string(K) + ">(layer)", i,
                                "must be below the number of layers of that kind, " +
                                    std::to_string(std::get<K>(layers_).size()));
    return i;
  }

  // Makes one sequence per layer with `make(cache, l)`; if a layer fails, the sequences made in
  // the layers before it are freed again and the failure propagates.
  template <class Make>
  layer_ids make_all(Make&& make) {
    layer_ids made(count_);  // allocated before any layer changes
    std::size_t done = 0;
    try {
      for_each_layer([&](auto& cache, std::size_t l) {
        made[l] = make(cache, l);
        done = l + 1;
      });
    } catch (...) {
      for_each_layer([&](auto& cache, std::size_t l) {
        if (l < done) cache.free(made[l]);
      });
      throw;
    }
    return made;
  }

  // make_all, then the result under a fresh model id; if the table cannot grow, the layers'
  // new sequences are freed again.
  template <class Make>
  sequence_id add(Make&& make) {
    const layer_ids made = make_all(make);
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      const sequence_id id = tag_ | next_;
      table_.emplace(id, made);  // a copy: `made` stays whole if the table cannot grow
      ++next_;
      return id;
    } catch (...) {
      for_each_layer([&](auto& cache, std::size_t l) { cache.free(made[l]); });
      throw;
    }
  }

  layer_ids ids(sequence_id id, const char* operation) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = table_.find(id);
    if (it == table_.end()) fail_unknown(id, operation);
    return it->second;
  }

  // Every layer still holds its sequence of `in`. A layer is a public paged_cache
  // (layer<K>(i)), so a host may free or clear one behind the model; an operation that would
  // then fail part-way (freeing the layers before it and orphaning those after) throws here,
  // before anything changes, naming the layer.
  void require_held(sequence_id id, const layer_ids& in, const char* operation) const {
    for_each_layer([&](const auto& cache, std::size_t l) {
      if (!cache.contains(in[l]))
        detail::fail<input_error>(name_ + "." + operation + "(sequence)", id,
                                  "is no longer held by layer " + std::to_string(l) + " (" + cache.config().name +
                                      ", id " + std::to_string(in[l]) +
                                      "): it was freed or cleared through layer<K>(i), behind the model");
    });
  }
  [[noreturn]] void fail_unknown(sequence_id id, const char* operation) const {
    detail::fail<input_error>(name_ + "." + operation + "(sequence)", id, detail::unknown_sequence(id, tag_, "model cache"));
  }

  // f(cache, model layer index) for every layer, kind after kind.
  template <class F>
  void for_each_layer(F&& f) {
    for_each_impl(*this, f, std::index_sequence_for<Kinds...>{});
  }
  template <class F>
  void for_each_layer(F&& f) const {
    for_each_impl(*this, f, std::index_sequence_for<Kinds...>{});
  }
  template <class Self, class F, std::size_t... K>
  static void for_each_impl(Self& self, F& f, std::index_sequence<K...>) {
    const auto kind_layers = [&](auto& layers, std::size_t offset) {
      for (std::size_t i = 0; i < layers.size(); ++i) {
        auto& cache = *layers[i];
        if constexpr (std::is_const_v<Self>)
          f(static_cast<const std::decay_t<decltype(cache)>&>(cache), offset + i);
        else
          f(cache, offset + i);
      }
    };
    (kind_layers(std::get<K>(self.layers_), self.offsets_[K]), ...);
  }

  std::string name_;
  std::tuple<std::vector<std::unique_ptr<Kinds>>...> layers_;
  std::array<std::size_t, kind_count> offsets_{};  // model index of each kind's first layer
  std::size_t count_ = 0;
  mutable std::mutex mutex_;
  std::unordered_map<sequence_id, layer_ids> table_;
  sequence_id tag_ = detail::next_sequence_tag();  // distinct from every layer's tag
  sequence_id next_ = 0;
};

}  // namespace phasekv
