#pragma once
// The data a compressor takes and gives, without the compressor: a chunk of new tokens, the
// options of an append, and one emitted entry. Diagnostics that consume entries (write_profile,
// read_attribution) need only these types, not the write path's engine.

#include <cstdint>

#include "phasekv/core/span.hpp"

namespace phasekv {

// New tokens for one stream, in the layout described in stream_config.hpp.
struct token_chunk {
  std::int64_t tokens = 0;
  span<const float> payload;  // [tokens][kv_heads][views][channels]
  span<const float> logits;   // [tokens][kv_heads][views][gate_channels]; empty unless gated
};

struct append_options {
  bool check_finite = false;  // reject NaN/Inf in the chunk (an O(n) scan)
  bool slot_weights = false;  // give each entry its per-slot weights (mean over channels)
};

// One emitted entry. Pointers are valid only during the sink call.
struct entry_view {
  std::int64_t index = 0;     // entry j
  std::int64_t anchor = 0;    // the position its post-pool RoPE used (or would use)
  std::int64_t kv_heads = 0;
  std::int64_t channels = 0;
  std::int64_t window = 0;
  const float* values = nullptr;        // [kv_heads][channels]
  const float* slot_weights = nullptr;  // [kv_heads][window], or null unless requested

  const float* head(std::int64_t h) const noexcept { return values + h * channels; }
};

}  // namespace phasekv
