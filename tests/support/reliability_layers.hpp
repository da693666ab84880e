#pragma once
// The compressors the reliability tests (test_reliability*.cpp) build their small layers from.

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/stream_compressor.hpp"

namespace phasekv_test::reliability_layers {

using mean_stream = phasekv::stream_compressor<phasekv::compressor_policy<phasekv::mean_pool>>;
// Vector gates, RoPE after pooling, RMSNorm.
using rope_stream = phasekv::stream_compressor<
    phasekv::compressor_policy<phasekv::vector_gated_pool, phasekv::rope_after_pool, phasekv::rms_norm>>;
using mean_cache = phasekv::paged_cache<mean_stream>;

}  // namespace phasekv_test::reliability_layers
