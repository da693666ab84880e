// phasekv-bench's "mean": plain averaging (see poolings.hpp).

#include <phasekv/compress/policies.hpp>

#include "poolings.hpp"

void phasekv_bench::add_mean(phasekv::pooling_registry& poolings) {
  poolings.add_compiled<phasekv::compressor_policy<phasekv::mean_pool>>("mean");
}
