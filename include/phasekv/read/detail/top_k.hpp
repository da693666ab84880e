#pragma once
// Top-k selection in O(n): the k highest scores, ties broken by the lower index,
// returned in rank order. Many scores and a small k are first cut at a score estimated from a
// sample of them (detail::keys_above_sampled_cut: a top 512 of 32K keeps ~1.5K). Large inputs
// are then narrowed with a histogram of their scores (detail::drop_below_top) to the top k plus
// the rest of one histogram bin; what is left is sorted by a byte-wise radix sort
// (detail::sort_descending) and cut to k, or, when no order is asked for, partitioned by
// std::nth_element (introselect).
//
// The selection runs on rank keys: each (score, index) packed into one 64-bit integer whose
// natural order is the rank order (rank_key below), so every step compares, counts or moves
// integers instead of calling a comparator that tests for NaN and ties. The radix sort, not
// nth_element + std::sort, orders the top 512 of 1–8K winners: both of those mispredict a branch
// on about every other comparison of random keys; the sort's passes have no branch on the data.
// The selection's time: bench_read's BM_top_k (bench/RESULTS.md).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "phasekv/core/span.hpp"

#include "phasekv/detail/simd/config.hpp"
#include "phasekv/detail/simd/intrinsics.hpp"

namespace phasekv {

struct scored_entry {
  std::int64_t index = 0;
  float score = 0.0f;
};

// The rank order: higher score first, equal scores by lower index, NaN scores (which callers
// should not produce) last. (score, index) as one integer, larger = ranks before: the high 32 bits are the score mapped to
// an unsigned integer in the same order (−0 counts as +0, every NaN maps to 0, below −∞), the low
// 32 bits are 2³² − 1 − index, so equal scores rank by the lower index. Indices must be below 2³².
// Without branches (scores of either sign arrive in random order, and a branch on the sign
// mispredicted half the time): negative scores flip every bit (larger magnitude, smaller key),
// non-negative ones set the top bit (above every negative).
inline std::uint32_t score_order(float score) noexcept {
  score += 0.0f;  // −0 → +0 (IEEE: −0 + +0 = +0; every other value unchanged)
  std::uint32_t bits;
  std::memcpy(&bits, &score, sizeof bits);
  const std::uint32_t flip = static_cast<std::uint32_t>(static_cast<std::int32_t>(bits) >> 31) | 0x80000000u;
  return score != score ? 0u : bits ^ flip;  // NaN: last
}
inline std::uint64_t rank_key(float score, std::int64_t index) noexcept {
  return (static_cast<std::uint64_t>(score_order(score)) << 32) | (0xFFFFFFFFu - static_cast<std::uint32_t>(index));
}
inline std::int64_t rank_key_index(std::uint64_t key) noexcept {
  return static_cast<std::int64_t>(0xFFFFFFFFu - static_cast<std::uint32_t>(key));
}

namespace detail {

// The least and greatest score order (a key's high half) of keys[0 … n), folded into lo and hi.
// Four running minima and maxima (eight lanes with AVX-512): one pair would make every key wait
// for the previous key's compare-and-move.
inline void low_high_orders(const std::uint64_t* keys, std::size_t n, std::uint32_t& lo, std::uint32_t& hi) noexcept {
  std::size_t i = 0;
#if PHASEKV_HAS_AVX512
  if (n >= 8) {
    __m512i low = _mm512_set1_epi64(0xFFFFFFFFLL), high = _mm512_setzero_si512();
    for (; i + 8 <= n; i += 8) {
      const __m512i order = _mm512_srli_epi64(_mm512_loadu_si512(keys + i), 32);
      low = _mm512_min_epu64(low, order);
      high = _mm512_max_epu64(high, order);
    }
    lo = std::min(lo, static_cast<std::uint32_t>(_mm512_reduce_min_epu64(low)));
    hi = std::max(hi, static_cast<std::uint32_t>(_mm512_reduce_max_epu64(high)));
  }
#endif
  std::uint32_t lows[4] = {lo, lo, lo, lo}, highs[4] = {hi, hi, hi, hi};
  for (; i + 4 <= n; i += 4)
    for (std::size_t a = 0; a < 4; ++a) {
      const auto order = static_cast<std::uint32_t>(keys[i + a] >> 32);
      lows[a] = std::min(lows[a], order);
      highs[a] = std::max(highs[a], order);
    }
  for (; i < n; ++i) {
    const auto order = static_cast<std::uint32_t>(keys[i] >> 32);
    lows[0] = std::min(lows[0], order);
    highs[0] = std::max(highs[0], order);
  }
  lo = std::min(std::min(lows[0], lows[1]), std::min(lows[2], lows[3]));
  hi = std::max(std::max(highs[0], highs[1]), std::max(highs[2], highs[3]));
}

// Moves the keys ≥ least to the front of keys[0 … n), in their order; returns how many. Without
// a branch on the data: a branch on each key mispredicted for every key kept. With AVX-512, eight
// keys a step, compressed in a register and stored whole at the write position (never past the
// eight keys just loaded, so nothing unread is overwritten).
inline std::size_t keep_at_least(std::uint64_t* keys, std::size_t n, std::uint64_t least) noexcept {
  std::size_t kept = 0, i = 0;
#if PHASEKV_HAS_AVX512
  const __m512i bound = _mm512_set1_epi64(static_cast<long long>(least));
  for (; i + 8 <= n; i += 8) {
    const __m512i v = _mm512_loadu_si512(keys + i);
    const __mmask8 m = _mm512_cmpge_epu64_mask(v, bound);
    _mm512_storeu_si512(keys + kept, _mm512_maskz_compress_epi64(m, v));
    unsigned bits = m;  // the set bits of 8
    bits = bits - ((bits >> 1) & 0x55u);
    bits = (bits & 0x33u) + ((bits >> 2) & 0x33u);
    kept += (bits + (bits >> 4)) & 0x0Fu;
  }
#endif
  for (; i < n; ++i) {
    const std::uint64_t key = keys[i];
    keys[kept] = key;
    kept += key >= least ? 1 : 0;
  }
  return kept;
}

// Drops keys that cannot be among the top `keep` (0 < keep < keys.size()): one pass finds the
// lowest and highest score (the keys' high halves, in rank order), a second counts the keys in
// 2048 bins spread evenly between them, and a third keeps the bins from the top down to the one
// where the count first reaches `keep`. What stays is the top `keep` plus the rest of that one
// bin, for the caller to partition or sort: on a top-512 of 4096 indexer scores about 600 keys
// (nth_element over all 4096 keys would mispredict its branches about half the time). Any
// distribution is safe: equal scores share a bin, and only whole bins below the cut are dropped.
inline void drop_below_top(std::vector<std::uint64_t>& keys, std::size_t keep) {
  constexpr int bin_bits = 11;
  std::uint32_t lo = 0xFFFFFFFFu, hi = 0;
  low_high_orders(keys.data(), keys.size(), lo, hi);
  int shift = 0;
  while (((hi - lo) >> shift) >= (1u << bin_bits)) ++shift;
  auto bin = [&](std::uint64_t key) { return (static_cast<std::uint32_t>(key >> 32) - lo) >> shift; };
  std::uint32_t count[1u << bin_bits] = {};
  for (const std::uint64_t key : keys) ++count[bin(key)];
  std::uint32_t cut = bin(std::uint64_t{hi} << 32);
  for (std::size_t seen = count[cut]; seen < keep;) seen += count[--cut];  // stops by bin 0: n > keep
  // bin(key) ≥ cut ⇔ order ≥ lo + cut · 2^shift (≤ hi, no overflow) ⇔ key ≥ that order in the
  // high half: one compare per key.
  const std::uint64_t least = static_cast<std::uint64_t>(lo + (cut << shift)) << 32;
  const std::size_t kept = keep_at_least(keys.data(), keys.size(), least);
  keys.resize(kept);
}

// Sorts keys into descending order: a least-significant-byte-first radix sort, each pass a
// stable counting sort on one byte with the buckets laid out from 255 down, so the last pass
// (the most significant byte) leaves the keys in descending order of the whole key. One pass
// over the keys counts all eight bytes; a byte that every key shares costs no pass (the high
// bytes of the indices, and of the scores once narrowed to a small range). `scratch` is reused.
inline void sort_descending(std::vector<std::uint64_t>& keys, std::vector<std::uint64_t>& scratch) {
  const std::size_t n = keys.size();
  if (n < 64) {  // a handful: the counts would cost more than the comparisons
    std::sort(keys.begin(), keys.end(), std::greater<std::uint64_t>());
    return;
  }
  std::uint32_t count[8][256] = {};
  for (const std::uint64_t key : keys)
    for (int b = 0; b < 8; ++b) ++count[b][(key >> (8 * b)) & 0xFF];
  scratch.resize(n);
  std::uint64_t* from = keys.data();
  std::uint64_t* to = scratch.data();
  for (int b = 0; b < 8; ++b) {
    const int shift = 8 * b;
    if (count[b][(from[0] >> shift) & 0xFF] == n) continue;
    std::uint32_t next[256];
    std::uint32_t placed = 0;
    for (int v = 255; v >= 0; --v) {
      next[v] = placed;
      placed += count[b][v];
    }
    for (std::size_t i = 0; i < n; ++i) to[next[(from[i] >> shift) & 0xFF]++] = from[i];
    std::swap(from, to);
  }
  if (from != keys.data()) std::copy(from, from + n, keys.data());
}

// The sampled cut. Scores far outnumbering k (a top 512 of 32K indexer scores) need not all
// become rank keys: the orders of cut_samples scores spread over the input give a cut that some
// 2k + 8·n/cut_samples scores are expected to reach (twice the share of the top k in the sample,
// plus eight samples against the sampling's noise), and only the scores at or above it become
// keys. The cut is a guess, checked: if fewer than k scores reach it, the caller makes a key of
// every score instead — with the top k at 1/64 of the scores (a sample rank of 24, expected
// 8), about one input in 10^6 of independent scores. Any input is safe: at least k scores at or
// above the cut means the k-th best is too, so every one of the top k is kept, ties included.
// Keying only the scores above the cut is what makes the selection cheap: making keys of all
// scores and narrowing them would be most of its work (bench_read's BM_top_k, bench/RESULTS.md).
inline constexpr std::size_t cut_samples = 512;

// Sample i of n scores: one in each stretch of n / cut_samples, at an offset scrambled by
// Fibonacci hashing, so that scores periodic in the index (as phase effects make them) cannot
// line up with the sampling.
inline std::size_t cut_sample_position(std::size_t i, std::size_t n) noexcept {
  const std::size_t stretch = n / cut_samples;
  const std::uint64_t scrambled = static_cast<std::uint32_t>(i * 0x9E3779B1u);
  return i * stretch + static_cast<std::size_t>((scrambled * stretch) >> 32);
}

// The sample rank of the cut for keep of n scores, or 0 where sampling does not pay (under 8192
// scores, or keep above about n/9, where the cut would keep a good part of the input anyway).
inline std::size_t cut_sample_rank(std::size_t n, std::size_t keep) noexcept {
  if (n < 16 * cut_samples || keep == 0) return 0;
  const std::size_t rank = (2 * keep * cut_samples + n - 1) / n + 8;
  return rank <= cut_samples / 4 ? rank : 0;
}

#if PHASEKV_HAS_AVX512
// score_order of sixteen scores.
inline __m512i score_orders(__m512 scores) noexcept {
  const __m512 plus = _mm512_add_ps(scores, _mm512_setzero_ps());  // −0 → +0
  const __m512i bits = _mm512_castps_si512(plus);
  const __m512i flip = _mm512_or_si512(_mm512_srai_epi32(bits, 31), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  return _mm512_maskz_xor_epi32(_mm512_cmp_ps_mask(plus, plus, _CMP_ORD_Q), bits, flip);  // NaN: 0
}
#endif

// How many of scores[0 … n) have an order of at least `least`.
inline std::size_t count_at_least(const float* scores, std::size_t n, std::uint32_t least) noexcept {
  std::size_t count = 0, j = 0;
#if PHASEKV_HAS_AVX512
  const __m512i bound = _mm512_set1_epi32(static_cast<int>(least));
  for (; j + 16 <= n; j += 16)
    count += static_cast<std::size_t>(
        __builtin_popcount(_mm512_cmpge_epu32_mask(score_orders(_mm512_loadu_ps(scores + j)), bound)));
#endif
  for (; j < n; ++j) count += score_order(scores[j]) >= least ? 1 : 0;
  return count;
}

// The rank keys of the scores with an order of at least `least`, in index order, into
// keys[0 …); keys must have room for their count plus 16. Without a branch on the data, as
// keep_at_least: with AVX-512, sixteen scores a step become two registers of eight keys, each
// compressed and stored whole at the write position.
inline void keys_at_least(const float* scores, std::size_t n, std::int64_t first_index, std::uint32_t least,
                          std::uint64_t* keys) noexcept {
  std::size_t kept = 0, j = 0;
#if PHASEKV_HAS_AVX512
  const __m512i bound = _mm512_set1_epi32(static_cast<int>(least));
  // The keys' low halves, 2^32 − 1 − index, for the eight lanes of each half of a step.
  const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i top = _mm512_set1_epi64(static_cast<long long>(0xFFFFFFFFu - static_cast<std::uint32_t>(first_index)));
  __m512i low_a = _mm512_sub_epi64(top, lane);
  __m512i low_b = _mm512_sub_epi64(low_a, _mm512_set1_epi64(8));
  const __m512i step = _mm512_set1_epi64(16);
  for (; j + 16 <= n; j += 16) {
    const __m512i orders = score_orders(_mm512_loadu_ps(scores + j));
    const __mmask16 keep = _mm512_cmpge_epu32_mask(orders, bound);
    const __m512i keys_a =
        _mm512_or_si512(_mm512_slli_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(orders)), 32), low_a);
    const __m512i keys_b =
        _mm512_or_si512(_mm512_slli_epi64(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(orders, 1)), 32), low_b);
    const auto keep_a = static_cast<__mmask8>(keep), keep_b = static_cast<__mmask8>(keep >> 8);
    _mm512_storeu_si512(keys + kept, _mm512_maskz_compress_epi64(keep_a, keys_a));
    kept += static_cast<std::size_t>(__builtin_popcount(keep_a));
    _mm512_storeu_si512(keys + kept, _mm512_maskz_compress_epi64(keep_b, keys_b));
    kept += static_cast<std::size_t>(__builtin_popcount(keep_b));
    low_a = _mm512_sub_epi64(low_a, step);
    low_b = _mm512_sub_epi64(low_b, step);
  }
#endif
  for (; j < n; ++j) {
    const std::uint64_t key = rank_key(scores[j], first_index + static_cast<std::int64_t>(j));
    keys[kept] = key;
    kept += static_cast<std::uint32_t>(key >> 32) >= least ? 1 : 0;
  }
}

