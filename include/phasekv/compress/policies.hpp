#pragma once
// Compile-time compressor policies. Three orthogonal axes — how a window is
// pooled, where RoPE is applied, whether the pooled entry is RMS-normalised — composed as
// compressor_policy<Pooling, Rope, Norm>. Each built-in choice is a tag; the writer selects code
// with `if constexpr`, so an unused option costs nothing in the hot loop. A pooling of your own
// (an MLP over the block, max pooling, attention pooling, a mitigation) plugs into the same
// point: see "Your own pooling" below.

#include <cstdint>
#include <type_traits>
#include <utility>

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

// --- Your own pooling -----------------------------------------------------------------------
// A pooling policy of your own is a type P with
//
//   static constexpr const char* name = "max";        // its identity in snapshots, with
//   static constexpr std::uint32_t version = 1;       //   its version
//   static constexpr std::int64_t gate_channels(std::int64_t channels);
//       // logit floats it reads per (token, view): 0 for every channel count (no logits) or
//       // positive for every one; the host hands them over as chunk.logits
//   void pool(const window_rows& w, float* out) const;
//       // out[channels]: the entry of KV head w.head from the window's real slots
//
// and optionally `span<const float> parameters() const` (its learned weights: their CRC-32C
// joins the snapshot identity). stream_compressor<compressor_policy<P, Rope, Norm>> takes a P
// (weights from the host) and runs it on every path — prefill and decode, fp32 and bf16 inputs,
// the paged cache, reads, snapshots; RMSNorm and RoPE after pooling apply to its output (RoPE
// before pooling is the built-ins' only). pool() must be a function of the rows it is given: the
// streaming path keeps the last W − 1 tokens' inputs and hands the same rows to pool() as a
// prefill does, so the two agree bit for bit — the property the tests check for every policy.
// Where a policy has a notion of per-slot weights it may write them to w.slot_weights (write
// profiles, gate concentration and interventions read them).
//
// Rows arrive as fp32 (bf16 inputs widened first) unless P declares
// `static constexpr bool reads_bf16_rows = true`: then an entry whose rows all lie in a bf16
// chunk gets them in place, w.payload_bf16 (w.logits_bf16) set and w.payload (w.logits) null —
// half the bytes and no widening pass, as the built-ins read them. Each bf16 value means its
// exact fp32 widening (simd::bf16_to_float), so such a policy must pool the widened values.
struct window_rows {
  std::int64_t entry = 0;           // j
  std::int64_t head = 0;            // KV head h
  std::int64_t channels = 0;        // C
  std::int64_t window = 0;          // W slots; the real ones are [first_slot, W)
  std::int64_t first_slot = 0;      // slots before it lie before token 0 (padding)
  std::int64_t first_position = 0;  // the token position of slot first_slot
  const float* const* payload = nullptr;  // [count()] rows of C fp32 values, slot first_slot + k
  const float* const* logits = nullptr;   // [count()] rows of gate_channels(C) values, or null
  float* slot_weights = nullptr;          // [count()] zeros to write per-slot weights into, or null
  const std::uint16_t* const* payload_bf16 = nullptr;  // the same rows in bf16, in place of payload
  const std::uint16_t* const* logits_bf16 = nullptr;   // (reads_bf16_rows policies only, see above)

  std::int64_t count() const noexcept { return window - first_slot; }
  std::int64_t slot(std::int64_t k) const noexcept { return first_slot + k; }
  std::int64_t position(std::int64_t k) const noexcept { return first_position + k; }
};

template <class P, class = void>
struct is_custom_pool : std::false_type {};
template <class P>
struct is_custom_pool<P, std::void_t<decltype(std::declval<const P&>().pool(std::declval<const window_rows&>(),
                                                                             std::declval<float*>()))>>
    : std::true_type {};
template <class P>
inline constexpr bool is_custom_pool_v = is_custom_pool<P>::value;

template <class P, class = void>
struct pool_reads_bf16_rows : std::false_type {};
template <class P>
struct pool_reads_bf16_rows<P, std::enable_if_t<P::reads_bf16_rows>> : std::true_type {};
template <class P>
inline constexpr bool pool_reads_bf16_rows_v = pool_reads_bf16_rows<P>::value;

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L && __has_include(<concepts>)
}  // namespace phasekv
#include <concepts>
namespace phasekv {
// The same requirements as a C++20 concept, for hosts that want the check in their own templates.
template <class P>
concept pooling_policy = requires(const P& p, const window_rows& w, float* out) {
  { P::name } -> std::convertible_to<const char*>;
  { P::version } -> std::convertible_to<std::uint32_t>;
  { P::gate_channels(std::int64_t{1}) } -> std::convertible_to<std::int64_t>;
  p.pool(w, out);
};
#endif

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
// Whether a pooling of the host's exposes its learned weights (`parameters()`).
template <class P, class = void>
struct has_pool_parameters : std::false_type {};
template <class P>
struct has_pool_parameters<P, std::void_t<decltype(std::declval<const P&>().parameters())>> : std::true_type {};

template <class Pooling>
struct is_gated : std::false_type {};
template <gate_width W>
struct is_gated<gated_pool<W>> : std::true_type {};
template <class Pooling>
constexpr bool reads_logits() noexcept {
  if constexpr (is_custom_pool_v<Pooling>) return Pooling::gate_channels(1) > 0;
  else return is_gated<Pooling>::value;
}
// Whether the policy reads gate logits (built-in gates, or a pooling of your own that asks for them).
template <class Pooling>
inline constexpr bool is_gated_v = reads_logits<Pooling>();

template <class Policy>
inline constexpr bool has_rope_v = !std::is_same_v<typename Policy::rope, no_rope>;
template <class Policy>
inline constexpr bool has_norm_v = std::is_same_v<typename Policy::norm, rms_norm>;

// Logits per (token, view) a pooling policy reads: C for vector gates, 1 for scalar, 0 otherwise.
template <class Pooling>
constexpr std::int64_t gate_channels(std::int64_t channels) noexcept {
  if constexpr (is_custom_pool_v<Pooling>) return Pooling::gate_channels(channels);
  else if constexpr (std::is_same_v<Pooling, vector_gated_pool>) return channels;
  else if constexpr (std::is_same_v<Pooling, scalar_gated_pool>) return 1;
  else return 0;
}

}  // namespace phasekv
