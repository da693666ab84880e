#pragma once
// Compile-time compressor policies. Three orthogonal axes — how a window is
// pooled, where RoPE is applied, whether the pooled entry is RMS-normalised — composed as
// compressor_policy<Pooling, Rope, Norm>. Each choice is a tag; the writer selects code with
// `if constexpr`, so an unused option costs nothing in the hot loop.

#include <cstdint>
#include <type_traits>

namespace phasekv {

// --- Pooling --------------------------------------------------------------------------------
// K̂_j = (1/n) Σ_i x_{j,i} over the n real (non-padding) slots.
struct mean_pool {};

enum class gate_width {
  vector,  // one logit per channel: a per-channel softmax over slots (DeepSeek-V4)
  scalar,  // one logit per token: one softmax over slots shared by every channel
};

// s_{j,i} = logit_{j,i} + bias_i,  α_{j,i} = softmax_i(s_{j,i}),  K̂_j = Σ_i α_{j,i} ⊙ x_{j,i}.
template <gate_width Width>
struct gated_pool {
  static constexpr gate_width width = Width;
};
using vector_gated_pool = gated_pool<gate_width::vector>;
using scalar_gated_pool = gated_pool<gate_width::scalar>;

// A static per-slot profile p_i, renormalised over the real slots: α_i = p_i / Σ_real p.
// Uniform p is mean pooling; one-hot p picks one offset.
struct fixed_weight_pool {};

// --- RoPE placement -------------------------------------------------------------------------
struct no_rope {};
struct rope_after_pool {};   // rotate the pooled entry at its anchor position (DeepSeek-V4)
struct rope_before_pool {};  // rotate each token's payload at its own position, then pool

// --- Normalisation --------------------------------------------------------------------------
struct no_norm {};
struct rms_norm {};  // x · rsqrt(mean(x²) + eps) · w, applied before post-pool RoPE

template <class Pooling, class Rope = no_rope, class Norm = no_norm>
struct compressor_policy {
  using pooling = Pooling;
  using rope = Rope;
  using norm = Norm;
};

// --- Traits ---------------------------------------------------------------------------------
template <class Pooling>
struct is_gated : std::false_type {};
template <gate_width W>
struct is_gated<gated_pool<W>> : std::true_type {};
template <class Pooling>
inline constexpr bool is_gated_v = is_gated<Pooling>::value;

template <class Policy>
inline constexpr bool has_rope_v = !std::is_same_v<typename Policy::rope, no_rope>;
template <class Policy>
inline constexpr bool has_norm_v = std::is_same_v<typename Policy::norm, rms_norm>;

// Logits per (token, view) a pooling policy reads: C for vector gates, 1 for scalar, 0 otherwise.
template <class Pooling>
constexpr std::int64_t gate_channels(std::int64_t channels) noexcept {
  if constexpr (std::is_same_v<Pooling, vector_gated_pool>) return channels;
  else if constexpr (std::is_same_v<Pooling, scalar_gated_pool>) return 1;
  else return 0;
}

}  // namespace phasekv
