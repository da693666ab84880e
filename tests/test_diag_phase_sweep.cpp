// The phase sweep harness (study/phase_sweep.hpp): the plan's balance properties, checked by
// brute force over many configs; detection of a synthetic periodic weak spot and
// non-detection of a flat one (deterministic hash-based Bernoulli trials); errored trials; bad
// configs; CSV and JSON output.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "phasekv/study/haystacks.hpp"
#include "phasekv/study/phase_sweep.hpp"

namespace test_diag_phase_sweep {

namespace {

using namespace phasekv;
using namespace phasekv::diag;

sweep_config make_config(std::int64_t stride, std::int64_t modulus, std::int64_t trials) {
  sweep_config c;
  c.stride = stride;
  c.modulus = modulus;
  c.trials_per_residue = trials;
  c.span = 4096;
  c.min_distance = 64;
  c.query_position = 8192;
  c.seed = 7;
  return c;
}

// A uniform [0, 1) number fixed by (salt, placement): the synthetic trial's coin.
double coin(std::uint64_t salt, const placement& p) {
  std::uint64_t state = salt * 0x100000001B3ull ^ static_cast<std::uint64_t>(p.target_position) * 0x9E3779B97F4A7C15ull ^
                        static_cast<std::uint64_t>(p.trial) << 32;
  return static_cast<double>(phasekv::detail::splitmix64(state) >> 11) * 0x1.0p-53;
}

std::vector<std::string> split(const std::string& s, char separator) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(s);
  while (std::getline(in, field, separator)) out.push_back(field);
  if (!s.empty() && s.back() == separator) out.push_back("");
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The plan
// ---------------------------------------------------------------------------------------------

TEST_CASE("phase sweep plan: counts, residues, range, fixed query, paired anchor blocks", "[diag][sweep]") {
  const auto config = make_config(4, 0, 32);
  const auto plan = plan_sweep(config);
  const std::int64_t m = 8;
  REQUIRE(plan.size() == static_cast<std::size_t>(m * 32));
  std::map<std::int64_t, std::int64_t> per_residue;
  std::map<std::int64_t, std::vector<std::int64_t>> by_trial;
  std::set<std::pair<std::int64_t, std::int64_t>> keys;
  for (const auto& p : plan) {
    CHECK(p.target_position % m == p.residue);
    CHECK(p.query_position == config.query_position);
    CHECK(p.target_position >= config.query_position - config.min_distance - config.span);
    CHECK(p.distance() >= config.min_distance);
    ++per_residue[p.residue];
    by_trial[p.trial].push_back(p.target_position);
    keys.insert({p.residue, p.trial});
  }
  CHECK(keys.size() == plan.size());  // each (residue, trial) once
  REQUIRE(per_residue.size() == static_cast<std::size_t>(m));
  for (const auto& [r, count] : per_residue) CHECK(count == 32);
  // One trial index: the M residues fill M consecutive positions (same anchor → paired design).
  for (auto& [trial, positions] : by_trial) {
    std::sort(positions.begin(), positions.end());
    CHECK(positions.back() - positions.front() == m - 1);
    CHECK(std::adjacent_find(positions.begin(), positions.end()) == positions.end());
  }
  // Targets spread over the range, not bunched: the anchors reach both ends.
  std::int64_t lowest = plan[0].target_position, highest = lowest;
  for (const auto& p : plan) {
    lowest = std::min(lowest, p.target_position);
    highest = std::max(highest, p.target_position);
  }
  CHECK(highest - lowest > config.span - 3 * m);
}

TEST_CASE("phase sweep plan: a jittered query keeps the pairing and frees the distance from the residue",
          "[diag][sweep]") {
  auto config = make_config(8, 16, 64);
  const auto fixed = plan_sweep(config);
  config.query_jitter = 8;
  const auto plan = plan_sweep(config);
  REQUIRE(plan.size() == fixed.size());
  std::map<std::int64_t, std::set<std::int64_t>> query_of_trial;
  std::map<std::int64_t, std::set<std::int64_t>> distance_phases;  // residue → distances mod S seen
  std::set<std::int64_t> offsets;
  for (const auto& p : plan) {
    const std::int64_t offset = config.query_position - p.query_position;
    CHECK(offset == config.query_offset(p.trial));
    offsets.insert(offset);
    REQUIRE(offset >= 0);
    REQUIRE(offset < 8);
    CHECK(p.distance() >= config.min_distance);  // from its own query
    CHECK(p.target_position >= config.first_target());
    query_of_trial[p.trial].insert(p.query_position);
    distance_phases[p.residue].insert(p.distance() % 8);
  }
  CHECK(offsets.size() == 8);
  for (const auto& [trial, queries] : query_of_trial) CHECK(queries.size() == 1);  // every residue, one query
  for (const auto& [residue, phases] : distance_phases) CHECK(phases.size() >= 6);  // with a fixed query: 1
  // Targets: the same anchors, moved down by the jitter's reach at most.
  CHECK(config.last_target() == make_config(8, 16, 64).last_target() - 7);
  // Jitter 1 is the fixed query, placement for placement.
  config.query_jitter = 1;
  const auto again = plan_sweep(config);
  for (std::size_t i = 0; i < fixed.size(); ++i) {
    CHECK(again[i].target_position == fixed[i].target_position);
    CHECK(again[i].query_position == fixed[i].query_position);
  }
}

TEST_CASE("phase sweep plan: deterministic; the seed changes the order only", "[diag][sweep]") {
  auto config = make_config(4, 8, 20);
  const auto a = plan_sweep(config), b = plan_sweep(config);
  REQUIRE(a.size() == b.size());
  bool same = true;
  for (std::size_t i = 0; i < a.size(); ++i)
    same = same && a[i].target_position == b[i].target_position && a[i].trial == b[i].trial;
  CHECK(same);
  config.seed = 8;
  const auto c = plan_sweep(config);
  bool same_order = true;
  std::multiset<std::int64_t> pa, pc;
  for (std::size_t i = 0; i < a.size(); ++i) {
    same_order = same_order && a[i].target_position == c[i].target_position;
    pa.insert(a[i].target_position);
    pc.insert(c[i].target_position);
  }
  CHECK_FALSE(same_order);
  CHECK(pa == pc);
  // Shuffled: residue 0's trials are not all at the front.
  std::int64_t zeros_in_front = 0;
  for (std::size_t i = 0; i < 20; ++i) zeros_in_front += a[i].residue == 0;
  CHECK(zeros_in_front < 20);
}

TEST_CASE("phase sweep plan: matched mean and variance across residues, over many configs", "[diag][sweep]") {
  // The documented guarantees: exact mean when M | n, else |Δmean| ≤ M/n; |Δvariance| ≤
  // M²/2 + 2M·span/n (the anchor of each trial index is its own); and distinct positions for
  // every trial of a residue once the range has room (span ≥ 2·M·n).
  std::int64_t configs = 0;
  for (std::int64_t stride : {1, 2, 3, 4, 8, 16}) {
    for (std::int64_t multiple : {1, 2, 3}) {
      const std::int64_t m = stride * multiple;
      if (m < 2) continue;
      for (std::int64_t trials : {10, 11, 16, 17, 23, 32, 48, 50, 64, 100}) {
        for (std::int64_t span : {3 * m, 3 * m + 5, std::int64_t{500}, std::int64_t{4096}, std::int64_t{131072}}) {
          if (span < 3 * m) continue;
          sweep_config c = make_config(stride, m, trials);
          c.span = span;
          c.min_distance = 1 + stride;
          c.query_position = span + c.min_distance + 3;
          const auto plan = plan_sweep(c);
          const auto st = plan_position_statistics(plan, m);
          REQUIRE(st.size() == static_cast<std::size_t>(m));
          double mean_low = st[0].mean, mean_high = st[0].mean, var_low = st[0].variance, var_high = st[0].variance;
          for (const auto& s : st) {
            REQUIRE(s.count == trials);
            mean_low = std::min(mean_low, s.mean);
            mean_high = std::max(mean_high, s.mean);
            var_low = std::min(var_low, s.variance);
            var_high = std::max(var_high, s.variance);
            if (span >= 2 * m * trials) CHECK(s.distinct == trials);
          }
          INFO("stride " << stride << " modulus " << m << " trials " << trials << " span " << span);
          const double md = static_cast<double>(m);
          if (trials % m == 0) CHECK(mean_high == mean_low);  // exact: integer sums are equal
          else CHECK(mean_high - mean_low <= md / static_cast<double>(trials) + 1e-9);
          CHECK(var_high - var_low <= md * md / 2 + 2 * md * static_cast<double>(span) / static_cast<double>(trials) +
                                          1e-6 * var_high);
          ++configs;
        }
      }
    }
  }
  CHECK(configs > 400);
}

TEST_CASE("phase sweep plan: a residue's trials use distinct positions (no copies counted as trials)", "[diag][sweep]") {
  // The old design gave each round one anchor: 32 trials of a residue shared 4 positions.
  const auto c = make_config(8, 16, 64);
  for (const auto& s : plan_position_statistics(plan_sweep(c), 16)) CHECK(s.distinct == 64);
}

TEST_CASE("phase sweep plan: layout modes plan the residues whose record fits, or crosses, a block", "[diag][sweep]") {
  for (std::int64_t stride : {4, 8}) {
    for (std::int64_t window : {stride, 2 * stride}) {
      for (std::int64_t origin : {std::int64_t{0}, stride / 2 + 1}) {
        for (std::int64_t length : {2, 3, 4}) {
          sweep_config c = make_config(stride, 0, 16);
          c.window = window;
          c.origin = origin;
          c.record.key_tokens = length - 1;
          c.layout = layout_mode::contained;
          const geometry g{stride, window, origin, anchor_mode::block_start};
          std::set<std::int64_t> offsets;
          for (const auto& p : plan_sweep(c)) {
            const auto l = classify_record(g, p.target_position, length);
            CHECK(l.kind == layout_class::contained);
            CHECK(p.layout.kind == layout_class::contained);
            CHECK(p.layout.first_offset == l.first_offset);
            offsets.insert(l.first_offset);
          }
          // every in-block offset the record's length allows: 0 … S − L
          CHECK(offsets.size() == static_cast<std::size_t>(stride - length + 1));
          c.layout = layout_mode::straddle;
          for (const auto& p : plan_sweep(c)) {
            CHECK(p.layout.boundaries >= 1);
            CHECK(p.layout.kind == (window > stride ? layout_class::straddle_covered : layout_class::straddle_split));
          }
          c.layout = layout_mode::any;
          CHECK(plan_sweep(c).size() == static_cast<std::size_t>(2 * stride * 16));
        }
      }
    }
  }
  sweep_config c = make_config(4, 0, 16);
  c.layout = layout_mode::contained;
  c.record.value_tokens = 4;  // L = 5 > S
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("record.length()"));
}

// ---------------------------------------------------------------------------------------------
// Bad configs
// ---------------------------------------------------------------------------------------------

TEST_CASE("phase sweep config: errors name the field and its value", "[diag][sweep]") {
  auto expect_error = [](const sweep_config& c, const std::string& fragment, const std::string& other = "") {
    try {
      c.validate();
      FAIL("no config_error for " << fragment);
    } catch (const config_error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find(fragment) != std::string::npos);
      if (!other.empty()) CHECK(what.find(other) != std::string::npos);
    }
  };
  auto c = make_config(4, 6, 32);
  expect_error(c, "modulus = 6", "stride = 4");
  c = make_config(4, 0, 32);
  REQUIRE_NOTHROW(c.validate());
  CHECK(c.resolved_modulus() == 8);
  c.stride = 0;
  expect_error(c, "stride = 0");
  c = make_config(1, 1, 32);
  expect_error(c, "modulus = 1");
  c = make_config(4, 8, 9);
  expect_error(c, "trials_per_residue = 9");
  c = make_config(4, 8, 32);
  c.span = 23;
  expect_error(c, "span = 23");
  c = make_config(4, 8, 32);
  c.min_distance = 0;
  expect_error(c, "min_distance = 0");
  c = make_config(4, 8, 32);
  c.query_position = 1000;  // 1000 − 64 − 4096 < 0
  expect_error(c, "query_position = 1000");
  c = make_config(4, -8, 32);
  expect_error(c, "modulus = -8");
  c = make_config(4, 8, 32);
  c.query_jitter = 0;
  expect_error(c, "query_jitter = 0");
  c = make_config(4, 8, 32);
  c.query_jitter = 8192 - 64 - 4096 + 2;  // the earliest query leaves no room for the span
  expect_error(c, "query_position = 8192", "query_jitter − 1");

