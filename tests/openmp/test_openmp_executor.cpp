// The reader on a real OpenMP team (phasekv::openmp_executor, built with -fopenmp and
// EIGEN_DONT_PARALLELIZE): bit-identical to the serial reader, with and without selection, over
// a context long enough for several scoring chunks and attention pieces. A separate binary:
// the main test binary stays free of OpenMP so that ThreadSanitizer (which does not understand
// libgomp's synchronisation) can run over it.

#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "phasekv/phasekv.hpp"

namespace {

using namespace phasekv;
using i64 = std::int64_t;
using csa_stream = stream_compressor<presets::deepseek_v4_csa_policy>;
using csa_cache = paged_cache<csa_stream, csa_stream>;

std::vector<float> uniform(std::mt19937& rng, i64 n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace

TEST_CASE("openmp_executor: the reader on two OpenMP threads equals the serial reader", "[read][executor][openmp]") {
#ifndef _OPENMP
  FAIL("this test must be compiled with OpenMP");
#endif
  stream_config kv = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer),
                ix = *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer);
  kv.channels = 64;
  kv.rope.channels = 16;
  ix.channels = 32;
  ix.rope.channels = 16;
  const geometry geom = presets::deepseek_v4_csa_layer.geom;
  cache_config cc;
  cc.page_size = 16;
  cc.pages = 1400;
  cc.window = raw_window_config{32, 1, kv.channels, 0};
  csa_cache cache(layer_compressor<csa_stream, csa_stream>(csa_stream(geom, kv), csa_stream(geom, ix)), cc);
  const sequence_id seq = cache.create();
  std::mt19937 rng(5);
  const i64 T = 20001, views = geom.branches();  // 5000 entries: two scoring chunks
  const auto kv_in = uniform(rng, T * views * kv.channels), kv_logits = uniform(rng, T * views * kv.channels);
  const auto ix_in = uniform(rng, T * views * ix.channels), ix_logits = uniform(rng, T * views * ix.channels);
  const auto window = uniform(rng, T * kv.channels);
  cache.append(seq, {token_chunk{T, kv_in, kv_logits}, token_chunk{T, ix_in, ix_logits}}, window);

  openmp_executor pool(2);
  REQUIRE(pool.concurrency() == 2);
  for (i64 top_k : {i64{0}, i64{700}}) {  // every entry in place / 700 selected: three pieces
    INFO("top_k " << top_k);
    reader_config rc;
    rc.query_heads = 40;
    rc.indexer_stream = 1;
    rc.top_k = top_k;
    rc.indexer_heads = 8;
    rc.sink = true;
    rc.derotate_output = true;
    sparse_reader serial(cache, rc), parallel(cache, rc);
    parallel.set_executor(pool);
    const auto q = uniform(rng, rc.query_heads * kv.channels), iq = uniform(rng, rc.indexer_heads * ix.channels);
    const auto iw = uniform(rng, rc.indexer_heads), sinks = uniform(rng, rc.query_heads);
    read_request rq;
    rq.position = T - 1;
    rq.queries = q;
    rq.sinks = sinks;
    if (top_k > 0) {
      rq.indexer_queries = iq;
      rq.indexer_weights = iw;
    }
    std::vector<float> a(static_cast<std::size_t>(serial.output_floats())), b(a.size());
    read_trace ta, tb;
    serial.read(cache, seq, rq, a.data(), &ta);
    for (int repeat = 0; repeat < 3; ++repeat) {
      parallel.read(cache, seq, rq, b.data(), &tb);
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      CHECK(ta.selected == tb.selected);
      CHECK(ta.entry_mass == tb.entry_mass);
      CHECK(ta.sink_mass == tb.sink_mass);
    }
    CHECK(ta.candidates == 5000);
  }
}
