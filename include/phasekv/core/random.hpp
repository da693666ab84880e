#pragma once
// SplitMix64 (Steele, Lea and Flood, 2014), the one generator behind everything phasekv draws where
// the draws must be reproducible exactly and across languages: sweep run orders, permutation nulls
// and the needle probe's salts (python/phasekv/sweep.py and lab/task.py compute the same sequence).
// Its outputs pass BigCrush; each call costs a few multiplies and no state beyond 64 bits.

#include <cstdint>

namespace phasekv::detail {

// The next output of the sequence whose state is `state` (advanced by the golden-ratio increment).
inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A stateless hash of (seed, salt): the first output of the sequence started at seed + γ·salt, with
// γ the increment, so consecutive salts give consecutive outputs of one sequence.
inline std::uint64_t mix64(std::uint64_t seed, std::uint64_t salt) {
  std::uint64_t state = seed + 0x9E3779B97F4A7C15ull * salt;
  return splitmix64(state);
}

}  // namespace phasekv::detail
