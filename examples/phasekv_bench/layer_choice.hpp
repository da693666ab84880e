#pragma once
// phasekv-bench's parts (examples/phasekv-bench.cpp): the layer a command line describes, and one
// function per pooling policy that runs phasekv::bench::run on it. Each policy is instantiated in a
// translation unit of its own (run_<policy>.cpp): in one unit with all the others, GCC inlined the
// write path less (its unit-growth limits), and a prefill ran ~7% slower than bench_write's.

#include <optional>
#include <string>

#include <phasekv/cache/paged_cache.hpp>
#include <phasekv/compress/layer_compressor.hpp>
#include <phasekv/compress/stream_compressor.hpp>
#include <phasekv/compress/stream_config.hpp>
#include <phasekv/core/geometry.hpp>
#include <phasekv/read/read_types.hpp>
#include <phasekv/testing/bench.hpp>

namespace phasekv_bench {

enum class policy_choice { mean, vector_gates, deepseek_v4, max, nsa_mlp };

struct layer_choice {
  phasekv::geometry geom;
  policy_choice policy = policy_choice::deepseek_v4;
  phasekv::stream_config kv;
  std::optional<phasekv::stream_config> indexer;
  phasekv::cache_config cache;
  phasekv::reader_config reader;
  std::string name;
};

phasekv::bench::results run_mean(const layer_choice& l, const phasekv::bench::run_config& rc);
phasekv::bench::results run_vector_gates(const layer_choice& l, const phasekv::bench::run_config& rc);
phasekv::bench::results run_deepseek_v4(const layer_choice& l, const phasekv::bench::run_config& rc);
phasekv::bench::results run_max(const layer_choice& l, const phasekv::bench::run_config& rc);
phasekv::bench::results run_nsa_mlp(const layer_choice& l, const phasekv::bench::run_config& rc);

// phasekv::bench::run on the layer with `Policy`'s streams: one (K/V) or two (and the indexer's
// keys); `pooling(config, seed)` makes each stream's pooling instance.
template <class Policy, class Pooling>
phasekv::bench::results run_with(const layer_choice& l, const phasekv::bench::run_config& rc, Pooling pooling) {
  using stream = phasekv::stream_compressor<Policy>;
  const stream kv(l.geom, l.kv, {}, pooling(l.kv, 1));
  if (l.indexer) {
    const stream ix(l.geom, *l.indexer, {}, pooling(*l.indexer, 2));
    return phasekv::bench::run(phasekv::layer_compressor<stream, stream>(kv, ix), l.cache, l.reader, rc, l.name);
  }
  return phasekv::bench::run(phasekv::layer_compressor<stream>(kv), l.cache, l.reader, rc, l.name);
}

}  // namespace phasekv_bench