  // run_sweep rejects it before running any trial.
  std::int64_t calls = 0;
  CHECK_THROWS_AS(run_sweep(make_config(4, 6, 32), [&](const placement&) { ++calls; return true; }), config_error);
  CHECK(calls == 0);
}

TEST_CASE("haystacks: no overlapping needles, first fit in plan order, residues spread", "[diag][sweep]") {
  for (const std::int64_t needle : {1, 2, 3, 8}) {
    for (const auto& [stride, trials] : {std::pair<std::int64_t, std::int64_t>{4, 32}, {3, 40}, {8, 10}}) {
      const auto plan = plan_sweep(make_config(stride, 0, trials));
      const auto haystack = assign_haystacks(plan, needle);
      REQUIRE(haystack.size() == plan.size());
      // The oracle, from the definition: scan every earlier placement of every haystack.
      const std::int64_t k = 2 * stride;
      std::int64_t used = 0;
      for (std::size_t i = 0; i < plan.size(); ++i) {
        auto overlaps = [&](std::int64_t h) {
          for (std::size_t k = 0; k < i; ++k)
            if (haystack[k] == h && std::abs(plan[k].target_position - plan[i].target_position) < needle) return true;
          return false;
        };
        std::int64_t first_fit = plan[i].trial % k;
        while (first_fit < used && overlaps(first_fit)) ++first_fit;
        INFO("needle " << needle << ", stride " << stride << ", placement " << i);
        REQUIRE(haystack[i] == first_fit);
        used = std::max(used, first_fit + 1);
      }
      // No haystack is one residue's: each residue's trials spread over min(M, trials per
      // residue)/2 haystacks or more, and every haystack holds several residues.
      std::map<std::int64_t, std::set<std::int64_t>> haystacks_of;
      for (std::size_t i = 0; i < plan.size(); ++i) haystacks_of[plan[i].residue].insert(haystack[i]);
      REQUIRE(static_cast<std::int64_t>(haystacks_of.size()) == 2 * stride);
      for (const auto& [residue, spread] : haystacks_of) {
        INFO("residue " << residue);
        CHECK(2 * static_cast<std::int64_t>(spread.size()) >= std::min(k, trials));
      }
      std::map<std::int64_t, std::set<std::int64_t>> residues_of;
      for (std::size_t i = 0; i < plan.size(); ++i) residues_of[haystack[i]].insert(plan[i].residue);
      for (const auto& [h, residues] : residues_of)
        if (h < k) CHECK(residues.size() >= 2);
      CHECK(used <= k + 2 * needle);  // the bound phase_sweep.hpp states
    }
  }
  CHECK_THROWS_AS(assign_haystacks({}, 0), input_error);
  CHECK(assign_haystacks({}, 2).empty());
}

