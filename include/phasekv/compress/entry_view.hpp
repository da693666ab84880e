#pragma once
// The data a compressor takes and gives, without the compressor: a chunk of new tokens, the
// options of an append, and one emitted entry. Diagnostics that consume entries (write_profile,
// read_attribution) need only these types, not the write path's engine.

#include <cstdint>

#include "phasekv/core/span.hpp"

namespace phasekv {

// New tokens for one stream, in the layout described in stream_config.hpp.
//
// The payload, and independently the logits, come in exactly one of two forms: fp32, or bf16 as
// raw bit patterns (little-endian std::uint16_t, what torch's bf16 `.view(torch.int16)` holds;
// DeepSeek-V4 computes its projections in bf16). A bf16 input means exactly its fp32 widening
// (bits << 16, exact): every entry is bit-identical to the one the fp32 form of the widened values
// gives — for every policy, chunking and mix of forms across appends — but the write path reads
// the bf16 rows in place, half the bytes, instead of a host first widening them in an extra pass.
// Giving both forms of one input (both non-empty) is an input_error.
struct token_chunk {
  std::int64_t tokens = 0;
  span<const float> payload;  // [tokens][kv_heads][views][channels]
  span<const float> logits;   // [tokens][kv_heads][views][gate_channels]; empty unless gated
  span<const std::uint16_t> payload_bf16 = {};  // the payload as bf16 bits, instead of `payload`
  span<const std::uint16_t> logits_bf16 = {};   // the logits as bf16 bits, instead of `logits`

  bool payload_is_bf16() const noexcept { return !payload_bf16.empty(); }
  bool logits_are_bf16() const noexcept { return !logits_bf16.empty(); }
};

struct append_options {
  bool check_finite = false;  // reject NaN/Inf in the chunk, either form (an O(n) scan)
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
