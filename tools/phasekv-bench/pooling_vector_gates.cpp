// phasekv-bench's "vector_gates": per-channel gates, no RoPE, no norm (see poolings.hpp).

#include <phasekv/compress/policies.hpp>

#include "poolings.hpp"

void phasekv_bench::add_vector_gates(phasekv::pooling_registry& poolings) {
  poolings.add_compiled<phasekv::compressor_policy<phasekv::vector_gated_pool>>("vector_gates");
}