// ---------------------------------------------------------------------------------------------
// Detection
// ---------------------------------------------------------------------------------------------

TEST_CASE("phase sweep: a boundary-phase weak spot is found with period S", "[diag][sweep]") {
  const auto config = make_config(4, 8, 200);
  std::vector<placement> seen;
  const auto result = run_sweep(config, [&](const placement& p) {
    seen.push_back(p);
    const double rate = (p.target_position % 4 == 3) ? 0.3 : 0.9;
    return coin(1, p) < rate;
  });
  INFO(to_table(result));
  REQUIRE(result.valid);
  CHECK(result.kind == outcome_kind::binary);
  CHECK(seen.size() == 8u * 200u);  // every planned trial ran once
  CHECK(result.errored_trials == 0);
  CHECK(result.all().period.period == Approx(4.0));
  CHECK(result.all().period.frequency == 2);
  // One dip every S = 4 residues of M = 8 puts 2/3 of the power at frequency 2 (period 4) and
  // 1/3 at its harmonic, the Nyquist frequency 4; noise moves it a little.
  CHECK(result.all().period.power_fraction > 0.6);
  CHECK(result.all().gap_points > 50.0);
  CHECK(result.all().gap_points < 70.0);
  CHECK(result.all().worst_residue % 4 == 3);
  CHECK(result.all().best_residue % 4 != 3);
  CHECK(result.all().homogeneity.test == "chi_square");
  CHECK(result.all().homogeneity.dof == 7);
  CHECK(result.all().homogeneity.p_value < 1e-30);
  CHECK_FALSE(result.all().homogeneity.approximate);
  CHECK(result.all().mean == Approx(0.75).margin(0.03));
  for (const auto& r : result.residues) {
    CHECK(r.valid == 200);
    CHECK(r.ci_low <= r.estimate);
    CHECK(r.estimate <= r.ci_high);
    const double truth = r.residue % 4 == 3 ? 0.3 : 0.9;
    CHECK(r.ci_low < truth + 0.02);  // loose: 8 intervals, a miss at 95% is possible but not here
    CHECK(r.ci_high > truth - 0.02);
  }
  const std::string table = to_table(result);
  CHECK(table.find("INVALID") == std::string::npos);
  CHECK(table.find("dominant period (all trials): 4") != std::string::npos);
}

