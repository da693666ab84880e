#pragma once
// One decode step in the DeepSeek-V4-Flash CSA shape, as bench_read.cpp times it and as
// peer/peer_dump.cpp writes it out for the PyTorch peer: the shape, the filled cache and reader
// (sparse_workload), and the dense full-attention baseline (dense_workload).
//
// The generator, the cache fill, the request's inputs and the read's floor are
// include/phasekv/tools/bench.hpp's (fast_random, fill_random_tokens, read_workload, read_cost),
// the ones phasekv-bench measures any layer with: for this shape both report the same figures.
// Both programs here build their inputs from the same seeds, so the numbers the peer recomputes
// are the very numbers the benchmark reads. Changing a seed, a generator or the order in which
// fill() draws changes both at once (and every peer comparison made before it).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <phasekv/cache/paged_cache.hpp>
#include <phasekv/compress/stream_compressor.hpp>
#include <phasekv/models/deepseek_v4.hpp>
#include <phasekv/read/sparse_reader.hpp>
#include <phasekv/tools/bench.hpp>

namespace phasekv::bench {

// ---- the shape -------------------------------------------------------------------------------

// 64 query heads over 1 KV head of 512 tied K/V channels, lightning indexer of 64 heads × 128
// channels, top-k 512, 128-token raw window, attention sink (S=4, W=8: the preset's geometry).
inline constexpr std::int64_t kQueryHeads = 64;
inline constexpr std::int64_t kChannels = 512;  // tied K/V
inline constexpr std::int64_t kIndexerHeads = 64;
inline constexpr std::int64_t kIndexerChannels = 128;
inline constexpr std::int64_t kTopK = 512;
inline constexpr std::int64_t kWindow = 128;
inline constexpr std::int64_t kBlock = 1024;        // tokens per append while filling the cache
inline constexpr std::int64_t kDenseBlock = 256;    // keys per block of the dense baseline (the reader's piece)
inline constexpr std::int64_t kMaxContext = 131072;  // the longest context; rows of bench_read's dense cache

using csa_stream = phasekv::stream_compressor<phasekv::presets::deepseek_v4_csa_policy>;
using csa_cache = phasekv::paged_cache<csa_stream, csa_stream>;

// ---- the sparse read -------------------------------------------------------------------------

// The preset's two streams: K/V (stream 0) and the indexer's keys (stream 1).
inline csa_cache::layer csa_layer() {
  namespace presets = phasekv::presets;
  return csa_cache::layer(
      csa_stream{presets::deepseek_v4_csa_layer.geom, presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer)},
      csa_stream{presets::deepseek_v4_csa_layer.geom,
                 *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer)});
}

// A cache for `tokens` tokens in pages of `page_size` entries (one entry per S = 4 tokens, plus a
// spare page), fp32 — or with bf16 indexer keys, or K/V entries stored as `kv_storage` (FP8:
// fp8_e4m3_block), or FP4 indexer keys (fp4_e2m1_hadamard) — with the raw window the reader
// attends to. `name` names it in errors.
inline phasekv::cache_config decode_cache_config(const std::string& name, std::int64_t tokens, std::int64_t page_size,
                                                 bool bf16_indexer = false,
                                                 phasekv::storage_type kv_storage = phasekv::storage_type::f32,
                                                 bool fp4_indexer = false) {
  phasekv::cache_config c;
  c.name = name;
  c.page_size = page_size;
  c.pages = (tokens / 4 + page_size - 1) / page_size + 1;
  c.storage = phasekv::storage_type::f32;
  c.stream_storage = {kv_storage, fp4_indexer    ? phasekv::storage_type::fp4_e2m1_hadamard
                                  : bf16_indexer ? phasekv::storage_type::bf16
                                                 : phasekv::storage_type::f32};
  c.window.tokens = kWindow;
  c.window.kv_heads = 1;
  c.window.key_channels = kChannels;
  c.window.value_channels = 0;  // tied
  if (kv_storage == phasekv::storage_type::fp8_e4m3_block) {  // DeepSeek-V4 keeps FP8 window values too
    c.window.precision = phasekv::storage_type::fp8_e4m3_block;
    c.window.rope_channels = 64;
  }
  return c;
}

inline phasekv::reader_config decode_reader_config(const std::string& name, bool bf16_indexer = false,
                                                   bool fp4_indexer = false) {
  phasekv::reader_config r;
  r.name = name + ".reader";
  r.query_heads = kQueryHeads;
  r.key_stream = 0;
  r.value_stream = 0;
  r.indexer_stream = 1;
  r.top_k = kTopK;
  r.indexer_heads = kIndexerHeads;
  r.sink = true;
  r.derotate_output = true;
  if (bf16_indexer) r.precision = phasekv::indexer_precision::bf16;
  if (fp4_indexer) r.precision = phasekv::indexer_precision::fp4;
  return r;
}

