#pragma once
// The compressed caches of a whole model: one paged_cache per layer (each with its own
// compressors, geometry, page pools and storage — a DeepSeek-V4 model mixes CSA layers, S = 4
// with an indexer, and HCA layers, S = W = 128), behind one sequence table. A model sequence id
// names the sequence in every layer at once, and the sequence operations act on every layer:
//
//   model_cache<csa_cache, hca_cache> model(layer_spec<csa_cache>{csa_layer, csa_config},
//                                           layer_spec<hca_cache>{hca_layer, hca_config});
//   sequence_id s = model.create();                  // in every layer
//   model.append<0>(s, {kv_chunk, indexer_chunk}, window_keys);   // layer by layer, as the
//   model.append<1>(s, {hca_chunk}, hca_window_keys);            // forward pass runs
//   sequence_id beam = model.fork(s);                // every layer shares s's pages
//   model.remove_suffix(beam, p0);                   // every layer rolls back, or none does
//
// Strong guarantee across layers: create, fork, copy, remove_suffix, keep, free and clear either
// take effect in every layer or throw with every layer exactly as it was (std::bad_alloc
// included). create/fork make the layers' sequences one by one and drop them again if a later
// layer fails; copy forks the source in every layer before it retires the destination's old
// sequences; remove_suffix checks every layer before it changes one. Appends go to one layer at a
// time (a forward pass produces one layer's inputs at a time), each with paged_cache's guarantee.
//
// Reading: layer<I>() is layer I's paged_cache and layer_id(s, I) the sequence's id in it.
//
// Thread safety is paged_cache's: calls on different model sequences may run concurrently, each
// sequence has one writer at a time. The table of model ids has its own mutex.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
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

// What one model sequence occupies, per layer and in total.
template <std::size_t Layers>
struct model_memory {
  std::array<sequence_memory, Layers> layers;
  sequence_memory total;  // sums of the layers' figures
};

// What the layers' pools hold, per layer (summed over its streams) and in total.
template <std::size_t Layers>
struct model_pool_usage {
  struct usage {
    std::int64_t pages_used = 0;
    std::int64_t bytes_used = 0;      // pages in use × page bytes
    std::int64_t bytes_touched = 0;   // pages ever handed out × page bytes (at most resident)
    std::int64_t bytes_reserved = 0;  // capacity × page bytes
  };
  std::array<usage, Layers> layers;
  usage total;
};

template <class... Layers>
class model_cache {
 public:
  static constexpr std::size_t layer_count = sizeof...(Layers);
  static_assert(layer_count >= 1, "a model needs at least one layer");
  using layer_ids = std::array<sequence_id, layer_count>;

  explicit model_cache(layer_spec<Layers>... specs, std::string name = "model")
      : name_(std::move(name)),
        layers_(std::make_unique<Layers>(std::move(specs.compressors), std::move(specs.config))...) {}

  model_cache(const model_cache&) = delete;
  model_cache& operator=(const model_cache&) = delete;

  template <std::size_t I>
  auto& layer() noexcept {
    return *std::get<I>(layers_);
  }
  template <std::size_t I>
  const auto& layer() const noexcept {
    return *std::get<I>(layers_);
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
    const layer_ids old = ids(destination, "copy");
    const layer_ids forks = make_all([&](auto& cache, std::size_t l) { return cache.fork(from[l]); });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      table_.find(destination)->second = forks;  // checked above; one writer per sequence
    }
    for_each_layer([&](auto& cache, std::size_t l) { cache.free(old[l]); });
  }

  // Forgets tokens [p0, end) in every layer (llama.cpp's seq_rm(seq, p0, -1)); throws before
  // anything changes unless every layer can roll back that far (see cache_config::history).
  void remove_suffix(sequence_id id, std::int64_t p0) {
    const layer_ids in = ids(id, "remove_suffix");
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
      in = it->second;
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
      dropped.reserve(table_.size());  // the only allocation: nothing is dropped if it fails
      for (auto it = table_.begin(); it != table_.end();) {
        if (it->first == id) {
          ++it;
          continue;
        }
        dropped.push_back(it->second);
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

  // Appends one layer's new tokens (see paged_cache::append).
  template <std::size_t I>
  std::int64_t append(sequence_id id, const typename std::tuple_element_t<I, std::tuple<Layers...>>::chunks& in,
                      span<const float> window_keys = {}, span<const float> window_values = {},
                      const append_options& options = {}) {
    return layer<I>().append(ids(id, "append")[I], in, window_keys, window_values, options);
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
  // The sequence's id in layer `l` (for that layer's paged_cache and reader).
  sequence_id layer_id(sequence_id id, std::size_t l) const {
    if (l >= layer_count)
      detail::fail<input_error>(name_ + ".layer_id(layer)", l, "must be below the layer count " + std::to_string(layer_count));
    return ids(id, "layer_id")[l];
  }

  model_memory<layer_count> memory(sequence_id id) const {
    const layer_ids in = ids(id, "memory");
    model_memory<layer_count> m;
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

  model_pool_usage<layer_count> pool_usage() const {
    model_pool_usage<layer_count> u;
    for_each_layer([&](const auto& cache, std::size_t l) {
      auto& layer = u.layers[l];
      for (std::size_t k = 0; k < std::decay_t<decltype(cache)>::stream_count; ++k) {
        const page_pool& pool = cache.pool(k);
        layer.pages_used += pool.used_pages();
        layer.bytes_used += pool.bytes_used();
        layer.bytes_touched += pool.pages_touched() * pool.bytes_per_page();
        layer.bytes_reserved += pool.bytes_reserved();
      }
      u.total.pages_used += layer.pages_used;
      u.total.bytes_used += layer.bytes_used;
      u.total.bytes_touched += layer.bytes_touched;
      u.total.bytes_reserved += layer.bytes_reserved;
    });
    return u;
  }

 private:
  // Makes one sequence per layer with `make(cache, l)`; if a layer fails, the sequences made in
  // the layers before it are freed again and the failure propagates.
  template <class Make>
  layer_ids make_all(Make&& make) {
    layer_ids made;
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
      table_.emplace(id, made);
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

  [[noreturn]] void fail_unknown(sequence_id id, const char* operation) const {
    detail::fail<input_error>(name_ + "." + operation + "(sequence)", id, "is not a live sequence of this model cache");
  }

  template <class F>
  void for_each_layer(F&& f) {
    for_each_impl(f, std::index_sequence_for<Layers...>{});
  }
  template <class F>
  void for_each_layer(F&& f) const {
    for_each_impl(f, std::index_sequence_for<Layers...>{});
  }
  template <class F, std::size_t... I>
  void for_each_impl(F& f, std::index_sequence<I...>) {
    (f(*std::get<I>(layers_), I), ...);
  }
  template <class F, std::size_t... I>
  void for_each_impl(F& f, std::index_sequence<I...>) const {
    (f(static_cast<const std::tuple_element_t<I, std::tuple<Layers...>>&>(*std::get<I>(layers_)), I), ...);
  }

  std::string name_;
  std::tuple<std::unique_ptr<Layers>...> layers_;
  mutable std::mutex mutex_;
  std::unordered_map<sequence_id, layer_ids> table_;
  sequence_id tag_ = detail::next_sequence_tag();  // distinct from every layer's tag
  sequence_id next_ = 0;
};

}  // namespace phasekv
