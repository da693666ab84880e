// phasekv-bench (examples/phasekv-bench.cpp) on vector gates.

#include "layer_choice.hpp"

namespace phasekv_bench {

phasekv::bench::results run_vector_gates(const layer_choice& l, const phasekv::bench::run_config& rc) {
  using policy = phasekv::compressor_policy<phasekv::vector_gated_pool>;
  return run_with<policy>(l, rc, [](const phasekv::stream_config&, int) { return policy::pooling{}; });
}

}  // namespace phasekv_bench
