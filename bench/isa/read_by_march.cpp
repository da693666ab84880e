// The cost of a build without -march=native: one DeepSeek-V4 CSA layer holding 32K tokens, read
// 10 times per repetition, 7 repetitions (median, min, max), in fp32 (f32 indexer) and at V4
// precision (FP8 entries, FP4 indexer). Build it once per -march and run each (docs/PLATFORMS.md):
//
//   for m in native x86-64-v3 x86-64; do
//     g++ -std=c++17 -O2 -march=$m -Iinclude $(pkg-config --cflags eigen3) bench/isa/read_by_march.cpp -o read_$m
//   done; for m in native x86-64-v3 x86-64; do echo "-march=$m"; ./read_$m; done
//
// Not part of the CMake build (bench/*.cpp are Google Benchmark binaries built for one -march).
#include <phasekv/engine.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
int main() {
  using namespace phasekv;
  using csa = stream_compressor<presets::deepseek_v4_csa_policy>;
  namespace P = presets;
  const std::int64_t tokens = 32768;
  std::uint64_t s = 1;
  auto values = [&](std::size_t n) { std::vector<float> v(n); for (float& x : v) { s = s * 6364136223846793005ull + 1442695040888963407ull; x = float(std::int64_t(s >> 40) - (1 << 23)) / float(1 << 23); } return v; };
  const auto kv = values(tokens * 2 * 512), ix = values(tokens * 2 * 128), window = values(tokens * 512);
  const auto q = values(64 * 512), iq = values(64 * 128);
  std::vector<float> w(64, 1.0f / 64), sinks(64, 0.5f), out(64 * 512);
  token_chunk kv_chunk{tokens, kv, kv}, ix_chunk{tokens, ix, ix};
  auto run = [&](const char* name, const cache_config& cc, const reader_config& rc) {
    layer_compressor<csa, csa> layer(
        csa(P::deepseek_v4_csa_layer.geom, P::deepseek_kv_stream(P::deepseek_v4_csa_layer)),
        csa(P::deepseek_v4_csa_layer.geom, *P::deepseek_indexer_stream(P::deepseek_v4_csa_layer)));
    paged_cache<csa, csa> cache(layer, cc);
    const sequence_id seq = cache.create();
    cache.append(seq, {kv_chunk, ix_chunk}, window);
    sparse_reader reader(cache, rc);
    std::vector<double> times;
    for (int rep = 0; rep < 7; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < 10; ++k) reader.read(cache, seq, read_request{tokens - 1, q, iq, w, sinks}, out.data());
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 10);
    }
    std::sort(times.begin(), times.end());
    std::printf("%s: median %.3f ms per read (min %.3f, max %.3f)\n", name, 1e3 * times[3], 1e3 * times[0], 1e3 * times[6]);
  };
  run("fp32 cache, f32 indexer", P::deepseek_cache(P::deepseek_v4_csa_layer, 1024),
      P::deepseek_reader(P::deepseek_v4_csa_layer));
  run("V4 precision (FP8, FP4 indexer)", P::deepseek_cache(P::deepseek_v4_csa_layer, 1024, 0, true),
      P::deepseek_reader(P::deepseek_v4_csa_layer, true));
}
