#pragma once
// The model front door as the conformance kit's subject: the layer under test becomes the one layer
// of a model_cache (models/model_cache.hpp) — its kind built from the compressors' policies,
// parameters and pooling instances and the cache config — and every operation the kit makes goes
// through the front door (a step per append, model snapshots), so the kit's properties hold the
// front door to what they hold paged_cache to.
//
//   layer_under_test<kv, ix> layer(compressors, cache, reader);
//   layer.subject = model_subject_factory<kv, ix>();
//   report r = check(layer);
//
// The cache config's page size, page count (per kind), history, window and storage carry over;
// its host memory and shared pools do not (a model has one allocator per kind).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "phasekv/compress/pooling_registry.hpp"
#include "phasekv/models/layer_kind.hpp"
#include "phasekv/models/model_cache.hpp"
#include "phasekv/models/model_snapshot.hpp"
#include "phasekv/testing/subject.hpp"

namespace phasekv::testing {

namespace model_subject_detail {

template <class Compressor>
stream_spec spec_of(const Compressor& c, storage_type storage) {
  using policy = typename Compressor::policy;
  using pooling = typename policy::pooling;
  stream_spec s;
  s.config = c.config();
  s.storage = storage;
  s.rope = std::is_same_v<typename policy::rope, rope_after_pool>    ? rope_placement::after_pool
           : std::is_same_v<typename policy::rope, rope_before_pool> ? rope_placement::before_pool
                                                                     : rope_placement::none;
  s.norm = has_norm_v<policy> ? entry_norm::rms : entry_norm::none;
  if constexpr (is_custom_pool_v<pooling>) s.pooling = pooling::name;
  else if constexpr (std::is_same_v<pooling, mean_pool>) s.pooling = "mean";
  else if constexpr (std::is_same_v<pooling, vector_gated_pool>) s.pooling = "vector_gates";
  else if constexpr (std::is_same_v<pooling, scalar_gated_pool>) s.pooling = "scalar_gates";
  else s.pooling = "fixed_weights";
  return s;
}

// A host's pooling with this compressor's instance (its weights), under its own name.
template <class Compressor>
void register_pooling(const Compressor& c, pooling_registry& poolings) {
  using pooling = typename Compressor::policy::pooling;
  if constexpr (is_custom_pool_v<pooling>) {
    if (poolings.contains(pooling::name)) return;
    const pooling instance = c.pool();
    poolings.add<pooling>(pooling::name, [instance](std::size_t) { return instance; });
  } else {
    (void)c;
    (void)poolings;
  }
}

}  // namespace model_subject_detail

template <class... Compressors>
class model_subject final : public cache_subject<paged_cache<Compressors...>> {
  using base = cache_subject<paged_cache<Compressors...>>;

 public:
  using typename base::append_item;
  using typename base::chunks;
  using typename base::layer;

  model_subject(const layer& compressors, const cache_config& config)
      : base(compressors, config),
        poolings_(poolings_of(compressors, std::index_sequence_for<Compressors...>{})),
        model_(spec_of(compressors, config, std::index_sequence_for<Compressors...>{}), options_of(config), poolings_) {}

  // ---- operations: the front door ------------------------------------------------------------
  sequence_id create() override { return model_.create(); }
  void append(sequence_id s, const chunks& in, span<const float> window_keys, span<const float> window_values) override {
    model_step step = model_.begin({s}, in[0].tokens);
    const layer_append row{span<const token_chunk>(in.data(), in.size()), window_keys, window_values};
    step.append(0, {row});
    step.commit();
  }
  void append_batch(span<const append_item> items) override {
    std::vector<sequence_id> ids;
    std::vector<std::int64_t> tokens;
    std::vector<layer_append> rows;
    for (const append_item& it : items) {
      ids.push_back(it.seq);
      tokens.push_back(it.in[0].tokens);
      rows.push_back({span<const token_chunk>(it.in.data(), it.in.size()), it.window_keys, it.window_values});
    }
    model_step step = model_.begin(span<const sequence_id>(ids.data(), ids.size()), span<const std::int64_t>(tokens.data(), tokens.size()));
    step.append(0, span<const layer_append>(rows.data(), rows.size()));
    step.commit();
  }
  sequence_id fork(sequence_id parent) override { return model_.fork(parent); }
  void copy(sequence_id source, sequence_id destination) override { model_.copy(source, destination); }
  void remove_suffix(sequence_id s, std::int64_t p0) override { model_.remove_suffix(s, p0); }
  void keep(sequence_id s) override { model_.keep(s); }
  void free(sequence_id s) override { model_.free(s); }
  std::vector<std::byte> snapshot(sequence_id s) override { return phasekv::snapshot(model_, s); }
  sequence_id restore(span<const std::byte> bytes) override { return phasekv::restore(model_, bytes); }

