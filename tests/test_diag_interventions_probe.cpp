// The intervention helpers (study/interventions.hpp) end to end: the synthetic needle probe
// (study/needle_probe.hpp, the real write path and reader) is swept with and without an
// intervention, and the measured profile is compared with the one the library predicts.
//
//   cycle_slot_profile + predicted_shift: concentrated gates with W = S, the gate biases cycled
//     by δ → the strong residue moves by δ, and A_δ matches predicted_shift(A_0, δ).
//   staggered_origins: the geometry's chunk origin set to each staggered origin o → the weak
//     boundary phase of a mean pool moves by o (phase = (t − origin) mod S), and A_o matches
//     predicted_shift(A_0, o).
//
// How a match is judged. Each residue's accuracy is a binomial proportion of n trials, and the
// prediction is a baseline sweep's proportion of another n. "Same rate at residue r" is the 2×2
// Pearson χ² (chi_square_homogeneity on the two counts, 1 dof; 0 when both are 0/n or both n/n);
// the M residues are independent, so their sum is χ² with M dof under "the prediction holds".
// A match needs p ≥ 0.001 (a false alarm once in a thousand runs; the runs are deterministic,
// so a pass is a pass); a mismatch (the unshifted profile, or the shift with the wrong sign)
// needs p < 1e-6 — both must be decided by the data, which is what makes the tests able to fail.
// On top, a plain bound per residue: |A(r) − prediction(r)| ≤ z·√(2·¼/n), the worst-case
// (p = ½) standard deviation of a difference of two proportions, with z = 4 (two-sided
// 6e-5 per residue; with M ≤ 8 residues under 1e-3 in all, Bonferroni), and the strong / weak
// residues compared by argmax / argmin.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "support/message_of.hpp"
#include "support/probe_sweeps.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/study/interventions.hpp"
#include "phasekv/study/needle_probe.hpp"
#include "phasekv/study/phase_sweep.hpp"
#include "phasekv/study/statistics.hpp"

