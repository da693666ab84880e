// phasekv-bench (examples/phasekv-bench.cpp) on DeepSeek-V4's policy (vector gates, RMSNorm,
// RoPE after pooling).

#include <phasekv/models/deepseek_v4.hpp>

#include "layer_choice.hpp"

namespace phasekv_bench {

phasekv::bench::results run_deepseek_v4(const layer_choice& l, const phasekv::bench::run_config& rc) {
  using policy = phasekv::presets::deepseek_v4_csa_policy;
  return run_with<policy>(l, rc, [](const phasekv::stream_config&, int) { return policy::pooling{}; });
}

}  // namespace phasekv_bench
