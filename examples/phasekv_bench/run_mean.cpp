// phasekv-bench (examples/phasekv-bench.cpp) on mean pooling.

#include "layer_choice.hpp"

namespace phasekv_bench {

phasekv::bench::results run_mean(const layer_choice& l, const phasekv::bench::run_config& rc) {
  using policy = phasekv::compressor_policy<phasekv::mean_pool>;
  return run_with<policy>(l, rc, [](const phasekv::stream_config&, int) { return policy::pooling{}; });
}

}  // namespace phasekv_bench
