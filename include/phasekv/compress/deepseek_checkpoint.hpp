#pragma once
// DeepSeek-V4's compressor tensors, as its checkpoint stores them, in phasekv's layout.
//
// DeepSeek's reference `Compressor` (inference/model.py) holds, for a compression ratio S and a
// head of D channels (512 for attention, 128 for the indexer), coff = 2 when the windows overlap
// (CSA: W = 2S) and 1 when they do not (HCA: W = S):
//
//   wkv, wgate   [coff·D][dim]   the payload and gate projections (nn.Linear weights: kv = x·wkvᵀ)
//   ape          [S][coff·D]     a bias added to the gate scores by the token's place in its block
//   norm.weight  [D]             RMSNorm's weight
//
// With overlap, the 2D outputs of one token are [first half | second half] and
// `overlap_transform` builds entry j's 2S slots from them: slot i < S takes the FIRST half of
// token i of block j − 1 (the previous block), slot S + i the SECOND half of token i of block j
// (its own block); the gate scores the same, with −inf where block j − 1 does not exist. Then
// softmax over the 2S slots per channel, the weighted sum, RMSNorm, RoPE on the last 64 channels
// at the block's first token.
//
// phasekv's per-branch inputs (stream_config.hpp, input_layout::per_branch) are
// payload[token][views][D] with view b = branch b, and branch 0 is the entry's OWN block
// (geometry.hpp: branch of slot i = floor((W − 1 − i)/S)); the slot bias is by slot,
// [kv_heads][W][D]. So, for one KV head:
//
//   phasekv view 0 (own block)       = DeepSeek channels [D, 2D)   (the second half)
//   phasekv view 1 (previous block)  = DeepSeek channels [0, D)    (the first half)
//   slot_bias[s]      = ape[s][0, D)        for s < S   (previous block: first half)
//   slot_bias[S + i]  = ape[i][D, 2D)       for i < S   (own block: second half)
//
// Without overlap (coff = 1) both are the identity: one view, slot_bias[s] = ape[s].
// Fed unswapped, phasekv would pool each token's previous-block projection into its own block
// and vice versa: accepted (the sizes agree) and wrong. The helpers below do the mapping:
//
//   projection_rows      wkv/wgate rows reordered once, so that x·wᵀ is phasekv's payload/logits
//   reorder_projected    or: a DeepSeek-ordered projected row (x·wkvᵀ as the checkpoint gives
//                        it) reordered per token, into another buffer or in place
//   slot_bias_from_ape   ape → stream_params::slot_bias
//   import_compressor    all of it: stream_params (slot bias, norm weight) + reordered rows
//
// DeepSeek's geometry is origin 0 with W = S or W = 2S; other geometries are a config_error.
// The checkpoint stores wkv/wgate and the norm weight in bf16: widen them to fp32 first (exact).
// The gate projections apply to the same x, so wgate takes the same row order as wkv.
// Errors name the field and its value: config_error for weights (they make a compressor),
// input_error for the per-token rows of reorder_projected.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "phasekv/compress/policies.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/span.hpp"

