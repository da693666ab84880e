#pragma once
// What the write path gives each phase (DESIGN.md §6, "write profile"): the total gate weight a
// token receives — the mean over channels of α, summed over every entry that covers it — and
// its coverage, aggregated by phase φ = (t − origin) mod S; plus the realised per-slot profile.
//
// Use it as a sink (or call it from one) on entries emitted with append_options::slot_weights.
// Only tokens whose covering entries have all been seen are counted, so a partial last window
// does not bias the tail phases.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"

namespace phasekv {

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
    detail::require(kv_heads >= 1, "write_profile.kv_heads", kv_heads, "must be at least 1");
    slot_sum_.assign(static_cast<std::size_t>(heads_ * geom_.window), 0.0);
  }

  void operator()(const entry_view& e) {
    detail::require<input_error>(e.slot_weights != nullptr, "write_profile: entry.slot_weights", "null",
                                 "emit entries with append_options::slot_weights = true");
    detail::require<input_error>(e.kv_heads == heads_ && e.window == geom_.window, "write_profile: entry.kv_heads",
                                 e.kv_heads, "must match the profile's kv_heads and window");
    const std::int64_t W = geom_.window;
    const std::int64_t last_token = geom_.slot_token(e.index, W - 1);
    if (static_cast<std::int64_t>(token_weight_.size()) < (last_token + 1) * heads_)
      token_weight_.resize(static_cast<std::size_t>((last_token + 1) * heads_), 0.0);
    for (std::int64_t h = 0; h < heads_; ++h)
      for (std::int64_t i = geom_.first_real_slot(e.index); i < W; ++i) {
        const double w = e.slot_weights[h * W + i];
        token_weight_[geom_.slot_token(e.index, i) * heads_ + h] += w;
        slot_sum_[h * W + i] += w;
      }
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

 private:
  void check_head(std::int64_t head) const {
    detail::require<input_error>(head >= 0 && head < heads_, "write_profile: head", head,
                                 "must lie in [0, kv_heads = " + std::to_string(heads_) + ")");
  }

  geometry geom_;
  std::int64_t heads_;
  std::int64_t entries_ = 0;       // one past the highest entry index seen
  std::int64_t entries_seen_ = 0;  // entries received
  std::vector<double> token_weight_;  // [token][head]
  std::vector<double> slot_sum_;      // [head][slot]
};

}  // namespace phasekv
