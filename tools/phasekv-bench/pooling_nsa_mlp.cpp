// phasekv-bench's "nsa_mlp": NSA's MLP compressor, a pooling of the host's
// (examples/pools/nsa_mlp_pool.hpp), with random weights for W slots of C channels and a hidden
// width of 64, seeded per stream (1 for K/V, 2 for an indexer's keys): a host would load its
// checkpoint's, per layer and stream, the same way.

#include <cstdint>
#include <random>
#include <vector>

#include "pools/nsa_mlp_pool.hpp"
#include "poolings.hpp"

void phasekv_bench::add_nsa_mlp(phasekv::pooling_registry& poolings) {
  poolings.add<phasekv_examples::nsa_mlp_pool>("nsa_mlp", [](const phasekv::stream_build& b) {
    constexpr std::int64_t hidden = 64;
    std::mt19937 rng(b.config.role == phasekv::stream_role::indexer ? 2u : 1u);
    std::normal_distribution<float> normal;
    auto random = [&](std::int64_t n, float scale) {
      std::vector<float> v(static_cast<std::size_t>(n));
      for (float& x : v) x = scale * normal(rng);
      return v;
    };
    const std::int64_t window = b.geom.window, channels = b.config.channels;
    return phasekv_examples::nsa_mlp_pool(window, channels, hidden, random(window * channels, 0.1f),
                                          random(hidden * window * channels, 0.02f), random(hidden, 0.01f),
                                          random(channels * hidden, 0.1f), random(channels, 0.01f));
  });
}
