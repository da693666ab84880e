#pragma once
// Bugs planted on purpose, for tests/test_testing_kit.cpp to show that the conformance kit
// (phasekv/testing/conformance.hpp) finds each with a useful report. Each is a mistake a host can
// make in its own code around phasekv — a pooling of its own, or the layer it wraps the cache in —
// and none touches the library.
//
//   leaky_mean_pool    a state leak between chunks: mean pooling through an accumulator that is
//                      cleared only when entry 0 starts ("a new sequence begins"), so whatever was
//                      pooled last — another sequence's entry in the same micro-batch — leaks in.
//   short_mean_pool    an off-by-one window: mean pooling whose loop starts at the second row once
//                      the window is full, so every full entry pools W − 1 tokens.
//   lazy_fork_subject  a copy-on-write hole: a host sequence table whose fork() only aliases the
//                      parent and makes the real fork when the fork is first written — but not when
//                      the parent is, so the parent's writes show through the fork.

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <phasekv/compress/policies.hpp>
#include <phasekv/testing/oracle.hpp>
#include <phasekv/testing/subject.hpp>

namespace phasekv_test::planted {

struct leaky_mean_pool {
  static constexpr const char* name = "leaky_mean";
  static constexpr std::uint32_t version = 1;
  static constexpr std::int64_t gate_channels(std::int64_t) { return 0; }

  mutable std::vector<float> sum;  // meant to be cleared for every entry
  mutable std::int64_t rows = 0;

  void pool(const phasekv::window_rows& w, float* out) const {
    if (w.entry == 0 || static_cast<std::int64_t>(sum.size()) != w.channels) {  // the bug: only here
      sum.assign(static_cast<std::size_t>(w.channels), 0.0f);
      rows = 0;
    }
    for (std::int64_t k = 0; k < w.count(); ++k)
      for (std::int64_t c = 0; c < w.channels; ++c) sum[static_cast<std::size_t>(c)] += w.payload[k][c];
    rows += w.count();
    for (std::int64_t c = 0; c < w.channels; ++c) out[c] = sum[static_cast<std::size_t>(c)] / static_cast<float>(rows);
  }
};

struct short_mean_pool {
  static constexpr const char* name = "short_mean";
  static constexpr std::uint32_t version = 1;
  static constexpr std::int64_t gate_channels(std::int64_t) { return 0; }

  void pool(const phasekv::window_rows& w, float* out) const {
    const std::int64_t first = w.first_slot == 0 && w.count() > 1 ? 1 : 0;  // the bug: 1 instead of 0
    for (std::int64_t c = 0; c < w.channels; ++c) {
      float s = 0.0f;
      for (std::int64_t k = first; k < w.count(); ++k) s += w.payload[k][c];
      out[c] = s / static_cast<float>(w.count() - first);
    }
  }
};

// What both pools claim to compute: the mean of the window's real rows, in double.
inline phasekv::testing::pooled_head mean_oracle(const phasekv::testing::oracle_window& w) {
  phasekv::testing::pooled_head p;
  p.values.assign(static_cast<std::size_t>(w.channels), 0.0);
  for (const auto& row : w.payload)
    for (std::int64_t c = 0; c < w.channels; ++c) p.values[static_cast<std::size_t>(c)] += row[static_cast<std::size_t>(c)];
  for (double& v : p.values) v /= static_cast<double>(w.count());
  return p;
}

template <class Cache>
class lazy_fork_subject : public phasekv::testing::cache_subject<Cache> {
  using base = phasekv::testing::cache_subject<Cache>;
  using base::cache_;

 public:
  using typename base::append_item;
  using typename base::chunks;
  using typename base::layer;
  lazy_fork_subject(const layer& l, const phasekv::cache_config& c) : base(l, c) {}

  phasekv::sequence_id create() override { return own(cache_.create()); }
  phasekv::sequence_id fork(phasekv::sequence_id parent) override {
    const phasekv::sequence_id handle = next_++;
    table_[handle] = {table_.at(parent).id, true};  // an alias until the fork is written
    return handle;
  }
  void append(phasekv::sequence_id s, const chunks& in, phasekv::span<const float> k, phasekv::span<const float> v) override {
    cache_.append(writable(s), in, k, v);  // the hole: aliases of s are not made real first
  }
  void append_batch(phasekv::span<const append_item> items) override {
    std::vector<append_item> mapped(items.begin(), items.end());
    for (append_item& it : mapped) it.seq = writable(it.seq);
    cache_.append_batch(phasekv::span<const append_item>(mapped));
  }
  void copy(phasekv::sequence_id source, phasekv::sequence_id destination) override {
    cache_.copy(table_.at(source).id, writable(destination));
  }
  void remove_suffix(phasekv::sequence_id s, std::int64_t p0) override { cache_.remove_suffix(writable(s), p0); }
  void keep(phasekv::sequence_id s) override {
    const phasekv::sequence_id id = writable(s);
    cache_.keep(id);
    for (auto it = table_.begin(); it != table_.end();) it = it->second.id == id ? std::next(it) : table_.erase(it);
  }
  void free(phasekv::sequence_id s) override {
    const entry e = table_.at(s);
    table_.erase(s);
    if (!e.alias) cache_.free(e.id);
  }
  std::vector<std::byte> snapshot(phasekv::sequence_id s) override { return phasekv::snapshot(cache_, table_.at(s).id); }
  phasekv::sequence_id restore(phasekv::span<const std::byte> bytes) override { return own(phasekv::restore(cache_, bytes)); }

  std::int64_t tokens(phasekv::sequence_id s) const override { return cache_.tokens(table_.at(s).id); }
  std::int64_t entries(phasekv::sequence_id s, std::size_t k) const override { return cache_.entries(table_.at(s).id, k); }
  phasekv::span<const std::byte> entry_bytes(phasekv::sequence_id s, std::size_t k, std::int64_t j) const override {
    return cache_.entry_bytes(table_.at(s).id, k, j);
  }
  void read_entry(phasekv::sequence_id s, std::size_t k, std::int64_t j, float* out) const override {
    cache_.read_entry(table_.at(s).id, k, j, out);
  }
  std::int64_t window_first(phasekv::sequence_id s) const override { return cache_.window_first(table_.at(s).id); }
  void copy_window_key(phasekv::sequence_id s, std::int64_t t, phasekv::span<float> out) const override {
    cache_.copy_window_key(table_.at(s).id, t, out);
  }
  void copy_window_value(phasekv::sequence_id s, std::int64_t t, phasekv::span<float> out) const override {
    cache_.copy_window_value(table_.at(s).id, t, out);
  }
  const phasekv::stream_state& state(phasekv::sequence_id s, std::size_t k) const override {
    return cache_.state(table_.at(s).id, k);
  }
  phasekv::sequence_view view_of(phasekv::sequence_id s) const override { return cache_.view_of(table_.at(s).id); }

 private:
  struct entry {
    phasekv::sequence_id id;  // the cache's sequence
    bool alias;               // shares it with the sequence it was forked from
  };
  phasekv::sequence_id own(phasekv::sequence_id id) {
    const phasekv::sequence_id handle = next_++;
    table_[handle] = {id, false};
    return handle;
  }
  // The cache sequence a write to `s` goes to: a fork is made real on its first write.
  phasekv::sequence_id writable(phasekv::sequence_id s) {
    entry& e = table_.at(s);
    if (e.alias) e = {cache_.fork(e.id), false};
    return e.id;
  }

  std::map<phasekv::sequence_id, entry> table_;
  phasekv::sequence_id next_ = 1;
};

}  // namespace phasekv_test::planted
