#pragma once
// What the conformance kit (conformance.hpp) drives: a layer's cache as a host uses it. By default
// phasekv's own paged_cache; a host that wraps the cache in its own layer — a sequence table of its
// own, lazy forks, a micro-batching append, snapshots through its own transport — derives from
// cache_subject, overrides what it changes, and hands the kit a factory for it
// (layer_under_test::subject), so the kit checks the host's integration, not only phasekv.
//
// Every operation is llama.cpp's vocabulary as paged_cache names it (create, append, fork, copy,
// remove_suffix, keep, free, snapshot, restore); every observation is what a later append or read
// depends on (entries as stored, window rows, the compressor states, a view for the reader). The
// kit compares observations of a sequence that went through operations with those of a sequence
// that never did, bit for bit.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot.hpp"
#include "phasekv/core/span.hpp"

namespace phasekv::testing {

template <class Cache>
class cache_subject {
 public:
  using cache_type = Cache;
  using layer = typename Cache::layer;
  using chunks = typename Cache::chunks;
  using append_item = typename Cache::append_item;
  static constexpr std::size_t stream_count = Cache::stream_count;

  cache_subject(const layer& compressors, const cache_config& config) : cache_(compressors, config) {}
  virtual ~cache_subject() = default;
  cache_subject(const cache_subject&) = delete;
  cache_subject& operator=(const cache_subject&) = delete;

  // ---- operations ------------------------------------------------------------------------------
  virtual sequence_id create() { return cache_.create(); }
  virtual void append(sequence_id s, const chunks& in, span<const float> window_keys, span<const float> window_values) {
    cache_.append(s, in, window_keys, window_values);
  }
  // Every item's sequence is distinct (paged_cache::append_batch).
  virtual void append_batch(span<const append_item> items) { cache_.append_batch(items); }
  virtual sequence_id fork(sequence_id parent) { return cache_.fork(parent); }
  virtual void copy(sequence_id source, sequence_id destination) { cache_.copy(source, destination); }
  virtual void remove_suffix(sequence_id s, std::int64_t p0) { cache_.remove_suffix(s, p0); }
  virtual void keep(sequence_id s) { cache_.keep(s); }
  virtual void free(sequence_id s) { cache_.free(s); }
  virtual std::vector<std::byte> snapshot(sequence_id s) { return phasekv::snapshot(cache_, s); }
  virtual sequence_id restore(span<const std::byte> bytes) { return phasekv::restore(cache_, bytes); }

  // ---- observations ----------------------------------------------------------------------------
  virtual std::int64_t tokens(sequence_id s) const { return cache_.tokens(s); }
  virtual std::int64_t entries(sequence_id s, std::size_t stream) const { return cache_.entries(s, stream); }
  virtual span<const std::byte> entry_bytes(sequence_id s, std::size_t stream, std::int64_t j) const {
    return cache_.entry_bytes(s, stream, j);
  }
  virtual void read_entry(sequence_id s, std::size_t stream, std::int64_t j, float* out) const {
    cache_.read_entry(s, stream, j, out);
  }
  virtual std::int64_t window_first(sequence_id s) const { return cache_.window_first(s); }
  virtual void copy_window_key(sequence_id s, std::int64_t t, span<float> out) const { cache_.copy_window_key(s, t, out); }
  virtual void copy_window_value(sequence_id s, std::int64_t t, span<float> out) const {
    cache_.copy_window_value(s, t, out);
  }
  virtual const stream_state& state(sequence_id s, std::size_t stream) const { return cache_.state(s, stream); }
  // The sequence's pages and window for the reader (valid until the sequence is next written).
  virtual sequence_view view_of(sequence_id s) const { return cache_.view_of(s); }
  // For the kit's coverage: the raw window ring's rows, and the pages stream k's sequences hold.
  virtual std::int64_t window_rows() const { return cache_.window_rows(); }
  virtual std::int64_t pages_used(std::size_t stream) const { return cache_.pool(stream).used_pages(); }

  const Cache& cache() const noexcept { return cache_; }
  Cache& cache() noexcept { return cache_; }
  layer_shape shape() const { return cache_.shape(); }

 protected:
  Cache cache_;
};

}  // namespace phasekv::testing
