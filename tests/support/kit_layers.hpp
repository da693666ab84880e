#pragma once
// A layer the conformance kit's tests check both on paged_cache (test_testing_kit.cpp) and through
// the model front door (test_model_kit.cpp): one definition, so the two runs hold the same layer.

#include <cstdint>

#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/testing/conformance.hpp"
#include "support/configs.hpp"

namespace phasekv_test {

using kit_mean = phasekv::stream_compressor<phasekv::compressor_policy<phasekv::mean_pool>>;

// Separate K and V streams of two heads (16 and 8 channels, mean-pooled over S = 2, W = 4) stored
// in bf16 and f16, pages of three entries, an untied raw window of five rows; a reader of four
// query heads (GQA, two per KV head) with sinks, keys on stream 0 and values on stream 1.
inline phasekv::testing::layer_under_test<kit_mean, kit_mean> split_kv_layer() {
  using namespace phasekv;
  stream_config k = rotated_stream_of("keys", 16, 2, input_layout::per_branch, 0);
  stream_config v = rotated_stream_of("values", 8, 2, input_layout::per_branch, 0);
  k.role = stream_role::key;
  v.role = stream_role::value;
  cache_config cc;
  cc.name = "kv";
  cc.page_size = 3;
  cc.stream_storage = {storage_type::bf16, storage_type::f16};
  cc.window = raw_window_config{5, 2, 16, 8};
  reader_config rc = reader_of("kv.reader", 4);
  rc.key_stream = 0;
  rc.value_stream = 1;
  rc.sink = true;
  const geometry g{2, 4};
  return testing::layer_under_test<kit_mean, kit_mean>(
      layer_compressor<kit_mean, kit_mean>(kit_mean(g, k), kit_mean(g, v)), cc, rc);
}

}  // namespace phasekv_test
