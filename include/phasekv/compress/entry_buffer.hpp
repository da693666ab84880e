#pragma once
// A sink that keeps every entry it is given, in plain vectors: for tests, examples and hosts
// that want the entries in one place before storing them elsewhere.

#include <cstdint>
#include <vector>

#include "phasekv/compress/stream_compressor.hpp"

namespace phasekv {

class entry_buffer {
 public:
  void operator()(const entry_view& e) {
    if (indices_.empty()) {
      floats_per_entry_ = e.kv_heads * e.channels;
      weights_per_entry_ = e.kv_heads * e.window;
    }
    indices_.push_back(e.index);
    anchors_.push_back(e.anchor);
    values_.insert(values_.end(), e.values, e.values + floats_per_entry_);
    if (e.slot_weights) slot_weights_.insert(slot_weights_.end(), e.slot_weights, e.slot_weights + weights_per_entry_);
  }

  std::size_t size() const noexcept { return indices_.size(); }
  bool empty() const noexcept { return indices_.empty(); }
  void clear() noexcept {
    indices_.clear();
    anchors_.clear();
    values_.clear();
    slot_weights_.clear();
  }

  std::int64_t index(std::size_t k) const { return indices_.at(k); }
  std::int64_t anchor(std::size_t k) const { return anchors_.at(k); }
  // [kv_heads][channels] of the k-th entry received.
  const float* values(std::size_t k) const { return values_.data() + k * floats_per_entry_; }
  // [kv_heads][window], or null when the entries came without slot weights.
  const float* slot_weights(std::size_t k) const {
    return slot_weights_.empty() ? nullptr : slot_weights_.data() + k * weights_per_entry_;
  }
  const std::vector<float>& all_values() const noexcept { return values_; }
  const std::vector<float>& all_slot_weights() const noexcept { return slot_weights_; }
  std::int64_t floats_per_entry() const noexcept { return floats_per_entry_; }

 private:
  std::vector<std::int64_t> indices_;
  std::vector<std::int64_t> anchors_;
  std::vector<float> values_;
  std::vector<float> slot_weights_;
  std::int64_t floats_per_entry_ = 0;
  std::int64_t weights_per_entry_ = 0;
};

}  // namespace phasekv
