#pragma once
// What the read tests share: small helpers (sizes, streams, exact random inputs, the tolerance
// check) and selection_world, a layer of [keys (mean pool), values (vector-gated), indexer keys
// (mean pool)] with two KV heads and a raw window, whose indexer scores are exact in fp32 so
// that selections compare exactly with the oracle's (oracle/scalar_attention.hpp).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/random_inputs.hpp"
#include "support/common.hpp"
#include "support/configs.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/read/read_types.hpp"

namespace phasekv_test::read_support {

using namespace phasekv;
using i64 = std::int64_t;

// An output element `got` is close to the oracle's `want` when
//   |got − want| ≤ kTolerance · max(|want|, value_scale).
constexpr double kTolerance = 1e-5;

using mean_stream = stream_compressor<compressor_policy<mean_pool>>;
using gated_stream = stream_compressor<compressor_policy<vector_gated_pool>>;

using phasekv_test::sz;


// What the random worlds of the read tests share (a test's spec adds how its streams are stored):
// the geometry, KV heads and their query-head groups, channel counts, the indexer, pages, the raw
// window, the selection, sinks and tied K/V.
struct world_shape {
  i64 stride = 1, window = 1, kv_heads = 1, group = 1, key_channels = 1, value_channels = 1, rope_channels = 0;
  i64 indexer_channels = 1, indexer_heads = 1, page_size = 1, window_tokens = 0, top_k = 0;
  bool sink = false, tied = false;

  i64 query_heads() const { return kv_heads * group; }
  i64 values() const { return tied ? key_channels : value_channels; }

  // S uniform in [1, max_stride], then W in [S, 2S + window_slack], then kv_heads in
  // [1, max_kv_heads]: the first draws of every random world.
  void draw_geometry(std::mt19937& rng, i64 max_stride, i64 window_slack, i64 max_kv_heads) {
    stride = phasekv_test::pick(rng, 1, max_stride);
    window = phasekv_test::pick(rng, stride, 2 * stride + window_slack);
    kv_heads = phasekv_test::pick(rng, 1, max_kv_heads);
  }