TEST_CASE("phase sweep: a flat accuracy is not called periodic at the 1% level", "[diag][sweep]") {
  const auto config = make_config(4, 8, 200);
  const auto result = run_sweep(config, [](const placement& p) { return coin(2, p) < 0.7; });
  INFO(to_table(result));
  REQUIRE(result.valid);
  CHECK(result.all().homogeneity.p_value > 0.01);
  CHECK(result.all().gap_points < 15.0);
  CHECK(result.all().mean == Approx(0.7).margin(0.03));
}

TEST_CASE("phase sweep: probabilities use ANOVA and a normal interval of the mean", "[diag][sweep]") {
  const auto config = make_config(4, 8, 50);
  SECTION("periodic") {
    const auto result = run_sweep(config, [](const placement& p) {
      const double base = (p.target_position % 4 == 3) ? 0.4 : 0.8;
      return base + 0.2 * (coin(3, p) - 0.5);
    });
    INFO(to_table(result));
    REQUIRE(result.valid);
    CHECK(result.kind == outcome_kind::probability);
    CHECK(result.all().homogeneity.test == "anova");
    CHECK(result.all().homogeneity.dof == 7);
    CHECK(result.all().homogeneity.dof_within == 8 * 50 - 8);
    CHECK(result.all().homogeneity.p_value < 1e-30);
    CHECK(result.all().period.period == Approx(4.0));
    CHECK(result.all().gap_points == Approx(40.0).margin(3.0));
    for (const auto& r : result.residues) {
      const double truth = r.residue % 4 == 3 ? 0.4 : 0.8;
      CHECK(r.ci_low < truth);
      CHECK(r.ci_high > truth);
      CHECK(r.ci_high - r.ci_low < 0.05);  // s ≈ 0.2/√12, n = 50: half-width ≈ 0.016
    }
  }
  SECTION("flat") {
    // float works as well as double.
    const auto result =
        run_sweep(config, [](const placement& p) { return 0.6f + 0.2f * static_cast<float>(coin(4, p) - 0.5); });
    INFO(to_table(result));
    REQUIRE(result.valid);
    CHECK(result.all().homogeneity.p_value > 0.01);
    CHECK(result.all().mean == Approx(0.6).margin(0.01));
  }
}