// The rank keys of at least the top `keep` of scores[0 … n) (and only of scores), in index
// order, by the sampled cut above; false, keys untouched, where sampling does not pay or the
// cut is too high.
inline bool keys_above_sampled_cut(span<const float> scores, std::int64_t first_index, std::size_t keep,
                                   std::vector<std::uint64_t>& keys) {
  const std::size_t n = scores.size(), rank = cut_sample_rank(n, keep);
  if (rank == 0) return false;
  std::uint32_t sample[cut_samples];
  for (std::size_t i = 0; i < cut_samples; ++i) sample[i] = score_order(scores[cut_sample_position(i, n)]);
  std::nth_element(sample, sample + (rank - 1), sample + cut_samples, std::greater<std::uint32_t>());
  const std::uint32_t cut = sample[rank - 1];
  const std::size_t count = count_at_least(scores.data(), n, cut);
  if (count < keep) return false;
  keys.resize(count + 16);
  keys_at_least(scores.data(), n, first_index, cut, keys.data());
  keys.resize(count);
  return true;
}

// min(k, n) for k of any sign.
inline std::size_t kept_count(std::size_t n, std::int64_t k) noexcept {
  return static_cast<std::size_t>(std::min<std::int64_t>(std::max<std::int64_t>(k, 0), static_cast<std::int64_t>(n)));
}

}  // namespace detail