  // The shape's fields, for a failing world's INFO.
  std::string describe_shape() const {
    std::ostringstream o;
    o << "S=" << stride << " W=" << window << " kv_heads=" << kv_heads << " group=" << group << " kc=" << key_channels
      << " vc=" << values() << " rope=" << rope_channels << " ic=" << indexer_channels << " ih=" << indexer_heads
      << " page=" << page_size << " win=" << window_tokens << " top_k=" << top_k << " sink=" << sink << " tied=" << tied;
    return o.str();
  }
};

// The reader of a random world (its spec has query_heads(), tied, top_k, indexer_heads, sink):
// keys on stream 0, values on stream 1 (or 0 when tied), the indexer on the next stream when it
// selects; a tied world's outputs are derotated.
template <class Spec>
reader_config reader_for(const Spec& s, const std::string& name) {
  reader_config rc;
  rc.name = name;
  rc.query_heads = s.query_heads();
  rc.key_stream = 0;
  rc.value_stream = s.tied ? 0 : 1;
  rc.indexer_stream = s.top_k > 0 ? (s.tied ? 1 : 2) : no_stream;
  rc.top_k = s.top_k;
  rc.indexer_heads = s.top_k > 0 ? s.indexer_heads : 0;
  rc.sink = s.sink;
  rc.derotate_output = s.tied;
  return rc;
}

inline stream_config make_stream(const std::string& name, stream_role role, i64 kv_heads, i64 channels) {
  return stream_of(name, role, channels, kv_heads);
}

// The caches of a random world (its spec has stride, window, kv_heads, key_channels,
// value_channels, indexer_channels, rope_channels): keys, values and indexer keys, each mean-pooled;
// or tied K/V whose last rope_channels channels are rotated (base 1000) after pooling, and the
// indexer keys.
using rope_stream = stream_compressor<compressor_policy<mean_pool, rope_after_pool>>;
using untied_cache = paged_cache<mean_stream, mean_stream, mean_stream>;
using tied_cache = paged_cache<rope_stream, mean_stream>;

template <class Spec>
untied_cache make_untied(const Spec& s, const cache_config& cc) {
  const geometry g{s.stride, s.window};
  return untied_cache(layer_compressor<mean_stream, mean_stream, mean_stream>(
                          mean_stream(g, make_stream("keys", stream_role::key, s.kv_heads, s.key_channels)),
                          mean_stream(g, make_stream("values", stream_role::value, s.kv_heads, s.value_channels)),
                          mean_stream(g, make_stream("indexer", stream_role::indexer, 1, s.indexer_channels))),
                      cc);
}

template <class Spec>
tied_cache make_tied(const Spec& s, const cache_config& cc) {
  const geometry g{s.stride, s.window};
  stream_config kv = make_stream("kv", stream_role::key_value, s.kv_heads, s.key_channels);
  kv.rope.channels = s.rope_channels;
  kv.rope.base = 1000.0;
  return tied_cache(layer_compressor<rope_stream, mean_stream>(
                        rope_stream(g, kv), mean_stream(g, make_stream("indexer", stream_role::indexer, 1, s.indexer_channels))),
                    cc);
}

// k·step with k uniform in [lo, hi]: small dyadic rationals, exact in fp32 and bf16.
inline std::vector<float> multiples(std::mt19937& rng, std::size_t count, double step, int lo, int hi) {
  std::uniform_int_distribution<int> k(lo, hi);
  std::vector<float> out(count);
  for (auto& x : out) x = static_cast<float>(k(rng) * step);
  return out;
}

inline std::vector<float> uniform(std::mt19937& rng, std::size_t count, float lo, float hi) {
  return phasekv_test::random_uniform(rng, count, lo, hi);
}

inline double max_abs(const float* x, std::size_t n) {
  double m = 0.0;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, std::abs(static_cast<double>(x[i])));
  return m;
}
inline double max_abs(const std::vector<std::vector<float>>& rows) {
  double m = 0.0;
  for (const auto& r : rows) m = std::max(m, max_abs(r.data(), r.size()));
  return m;
}

// "" when every |got − want| ≤ tolerance · max(|want|, scale), else the worst offender.
inline std::string mismatch(const float* got, const std::vector<double>& want, double scale, double tolerance = kTolerance) {
  double worst = 0.0;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    if (!std::isfinite(g)) {
      std::ostringstream out;
      out << "element " << i << " is " << g << " (want " << want[i] << ")";
      return out.str();
    }
    const double err = std::abs(g - want[i]) / std::max(std::abs(want[i]), scale);
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  if (worst <= tolerance) return "";
  std::ostringstream out;
  out.precision(9);
  out << "element " << worst_i << ": got " << got[worst_i] << ", want " << want[worst_i] << " (relative error " << worst
      << " > " << tolerance << ", value scale " << scale << ")";
  return out.str();
}

inline std::string mass_mismatch(const std::vector<float>& got, const std::vector<double>& want, double tolerance,
                          const char* what) {
  if (got.size() != want.size())
    return std::string(what) + ": size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(static_cast<double>(got[i]) - want[i]) <= tolerance)) {
      std::ostringstream out;
      out << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
      return out.str();
    }
  return "";
}

inline std::vector<float> row(const float* p, i64 n) { return std::vector<float>(p, p + n); }

template <class Cache>
std::vector<float> entry_of(const Cache& cache, sequence_id seq, std::size_t stream, i64 j, i64 floats) {
  std::vector<float> out(sz(floats));
  cache.read_entry(seq, stream, j, out.data());
  return out;
}

// A layer of [keys (mean pool), values (vector-gated), indexer keys (mean pool)] over S=2, W=4,
// two KV heads, and a raw window of 5 tokens.
using selection_cache = paged_cache<mean_stream, gated_stream, mean_stream>;