namespace test_diag_interventions_probe {

using namespace phasekv;
using namespace phasekv::diag;
using namespace phasekv::diag::probe;

namespace {

constexpr std::int64_t trials_per_residue = 64;

constexpr auto small_config = &phasekv_test::small_probe_config;
using phasekv_test::residue_accuracy;

// The same plan (seed) for every config, so baseline and intervention see the same placements.
sweep_result probe_sweep(const needle_config& config) { return phasekv_test::probe_sweep(config, trials_per_residue); }

// Successes per residue as doubles, so predicted_shift can move the counts themselves.
std::vector<double> successes(const sweep_result& r) {
  std::vector<double> s;
  for (const auto& row : r.residues) s.push_back(static_cast<double>(row.successes));
  return s;
}

struct comparison {
  double chi_square = 0.0;  // Σ_r of the per-residue 2×2 Pearson χ²
  double p_value = 1.0;     // Pr(χ²_M ≥ chi_square)
  double max_abs = 0.0;     // max_r |measured(r) − predicted(r)|
};

// `measured` against a predicted profile given as success counts of the same n per residue.
comparison compare(const sweep_result& measured, const std::vector<double>& predicted_successes) {
  comparison out;
  const std::int64_t n = trials_per_residue;
  for (std::size_t r = 0; r < measured.residues.size(); ++r) {
    const auto& row = measured.residues[r];
    REQUIRE(row.valid == n);
    const auto predicted = static_cast<std::int64_t>(predicted_successes[r]);
    const std::vector<std::int64_t> s{row.successes, predicted}, t{n, n};
    out.chi_square += stats::chi_square_homogeneity(s, t).statistic;
    out.max_abs = std::max(out.max_abs, std::fabs(row.estimate - static_cast<double>(predicted) / static_cast<double>(n)));
  }
  out.p_value = stats::chi_square_upper_tail(out.chi_square, static_cast<double>(measured.residues.size()));
  return out;
}

// z·√(2·¼/n) with z = 4 (see top).
double max_abs_bound() { return 4.0 * std::sqrt(0.5 / static_cast<double>(trials_per_residue)); }

bool matches(const comparison& c) { return c.p_value >= 1e-3 && c.max_abs <= max_abs_bound(); }
bool clearly_differs(const comparison& c) { return c.p_value < 1e-6; }

void show(const char* name, std::int64_t shift, const sweep_result& r) {
  std::printf("%s %lld: p %.3g, best %lld, worst %lld |", name, static_cast<long long>(shift),
              r.all().homogeneity.p_value, static_cast<long long>(r.all().best_residue), static_cast<long long>(r.all().worst_residue));
  for (const auto& row : r.residues) std::printf(" %.2f", row.estimate);
  std::printf("\n");
}

void show(const char* name, const comparison& c) {
  std::printf("  %-22s chi2 %8.2f  p %9.3g  max|diff| %.3f\n", name, c.chi_square, c.p_value, c.max_abs);
}

// The measured profile after a shift by `shift` against the reference a0 shifted by it (must
// match within binomial noise), a0 unshifted and a0 shifted the wrong way (must clearly differ;
// the wrong way is the same shift when 2·shift ≡ 0 mod S).
void check_shifted(const sweep_result& measured, const sweep_result& a0, std::int64_t S, std::int64_t shift) {
  const comparison shifted = compare(measured, predicted_shift(successes(a0), S, shift));
  const comparison unshifted = compare(measured, successes(a0));
  const comparison wrong_sign = compare(measured, predicted_shift(successes(a0), S, -shift));
  show("predicted_shift(+)", shifted);
  show("unshifted", unshifted);
  show("predicted_shift(-)", wrong_sign);
  CHECK(matches(shifted));
  CHECK(clearly_differs(unshifted));
  if ((2 * shift) % S != 0) CHECK(clearly_differs(wrong_sign));
}

}  // namespace

TEST_CASE("interventions + needle probe: cycling gate biases by delta moves the strong residue by delta",
          "[needle][interventions]") {
  const std::int64_t S = 4;
  SECTION("one head: strong phase 0 moves to delta") {
    const needle_config base = small_config(needle_policy::concentrated_gates, S, S);
    const sweep_result a0 = probe_sweep(base);
    show("gates delta", 0, a0);
    REQUIRE(a0.valid);
    REQUIRE(a0.all().best_residue % S == 0);
    for (std::int64_t delta : {1, 2}) {
      needle_config c = base;
      c.key_slot_bias = cycle_slot_profile(base.concentrated_slot_bias(false), S, S, delta);
      c.value_slot_bias = cycle_slot_profile(base.concentrated_slot_bias(true), S, S, delta);
      const sweep_result ad = probe_sweep(c);
      show("gates delta", delta, ad);
      REQUIRE(ad.valid);
      // The strong residue moved by δ (the argmax, and every residue of that phase is strong).
      CHECK(ad.all().best_residue % S == (a0.all().best_residue + delta) % S);
      for (std::int64_t r = delta; r < 2 * S; r += S) CHECK(ad.residues[static_cast<std::size_t>(r)].estimate > 0.9);
      // The library's prediction, from the estimates and from the sweep overload, agree …
      const auto predicted = predicted_shift(residue_accuracy(a0), S, delta);
      CHECK(predicted_shift(a0, delta) == predicted);
      // … and the measured profile matches it within binomial noise.
      check_shifted(ad, a0, S, delta);
    }
  }
  SECTION("two heads: each head's block is cycled on its own") {
    // Heads at offsets 0 and 1 → strong phases 0 and 1; cycled by 1 → 1 and 2.
    needle_config base = small_config(needle_policy::concentrated_gates, S, S);
    base.heads = 2;
    const sweep_result a0 = probe_sweep(base);
    needle_config c = base;
    c.key_slot_bias = cycle_slot_profile(base.concentrated_slot_bias(false), S, S, 1, 2);
    c.value_slot_bias = cycle_slot_profile(base.concentrated_slot_bias(true), S, S, 1, 2);
    const sweep_result a1 = probe_sweep(c);
    show("two heads delta", 0, a0);
    show("two heads delta", 1, a1);
    REQUIRE(a0.valid);
    REQUIRE(a1.valid);
    for (std::int64_t r = 0; r < 2 * S; ++r) {
      const bool strong = r % S == 1 || r % S == 2;
      CHECK((a1.residues[static_cast<std::size_t>(r)].estimate > 0.5) == strong);
    }
    const comparison shifted = compare(a1, predicted_shift(successes(a0), S, 1));
    const comparison unshifted = compare(a1, successes(a0));
    show("predicted_shift(+1)", shifted);
    show("unshifted", unshifted);
    CHECK(matches(shifted));
    CHECK(clearly_differs(unshifted));
  }
  SECTION("where the prediction does not apply: the needle's value token wraps to another entry") {
    // A record is a key at t and its value at t + 1, read through the key gate's slot k and
    // the value gate's slot k + 1 of ONE entry. Cycling by δ = S − 1 moves the key gate to
    // slot S − 1 and the value gate to slot 0 of the same entry — the token S − 1 positions
    // BEFORE the key, not after it — so no phase is read correctly any more instead of phase
    // S − 1 becoming the strong one. predicted_shift assumes the effect at a residue is a
    // function of that token's own slot; a pattern that spans a block boundary breaks it.
    const needle_config base = small_config(needle_policy::concentrated_gates, S, S);
    const sweep_result a0 = probe_sweep(base);
    needle_config c = base;
    c.key_slot_bias = cycle_slot_profile(base.concentrated_slot_bias(false), S, S, S - 1);
    c.value_slot_bias = cycle_slot_profile(base.concentrated_slot_bias(true), S, S, S - 1);
    const sweep_result a3 = probe_sweep(c);
    show("gates delta", S - 1, a3);
    REQUIRE(a3.valid);
    for (const auto& row : a3.residues) CHECK(row.estimate < 0.2);
    const comparison shifted = compare(a3, predicted_shift(successes(a0), S, S - 1));
    show("predicted_shift(+3)", shifted);
    CHECK(clearly_differs(shifted));
  }
}

TEST_CASE("interventions + needle probe: staggering the chunk origin shifts the profile by the origin",
          "[needle][interventions]") {
  // Mean pool, W = S: weak at the boundary phase S − 1, i.e. at residues t ≡ origin + S − 1
  // (phase = (t − origin) mod S): an origin o moves the weak residue by +o, A_o = predicted_shift(A_0, o).
  const std::int64_t S = 4;
  const needle_config base = small_config(needle_policy::mean_pool, S, S);
  const std::vector<geometry> origins = staggered_origins(geometry{S, S, 0, anchor_mode::block_start}, S);
  REQUIRE(origins.size() == static_cast<std::size_t>(S));
  REQUIRE(origins[0].origin == 0);
  const sweep_result a0 = probe_sweep(base);
  show("mean pool origin", 0, a0);
  REQUIRE(a0.valid);
  REQUIRE(a0.all().worst_residue % S == S - 1);
  REQUIRE(a0.all().homogeneity.p_value < 1e-6);
  for (std::size_t h = 1; h < origins.size(); ++h) {
    const std::int64_t o = origins[h].origin;
    needle_config c = base;
    c.origin = o;
    const sweep_result ao = probe_sweep(c);
    show("mean pool origin", o, ao);
    REQUIRE(ao.valid);
    CHECK(ao.all().worst_residue % S == (S - 1 + o) % S);
    for (std::int64_t r = 0; r < 2 * S; ++r) {
      // Every residue of the new boundary phase is below every other one.
      if (r % S != (S - 1 + o) % S) continue;
      for (std::int64_t q = 0; q < 2 * S; ++q)
        if (q % S != r % S)
          CHECK(ao.residues[static_cast<std::size_t>(r)].estimate < ao.residues[static_cast<std::size_t>(q)].estimate);
    }
    check_shifted(ao, a0, S, o);
  }
}

TEST_CASE("needle probe: intervention knobs are validated", "[needle][interventions]") {
  auto bad = [](auto mutate, const char* message) {
    needle_config c = small_config(needle_policy::concentrated_gates, 4, 4);
    mutate(c);
    CHECK_THAT(phasekv_test::message_of<config_error>([&] { needle_probe p(c); }), Catch::Contains(message));
  };
  bad([](needle_config& c) { c.origin = 4; }, "needle_config.origin = 4");
  bad([](needle_config& c) { c.origin = -1; }, "needle_config.origin = -1");
  bad([](needle_config& c) { c.policy = needle_policy::full_attention; c.origin = 1; }, "needle_config.origin = 1");
  bad([](needle_config& c) { c.key_slot_bias.assign(3, 0.0f); }, "needle_config.key_slot_bias.size() = 3");
  bad([](needle_config& c) { c.value_slot_bias.assign(4, 0.0f); c.value_slot_bias[2] = NAN; },
      "needle_config.value_slot_bias[2]");
  bad([](needle_config& c) { c.policy = needle_policy::mean_pool; c.key_slot_bias.assign(4, 0.0f); },
      "needle_config.key_slot_bias.size() = 4");
  // The defaults are the peaked biases the probe always used.
  needle_config c = small_config(needle_policy::concentrated_gates, 4, 4);
  c.heads = 2;
  c.gate_offset = 3;
  CHECK(c.concentrated_slot_bias(false) == std::vector<float>{0, 0, 0, 12, 12, 0, 0, 0});
  CHECK(c.concentrated_slot_bias(true) == std::vector<float>{12, 0, 0, 0, 0, 12, 0, 0});
}

}  // namespace test_diag_interventions_probe
