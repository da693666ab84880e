#pragma once
// Max pooling as a pooling policy of the host's (compress/policies.hpp, "Your own pooling"):
//
//   K̂_j[c] = max over the real slots i of x_{j,i}[c]
//
// Its per-slot weights (for write profiles): the share of channels whose maximum slot i holds
// (ties to the earlier slot), so they sum to 1 over the real slots as the built-ins' do.

#include <cstdint>

#include <phasekv/compress/policies.hpp>

namespace phasekv_examples {

struct max_pool {
  static constexpr const char* name = "max";
  static constexpr std::uint32_t version = 1;
  static constexpr std::int64_t gate_channels(std::int64_t) { return 0; }  // reads no logits

  // For phasekv::bench's floor: one comparison per slot and channel (priced as a FLOP).
  double flops_per_entry(std::int64_t window, std::int64_t channels) const {
    return static_cast<double>(window) * static_cast<double>(channels);
  }

  void pool(const phasekv::window_rows& w, float* out) const {
    const std::int64_t n = w.count(), c_count = w.channels;
    for (std::int64_t c = 0; c < c_count; ++c) {
      std::int64_t best = 0;
      for (std::int64_t k = 1; k < n; ++k)
        if (w.payload[k][c] > w.payload[best][c]) best = k;
      out[c] = w.payload[best][c];
      if (w.slot_weights) w.slot_weights[best] += 1.0f / static_cast<float>(c_count);
    }
  }
};

}  // namespace phasekv_examples
