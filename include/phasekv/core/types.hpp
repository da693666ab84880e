#pragma once
// The ids every part shares, defined once.

#include <cstdint>

namespace phasekv {

// A sequence of a paged_cache or model_cache: the owner's tag in the top bits, its slot below
// (detail::sequence_tag in cache/paged_cache.hpp).
using sequence_id = std::int64_t;

// Index of a page in its pool, [0, capacity). 32 bits like vLLM's and FlashInfer's page indices.
using page_id = std::int32_t;

}  // namespace phasekv
