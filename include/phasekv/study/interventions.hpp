#pragma once
// Interventions: causal probes of where phase effects come from.
//
//   head_knockout_map    accuracy change by residue when each head is knocked out in turn
//                        (the phase specialisation map)
//   knockout_phase_test  whether a knockout's cost depends on the phase (a head × phase test)
//   cycle_slot_profile   cycle offset-specific gate parameters by δ (W = S)
//   predicted_shift      the accuracy profile cycling predicts: A_δ(r) ≈ A_0((r − δ) mod S)
//   staggered_origins    per-head geometries whose chunk origins are spread over the stride

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/study/logistic.hpp"
#include "phasekv/study/phase_sweep.hpp"

namespace phasekv::diag {

// --- head knockout ------------------------------------------------------------------------------

struct knockout_map {
  std::int64_t heads = 0;
  std::int64_t modulus = 0;             // M: columns
  sweep_result baseline;                // knocked_head = −1
  std::vector<sweep_result> knocked;    // one per head, knocked[h] with head h knocked out
  std::vector<double> delta;            // [heads][M]: knocked[h].estimate(r) − baseline.estimate(r)
                                        // (NaN where either residue has no valid trial)
  double at(std::int64_t head, std::int64_t residue) const {
    return delta[static_cast<std::size_t>(head * modulus + residue)];
  }
};

// Runs run_sweep(config, …) once with no head knocked out (baseline) and once per head h in
// [0, heads), calling `trial(const placement&, std::int64_t knocked_head)` with knocked_head = −1
// for the baseline. The trial returns bool or a probability in [0, 1], as for run_sweep; every
// sweep uses the same config (and seed), so all of them see the same placements.
// Knocking out is the HOST's job: inside its trial, for knocked_head = h, it replaces head h's
// output by a calibration mean (its mean output over a calibration set) — the library never sees
// the model. Throws config_error for a bad config or heads < 1, before any trial runs.
template <class Trial>
knockout_map head_knockout_map(const sweep_config& config, std::int64_t heads, Trial&& trial) {
  using returned = std::decay_t<std::invoke_result_t<Trial&, const placement&, std::int64_t>>;
  static_assert(std::is_same_v<returned, bool> || std::is_floating_point_v<returned>,
                "head_knockout_map: the trial must return bool or a floating-point probability in [0, 1]");
  phasekv::detail::require(heads >= 1, "head_knockout_map: heads", heads, "must be at least 1");
  config.validate();
  knockout_map out;
  out.heads = heads;
  out.modulus = config.resolved_modulus();
  out.baseline = run_sweep(config, [&](const placement& p) -> returned { return trial(p, std::int64_t{-1}); });
  out.knocked.reserve(static_cast<std::size_t>(heads));
  out.delta.assign(static_cast<std::size_t>(heads * out.modulus), std::numeric_limits<double>::quiet_NaN());
  for (std::int64_t h = 0; h < heads; ++h) {
    out.knocked.push_back(run_sweep(config, [&](const placement& p) -> returned { return trial(p, h); }));
    const sweep_result& k = out.knocked.back();
    for (std::int64_t r = 0; r < out.modulus; ++r)
      out.delta[static_cast<std::size_t>(h * out.modulus + r)] =
          k.residues[static_cast<std::size_t>(r)].estimate - out.baseline.residues[static_cast<std::size_t>(r)].estimate;
  }
  return out;
}

// Whether knocking a head out costs more at some phases than at others (a head that serves some
// phases only): a logistic fit (logistic.hpp) of success on the phase (S levels, φ = the
// residue's in-block offset of the sweep's stream), the knockout (0/1) and their interaction, over
// the baseline's and the knocked sweep's binary trials (a residue's successes and failures; the
// two sweeps share their placements, which this test treats as independent — conservative for a
// paired design), and the likelihood ratio of the S − 1 interaction columns held at 0. Firth's
// penalty keeps a phase at which every trial fails finite. Throws input_error for a head outside
// the map or a sweep that is not binary.
inline stats::likelihood_ratio knockout_phase_test(const knockout_map& map, std::int64_t head) {
  using phasekv::detail::require;
  require<input_error>(head >= 0 && head < map.heads, "knockout_phase_test: head", head,
                       "must lie in [0, heads = " + std::to_string(map.heads) + ")");
  require<input_error>(map.baseline.kind == outcome_kind::binary, "knockout_phase_test: baseline.kind", "probability",
                       "must be binary (success counts per residue)");
  const std::int64_t S = map.baseline.config.stride;
  const std::size_t k = static_cast<std::size_t>(2 * S);  // 1, knocked, S − 1 phases, S − 1 interactions
  std::vector<double> x, y;
  for (int knocked = 0; knocked < 2; ++knocked) {
    const sweep_result& sweep = knocked ? map.knocked[static_cast<std::size_t>(head)] : map.baseline;
    for (const residue_outcome& r : sweep.residues)
      for (std::int64_t i = 0; i < r.valid; ++i) {
        std::vector<double> row(k, 0.0);
        row[0] = 1.0;
        row[1] = knocked;
        if (r.phase > 0) {
          row[static_cast<std::size_t>(1 + r.phase)] = 1.0;
          row[static_cast<std::size_t>(S + r.phase)] = knocked;
        }
        x.insert(x.end(), row.begin(), row.end());
        y.push_back(i < r.successes ? 1.0 : 0.0);
      }
  }
  std::vector<std::size_t> interaction;
  for (std::int64_t phase = 1; phase < S; ++phase) interaction.push_back(static_cast<std::size_t>(S + phase));
  if (interaction.empty()) return {};
  return stats::test_columns(x, y, k, interaction);
}

// --- cycling offset-specific parameters ---------------------------------------------------------

// For W = S (offset = phase), cycles per-slot parameters by δ: slot i takes the parameter of slot
// (i − δ) mod W, so whatever slot k had (a weak spot) moves to slot k + δ, i.e. to phase k + δ.
// `params` is laid out [heads][W][G]: for each of `heads` blocks, W rows of G floats per slot,
// G = params.size() / (heads · W) — a slot profile (G = 1), a per-slot scalar bias (G = 1), or a
// stream_params::slot_bias of one KV head (G = gate channels; pass heads = kv_heads for the
// whole [kv_heads][W][gates] vector). Rows move whole; each head block is cycled on its own.
// δ may be any integer (taken mod W). Throws input_error if W ≠ S, heads < 1 or the size is not
// a positive multiple of heads · W.
inline std::vector<float> cycle_slot_profile(span<const float> params, std::int64_t window, std::int64_t stride,
                                             std::int64_t delta, std::int64_t heads = 1) {
  using phasekv::detail::require;
  require<input_error>(stride >= 1, "cycle_slot_profile: stride", stride, "must be at least 1");
  require<input_error>(window == stride, "cycle_slot_profile: window", window,
                       "must equal stride = " + std::to_string(stride) +
                           " (with W > S a token sits at several offsets, so cycling offsets does not cycle phases)");
  require<input_error>(heads >= 1, "cycle_slot_profile: heads", heads, "must be at least 1");
  const std::int64_t block = heads * window;
  const std::int64_t n = static_cast<std::int64_t>(params.size());
  require<input_error>(n > 0 && n % block == 0, "cycle_slot_profile: params.size()", n,
                       "must be a positive multiple of heads × window = " + std::to_string(block));
  const std::int64_t G = n / block;
  std::vector<float> out(params.size());
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t i = 0; i < window; ++i) {
      const std::int64_t from = floor_mod(i - delta, window);
      for (std::int64_t g = 0; g < G; ++g)
        out[static_cast<std::size_t>((h * window + i) * G + g)] =
            params[static_cast<std::size_t>((h * window + from) * G + g)];
    }
  return out;
}

