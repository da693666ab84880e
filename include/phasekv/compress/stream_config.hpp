#pragma once
// What one compressed stream looks like: its shape, how the host hands over its
// inputs, and the learned or static parameters of its pooling. The pooling/RoPE/norm choices
// themselves are compile-time policies (policies.hpp); this is everything that is a number.
//
// Input layout of one chunk of n tokens (row-major, token-major — what a GEMM of hidden states
// against stacked projections produces):
//   payload[n][kv_heads][views][channels]        x = C_v · h
//   logits [n][kv_heads][views][gate_channels]   s = Z_v · h   (gated pooling only)
// where views = branches (one per branch, DeepSeek-V4) or window (one per slot, the general
// form), and slot i of an entry reads view branch_of_slot(i) or i accordingly.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/compress/policies.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/rope.hpp"

namespace phasekv {

enum class input_layout {
  per_branch,  // one payload/logit view per branch, shared by the slots of that branch
  per_slot,    // one view per slot
};

// How the reader uses a stream. The writer treats all roles alike.
enum class stream_role {
  key,        // keys, with their own gates
  value,      // values, with their own gates
  key_value,  // tied K/V: one stream read as both (DeepSeek-V4)
  indexer,    // indexer keys, used only to score entries for top-k selection
};

struct stream_config {
  std::string name = "stream";  // used in error messages
  stream_role role = stream_role::key_value;
  std::int64_t channels = 0;    // channels per entry and head
  std::int64_t kv_heads = 1;
  input_layout inputs = input_layout::per_branch;
  rope_config rope;             // read only by policies with RoPE; ignored (never validated) otherwise
  double norm_eps = 1e-6;       // read only by rms_norm

  // What holds for every policy and geometry (validate_stream checks the rest); throws
  // config_error naming the field.
  void validate() const {
    using detail::require;
    require(channels >= 1 && channels <= limits::max_channels, name + ".channels", channels, "must lie in [1, 2^20]");
    require(kv_heads >= 1 && kv_heads <= limits::max_heads, name + ".kv_heads", kv_heads, "must lie in [1, 2^16]");
    require(inputs == input_layout::per_branch || inputs == input_layout::per_slot, name + ".inputs",
            static_cast<int>(inputs), "is not an input_layout");
    require(role == stream_role::key || role == stream_role::value || role == stream_role::key_value ||
                role == stream_role::indexer,
            name + ".role", static_cast<int>(role), "is not a stream_role");
  }
};

// Learned or static parameters. Empty vectors take the documented default.
struct stream_params {
  std::vector<float> slot_bias;     // gated: [kv_heads][window][gate_channels]; empty = zeros
  std::vector<float> norm_weight;   // rms_norm: [channels]; empty = ones
  std::vector<float> slot_profile;  // fixed_weight_pool: [window], finite, ≥ 0, positive sum
};

// Views per token for a layout over a geometry.
inline std::int64_t views_per_token(input_layout layout, const geometry& geom) noexcept {
  return layout == input_layout::per_branch ? geom.branches() : geom.window;
}

namespace detail {

inline void require_finite(const std::vector<float>& values, const std::string& field) {
  for (std::size_t i = 0; i < values.size(); ++i)
    require(std::isfinite(values[i]), field + "[" + std::to_string(i) + "]", values[i], "must be finite");
}

inline void require_size(const std::vector<float>& values, std::size_t expected, const std::string& field,
                         const std::string& shape) {
  if (values.size() != expected)
    fail(field + ".size()", values.size(), "must be " + std::to_string(expected) + " (" + shape + ")");
}

}  // namespace detail

// Validates a stream for a policy over a geometry; throws config_error naming the field.
template <class Policy>
void validate_stream(const geometry& geom, const stream_config& config, const stream_params& params) {
  using detail::require;
  geom.validate();
  const std::string& n = config.name;
  config.validate();
  // Every per-token size the compressor derives is at most this product (vector gates have as
  // many logits as channels), so checking it once keeps all of them in range.
  detail::checked_product(config.channels, config.kv_heads * views_per_token(config.inputs, geom),
                          limits::max_floats_per_token, n + ".channels", config.channels,
                          "the floats one token hands over (kv_heads × views × channels)");

  if constexpr (has_rope_v<Policy>) {
    config.rope.validate(n + ".rope", config.channels);
    require(config.rope.channels >= 2, n + ".rope.channels", config.rope.channels,
            "must be at least 2 for a policy with RoPE");
  }

  using pooling = typename Policy::pooling;
  const auto heads = static_cast<std::size_t>(config.kv_heads);
  const auto window = static_cast<std::size_t>(geom.window);
  if constexpr (is_custom_pool_v<pooling>) {
    require(params.slot_bias.empty(), n + ".slot_bias.size()", params.slot_bias.size(),
            std::string("must be 0: the pooling policy '") + pooling::name + "' keeps its own parameters");
  } else if constexpr (is_gated_v<pooling>) {
    if (!params.slot_bias.empty()) {
      const auto gates = static_cast<std::size_t>(gate_channels<pooling>(config.channels));
      detail::require_size(params.slot_bias, heads * window * gates, n + ".slot_bias",
                           "kv_heads × window × gate channels");
      detail::require_finite(params.slot_bias, n + ".slot_bias");
    }
  } else {
    require(params.slot_bias.empty(), n + ".slot_bias.size()", params.slot_bias.size(),
            "must be 0: this pooling policy has no gates");
  }

  if constexpr (has_norm_v<Policy>) {
    require(std::isfinite(config.norm_eps) && config.norm_eps > 0.0, n + ".norm_eps", config.norm_eps,
            "must be finite and positive");
    if (!params.norm_weight.empty()) {
      detail::require_size(params.norm_weight, static_cast<std::size_t>(config.channels), n + ".norm_weight",
                           "channels");
      detail::require_finite(params.norm_weight, n + ".norm_weight");
    }
  } else {
    require(params.norm_weight.empty(), n + ".norm_weight.size()", params.norm_weight.size(),
            "must be 0: this policy has no RMSNorm");
  }

  if constexpr (std::is_same_v<pooling, fixed_weight_pool>) {
    detail::require_size(params.slot_profile, window, n + ".slot_profile", "window");
    double sum = 0.0;
    for (std::size_t i = 0; i < window; ++i) {
      const float p = params.slot_profile[i];
      require(std::isfinite(p) && p >= 0.0f, n + ".slot_profile[" + std::to_string(i) + "]", p,
              "must be finite and non-negative");
      sum += p;
    }
    require(sum > 0.0, n + ".slot_profile (sum)", sum, "must be positive");
  } else {
    require(params.slot_profile.empty(), n + ".slot_profile.size()", params.slot_profile.size(),
            "must be 0: only fixed_weight_pool reads a slot profile");
  }
}

}  // namespace phasekv
