// phasekv-bench's "max": max pooling, a pooling of the host's (examples/pools/max_pool.hpp), which
// states its arithmetic for the write floor.

#include "pools/max_pool.hpp"
#include "poolings.hpp"

void phasekv_bench::add_max(phasekv::pooling_registry& poolings) { poolings.add<phasekv_examples::max_pool>("max"); }
