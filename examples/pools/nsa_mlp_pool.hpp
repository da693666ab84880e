#pragma once
// NSA's compressor (Native Sparse Attention, 2025) as a pooling policy of the host's
// (compress/policies.hpp, "Your own pooling"): a block's rows, each with an intra-block
// position embedding, through a two-layer MLP:
//
//   z = [x_{j,0} + e_0, …, x_{j,W−1} + e_{W−1}]          (W·C; a padding slot contributes 0)
//   K̂_j = W2 · ReLU(W1 · z + b1) + b2                    (W1: D × W·C, W2: C × D)
//
// shared by every KV head. The weights come from the host (its checkpoint); parameters() makes
// them part of the snapshot identity, so a snapshot restores only under the same weights.

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <phasekv/compress/policies.hpp>
#include <phasekv/core/span.hpp>

namespace phasekv_examples {

class nsa_mlp_pool {
 public:
  static constexpr const char* name = "nsa_mlp";
  static constexpr std::uint32_t version = 1;
  static constexpr std::int64_t gate_channels(std::int64_t) { return 0; }

  nsa_mlp_pool() = default;
  // position [W][C], w1 [D][W·C], b1 [D], w2 [C][D], b2 [C], row-major.
  nsa_mlp_pool(std::int64_t window, std::int64_t channels, std::int64_t hidden, std::vector<float> position,
               std::vector<float> w1, std::vector<float> b1, std::vector<float> w2, std::vector<float> b2)
      : window_(window), channels_(channels), hidden_(hidden) {
    auto need = [](const std::vector<float>& v, std::int64_t n, const char* what) {
      if (static_cast<std::int64_t>(v.size()) != n)
        throw std::invalid_argument(std::string("nsa_mlp_pool: ") + what + ".size() = " + std::to_string(v.size()) +
                                    ": must be " + std::to_string(n));
    };
    need(position, window * channels, "position");
    need(w1, hidden * window * channels, "w1");
    need(b1, hidden, "b1");
    need(w2, channels * hidden, "w2");
    need(b2, channels, "b2");
    for (auto* part : {&position, &w1, &b1, &w2, &b2}) weights_.insert(weights_.end(), part->begin(), part->end());
  }

  phasekv::span<const float> parameters() const { return phasekv::span<const float>(weights_.data(), weights_.size()); }

  // For phasekv::bench's floor: the two layers' multiply-adds (2 FLOPs each), D·W·C and C·D, plus
  // the position embedding's and biases' additions, for one entry of one KV head.
  double flops_per_entry(std::int64_t window, std::int64_t channels) const {
    const double in = static_cast<double>(window) * static_cast<double>(channels), d = static_cast<double>(hidden_);
    return 2.0 * d * in + 2.0 * static_cast<double>(channels) * d + in + d + static_cast<double>(channels);
  }

  void pool(const phasekv::window_rows& w, float* out) const {
    if (w.window != window_ || w.channels != channels_)
      throw std::invalid_argument("nsa_mlp_pool: built for W = " + std::to_string(window_) + ", C = " +
                                  std::to_string(channels_) + ", used with W = " + std::to_string(w.window) +
                                  ", C = " + std::to_string(w.channels));
    const float* position = weights_.data();
    const float* w1 = position + window_ * channels_;
    const float* b1 = w1 + hidden_ * window_ * channels_;
    const float* w2 = b1 + hidden_;
    const float* b2 = w2 + channels_ * hidden_;
    const std::int64_t in = window_ * channels_;
    std::vector<float>& z = scratch();
    z.assign(static_cast<std::size_t>(in + hidden_), 0.0f);
    for (std::int64_t k = 0; k < w.count(); ++k)
      for (std::int64_t c = 0; c < channels_; ++c)
        z[static_cast<std::size_t>(w.slot(k) * channels_ + c)] = w.payload[k][c] + position[w.slot(k) * channels_ + c];
    float* h = z.data() + in;
    for (std::int64_t d = 0; d < hidden_; ++d) {
      float s = b1[d];
      for (std::int64_t i = 0; i < in; ++i) s += w1[d * in + i] * z[static_cast<std::size_t>(i)];
      h[d] = std::max(s, 0.0f);
    }
    for (std::int64_t c = 0; c < channels_; ++c) {
      float s = b2[c];
      for (std::int64_t d = 0; d < hidden_; ++d) s += w2[c * hidden_ + d] * h[d];
      out[c] = s;
    }
  }

 private:
  // Working memory per thread: pool() is const and may run for several sequences at once
  // (append_batch), so it keeps nothing between calls.
  static std::vector<float>& scratch() {
    thread_local std::vector<float> z;
    return z;
  }

  std::int64_t window_ = 0, channels_ = 0, hidden_ = 0;
  std::vector<float> weights_;  // position, w1, b1, w2, b2
};

}  // namespace phasekv_examples
