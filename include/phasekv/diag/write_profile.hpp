#pragma once
// What the write path gives each phase: the total gate weight a
// token receives — the mean over channels of α, summed over every entry that covers it — and
// its coverage, aggregated by phase φ = (t − origin) mod S; plus the realised per-slot profile.
//
// Use it as a sink (or call it from one) on entries emitted with append_options::slot_weights.
// Only tokens whose covering entries have all been seen are counted, so a partial last window
// does not bias the tail phases.
//
// Gate concentration, the study's two effective numbers of offsets, each from 1
// (one-hot) to W (uniform), with H(p) = −Σ_i p_i ln p_i (0 ln 0 = 0):
//   static      exp(H(E[α]))   — entropy of the mean slot profile: low when every window
//                                 weights the same offsets
//   per window  E[exp(H(α))]   — mean effective offsets of single windows: low whenever each
//                                 window is peaked, even if the peak moves between windows
// They agree when every window has the same α; per-window falling well below static means the
// windows are peaked but on different offsets.
// Both are taken over the entries that contain no padding: a padded first entry spreads its
// weight over fewer than W real slots, which would pull both measures toward fewer offsets for
// a reason that has nothing to do with the gate. Each window's α is normalised to sum 1 first
// (fp32 softmax sums are 1 ± rounding); a window whose weights sum to 0 for a head (only
// possible in hand-built entries) is skipped for that head. α here is the entry's slot weight,
// i.e. for vector gates the mean over channels: the measures describe that channel-mean
// profile, whose entropy is at least the mean per-channel entropy (H is concave) — channels
// peaked on different offsets read as spread out.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/compress/entry_view.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/detail/limits.hpp"

namespace phasekv::diag {

struct phase_weight {
  std::int64_t phase = 0;
  std::int64_t tokens = 0;     // tokens of this phase counted
  double mean_weight = 0.0;    // mean total weight received
  double stddev_weight = 0.0;  // its spread across those tokens
  double coverage = 0.0;       // entries covering a token of this phase
};

class write_profile {
 public:
  write_profile(const geometry& geom, std::int64_t kv_heads) : geom_(geom), heads_(kv_heads) {
    geom_.validate();
    phasekv::detail::require(kv_heads >= 1, "write_profile.kv_heads", kv_heads, "must be at least 1");
    phasekv::detail::require(kv_heads <= limits::max_heads, "write_profile.kv_heads", kv_heads, "must be at most 2^16");
    slot_sum_.assign(static_cast<std::size_t>(heads_ * geom_.window), 0.0);
    unpadded_slot_sum_.assign(static_cast<std::size_t>(heads_ * geom_.window), 0.0);
    window_effective_sum_.assign(static_cast<std::size_t>(heads_), 0.0);
    unpadded_windows_.assign(static_cast<std::size_t>(heads_), 0);
    scratch_.assign(static_cast<std::size_t>(geom_.window), 0.0);  // sized here: operator() never allocates it
  }

  void operator()(const entry_view& e) {
    phasekv::detail::require<input_error>(e.slot_weights != nullptr, "write_profile: entry.slot_weights", "null",
                                          "emit entries with append_options::slot_weights = true");
    phasekv::detail::require<input_error>(e.kv_heads == heads_, "write_profile: entry.kv_heads", e.kv_heads,
                                          "must match the profile's kv_heads = " + std::to_string(heads_));
    phasekv::detail::require<input_error>(e.window == geom_.window, "write_profile: entry.window", e.window,
                                          "must match the profile's window = " + std::to_string(geom_.window));
    phasekv::detail::require<input_error>(e.index >= 0, "write_profile: entry.index", e.index, "must be non-negative");
    // slot_token(index, W − 1) = (index + 1)·S − 1 − lead and the table of (that + 1) · kv_heads
    // doubles must not wrap: an entry index never reaches the token limit, and the table stays
    // within one allocation's limit.
    phasekv::detail::require<input_error>(e.index < limits::max_tokens, "write_profile: entry.index", e.index,
                                          "must be below 2^48 (limits::max_tokens)");
    std::int64_t cells = 0;
    if (!phasekv::detail::product_within(e.index + 1, geom_.stride * heads_, limits::max_bytes / std::int64_t{sizeof(double)},
                                         cells))
      phasekv::detail::fail<input_error>("write_profile: entry.index", e.index,
                                         "needs (index + 1) × stride × kv_heads per-token weights, beyond limits::max_bytes");
    const std::int64_t W = geom_.window;
    const std::int64_t first_real = geom_.first_real_slot(e.index);
    // Validate every weight before touching any state, so a bad entry leaves the profile as it was.
    for (std::int64_t h = 0; h < heads_; ++h)
      for (std::int64_t i = first_real; i < W; ++i) {
        const float w = e.slot_weights[h * W + i];
        if (!(std::isfinite(w) && w >= 0.0f))
          phasekv::detail::fail<input_error>("write_profile: entry " + std::to_string(e.index) + " slot_weights[head " +
                                        std::to_string(h) + "][slot " + std::to_string(i) + "]",
                                    w, "must be finite and non-negative");
      }
    const std::int64_t last_token = geom_.slot_token(e.index, W - 1);
    if (static_cast<std::int64_t>(token_weight_.size()) < (last_token + 1) * heads_)
      token_weight_.resize(static_cast<std::size_t>((last_token + 1) * heads_), 0.0);
    for (std::int64_t h = 0; h < heads_; ++h)
      for (std::int64_t i = first_real; i < W; ++i) {
        const double w = e.slot_weights[h * W + i];
        token_weight_[geom_.slot_token(e.index, i) * heads_ + h] += w;
        slot_sum_[h * W + i] += w;
      }
    if (first_real == 0) accumulate_concentration(e.slot_weights);
    entries_ = std::max(entries_, e.index + 1);
    ++entries_seen_;
  }