// Appends `tokens` tokens to `seq` through both streams in blocks of kBlock (fill_random_tokens:
// the K/V stream's inputs one random block appended cyclically, the indexer's fresh for every
// block from `seed`, so its scores are not periodic).
inline void append_random_tokens(csa_cache& cache, phasekv::sequence_id seq, std::int64_t tokens, std::uint64_t seed) {
  static_assert(kBlock == 1024, "fill_random_tokens appends in blocks of 1024");
  fill_random_tokens(cache, seq, tokens, seed);
}

// The read path's decode step at position tokens − 1: the cache, its reader, the request's inputs
// (seeds 21–24) and the output. The constructor leaves the cache empty; fill() appends the tokens
// (apart, so that a caller can time it).
struct sparse_workload : read_workload<csa_cache> {
  // `name` names the cache and (with ".reader") the reader in errors. bf16_indexer: the indexer
  // keys stored and scored in bf16 (reader_config::precision); kv_storage: the K/V entries';
  // fp4_indexer: the indexer keys stored and scored in FP4 (DeepSeek-V4's indexer).
  sparse_workload(const std::string& name, std::int64_t context, std::int64_t page, bool bf16_indexer = false,
                  phasekv::storage_type kv_storage = phasekv::storage_type::f32, bool fp4_indexer = false)
      : read_workload<csa_cache>(csa_layer(), decode_cache_config(name, context, page, bf16_indexer, kv_storage, fp4_indexer),
                                 decode_reader_config(name, bf16_indexer, fp4_indexer), context) {}
};

// ---- the dense baseline ----------------------------------------------------------------------

// Full attention of every query head over all `tokens` raw keys (tied K/V, one KV head), as a
// good CPU flash-decode does it, with the reader's own attention kernel (kernels/attention.hpp:
// query heads in SIMD lanes, the scale folded into Q once): blocks of keys small enough to stay
// in L2 between the logits and the output, each an online-softmax state merged into the running
// one. The sink enters the final denominator only, as in the reader. (An Eigen-GEMM version ran
// at 0.4–0.5 of the FMA peak and lost to torch's OpenBLAS: a baseline a user would beat.)
class dense_decoder {
  using kernel = phasekv::kernels::attention<>;

 public:
  dense_decoder(std::int64_t heads, std::int64_t channels, std::int64_t block, float scale)
      : heads_(heads), channels_(channels), block_(block), scale_(scale), rows_(static_cast<std::size_t>(block)) {}

  void run(const float* queries, const float* kv, std::int64_t tokens, const float* sinks, float* out) {
    kernel::prepare(queries, heads_, channels_, scale_, query_);
    logits_.resize(static_cast<std::size_t>(block_ * query_.padded));
    max_.resize(static_cast<std::size_t>(query_.padded));
    sum_.resize(static_cast<std::size_t>(query_.padded));
    total_.reset(heads_, channels_);
    for (std::int64_t first = 0; first < tokens; first += block_) {
      const std::int64_t n = std::min(block_, tokens - first);
      for (std::int64_t i = 0; i < n; ++i) rows_[static_cast<std::size_t>(i)] = kv + (first + i) * channels_;
      kernel::logits(query_, rows_.data(), n, logits_.data());
      kernel::softmax(logits_.data(), n, query_.padded, max_.data(), sum_.data());
      float* o = block_state_.assign(heads_, channels_, max_.data(), sum_.data());
      kernel::output(logits_.data(), query_.padded, heads_, rows_.data(), n, channels_, o);
      total_.merge(block_state_);
    }
    total_.finish(out, sinks);
  }

 private:
  std::int64_t heads_, channels_, block_;
  float scale_;
  kernel::prepared query_;
  kernel::aligned_floats logits_;
  std::vector<float> max_, sum_;
  std::vector<const float*> rows_;
  phasekv::softmax_state total_, block_state_;
};

// The dense step's inputs and output: a raw fp32 cache of `rows` tokens (tied K/V; seed 11), of
// which a context of n tokens reads the first n — the generator is sequential, so those rows are
// the same whatever `rows` is — and the queries and sinks (seeds 12, 13).
struct dense_workload {
  std::vector<float> kv, queries, sinks;
  std::vector<float> out = std::vector<float>(static_cast<std::size_t>(kQueryHeads * kChannels));
  dense_decoder decoder{kQueryHeads, kChannels, kDenseBlock, 1.0f / std::sqrt(static_cast<float>(kChannels))};

  explicit dense_workload(std::int64_t rows)
      : kv(random_vector(rows * kChannels, 11)),
        queries(random_vector(kQueryHeads * kChannels, 12)),
        sinks(random_vector(kQueryHeads, 13)) {}

  void step(std::int64_t tokens) { decoder.run(queries.data(), kv.data(), tokens, sinks.data(), out.data()); }
};

}  // namespace phasekv::bench