// Drops keys that cannot be among the top min(k, n), keeping them all and perhaps some more:
// keep_top_keys's first step, and for a stage whose survivors are merged and selected again.
inline void narrow_to_top_keys(std::vector<std::uint64_t>& keys, std::int64_t k) {
  const std::size_t keep = detail::kept_count(keys.size(), k);
  if (keep == 0) keys.clear();
  // Under a thousand keys the histogram's three passes save less than they cost.
  else if (keep < keys.size() && keys.size() >= 1024) detail::drop_below_top(keys, keep);
}

// Keeps the top min(k, n) keys; best first when `sorted` (narrowed, radix-sorted, cut),
// else in no particular order (narrowed, then partitioned by nth_element). `scratch` is the
// radix sort's buffer, kept by callers that select often.
inline void keep_top_keys(std::vector<std::uint64_t>& keys, std::int64_t k, bool sorted,
                          std::vector<std::uint64_t>& scratch) {
  const std::size_t keep = detail::kept_count(keys.size(), k);
  narrow_to_top_keys(keys, k);
  if (sorted) {
    detail::sort_descending(keys, scratch);
  } else if (keep < keys.size()) {
    std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(keep), keys.end(),
                     std::greater<std::uint64_t>());
  }
  keys.resize(keep);
}

inline void keep_top_keys(std::vector<std::uint64_t>& keys, std::int64_t k, bool sorted) {
  std::vector<std::uint64_t> scratch;
  keep_top_keys(keys, k, sorted, scratch);
}