  // Per phase, for one head.
  std::vector<phase_weight> by_phase(std::int64_t head) const {
    check_head(head);
    const std::int64_t S = geom_.stride;
    std::vector<phase_weight> out(static_cast<std::size_t>(S));
    std::vector<double> sum(S, 0.0), sum_sq(S, 0.0), cover(S, 0.0);
    for (std::int64_t t = 0; t * heads_ < static_cast<std::int64_t>(token_weight_.size()); ++t) {
      if (geom_.entries_covering(t).last > entries_) break;  // a covering entry is still missing
      const std::int64_t p = geom_.phase_of(t);
      const double w = token_weight_[t * heads_ + head];
      out[p].tokens += 1;
      sum[p] += w;
      sum_sq[p] += w * w;
      cover[p] += static_cast<double>(geom_.coverage(t));
    }
    for (std::int64_t p = 0; p < S; ++p) {
      phase_weight& r = out[p];
      r.phase = p;
      if (r.tokens == 0) continue;
      const double n = static_cast<double>(r.tokens);
      r.mean_weight = sum[p] / n;
      r.stddev_weight = std::sqrt(std::max(0.0, sum_sq[p] / n - r.mean_weight * r.mean_weight));
      r.coverage = cover[p] / n;
    }
    return out;
  }

  // Mean weight per slot over the entries seen (padding counts as 0).
  std::vector<double> slot_profile(std::int64_t head) const {
    check_head(head);
    std::vector<double> out(slot_sum_.begin() + head * geom_.window, slot_sum_.begin() + (head + 1) * geom_.window);
    if (entries_seen_ > 0)
      for (double& w : out) w /= static_cast<double>(entries_seen_);
    return out;
  }

  // Mean normalised weight per slot over the entries without padding (E[α] of the static
  // concentration); all zeros before the first such entry.
  std::vector<double> unpadded_slot_profile(std::int64_t head) const {
    check_head(head);
    std::vector<double> out(unpadded_slot_sum_.begin() + head * geom_.window,
                            unpadded_slot_sum_.begin() + (head + 1) * geom_.window);
    const std::int64_t n = unpadded_windows_[static_cast<std::size_t>(head)];
    if (n > 0)
      for (double& w : out) w /= static_cast<double>(n);
    return out;
  }

  // Static gate concentration exp(H(E[α])), in [1, W]; 0 before the first entry without padding.
  double static_concentration(std::int64_t head) const {
    check_head(head);
    if (unpadded_windows_[static_cast<std::size_t>(head)] == 0) return 0.0;
    const auto profile = unpadded_slot_profile(head);
    return std::exp(entropy(profile.data(), geom_.window));
  }

  // Per-window gate concentration E[exp(H(α))], in [1, W]; 0 before the first entry without padding.
  double window_concentration(std::int64_t head) const {
    check_head(head);
    const std::int64_t n = unpadded_windows_[static_cast<std::size_t>(head)];
    return n == 0 ? 0.0 : window_effective_sum_[static_cast<std::size_t>(head)] / static_cast<double>(n);
  }

  // Windows both concentration measures of `head` average over.
  std::int64_t concentration_windows(std::int64_t head) const {
    check_head(head);
    return unpadded_windows_[static_cast<std::size_t>(head)];
  }

 private:
  // Shannon entropy (natural log) of p[0..n), which sums to 1; 0 ln 0 = 0.
  template <class T>
  static double entropy(const T* p, std::int64_t n) {
    double h = 0.0;
    for (std::int64_t i = 0; i < n; ++i)
      if (p[i] > 0) h -= static_cast<double>(p[i]) * std::log(static_cast<double>(p[i]));
    return h;
  }

  void accumulate_concentration(const float* weights) {
    const std::int64_t W = geom_.window;
    std::vector<double>& alpha = scratch_;
    for (std::int64_t h = 0; h < heads_; ++h) {
      double sum = 0.0;
      for (std::int64_t i = 0; i < W; ++i) sum += weights[h * W + i];
      if (!(sum > 0.0)) continue;
      for (std::int64_t i = 0; i < W; ++i) {
        alpha[static_cast<std::size_t>(i)] = weights[h * W + i] / sum;
        unpadded_slot_sum_[static_cast<std::size_t>(h * W + i)] += alpha[static_cast<std::size_t>(i)];
      }
      window_effective_sum_[static_cast<std::size_t>(h)] += std::exp(entropy(alpha.data(), W));
      ++unpadded_windows_[static_cast<std::size_t>(h)];
    }
  }

  void check_head(std::int64_t head) const {
    phasekv::detail::require<input_error>(head >= 0 && head < heads_, "write_profile: head", head,
                                          "must lie in [0, kv_heads = " + std::to_string(heads_) + ")");
  }

  geometry geom_;
  std::int64_t heads_;
  std::int64_t entries_ = 0;       // one past the highest entry index seen
  std::int64_t entries_seen_ = 0;  // entries received
  std::vector<double> token_weight_;  // [token][head]
  std::vector<double> slot_sum_;      // [head][slot]
  std::vector<double> unpadded_slot_sum_;       // [head][slot]: Σ normalised α over unpadded entries
  std::vector<double> window_effective_sum_;    // [head]: Σ exp(H(α)) over the same entries
  std::vector<std::int64_t> unpadded_windows_;  // [head]: how many entries those sums hold
  std::vector<double> scratch_;                 // one window's normalised α
};

}  // namespace phasekv::diag