// ---------------------------------------------------------------------------------------------
// Errored trials
// ---------------------------------------------------------------------------------------------

TEST_CASE("phase sweep: throwing and NaN trials are errored, counted and excluded", "[diag][sweep]") {
  const auto config = make_config(4, 8, 32);
  SECTION("a few errors: still valid, message kept, not counted as success or wrong answer") {
    const auto result = run_sweep(config, [](const placement& p) -> double {
      if (p.residue == 2 && p.trial == 0) throw std::runtime_error("engine said \"out of memory\"");
      if (p.residue == 3 && p.trial < 2) return std::numeric_limits<double>::quiet_NaN();
      if (p.residue == 4 && p.trial == 5) return 1.5;
      return 1.0;
    });
    INFO(to_table(result));
    CHECK(result.valid);
    CHECK(result.errored_trials == 4);
    CHECK(result.residues[2].errored == 1);
    CHECK(result.residues[2].valid == 31);
    CHECK(result.residues[3].errored == 2);
    CHECK(result.residues[4].errored == 1);
    CHECK(result.residues[0].errored == 0);
    // Every valid trial returned 1: an error counted as 0 would show as an estimate below 1.
    for (const auto& r : result.residues) CHECK(r.estimate == 1.0);
    CHECK(result.all().gap_points == 0.0);
    const bool known = result.first_error.find("out of memory") != std::string::npos ||
                       result.first_error.find("nan") != std::string::npos ||
                       result.first_error.find("1.5") != std::string::npos;
    CHECK(known);
    CHECK(result.first_error.find("residue") != std::string::npos);
    CHECK(to_table(result).find("errored trials: 4") != std::string::npos);
  }
  SECTION("the message survives and is escaped in JSON") {
    const auto result = run_sweep(config, [](const placement& p) -> bool {
      if (p.residue == 1 && p.trial == 3) throw std::runtime_error("bad \"quote\" \\ and\nnewline");
      return p.trial % 2 == 0;
    });
    CHECK(result.errored_trials == 1);
    CHECK(result.first_error.find("bad \"quote\"") != std::string::npos);
    const std::string json = to_json(result);
    CHECK(json.find("bad \\\"quote\\\" \\\\ and\\nnewline") != std::string::npos);
    CHECK(json.find('\n') == std::string::npos);
    CHECK(to_summary_csv(result).find("\nfirst_error,") != std::string::npos);
    CHECK(result.residues[1].successes == 16);  // trial 3 (odd) errored: 16 of 31 valid succeeded
    CHECK(result.residues[1].valid == 31);
  }
  SECTION("a non-std exception is an error too") {
    const auto result = run_sweep(config, [](const placement& p) -> bool {
      if (p.residue == 0 && p.trial == 0) throw 42;
      return true;
    });
    CHECK(result.errored_trials == 1);
    CHECK(result.first_error.find("non-std::exception") != std::string::npos);
  }
  SECTION("too few valid trials at one residue: invalid, loudly, no numbers") {
    const auto result = run_sweep(config, [](const placement& p) -> bool {
      if (p.residue == 5 && p.trial >= 7) throw std::runtime_error("timeout");
      return p.residue != 3;
    });
    CHECK_FALSE(result.valid);
    CHECK(result.errored_trials == 25);
    CHECK(result.residues[5].valid == 7);
    CHECK(result.invalid_reason.find("residue 5 has 7 valid trials") != std::string::npos);
    CHECK(std::isnan(result.all().gap_points));
    CHECK(std::isnan(result.all().homogeneity.p_value));
    CHECK(std::isnan(result.all().mean));
    CHECK(std::isnan(result.all().period.period));
    CHECK(result.all().best_residue == -1);
    const std::string table = to_table(result);
    CHECK(table.rfind("INVALID SWEEP", 0) == 0);
    CHECK(table.find("n/a") != std::string::npos);
    CHECK(table.find("gap ") == std::string::npos);
    const std::string json = to_json(result);
    CHECK(json.find("\"valid\":false") != std::string::npos);
    CHECK(json.find("\"gap_points\":null") != std::string::npos);
    CHECK(json.find("\"p_value\":null") != std::string::npos);
    CHECK(to_summary_csv(result).find("\nvalid,false\n") != std::string::npos);
  }
  SECTION("every trial errors: invalid, estimates NaN") {
    const auto result = run_sweep(config, [](const placement&) -> double { throw std::runtime_error("down"); });
    CHECK_FALSE(result.valid);
    CHECK(result.errored_trials == 8 * 32);
    CHECK(std::isnan(result.residues[0].estimate));
    CHECK(to_json(result).find("\"estimate\":null") != std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

TEST_CASE("phase sweep: CSV has a header and M rows that parse back; JSON has the keys", "[diag][sweep]") {
  const auto config = make_config(4, 8, 40);
  const auto result = run_sweep(config, [](const placement& p) { return coin(5, p) < (p.residue % 4 == 3 ? 0.4 : 0.8); });
  REQUIRE(result.valid);
  const auto rows = split(to_csv(result), '\n');
  REQUIRE(rows.size() == 1 + 8 + 1);  // header, residues, the empty piece after the last newline
  CHECK(rows.back().empty());
  CHECK(rows[0] ==
        "residue,phase,layout,planned,valid,errored,successes,estimate,ci_low,ci_high,selection_miss,read_dilution,"
        "write_dilution,readout,unattributed");
  for (std::size_t i = 1; i < 1 + 8; ++i) {
    const auto fields = split(rows[i], ',');
    REQUIRE(fields.size() == 15);
    const auto& r = result.residues[i - 1];
    CHECK(std::stoll(fields[0]) == r.residue);
    CHECK(std::stoll(fields[1]) == r.residue % 4);
    CHECK(fields[2] == (r.residue % 4 == 3 ? "straddle_split" : "contained"));
    CHECK(std::stoll(fields[4]) == r.valid);
    CHECK(std::stoll(fields[5]) == r.errored);
    CHECK(std::stoll(fields[6]) == r.successes);
    CHECK(std::stod(fields[7]) == Approx(r.estimate).epsilon(1e-9));
    CHECK(std::stod(fields[8]) == Approx(r.ci_low).epsilon(1e-9));
    CHECK(std::stod(fields[9]) == Approx(r.ci_high).epsilon(1e-9));
    CHECK(std::stoll(fields[14]) == r.valid - r.successes);  // unattributed wrong answers
  }
  // The summary is a table of its own: key,value.
  std::map<std::string, std::string> summary;
  const auto lines = split(to_summary_csv(result), '\n');
  CHECK(lines[0] == "key,value");
  for (std::size_t i = 1; i + 1 < lines.size(); ++i) {
    const auto fields = split(lines[i], ',');
    REQUIRE(fields.size() == 2);
    summary[fields[0]] = fields[1];
  }
  REQUIRE(summary.count("p_value") == 1);
  CHECK(std::stod(summary["p_value"]) == Approx(result.all().homogeneity.p_value).epsilon(1e-9));
  CHECK(summary["dominant_period"] == "4");
  CHECK(summary["frequency"] == "2");
  CHECK(summary["errored_trials"] == "0");
  CHECK(summary["kind"] == "binary");

  const std::string json = to_json(result);
  for (const char* key : {"\"kind\":\"binary\"", "\"valid\":true", "\"stride\":4", "\"modulus\":8", "\"gap_points\":",
                          "\"homogeneity\":{\"test\":\"chi_square\"", "\"p_value\":", "\"dominant_period\":{\"period\":",
                          "\"power_fraction\":", "\"errored_trials\":0", "\"first_error\":\"\"", "\"residues\":[",
                          "\"best_residue\":", "\"worst_residue\":", "\"mean\":"}) {
    INFO(key);
    CHECK(json.find(key) != std::string::npos);
  }
  std::int64_t residue_objects = 0;
  for (std::size_t at = json.find("{\"residue\":"); at != std::string::npos; at = json.find("{\"residue\":", at + 1))
    ++residue_objects;
  CHECK(residue_objects == 8);
  CHECK(std::count(json.begin(), json.end(), '{') == std::count(json.begin(), json.end(), '}'));
  CHECK(json.find(":nan") == std::string::npos);  // ("dominant" contains "nan")
  CHECK(json.find(":-nan") == std::string::npos);
  CHECK(json.find("inf") == std::string::npos);

  // Probability sweeps leave `successes` empty in CSV and null in JSON.
  const auto probabilities = run_sweep(config, [](const placement& p) { return coin(6, p); });
  const auto prow = split(split(to_csv(probabilities), '\n')[1], ',');
  REQUIRE(prow.size() == 15);
  CHECK(prow[6].empty());
  CHECK(prow[14].empty());
  CHECK(to_json(probabilities).find("\"successes\":null") != std::string::npos);
  CHECK(to_json(probabilities).find("\"test\":\"anova\"") != std::string::npos);
}

namespace {

// A strict reader of one CSV table (RFC 4180): every record ends with "\n", fields are separated
// by commas, a field holding a comma, quote or line break is quoted ("" inside is one quote), and
// every record has as many fields as the header. This is what Python's csv module or a
// spreadsheet needs to see the file as one table; a comment line ("# key,value") breaks it.
std::vector<std::vector<std::string>> read_csv_strictly(const std::string& text) {
  REQUIRE(!text.empty());
  REQUIRE(text.back() == '\n');
  std::vector<std::vector<std::string>> records(1);
  std::string field;
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c != '"') field += c;
      else if (i + 1 < text.size() && text[i + 1] == '"') field += text[++i];
      else {
        quoted = false;  // a closing quote ends the field
        REQUIRE((i + 1 < text.size() && (text[i + 1] == ',' || text[i + 1] == '\n')));
      }
    } else if (c == '"') {
      REQUIRE(field.empty());  // a quote opens a field or is not allowed
      quoted = true;
    } else if (c == ',' || c == '\n') {
      records.back().push_back(field);
      field.clear();
      if (c == '\n') records.emplace_back();
    } else {
      field += c;
    }
  }
  REQUIRE_FALSE(quoted);
  records.pop_back();  // the empty record after the last "\n"
  REQUIRE(records.size() >= 2);
  for (std::size_t r = 0; r < records.size(); ++r) {
    INFO("record " << r << " starts with '" << records[r][0] << "'");
    CHECK(records[r].size() == records[0].size());
  }
  return records;
}

}  // namespace

