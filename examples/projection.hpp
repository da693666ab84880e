#pragma once
// A helper for the examples, whose hosts have no projections of their own (an engine runs its
// model's; the engine headers need no linear algebra): applies the
// payload maps C_v and gate maps Z_v of every head and view to a batch of hidden states with
// one GEMM each, producing a token_chunk's buffers in the layout stream_config.hpp describes.
//
//   payload[t][h][v][:] = C_{h,v} · hidden[t]      logits[t][h][v][:] = Z_{h,v} · hidden[t]
//
// The maps are stored stacked, rows in exactly that [h][v][channel] order, so the product
// hidden · mapᵀ is already the chunk layout.

#include <cstdint>
#include <string>
#include <vector>

#include <phasekv/detail/simd/intrinsics.hpp>  // before Eigen, which includes the intrinsics too
#include <Eigen/Core>

#include <phasekv/compress/stream_compressor.hpp>
#include <phasekv/core/error.hpp>

namespace phasekv_examples {

using phasekv::span;
using phasekv::token_chunk;
using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

class stream_projection {
 public:
  stream_projection() = default;
  // payload_map: (kv_heads·views·channels) × hidden; gate_map: (kv_heads·views·gate_channels)
  // × hidden, or empty for pooling without gates.
  stream_projection(Eigen::MatrixXf payload_map, Eigen::MatrixXf gate_map)
      : payload_map_(std::move(payload_map)), gate_map_(std::move(gate_map)) {
    phasekv::detail::require(gate_map_.size() == 0 || gate_map_.cols() == payload_map_.cols(), "projection.gate_map.cols()",
                    gate_map_.cols(), "must equal payload_map.cols() = " + std::to_string(payload_map_.cols()));
  }

  // Random maps of the right shape for a compressor (for demos and tests), entries N(0, scale²).
  template <class Compressor, class Rng>
  static stream_projection random(const Compressor& c, std::int64_t hidden, Rng& rng, float scale) {
    auto fill = [&](Eigen::Index rows) {
      Eigen::MatrixXf m(rows, hidden);
      for (Eigen::Index k = 0; k < m.size(); ++k) m.data()[k] = scale * rng();
      return m;
    };
    return stream_projection(fill(c.payload_floats_per_token()), fill(c.logit_floats_per_token()));
  }

  std::int64_t hidden() const noexcept { return payload_map_.cols(); }

  // Projects hidden (tokens × hidden, row-major) into payload and logits (resized to fit) and
  // returns the chunk that views them.
  template <class Compressor>
  token_chunk project(const Compressor& c, const row_matrix& hidden, std::vector<float>& payload,
                      std::vector<float>& logits) const {
    using phasekv::detail::require;
    using phasekv::input_error;
    require<input_error>(hidden.cols() == this->hidden(), "projection: hidden.cols()", hidden.cols(),
                         "must equal the maps' hidden size " + std::to_string(this->hidden()));
    require<input_error>(payload_map_.rows() == c.payload_floats_per_token(), "projection.payload_map.rows()",
                         payload_map_.rows(),
                         "must equal the compressor's payload floats per token " +
                             std::to_string(c.payload_floats_per_token()));
    require<input_error>(gate_map_.rows() == c.logit_floats_per_token(), "projection.gate_map.rows()", gate_map_.rows(),
                         "must equal the compressor's logit floats per token " + std::to_string(c.logit_floats_per_token()));
    const Eigen::Index n = hidden.rows();
    payload.resize(static_cast<std::size_t>(n * payload_map_.rows()));
    Eigen::Map<row_matrix>(payload.data(), n, payload_map_.rows()).noalias() = hidden * payload_map_.transpose();
    logits.resize(static_cast<std::size_t>(n * gate_map_.rows()));
    if (gate_map_.rows() > 0)
      Eigen::Map<row_matrix>(logits.data(), n, gate_map_.rows()).noalias() = hidden * gate_map_.transpose();
    token_chunk chunk;
    chunk.tokens = n;
    chunk.payload = span<const float>(payload.data(), payload.size());
    chunk.logits = span<const float>(logits.data(), logits.size());
    return chunk;
  }

 private:
  Eigen::MatrixXf payload_map_;
  Eigen::MatrixXf gate_map_;
};

}  // namespace phasekv_examples
