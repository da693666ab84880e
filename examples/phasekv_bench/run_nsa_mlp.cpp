// phasekv-bench (examples/phasekv-bench.cpp) on NSA's MLP compressor, a pooling of the host's
// (examples/pools/nsa_mlp_pool.hpp), with random weights for W slots of C channels and a hidden
// width of 64, seeded per stream: the host would load its checkpoint's.

#include <cstdint>
#include <random>
#include <vector>

#include "../pools/nsa_mlp_pool.hpp"
#include "layer_choice.hpp"

namespace phasekv_bench {

phasekv::bench::results run_nsa_mlp(const layer_choice& l, const phasekv::bench::run_config& rc) {
  const std::int64_t window = l.geom.window;
  auto pooling = [window](const phasekv::stream_config& c, int seed) {
    constexpr std::int64_t hidden = 64;
    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    std::normal_distribution<float> normal;
    auto random = [&](std::int64_t n, float scale) {
      std::vector<float> v(static_cast<std::size_t>(n));
      for (float& x : v) x = scale * normal(rng);
      return v;
    };
    const std::int64_t channels = c.channels;
    return phasekv_examples::nsa_mlp_pool(window, channels, hidden, random(window * channels, 0.1f),
                                          random(hidden * window * channels, 0.02f), random(hidden, 0.01f),
                                          random(channels * hidden, 0.1f), random(channels, 0.01f));
  };
  return run_with<phasekv::compressor_policy<phasekv_examples::nsa_mlp_pool>>(l, rc, pooling);
}

}  // namespace phasekv_bench