TEST_CASE("phase sweep: the CSV is one plain table a strict reader accepts", "[diag][sweep]") {
  const auto config = make_config(4, 8, 12);
  SECTION("binary, with an errored trial whose message holds commas and quotes") {
    const auto result = run_sweep(config, [](const placement& p) -> bool {
      if (p.residue == 1 && p.trial == 0) throw std::runtime_error("engine: \"a, b\",\nc");
      return coin(8, p) < 0.7;
    });
    const auto records = read_csv_strictly(to_csv(result));
    REQUIRE(records.size() == 1 + 8);
    CHECK(records[0] == std::vector<std::string>{"residue", "phase", "layout", "planned", "valid", "errored",
                                                 "successes", "estimate", "ci_low", "ci_high", "selection_miss",
                                                 "read_dilution", "write_dilution", "readout", "unattributed"});
    for (std::size_t i = 1; i < records.size(); ++i) CHECK(std::stoll(records[i][0]) == static_cast<long long>(i - 1));
    // The errored trial is a column of its own: not in `valid`, not a wrong answer.
    CHECK(records[2][4] == "11");
    CHECK(records[2][5] == "1");
    // The summary is a table of its own; free text is quoted, not allowed to add fields or lines.
    const auto summary = read_csv_strictly(to_summary_csv(result));
    CHECK(summary[0] == std::vector<std::string>{"key", "value"});
    bool has_error = false;
    for (const auto& record : summary) {
      if (record[0] != "first_error") continue;
      has_error = true;
      CHECK(record[1].find("threw: engine: \"a, b\", c") != std::string::npos);
    }
    CHECK(has_error);
  }
  SECTION("invalid probability sweep") {
    const auto result = run_sweep(config, [](const placement&) -> double { throw std::runtime_error("down, again"); });
    REQUIRE_FALSE(result.valid);
    const auto records = read_csv_strictly(to_csv(result));
    CHECK(records.size() == 1 + 8);
    read_csv_strictly(to_summary_csv(result));
  }
}

