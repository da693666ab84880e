#pragma once
// Read attribution: where the attention mass of one read went, token by token
// and phase by phase, and whether a target token was reachable through the indexer.
//
//   slot_weight_log  a sink-compatible recorder of each entry's per-slot weights
//   attribute        distribute a read_trace's entry masses to tokens, aggregate by phase
//   find_target      was an entry covering a target token selected, and at what rank
//   classify_failure why a read missed a record: not selected, outweighed, or written faintly
//
// Attribution (precisely). For a read_trace with selected entries j_0 … j_{K−1} (rank order) and
// masses m_k = entry_mass[k] (means over query heads, as sparse_reader reports them), and the
// log's weights w_j[i] for slot i of entry j:
//
//   mass(t) =  Σ_{k : t lies in a real slot i of j_k}  m_k · w_{j_k}[i] / Σ_{real slots i'} w_{j_k}[i']
//            + window_token_mass[t − window_first]        (if window_first ≤ t < window_first + N)
//
// Real slots are [geom.first_real_slot(j), W): padding slots (tokens < 0) are ignored even if a
// hand-built log gives them weight, so a padded first entry spreads its mass over its real
// tokens only, and every entry's mass is conserved: Σ_t mass(t) = Σ_k m_k + Σ window_token_mass.
// A token that lies both in a selected entry and in the raw window receives both contributions
// (the two paths are separate keys in the softmax). The sink's mass goes to no token; it is
// reported as sink_mass. Accumulation is in double.
//
// The token list holds every token *reached* by the read — every real slot token of every
// selected entry and every raw-window token — in increasing token order, including tokens whose
// mass is 0. Per phase φ = geom.phase_of(t): sum = Σ mass(t) over reached tokens of that phase,
// tokens = how many reached tokens have that phase, mean = sum / tokens (0 when tokens = 0).
//
// Which weights: the log keeps, per entry, W floats — the weights of one KV head (`head` ≥ 0,
// the one a GQA group of query heads reads), or the mean over the entry's KV heads (`head` = −1,
// the default). The trace's entry masses are means over all query heads, so the KV-head mean is
// the matching choice when every KV head serves the same number of query heads; use one head's
// log with a trace of a single-KV-head reader (or of the query heads of that head) otherwise.
// Slot weights are the mean over channels of the gate α (append_options::slot_weights), so
// attribution follows that channel-mean profile.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "phasekv/compress/entry_view.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/diag/record_layout.hpp"
#include "phasekv/read/read_types.hpp"

namespace phasekv::diag {

// Records per-slot weights of the entries it is given, by entry index. Use it as (or call it
// from) the sink of stream_compressor::append with append_options::slot_weights = true.
// Storage is a flat table indexed by entry index: W floats per entry up to the largest index
// seen (plus one byte per entry for "recorded"), so log one stream from its start.
// Recording an index again overwrites it (last write wins). A throwing call changes nothing.
class slot_weight_log {
 public:
  // `head` = −1: mean over the entry's KV heads; `head` ≥ 0: that KV head only.
  explicit slot_weight_log(std::int64_t window, std::int64_t head = -1) : window_(window), head_(head) {
    phasekv::detail::require(window >= 1 && window <= (std::int64_t{1} << 20), "slot_weight_log: window", window,
                             "must lie in [1, 2^20]");
    phasekv::detail::require(head >= -1, "slot_weight_log: head", head, "must be -1 (mean over KV heads) or a KV head index");
  }