  // ---- observations --------------------------------------------------------------------------
  std::int64_t tokens(sequence_id s) const override { return model_.tokens(s); }
  std::int64_t entries(sequence_id s, std::size_t) const override {
    return this->cache_.compressors().geom().completed_entries(model_.tokens(s));
  }
  span<const std::byte> entry_bytes(sequence_id s, std::size_t stream, std::int64_t j) const override {
    return model_.entry_bytes(0, stream, s, j);
  }
  void read_entry(sequence_id s, std::size_t stream, std::int64_t j, float* out) const override {
    const stream_shape& st = model_.shape(0).streams.at(stream);
    model_.read_entry(0, stream, s, j, span<float>(out, static_cast<std::size_t>(st.kv_heads * st.channels)));
  }
  std::int64_t window_first(sequence_id s) const override { return model_.window_first(0, s); }
  void copy_window_key(sequence_id s, std::int64_t t, span<float> out) const override { model_.copy_window_key(0, s, t, out); }
  void copy_window_value(sequence_id s, std::int64_t t, span<float> out) const override {
    model_.copy_window_value(0, s, t, out);
  }
  const stream_state& state(sequence_id s, std::size_t stream) const override {
    // A copy the model made (rolled back as the sequence sees it), kept until asked again.
    return states_[{s, stream}] = model_.state(0, stream, s);
  }
  sequence_view view_of(sequence_id s) const override { return model_.view(0, s); }
  std::int64_t window_rows() const override {
    const raw_window_config& w = model_.shape(0).window;
    return w.tokens > 0 ? w.tokens + model_.options().history : 0;
  }
  std::int64_t pages_used(std::size_t) const override { return model_.pool_usage().kinds[0].pages_used; }

  const model_cache& model() const noexcept { return model_; }

 private:
  // The layer as the one layer of a model: no reader (the kit reads the views with its own).
  template <std::size_t... K>
  static model_spec spec_of(const layer& compressors, const cache_config& config, std::index_sequence<K...>) {
    const auto storage = [&](std::size_t k) { return config.stream_storage.empty() ? config.storage : config.stream_storage[k]; };
    model_spec spec;
    spec.name = config.name;
    layer_kind kind;
    kind.name = config.name;
    kind.geom = compressors.geom();
    kind.window = config.window;
    kind.page_size = config.page_size;
    kind.reader.query_heads = 0;
    (kind.streams.push_back(model_subject_detail::spec_of(compressors.template stream<K>(), storage(K))), ...);
    model_layer only;
    (only.params.push_back(compressors.template stream<K>().params()), ...);
    spec.kinds.push_back(std::move(kind));
    spec.layers.push_back(std::move(only));
    return spec;
  }
  template <std::size_t... K>
  static pooling_registry poolings_of(const layer& compressors, std::index_sequence<K...>) {
    pooling_registry r = pooling_registry::builtins();
    (model_subject_detail::register_pooling(compressors.template stream<K>(), r), ...);
    return r;
  }
  static model_options options_of(const cache_config& config) {
    model_options o;
    o.pages = config.pages;
    o.history = config.history;
    return o;
  }
  pooling_registry poolings_;
  model_cache model_;
  mutable std::map<std::pair<sequence_id, std::size_t>, stream_state> states_;
};

// A layer_under_test::subject that runs the kit through the model front door.
template <class... Compressors>
auto model_subject_factory() {
  return [](const layer_compressor<Compressors...>& compressors, const cache_config& config)
             -> std::unique_ptr<cache_subject<paged_cache<Compressors...>>> {
    return std::make_unique<model_subject<Compressors...>>(compressors, config);
  };
}

}  // namespace phasekv::testing
