#pragma once
// Configurations of published models, for orientation and tests.
// Learned parameters (gate biases, norm weights) are the model's; these give shapes and maths.
// DeepSeek's checkpoint tensors map onto these streams with compress/deepseek_checkpoint.hpp.
// The cache presets (cache/presets.hpp) choose the storage: fp32 by default, DeepSeek-V4's own
// FP8 entries in the *_precision_cache variants.

#include "phasekv/compress/policies.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/rope.hpp"

namespace phasekv::presets {

// DeepSeek-V4 compressed sparse attention (CSA) layers: S=4, W=8, two branches (one projection
// per branch), vector gates with a per-slot bias (the `ape` parameter), RMSNorm, interleaved
// RoPE after pooling on the last 64 of 512 channels at the block start, YaRN-scaled.
using deepseek_v4_csa_policy = compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>;

inline geometry deepseek_v4_csa_geometry() { return geometry{4, 8, 0, anchor_mode::block_start}; }

inline rope_config deepseek_v4_compressed_rope() {
  rope_config r;
  r.channels = 64;
  r.base = 160000.0;
  r.layout = rope_layout::interleaved;
  r.yarn.enabled = true;
  r.yarn.factor = 16.0;
  r.yarn.original_context = 65536;
  r.yarn.beta_fast = 32.0;
  r.yarn.beta_slow = 1.0;
  return r;
}

// Tied K/V: one 512-channel stream read as both keys and values, one KV head.
inline stream_config deepseek_v4_csa_kv() {
  stream_config c;
  c.name = "csa.kv";
  c.role = stream_role::key_value;
  c.channels = 512;
  c.kv_heads = 1;
  c.inputs = input_layout::per_branch;
  c.rope = deepseek_v4_compressed_rope();
  c.norm_eps = 1e-6;
  return c;
}

// The lightning indexer's compressed keys: 128 channels, same geometry and pooling. Where its
// RoPE channels sit in the real model is our reading, not a published fact: last 64 here.
inline stream_config deepseek_v4_csa_indexer() {
  stream_config c = deepseek_v4_csa_kv();
  c.name = "csa.indexer";
  c.role = stream_role::indexer;
  c.channels = 128;
  return c;
}

// DeepSeek-V4 heavily compressed attention (HCA) layers: S = W = 128 (one branch, no overlap),
// the same gated pooling, RMSNorm and RoPE (last 64 of 512 channels) as CSA, tied 512-channel
// K/V, no indexer: a query attends to every complete entry.
using deepseek_v4_hca_policy = deepseek_v4_csa_policy;

inline geometry deepseek_v4_hca_geometry() { return geometry{128, 128, 0, anchor_mode::block_start}; }

inline stream_config deepseek_v4_hca_kv() {
  stream_config c = deepseek_v4_csa_kv();
  c.name = "hca.kv";
  return c;
}

// DeepSeek-V4.1 CSA layers use S = 2; the window is our assumption (W = 2S, overlapping as in
// V4's CSA). Note that V4's reference Compressor turns the overlap on only for ratio 4
// (`overlap = compress_ratio == 4`): if V4.1 kept that line, its S = 2 windows would not overlap
// (W = S = 2) — check against V4.1's own code before loading its weights
// (deepseek::coff() of this geometry is 2: it expects ape [2][1024] and 1024-row projections).
inline geometry deepseek_v4_1_csa_geometry() { return geometry{2, 4, 0, anchor_mode::block_start}; }

// V4.1's CSA streams: otherwise V4's (the same policy, channels, RoPE and norm).
using deepseek_v4_1_csa_policy = deepseek_v4_csa_policy;

inline stream_config deepseek_v4_1_csa_kv() {
  stream_config c = deepseek_v4_csa_kv();
  c.name = "v4.1.csa.kv";
  return c;
}

inline stream_config deepseek_v4_1_csa_indexer() {
  stream_config c = deepseek_v4_csa_indexer();
  c.name = "v4.1.csa.indexer";
  return c;
}

// NSA's compressed branch geometry: blocks of 32 tokens every 16 (its MLP compressor is not a
// pooling policy; use this geometry with a policy of your choice).
inline geometry nsa_compressed_geometry() { return geometry{16, 32, 0, anchor_mode::block_start}; }

}  // namespace phasekv::presets