namespace phasekv::deepseek {

// coff of DeepSeek's Compressor for a geometry: 2 for W = 2S (overlapping windows, CSA), 1 for
// W = S (HCA). Throws config_error naming the geometry for anything DeepSeek's code cannot
// express (origin ≠ 0, W ∉ {S, 2S}).
inline std::int64_t coff(const geometry& geom) {
  geom.validate();
  phasekv::detail::require(geom.origin == 0, "geometry.origin", geom.origin,
                  "must be 0: DeepSeek's Compressor starts blocks at token 0");
  phasekv::detail::require(geom.window == geom.stride || geom.window == 2 * geom.stride, "geometry.window", geom.window,
                  "must be geometry.stride (" + std::to_string(geom.stride) + ", no overlap) or twice it (" +
                      std::to_string(2 * geom.stride) + ", overlap): DeepSeek's Compressor has no other window");
  return geom.window / geom.stride;
}

namespace detail {

inline void require_channels(std::int64_t channels) {
  phasekv::detail::require(channels >= 1 && channels <= limits::max_channels, "channels", channels,
                           "must lie in [1, 2^20]");
}

// DeepSeek output channel of phasekv view v, channel c: view 0 = own block = second half.
constexpr std::int64_t source_channel(std::int64_t k, std::int64_t channels, std::int64_t view,
                                      std::int64_t c) noexcept {
  return k == 1 ? c : (view == 0 ? channels : 0) + c;
}

// A span that claims elements must point at them (span(nullptr, n) would be read).
template <class T>
void require_data(span<T> s, const std::string& field) {
  if (s.data() == nullptr && s.size() != 0)
    phasekv::detail::fail<input_error>(field, "null", "must point to its " + std::to_string(s.size()) + " elements");
}

}  // namespace detail

// ape [S][coff·D] → phasekv's slot bias [W][D] (one KV head): slot s < S of an overlapping
// window takes ape[s][0, D), slot S + i takes ape[i][D, 2D); without overlap slot s takes ape[s].
inline std::vector<float> slot_bias_from_ape(const geometry& geom, std::int64_t channels, span<const float> ape) {
  const std::int64_t k = coff(geom);
  detail::require_channels(channels);
  const std::int64_t S = geom.stride, D = channels, W = geom.window;
  detail::require_data(ape, "ape");
  if (static_cast<std::int64_t>(ape.size()) != S * k * D)
    phasekv::detail::fail("ape.size()", ape.size(),
                          "must be " + std::to_string(S * k * D) + " ([ratio " + std::to_string(S) + "][" +
                              std::to_string(k) + " × " + std::to_string(D) + " channels])");
  for (std::int64_t i = 0; i < S * k * D; ++i)
    if (!std::isfinite(ape[static_cast<std::size_t>(i)]))
      phasekv::detail::fail("ape[" + std::to_string(i / (k * D)) + "][" + std::to_string(i % (k * D)) + "]",
                            ape[static_cast<std::size_t>(i)], "must be finite");
  std::vector<float> bias(static_cast<std::size_t>(W * D));
  for (std::int64_t s = 0; s < W; ++s) {
    const std::int64_t row = s % S;                        // the slot's place in its block
    const std::int64_t half = k == 2 && s < S ? 0 : k - 1;  // previous block: first half
    std::copy_n(ape.data() + row * k * D + half * D, D, bias.data() + s * D);
  }
  return bias;
}

// wkv or wgate [coff·D][dim] (row-major, nn.Linear's [out][in]) with its rows in phasekv's view
// order: rows [v·D, (v+1)·D) of the result are view v's projection, so hidden · resultᵀ is
// payload[views][D] (or logits) for one KV head. `field` names the tensor in errors.
inline std::vector<float> projection_rows(const geometry& geom, std::int64_t channels, std::int64_t dim,
                                          span<const float> weight, const std::string& field = "wkv") {
  const std::int64_t k = coff(geom);
  detail::require_channels(channels);
  phasekv::detail::require(dim >= 1 && dim <= limits::max_channels, "dim", dim, "must lie in [1, 2^20]");
  const std::int64_t rows = k * channels;
  detail::require_data(weight, field);
  if (static_cast<std::int64_t>(weight.size()) != rows * dim)
    phasekv::detail::fail(field + ".size()", weight.size(),
                          "must be " + std::to_string(rows * dim) + " ([" + std::to_string(k) + " × " +
                              std::to_string(channels) + " rows][dim " + std::to_string(dim) + "])");
  std::vector<float> out(static_cast<std::size_t>(rows * dim));
  for (std::int64_t v = 0; v < k; ++v)
    for (std::int64_t c = 0; c < channels; ++c)
      std::copy_n(weight.data() + detail::source_channel(k, channels, v, c) * dim, dim,
                  out.data() + (v * channels + c) * dim);
  return out;
}

// Projected rows in DeepSeek's order, [tokens][coff·D] (x·wkvᵀ or x·wgateᵀ of the checkpoint's
// weights), into phasekv's [tokens][views][D] — the payload or logits of a token_chunk with one
// KV head. `in` and `out` must not overlap; the in-place overload swaps the halves.
inline void reorder_projected(const geometry& geom, std::int64_t channels, std::int64_t tokens, span<const float> in,
                              span<float> out) {
  const std::int64_t k = coff(geom);
  detail::require_channels(channels);
  const std::int64_t row = k * channels;
  phasekv::detail::require<input_error>(tokens >= 0 && tokens <= limits::max_tokens, "tokens", tokens,
                                        "must lie in [0, 2^48]");
  detail::require_data(in, "in");
  detail::require_data(out, "out");
  std::int64_t expected = 0;
  const bool representable = phasekv::detail::product_within(tokens, row, limits::max_bytes, expected);
  if (!representable || static_cast<std::int64_t>(in.size()) != expected)
    phasekv::detail::fail<input_error>("in.size()", in.size(),
                                       "must be tokens × " + std::to_string(row) + " ([tokens][" + std::to_string(k) +
                                           " × " + std::to_string(channels) + " channels])");
  if (out.size() != in.size())
    phasekv::detail::fail<input_error>("out.size()", out.size(), "must equal in.size() = " + std::to_string(in.size()));
  if (in.size() > 0 && in.data() < out.data() + out.size() && out.data() < in.data() + in.size())
    phasekv::detail::fail<input_error>("out", "overlapping in", "must not overlap in (use the in-place overload)");
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t v = 0; v < k; ++v)
      std::copy_n(in.data() + t * row + detail::source_channel(k, channels, v, 0), channels,
                  out.data() + t * row + v * channels);
}