TEST_CASE("phase sweep: no period is reported without a phase effect", "[diag][sweep]") {
  const auto config = make_config(4, 8, 40);
  SECTION("a constant profile (flat)") {
    const auto result = run_sweep(config, [](const placement&) { return true; });
    REQUIRE(result.valid);
    REQUIRE(result.all().period.flat);
    CHECK(to_json(result).find("\"dominant_period\":{\"period\":null,\"frequency\":null,\"power_fraction\":null,"
                                "\"flat\":true}") != std::string::npos);
    CHECK(to_table(result).find("dominant period (all trials): none") != std::string::npos);
    CHECK(to_summary_csv(result).find("\ndominant_period,\nfrequency,\npower_fraction,\nflat,true\n") !=
          std::string::npos);
  }
  SECTION("a profile that varies only by chance (homogeneity p ≥ 0.05)") {
    const auto result = run_sweep(config, [](const placement& p) { return coin(2, p) < 0.7; });
    REQUIRE(result.valid);
    REQUIRE_FALSE(result.all().period.flat);
    REQUIRE(result.all().homogeneity.p_value >= 0.05);
    CHECK(to_json(result).find("\"dominant_period\":{\"period\":null,\"frequency\":null,\"power_fraction\":null,"
                                "\"flat\":false}") != std::string::npos);
    CHECK(to_table(result).find("dominant period (all trials): none") != std::string::npos);
    CHECK(to_summary_csv(result).find("\ndominant_period,\n") != std::string::npos);
  }
  SECTION("a phase effect: the period is a number") {
    const auto result =
        run_sweep(config, [](const placement& p) { return coin(1, p) < (p.residue % 4 == 3 ? 0.2 : 0.9); });
    REQUIRE(result.all().homogeneity.p_value < 0.05);
    CHECK(to_json(result).find("\"dominant_period\":{\"period\":4,\"frequency\":2,") != std::string::npos);
  }
}