  void operator()(const entry_view& e) {
    const std::string who = "slot_weight_log: entry " + std::to_string(e.index);
    phasekv::detail::require<input_error>(e.slot_weights != nullptr, who + " slot_weights", "null",
                                          "emit entries with append_options::slot_weights = true");
    phasekv::detail::require<input_error>(e.index >= 0, "slot_weight_log: entry.index", e.index, "must be non-negative");
    phasekv::detail::require<input_error>(e.window == window_, who + " window", e.window,
                                          "must equal the log's window = " + std::to_string(window_));
    phasekv::detail::require<input_error>(e.kv_heads >= 1, who + " kv_heads", e.kv_heads, "must be at least 1");
    phasekv::detail::require<input_error>(head_ < e.kv_heads, who + " kv_heads", e.kv_heads,
                                          "must exceed the log's head = " + std::to_string(head_));
    const std::int64_t W = window_;
    const std::int64_t first_head = head_ < 0 ? 0 : head_;
    const std::int64_t last_head = head_ < 0 ? e.kv_heads : head_ + 1;
    for (std::int64_t h = first_head; h < last_head; ++h)
      for (std::int64_t i = 0; i < W; ++i) {
        const float w = e.slot_weights[h * W + i];
        if (!(std::isfinite(w) && w >= 0.0f))
          phasekv::detail::fail<input_error>(who + " slot_weights[head " + std::to_string(h) + "][slot " + std::to_string(i) + "]",
                                             w, "must be finite and non-negative");
      }
    // The table holds (index + 1) · W floats: bound the index (an entry index never reaches the
    // token limit) and the product before any size is computed, so nothing wraps in size_t.
    phasekv::detail::require<input_error>(e.index < limits::max_tokens, "slot_weight_log: entry.index", e.index,
                                          "must be below 2^48 (limits::max_tokens)");
    std::int64_t floats = 0;
    if (!phasekv::detail::product_within(e.index + 1, W, limits::max_bytes / std::int64_t{sizeof(float)}, floats))
      phasekv::detail::fail<input_error>("slot_weight_log: entry.index", e.index,
                                         "needs (index + 1) × window = (" + std::to_string(e.index) + " + 1) × " +
                                             std::to_string(W) + " floats, beyond limits::max_bytes");
    // Validated: now write. Reserve both tables before resizing either, so an allocation failure
    // leaves both as they were (resizing within the capacity cannot throw).
    const std::size_t need = static_cast<std::size_t>(e.index) + 1;
    if (recorded_.size() < need) {
      weights_.reserve(static_cast<std::size_t>(floats));
      recorded_.reserve(need);
      weights_.resize(static_cast<std::size_t>(floats), 0.0f);
      recorded_.resize(need, 0);
    }
    float* out = weights_.data() + static_cast<std::size_t>(e.index * W);
    const double heads = static_cast<double>(last_head - first_head);
    for (std::int64_t i = 0; i < W; ++i) {
      double sum = 0.0;
      for (std::int64_t h = first_head; h < last_head; ++h) sum += e.slot_weights[h * W + i];
      out[i] = static_cast<float>(sum / heads);
    }
    if (!recorded_[static_cast<std::size_t>(e.index)]) ++count_;
    recorded_[static_cast<std::size_t>(e.index)] = 1;
  }

  std::int64_t window() const noexcept { return window_; }
  std::int64_t head() const noexcept { return head_; }
  std::int64_t recorded() const noexcept { return count_; }  // distinct entries recorded
  bool has(std::int64_t j) const noexcept {
    return j >= 0 && static_cast<std::size_t>(j) < recorded_.size() && recorded_[static_cast<std::size_t>(j)];
  }
  // The W weights of entry j; input_error naming the entry if it was never recorded.
  span<const float> weights(std::int64_t j) const {
    if (!has(j))
      phasekv::detail::fail<input_error>("slot_weight_log: entry", j,
                                         "was not recorded (log the stream's entries with append_options::slot_weights)");
    return {weights_.data() + static_cast<std::size_t>(j * window_), static_cast<std::size_t>(window_)};
  }
  void clear() noexcept {
    weights_.clear();
    recorded_.clear();
    count_ = 0;
  }

 private:
  std::int64_t window_;
  std::int64_t head_;
  std::int64_t count_ = 0;
  std::vector<float> weights_;       // [entry][W]
  std::vector<unsigned char> recorded_;
};

struct token_mass {
  std::int64_t token = 0;
  std::int64_t phase = 0;
  double mass = 0.0;          // from_entries + from_window
  double from_entries = 0.0;  // via selected compressed entries
  double from_window = 0.0;   // via the raw local window
};

struct phase_mass {
  std::int64_t phase = 0;
  std::int64_t tokens = 0;  // reached tokens of this phase
  double sum = 0.0;
  double mean = 0.0;        // sum / tokens (0 when tokens = 0)
};

struct token_attribution {
  std::vector<token_mass> tokens;  // reached tokens, increasing token order
  std::vector<phase_mass> phases;  // S rows, phase order
  double entry_mass = 0.0;         // Σ trace.entry_mass
  double window_mass = 0.0;        // Σ trace.window_token_mass
  double sink_mass = 0.0;          // trace.sink_mass (attributed to no token)
  double total = 0.0;              // Σ_t mass(t) = entry_mass + window_mass (up to rounding)