inline void reorder_projected(const geometry& geom, std::int64_t channels, span<float> rows) {
  const std::int64_t k = coff(geom);
  detail::require_channels(channels);
  const std::int64_t row = k * channels;
  detail::require_data(rows, "rows");
  if (static_cast<std::int64_t>(rows.size()) % row != 0)
    phasekv::detail::fail<input_error>("rows.size()", rows.size(),
                                       "must be a multiple of " + std::to_string(row) + " ([tokens][" +
                                           std::to_string(k) + " × " + std::to_string(channels) + " channels])");
  if (k == 1) return;
  for (std::size_t t = 0; t < rows.size(); t += static_cast<std::size_t>(row))
    std::swap_ranges(rows.data() + t, rows.data() + t + channels, rows.data() + t + channels);
}

// One Compressor's tensors as its checkpoint stores them (widened to fp32, row-major). Empty
// wkv/wgate are skipped (a host that projects with the checkpoint's own weights and reorders the
// projected rows instead); an empty norm_weight leaves RMSNorm's weight at ones.
struct compressor_tensors {
  span<const float> wkv;          // [coff·D][dim]
  span<const float> wgate;        // [coff·D][dim]
  span<const float> ape;          // [S][coff·D]
  span<const float> norm_weight;  // [D]
  std::int64_t dim = 0;           // the projections' input width (the model's hidden size)
};

struct imported_compressor {
  stream_params params;           // slot_bias [W][D] from ape, norm_weight [D]
  std::vector<float> wkv, wgate;  // [views][D][dim]: hidden · wkvᵀ = payload[views][D]
};

// Everything a stream_compressor<Policy>(geom, config, result.params) needs from DeepSeek's
// Compressor, checked against the stream: one KV head, per-branch inputs, vector gates (the gate
// has D channels, like ape), RMSNorm if the tensors carry a norm weight. Throws config_error
// naming the field ("csa.kv.ape.size()", "csa.kv.kv_heads", …).
template <class Policy>
imported_compressor import_compressor(const geometry& geom, const stream_config& config,
                                      const compressor_tensors& tensors) {
  static_assert(std::is_same_v<typename Policy::pooling, vector_gated_pool>,
                "DeepSeek's Compressor gates every channel (ape, wgate): the policy must pool with vector_gated_pool");
  using phasekv::detail::require;
  const std::string& n = config.name;
  coff(geom);
  require(config.kv_heads == 1, n + ".kv_heads", config.kv_heads, "must be 1: DeepSeek's Compressor has one head");
  require(config.inputs == input_layout::per_branch, n + ".inputs",
          config.inputs == input_layout::per_slot ? "per_slot" : "not an input_layout",
          "must be per_branch: DeepSeek projects once per branch");
  const std::int64_t D = config.channels;
  detail::require_channels(D);
  detail::require_data(tensors.wkv, n + ".wkv");
  detail::require_data(tensors.wgate, n + ".wgate");
  detail::require_data(tensors.ape, n + ".ape");
  detail::require_data(tensors.norm_weight, n + ".norm_weight");
  auto named = [&](auto&& f) {
    try {
      return f();
    } catch (const config_error& e) {
      throw config_error(n + "." + e.what());
    }
  };
  imported_compressor out;
  out.params.slot_bias = named([&] { return slot_bias_from_ape(geom, D, tensors.ape); });
  if (!tensors.norm_weight.empty()) {
    require(has_norm_v<Policy>, n + ".norm_weight.size()", tensors.norm_weight.size(),
            "must be 0: this policy has no RMSNorm");
    require(static_cast<std::int64_t>(tensors.norm_weight.size()) == D, n + ".norm_weight.size()",
            tensors.norm_weight.size(), "must be " + std::to_string(D) + " (channels)");
    out.params.norm_weight.assign(tensors.norm_weight.begin(), tensors.norm_weight.end());
  }
  if (!tensors.wkv.empty())
    out.wkv = named([&] { return projection_rows(geom, D, tensors.dim, tensors.wkv, "wkv"); });
  if (!tensors.wgate.empty())
    out.wgate = named([&] { return projection_rows(geom, D, tensors.dim, tensors.wgate, "wgate"); });
  validate_stream<Policy>(geom, config, out.params);  // finite bias and weight, the policy's shapes
  return out;
}

}  // namespace phasekv::deepseek
