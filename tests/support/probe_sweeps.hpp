#pragma once
// The small needle-probe world the diagnostics tests share: a 4096-token context with 256
// records and 128-channel embeddings (fast at -O1, strong enough to show every phase effect), and
// a binary sweep of it over the whole context with a fixed plan (seed 3), so a baseline and an
// intervention see the same placements and haystacks.

#include <cstdint>
#include <vector>

#include "phasekv/study/needle_probe.hpp"
#include "phasekv/study/phase_sweep.hpp"

namespace phasekv_test {

inline phasekv::diag::probe::needle_config small_probe_config(phasekv::diag::probe::needle_policy policy,
                                                              std::int64_t stride, std::int64_t window) {
  phasekv::diag::probe::needle_config c;
  c.tokens = 4096;
  c.records = 256;
  c.channels = 128;
  c.policy = policy;
  c.stride = stride;
  c.window = window;
  c.seed = 7;
  return c;
}

// needle_sweep groups the plan's targets into non-overlapping haystacks, one build each.
inline phasekv::diag::sweep_result probe_sweep(const phasekv::diag::probe::needle_config& config,
                                               std::int64_t trials_per_residue = 48, std::int64_t modulus = 0) {
  phasekv::diag::probe::needle_probe p(config);
  phasekv::diag::sweep_config sc;
  sc.stride = config.effective_stride();
  sc.modulus = modulus;
  sc.trials_per_residue = trials_per_residue;
  sc.query_position = config.tokens - 1;
  sc.span = config.tokens - 64;
  sc.min_distance = 16;
  sc.seed = 3;
  return phasekv::diag::probe::needle_sweep(p, sc);
}

inline std::vector<double> residue_accuracy(const phasekv::diag::sweep_result& r) {
  std::vector<double> a;
  for (const auto& row : r.residues) a.push_back(row.estimate);
  return a;
}

}  // namespace phasekv_test
