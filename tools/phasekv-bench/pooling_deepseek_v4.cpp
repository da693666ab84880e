// phasekv-bench's "deepseek_v4": DeepSeek-V4's policy, vector gates, RoPE after pooling, RMSNorm
// (see poolings.hpp).

#include <phasekv/models/deepseek_v4.hpp>

#include "poolings.hpp"

void phasekv_bench::add_deepseek_v4(phasekv::pooling_registry& poolings) {
  poolings.add_compiled<phasekv::presets::deepseek_v4_csa_policy>("deepseek_v4");
}
