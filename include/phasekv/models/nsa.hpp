#pragma once
// Native Sparse Attention's (2025) compressed branch: blocks of l = 32 tokens every d = 16, each
// compressed by an MLP over the block with an intra-block position embedding — not a built-in
// pooling: examples/pools/nsa_mlp_pool.hpp writes it as a pooling policy of the host's, on this
// geometry. Its selection branch (blocks of 64, top 16) and 512-token sliding window read the
// uncompressed tokens, which phasekv does not store.

#include "phasekv/core/geometry.hpp"

namespace phasekv::presets {

inline geometry nsa_compressed_geometry() { return geometry{16, 32, 0, anchor_mode::block_start}; }

}  // namespace phasekv::presets
