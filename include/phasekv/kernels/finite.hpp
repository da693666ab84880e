#pragma once
// Whether every float of an array is finite, in one vectorised pass: x · 0 is 0 for finite x and
// NaN for ±inf and NaN, so the sum of x · 0 over the array is 0 exactly when all of them are
// finite. Callers look for the offending element only when this says false.

#include <cmath>
#include <cstdint>

#include "phasekv/detail/simd/batch.hpp"

namespace phasekv::kernels {

template <class Arch = simd::default_arch>
inline bool all_finite(const float* values, std::int64_t count) noexcept {
  using batch = simd::float_batch<Arch>;
  constexpr std::int64_t lanes = static_cast<std::int64_t>(batch::size);
  const batch zero(0.0f);
  // Four sums, so that the loop runs at the loads' pace rather than one add's latency a batch.
  batch acc[4] = {batch(0.0f), batch(0.0f), batch(0.0f), batch(0.0f)};
  std::int64_t i = 0;
  for (; i + 4 * lanes <= count; i += 4 * lanes)
    for (int a = 0; a < 4; ++a) acc[a] += batch::load_unaligned(values + i + a * lanes) * zero;
  for (; i + lanes <= count; i += lanes) acc[0] += batch::load_unaligned(values + i) * zero;
  float tail = simd::reduce_add((acc[0] + acc[1]) + (acc[2] + acc[3]));
  for (; i < count; ++i) tail += values[i] * 0.0f;
  return tail == 0.0f;
}

}  // namespace phasekv::kernels