TEST_CASE("phase sweep: the contained profile sees a within-window offset effect the straddle split cannot explain",
          "[diag][sweep][layout]") {
  // S = W = 8, records of 3 tokens: contained at offsets 0 … 5, straddling at 6 and 7. A host that
  // retrieves well only when the record starts at offset 2 — inside the block either way — has a
  // within-window phase effect; a host that fails only straddling records has none.
  sweep_config c = make_config(8, 16, 64);
  c.record.key_tokens = 2;
  c.span = 8192;
  c.query_position = 8192 + 64 + 8;
  const auto offset_two = run_sweep(c, [](const placement& p) {
    return coin(11, p) < (p.layout.first_offset == 2 ? 0.9 : 0.5);
  });
  REQUIRE(offset_two.valid);
  const profile_summary* within = offset_two.profile("contained");
  REQUIRE(within != nullptr);
  REQUIRE(within->valid);
  CHECK(within->residues.size() == 12);
  CHECK(within->homogeneity.p_value < 1e-6);
  CHECK(within->phase_test.p_value < 0.01);
  CHECK(within->has_period());
  // Residues r and r + 8 agree. With offsets 6 and 7 absent, period 4 fits the present residues
  // as well as 8 (offset 2's residues 2 and 10 are 4 apart from absent ones only): the smallest
  // fold the data cannot reject is reported, a divisor of S.
  CHECK(within->period.period == 4);
  CHECK(within->phase_amplitude.estimate > 0.25);
  CHECK(within->phase_amplitude.low > 0.0);
  CHECK(offset_two.layouts[static_cast<std::size_t>(layout_class::straddle_split)].residues == 4);

  const auto split_only = run_sweep(c, [](const placement& p) {
    return coin(12, p) < (p.layout.kind == layout_class::contained ? 0.8 : 0.3);
  });
  REQUIRE(split_only.valid);
  CHECK(split_only.all().homogeneity.p_value < 1e-6);  // all trials: a strong effect
  const profile_summary* flat = split_only.profile("contained");
  REQUIRE(flat->valid);
  CHECK(flat->homogeneity.p_value > 0.01);       // within the window: none
  CHECK(flat->phase_test.p_value > 0.01);
  CHECK_FALSE(flat->has_period());
  CHECK(flat->debiased_gap.low <= 0.0);
  CHECK(flat->debiased_gap.high >= 0.0);
  // The report says which profile a period belongs to.
  const std::string table = to_table(split_only);
  CHECK(table.find("dominant period (all trials): 8") != std::string::npos);
  CHECK(table.find(" contained ") != std::string::npos);
  const std::string json = to_json(split_only);
  CHECK(json.find("\"period_of\":\"all\"") != std::string::npos);
  CHECK(json.find("\"name\":\"contained\"") != std::string::npos);

  // A plan of contained trials alone: only those residues are planned and reported.
  c.layout = layout_mode::contained;
  const auto planned = run_sweep(c, [](const placement& p) { return coin(13, p) < 0.7; });
  REQUIRE(planned.valid);
  std::int64_t planned_residues = 0;
  for (const auto& r : planned.residues) planned_residues += r.planned > 0;
  CHECK(planned_residues == 12);
  CHECK(planned.profile("straddle")->valid == false);
}

TEST_CASE("phase sweep: attributed failures are counted by cause, per residue and per layout", "[diag][sweep]") {
  const auto c = make_config(4, 8, 20);
  const auto result = run_sweep(c, [](const placement& p) {
    if (p.layout.kind != layout_class::contained) return attributed_outcome{false, failure_cause::write_dilution};
    return attributed_outcome{p.trial % 4 != 0, failure_cause::selection_miss};
  });
  REQUIRE(result.valid);
  CHECK(result.attributed);
  for (const auto& r : result.residues) {
    if (r.layout == layout_class::contained) {
      CHECK(r.failures[static_cast<std::size_t>(failure_cause::selection_miss)] == 5);
      CHECK(r.successes == 15);
    } else {
      CHECK(r.failures[static_cast<std::size_t>(failure_cause::write_dilution)] == 20);
    }
  }
  CHECK(result.layouts[0].failures[static_cast<std::size_t>(failure_cause::selection_miss)] == 6 * 5);
  CHECK(to_json(result).find("\"write_dilution\":20") != std::string::npos);
  CHECK(to_table(result).find("failures: select/read/write/readout/?") != std::string::npos);
  // A cause outside the enum is an errored trial, not a count.
  const auto bad = run_sweep(c, [](const placement&) { return attributed_outcome{false, static_cast<failure_cause>(9)}; });
  CHECK(bad.errored_trials == 8 * 20);
}

TEST_CASE("phase sweep: one cycle over all residues is reported as the trivial fit, unless M = S", "[diag][sweep]") {
  for (const std::int64_t modulus : {8, 4}) {
    sweep_config c;
    c.stride = 4;
    c.modulus = modulus;
    c.trials_per_residue = 20;
    c.query_position = 4000;
    c.span = 3000;
    // Good in the first half of the residues, bad in the second: one cycle of M.
    const sweep_result r = run_sweep(c, [&](const placement& p) { return p.residue < modulus / 2; });
    REQUIRE(r.has_period());
    REQUIRE(r.all().period.frequency == 1);
    const bool trivial = to_table(r).find("the trivial fit") != std::string::npos;
    INFO("modulus " << modulus);
    CHECK(trivial == (modulus != c.stride));
  }
}

}  // namespace test_diag_phase_sweep
