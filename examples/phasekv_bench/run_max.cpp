// phasekv-bench (examples/phasekv-bench.cpp) on max pooling, a pooling of the host's
// (examples/pools/max_pool.hpp).

#include "../pools/max_pool.hpp"
#include "layer_choice.hpp"

namespace phasekv_bench {

phasekv::bench::results run_max(const layer_choice& l, const phasekv::bench::run_config& rc) {
  using policy = phasekv::compressor_policy<phasekv_examples::max_pool>;
  return run_with<policy>(l, rc, [](const phasekv::stream_config&, int) { return policy::pooling{}; });
}

}  // namespace phasekv_bench