  // mass(t), 0 for a token the read did not reach.
  double mass_of(std::int64_t t) const {
    const auto it = std::lower_bound(tokens.begin(), tokens.end(), t,
                                     [](const token_mass& a, std::int64_t b) { return a.token < b; });
    return (it != tokens.end() && it->token == t) ? it->mass : 0.0;
  }
};

// See the header comment. Throws input_error if the log's window is not geom.window, the trace's
// entry_mass does not match its selection, a mass is negative or not finite, a selected entry is
// missing from the log (the message names it), or a selected entry's real slots weigh 0 in total.
inline token_attribution attribute(const geometry& geom, const slot_weight_log& log, const read_trace& trace) {
  using phasekv::detail::require;
  geom.validate();
  require<input_error>(log.window() == geom.window, "attribute: log.window", log.window(),
                       "must equal geometry.window = " + std::to_string(geom.window));
  require<input_error>(trace.entry_mass.size() == trace.selected.size(), "attribute: trace.entry_mass.size()",
                       trace.entry_mass.size(),
                       "must equal trace.selected.size() = " + std::to_string(trace.selected.size()));
  require<input_error>(trace.window_first >= 0 || trace.window_token_mass.empty(), "attribute: trace.window_first",
                       trace.window_first, "must be non-negative");

  struct parts {
    double entries = 0.0, window = 0.0;
  };
  std::map<std::int64_t, parts> acc;
  token_attribution out;
  const std::int64_t W = geom.window;

  for (std::size_t k = 0; k < trace.selected.size(); ++k) {
    const std::int64_t j = trace.selected[k];
    const double m = trace.entry_mass[k];
    require<input_error>(std::isfinite(m) && m >= 0.0, "attribute: trace.entry_mass[" + std::to_string(k) + "]", m,
                         "must be finite and non-negative");
    require<input_error>(j >= 0, "attribute: trace.selected[" + std::to_string(k) + "]", j, "must be non-negative");
    const span<const float> w = log.weights(j);  // throws naming entry j
    const std::int64_t first = geom.first_real_slot(j);
    double sum = 0.0;
    for (std::int64_t i = first; i < W; ++i) sum += w[static_cast<std::size_t>(i)];
    require<input_error>(sum > 0.0, "attribute: entry " + std::to_string(j) + " real-slot weight sum", sum,
                         "must be positive to distribute the entry's mass");
    for (std::int64_t i = first; i < W; ++i)
      acc[geom.slot_token(j, i)].entries += m * static_cast<double>(w[static_cast<std::size_t>(i)]) / sum;
    out.entry_mass += m;
  }
  for (std::size_t k = 0; k < trace.window_token_mass.size(); ++k) {
    const double m = trace.window_token_mass[k];
    require<input_error>(std::isfinite(m) && m >= 0.0, "attribute: trace.window_token_mass[" + std::to_string(k) + "]",
                         m, "must be finite and non-negative");
    acc[trace.window_first + static_cast<std::int64_t>(k)].window += m;
    out.window_mass += m;
  }
  out.sink_mass = trace.sink_mass;

  out.phases.resize(static_cast<std::size_t>(geom.stride));
  for (std::int64_t p = 0; p < geom.stride; ++p) out.phases[static_cast<std::size_t>(p)].phase = p;
  out.tokens.reserve(acc.size());
  for (const auto& [t, a] : acc) {
    token_mass tm;
    tm.token = t;
    tm.phase = geom.phase_of(t);
    tm.from_entries = a.entries;
    tm.from_window = a.window;
    tm.mass = a.entries + a.window;
    out.total += tm.mass;
    phase_mass& pm = out.phases[static_cast<std::size_t>(tm.phase)];
    ++pm.tokens;
    pm.sum += tm.mass;
    out.tokens.push_back(tm);
  }
  for (auto& pm : out.phases) pm.mean = pm.tokens > 0 ? pm.sum / static_cast<double>(pm.tokens) : 0.0;
  return out;
}

// Whether a target token was reachable in one read.
struct target_selection {
  std::int64_t token = 0;
  std::int64_t phase = 0;
  std::int64_t covering_candidates = 0;  // entries covering the token that were candidates (j < trace.candidates)
  std::int64_t covering_selected = 0;    // of those, how many were selected
  bool selected = false;                 // some selected entry covers the token
  std::int64_t rank = -1;                // best (lowest) rank among them, −1 if none
  std::int64_t entry = -1;               // the entry at that rank, −1 if none
  float entry_mass = 0.0f;               // its trace.entry_mass (0 if none or not recorded)
  bool in_window = false;                // the token is among the raw window tokens read
};

// Ranks are positions in trace.selected (0 = best indexer score; index order without an indexer).
// Throws input_error for a negative target.
inline target_selection find_target(const geometry& geom, const read_trace& trace, std::int64_t target_token) {
  geom.validate();
  phasekv::detail::require<input_error>(target_token >= 0, "find_target: target_token", target_token, "must be non-negative");
  target_selection out;
  out.token = target_token;
  out.phase = geom.phase_of(target_token);
  const entry_range cover = geom.entries_covering(target_token);
  out.covering_candidates = std::max<std::int64_t>(0, std::min(cover.last, trace.candidates) - cover.first);
  for (std::size_t k = 0; k < trace.selected.size(); ++k) {
    if (!cover.contains(trace.selected[k])) continue;
    ++out.covering_selected;
    if (!out.selected) {
      out.selected = true;
      out.rank = static_cast<std::int64_t>(k);
      out.entry = trace.selected[k];
      out.entry_mass = k < trace.entry_mass.size() ? trace.entry_mass[k] : 0.0f;
    }
  }
  out.in_window = target_token >= trace.window_first &&
                  target_token < trace.window_first + static_cast<std::int64_t>(trace.window_token_mass.size());
  return out;
}

// Why a read failed to retrieve a record of tokens [first, first + length) (the written-badly /
// read-badly split). The record's entries are those whose window holds any of its tokens.
//   selection_miss  no selected entry is one of them and no record token is in the raw window
//   read_dilution   reached, but they (and the record's window tokens) got less than
//                   read_threshold of the read's attention mass (trace masses: means over heads)
//   write_dilution  they got the mass, but inside them the record's tokens weigh less than
//                   write_threshold × what uniform pooling would give them:
//                     share   = Σ_k m_k Σ_{record slots i} w_k[i] / Σ_{real slots} w_k  / Σ_k m_k
//                     uniform = Σ_k m_k (record tokens among k's real slots / real slots) / Σ_k m_k
//                   (mean pooling has share = uniform: it never dilutes by this measure)
//   readout         neither: the record was read and weighted; what failed is downstream
// Throws what attribute() throws for a bad trace or log.
struct failure_attribution {
  failure_cause cause = failure_cause::unattributed;
  std::int64_t entries_selected = 0;  // selected entries holding a record token
  double read_mass = 0.0;             // their mass + the record's window-token mass
  double write_share = 0.0;           // see above (0 when no entry was selected)
  double uniform_share = 0.0;
};

inline failure_attribution classify_failure(const geometry& geom, const slot_weight_log& log, const read_trace& trace,
                                            std::int64_t first, std::int64_t length, double read_threshold = 0.5,
                                            double write_threshold = 0.5) {
  using phasekv::detail::require;
  geom.validate();
  require<input_error>(first >= 0 && length >= 1 && length <= (std::int64_t{1} << 20), "classify_failure: first",
                       first, "must be non-negative, with length in [1, 2^20]");
  require<input_error>(read_threshold >= 0.0 && read_threshold <= 1.0 && write_threshold >= 0.0, "classify_failure: read_threshold",
                       read_threshold, "must lie in [0, 1] (and write_threshold be non-negative)");
  require<input_error>(trace.entry_mass.size() == trace.selected.size(), "classify_failure: trace.entry_mass.size()",
                       trace.entry_mass.size(), "must equal trace.selected.size() = " + std::to_string(trace.selected.size()));
  const std::int64_t last = first + length - 1;
  const entry_range cover{geom.block_of(first), geom.entries_covering(last).last};
  failure_attribution out;
  double mass = 0.0, share = 0.0, uniform = 0.0;
  for (std::size_t k = 0; k < trace.selected.size(); ++k) {
    const std::int64_t j = trace.selected[k];
    if (!cover.contains(j)) continue;
    ++out.entries_selected;
    const double m = trace.entry_mass[k];
    require<input_error>(std::isfinite(m) && m >= 0.0, "classify_failure: trace.entry_mass[" + std::to_string(k) + "]",
                         m, "must be finite and non-negative");
    const span<const float> w = log.weights(j);  // throws naming entry j
    const std::int64_t lo = geom.first_real_slot(j);
    double total = 0.0, record = 0.0;
    std::int64_t record_slots = 0;
    for (std::int64_t i = lo; i < geom.window; ++i) {
      const std::int64_t t = geom.slot_token(j, i);
      total += w[static_cast<std::size_t>(i)];
      if (t >= first && t <= last) {
        record += w[static_cast<std::size_t>(i)];
        ++record_slots;
      }
    }
    mass += m;
    if (total > 0.0) share += m * record / total;
    uniform += m * static_cast<double>(record_slots) / static_cast<double>(geom.window - lo);
  }
  double window_mass = 0.0;
  bool in_window = false;
  for (std::size_t k = 0; k < trace.window_token_mass.size(); ++k) {
    const std::int64_t t = trace.window_first + static_cast<std::int64_t>(k);
    if (t < first || t > last) continue;
    in_window = true;
    window_mass += trace.window_token_mass[k];
  }
  out.read_mass = mass + window_mass;
  out.write_share = mass > 0.0 ? share / mass : 0.0;
  out.uniform_share = mass > 0.0 ? uniform / mass : 0.0;
  if (out.entries_selected == 0 && !in_window) out.cause = failure_cause::selection_miss;
  else if (out.read_mass < read_threshold) out.cause = failure_cause::read_dilution;
  else if (mass > 0.0 && out.write_share < write_threshold * out.uniform_share) out.cause = failure_cause::write_dilution;
  else out.cause = failure_cause::readout;
  return out;
}

}  // namespace phasekv::diag