// The rank keys of scores[0 … n), scores[j] belonging to entry first_index + j.
inline void rank_keys(span<const float> scores, std::int64_t first_index, std::vector<std::uint64_t>& keys) {
  keys.resize(scores.size());
  for (std::size_t j = 0; j < scores.size(); ++j) keys[j] = rank_key(scores[j], first_index + static_cast<std::int64_t>(j));
}

// The rank keys of the top min(k, n) of scores[0 … n), best first, into `keys`; scores[j]
// belongs to entry first_index + j. Many scores and a small k take the sampled cut
// (detail::keys_above_sampled_cut), the rest a key per score; the keys are the same either way.
inline void select_top_keys(span<const float> scores, std::int64_t first_index, std::int64_t k,
                            std::vector<std::uint64_t>& keys, std::vector<std::uint64_t>& scratch) {
  if (!detail::keys_above_sampled_cut(scores, first_index, detail::kept_count(scores.size(), k), keys))
    rank_keys(scores, first_index, keys);
  keep_top_keys(keys, k, true, scratch);
}

// The top min(k, n) of scores[0 … n), best first, into `out` (reusing its storage); scores[j]
// belongs to entry first_index + j.
inline void select_top_k(span<const float> scores, std::int64_t k, std::vector<scored_entry>& out,
                         std::int64_t first_index = 0) {
  std::vector<std::uint64_t> keys, scratch;
  select_top_keys(scores, first_index, k, keys, scratch);
  out.resize(keys.size());
  for (std::size_t r = 0; r < keys.size(); ++r) {
    const std::int64_t index = rank_key_index(keys[r]);
    out[r] = {index, scores[static_cast<std::size_t>(index - first_index)]};
  }
}

}  // namespace phasekv