// The accuracy profile over M residues that cycling by δ predicts from the uncycled A_0:
//   A_δ(r) = A_0(base(r) + ((r mod S) − δ) mod S),   base(r) = r − (r mod S)
// i.e. the shift happens within each period of S residues (residues r and r + S share a phase but
// may differ in distance effects, which the shift leaves where they were). Throws input_error
// unless M = accuracy.size() is a positive multiple of stride.
// The prediction assumes what a token receives depends on its own slot only. A mechanism that
// pairs neighbouring tokens breaks it where cycling wraps a pair across the block edge: with the
// needle probe's concentrated gates (key slot r, value slot r + 1), δ = S − 1 puts the value gate
// on slot 0 — a token before the key, not after it — and no phase retrieves at all
// (tests/test_diag_interventions_probe.cpp).
inline std::vector<double> predicted_shift(span<const double> accuracy, std::int64_t stride, std::int64_t delta) {
  using phasekv::detail::require;
  require<input_error>(stride >= 1, "predicted_shift: stride", stride, "must be at least 1");
  const std::int64_t m = static_cast<std::int64_t>(accuracy.size());
  require<input_error>(m > 0 && m % stride == 0, "predicted_shift: accuracy.size()", m,
                       "must be a positive multiple of stride = " + std::to_string(stride));
  std::vector<double> out(accuracy.size());
  for (std::int64_t r = 0; r < m; ++r) {
    const std::int64_t phase = r % stride;
    out[static_cast<std::size_t>(r)] = accuracy[static_cast<std::size_t>(r - phase + floor_mod(phase - delta, stride))];
  }
  return out;
}

// The same on a sweep's per-residue estimates (config.stride, M = config.modulus).
inline std::vector<double> predicted_shift(const sweep_result& baseline, std::int64_t delta) {
  std::vector<double> a;
  a.reserve(baseline.residues.size());
  for (const auto& row : baseline.residues) a.push_back(row.estimate);
  return predicted_shift(span<const double>(a.data(), a.size()), baseline.config.stride, delta);
}

// --- staggered origins --------------------------------------------------------------------------

// One geometry per head h ∈ [0, heads): base with origin (base.origin + floor(h·S / heads)) mod S.
// With base.origin = 0 that is floor(h·S/heads): heads spread as evenly as integers allow (exact
// when heads divides S; heads > S makes some heads share an origin). Throws config_error for a
// bad base geometry or heads < 1.
inline std::vector<geometry> staggered_origins(const geometry& base, std::int64_t heads) {
  base.validate();
  phasekv::detail::require(heads >= 1, "staggered_origins: heads", heads, "must be at least 1");
  std::vector<geometry> out(static_cast<std::size_t>(heads), base);
  for (std::int64_t h = 0; h < heads; ++h)
    out[static_cast<std::size_t>(h)].origin = floor_mod(base.origin + (h * base.stride) / heads, base.stride);
  return out;
}

}  // namespace phasekv::diag
