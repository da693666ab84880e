#pragma once
// Reader configurations of published models, next to their compressor and cache presets.

#include "phasekv/read/sparse_reader.hpp"

namespace phasekv::presets {

// DeepSeek-V4-Flash CSA layer: 64 query heads over one tied 512-channel K/V head (stream 0), the
// lightning indexer's 64 heads on stream 1 choosing the top 512 entries, an attention sink per
// head, and the output's RoPE channels rotated back by the query position.
inline reader_config deepseek_v4_csa_reader() {
  reader_config r;
  r.name = "csa.reader";
  r.query_heads = 64;
  r.key_stream = 0;
  r.value_stream = 0;
  r.indexer_stream = 1;
  r.top_k = 512;
  r.indexer_heads = 64;
  r.sink = true;
  r.derotate_output = true;
  return r;
}

// DeepSeek-V4-Flash HCA layer: the same heads, no indexer: every complete entry is read.
inline reader_config deepseek_v4_hca_reader() {
  reader_config r = deepseek_v4_csa_reader();
  r.name = "hca.reader";
  r.indexer_stream = no_stream;
  r.top_k = 0;
  r.indexer_heads = 0;
  return r;
}

// DeepSeek-V4.1 CSA layer (S = 2, W = 4): heads, indexer and top-k as V4-Flash's CSA (our
// assumption: only the stride is published).
inline reader_config deepseek_v4_1_csa_reader() {
  reader_config r = deepseek_v4_csa_reader();
  r.name = "v4.1.csa.reader";
  return r;
}

// The readers of the DeepSeek-V4 precision caches (cache/presets.hpp: *_precision_cache): the
// same heads and selection, the indexer in DeepSeek-V4's FP4 (indexer_precision::fp4: queries
// Hadamard-transformed and quantized to e2m1 like the stored keys, scores as exact integer dot
// products). Attention reads the FP8 entries directly, so the K/V side needs no setting.
inline reader_config deepseek_v4_csa_precision_reader() {
  reader_config r = deepseek_v4_csa_reader();
  r.name = "csa.precision.reader";
  r.precision = indexer_precision::fp4;
  return r;
}

// HCA has no indexer: its precision reader is the plain one (FP8 entries need no setting),
// named after the cache it reads.
inline reader_config deepseek_v4_hca_precision_reader() {
  reader_config r = deepseek_v4_hca_reader();
  r.name = "hca.precision.reader";
  return r;
}

inline reader_config deepseek_v4_1_csa_precision_reader() {
  reader_config r = deepseek_v4_1_csa_reader();
  r.name = "v4.1.csa.precision.reader";
  r.precision = indexer_precision::fp4;
  return r;
}

}  // namespace phasekv::presets