struct selection_world {
  static constexpr i64 kv_heads = 2, key_channels = 8, value_channels = 6, indexer_channels = 8;
  static constexpr i64 query_heads = 6, indexer_heads = 3, window = 5;
  geometry geom = geometry{2, 4};

  // A reader over this world's streams: keys 0, values 1, indexer 2.
  static reader_config reader(const std::string& name, i64 top_k, bool sink) {
    reader_config rc;
    rc.name = name;
    rc.query_heads = query_heads;
    rc.key_stream = 0;
    rc.value_stream = 1;
    rc.indexer_stream = 2;
    rc.top_k = top_k;
    rc.indexer_heads = indexer_heads;
    rc.sink = sink;
    return rc;
  }

  selection_cache make(storage_type storage, std::uint32_t seed, i64 history = 0, i64 pages = 128,
                       std::vector<storage_type> stream_storage = {}) const {
    std::mt19937 rng(seed);
    stream_params vp;
    vp.slot_bias = phasekv_test::random_bias(rng, sz(kv_heads * geom.window * value_channels));
    cache_config cc;
    cc.name = "cache";
    cc.page_size = 3;  // candidates span several pages, the last one partial
    cc.pages = pages;
    cc.storage = storage;
    cc.stream_storage = std::move(stream_storage);
    cc.history = history;
    cc.window = raw_window_config{window, kv_heads, key_channels, value_channels};
    return selection_cache(
        layer_compressor<mean_stream, gated_stream, mean_stream>(
            mean_stream(geom, make_stream("keys", stream_role::key, kv_heads, key_channels)),
            gated_stream(geom, make_stream("values", stream_role::value, kv_heads, value_channels), vp),
            mean_stream(geom, make_stream("indexer", stream_role::indexer, 1, indexer_channels))),
        cc);
  }

  // Inputs of `tokens` tokens. Indexer payloads: multiples of 1/4 in [−1, 1] drawn from a
  // palette of `palette` token vectors (1: every entry ties), so scores tie often and exactly.
  struct inputs {
    std::vector<float> keys, values, value_logits, indexer, window_keys, window_values;
  };
  inputs make_inputs(std::mt19937& rng, i64 tokens, int palette) const {
    inputs in;
    const i64 views = geom.branches();
    in.keys = uniform(rng, sz(tokens * kv_heads * views * key_channels), -1.0f, 1.0f);
    in.values = uniform(rng, sz(tokens * kv_heads * views * value_channels), -1.0f, 1.0f);
    in.value_logits = uniform(rng, sz(tokens * kv_heads * views * value_channels), -2.0f, 2.0f);
    const i64 per_token = views * indexer_channels;
    std::vector<std::vector<float>> colours;
    for (int p = 0; p < palette; ++p) colours.push_back(multiples(rng, sz(per_token), 0.25, -4, 4));
    std::uniform_int_distribution<int> pick(0, palette - 1);
    for (i64 t = 0; t < tokens; ++t) {
      const auto& c = colours[sz(pick(rng))];
      in.indexer.insert(in.indexer.end(), c.begin(), c.end());
    }
    in.window_keys = uniform(rng, sz(tokens * kv_heads * key_channels), -1.0f, 1.0f);
    in.window_values = uniform(rng, sz(tokens * kv_heads * value_channels), -1.0f, 1.0f);
    return in;
  }

  void append(selection_cache& cache, sequence_id seq, const inputs& in, i64 first, i64 count) const {
    const i64 views = geom.branches();
    auto part = [&](const std::vector<float>& v, i64 per_token) {
      return span<const float>(v.data() + first * per_token, sz(count * per_token));
    };
    cache.append(seq,
                 {token_chunk{count, part(in.keys, kv_heads * views * key_channels), {}},
                  token_chunk{count, part(in.values, kv_heads * views * value_channels),
                              part(in.value_logits, kv_heads * views * value_channels)},
                  token_chunk{count, part(in.indexer, views * indexer_channels), {}}},
                 part(in.window_keys, kv_heads * key_channels), part(in.window_values, kv_heads * value_channels));
  }
};

}  // namespace phasekv_test::read_support
