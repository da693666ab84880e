#pragma once
// phasekv-bench's poolings (tools/phasekv-bench/phasekv-bench.cpp): each a registry id whose compiled policy
// is instantiated in a translation unit of its own (pooling_<id>.cpp). In one unit with all the
// others, GCC inlined the write path less (its unit-growth limits), and a prefill ran ~7% slower
// than bench_write's.
//
//   mean          compressor_policy<mean_pool>: plain averaging
//   vector_gates  compressor_policy<vector_gated_pool>: per-channel gates, no RoPE, no norm
//   deepseek_v4   DeepSeek-V4's policy: vector gates, RoPE after pooling, RMSNorm
//   max, nsa_mlp  poolings of the host's (examples/pools/), registered as a host registers its own

#include <phasekv/compress/pooling_registry.hpp>

namespace phasekv_bench {

void add_mean(phasekv::pooling_registry& poolings);
void add_vector_gates(phasekv::pooling_registry& poolings);
void add_deepseek_v4(phasekv::pooling_registry& poolings);
void add_max(phasekv::pooling_registry& poolings);
void add_nsa_mlp(phasekv::pooling_registry& poolings);

inline phasekv::pooling_registry poolings() {
  phasekv::pooling_registry r;
  add_mean(r);
  add_vector_gates(r);
  add_deepseek_v4(r);
  add_max(r);
  add_nsa_mlp(r);
  return r;
}

}  // namespace phasekv_bench
