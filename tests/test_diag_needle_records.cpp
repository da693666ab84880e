// The needle probe with records of several tokens, per-slot profiles and selection: constructed
// write paths whose within-window profile is known from the maths, and failures built to come
// from selection, from the read and from the write, classified through the real reader.
//
//   * mean pooling, isolated targets: a contained record's entry holds the same tokens at any
//     offset (a mean is permutation invariant), so the contained-only profile is flat;
//   * fixed_weight one-hot on offset o: every entry is the token at o, so a record is retrieved
//     exactly when one of its value tokens sits at o (a key token at o is read but returns the key);
//   * positional_gates: a record's weight in its entry, and its value's, follow exp(bias) of
//     their slots, so the contained profile follows the bias profile;
//   * top_k = 1 on a record split by a block boundary: the top entry often holds only the key →
//     selection misses; top_k = 0 (all entries): never a selection miss, the split match is a read
//     dilution; concentrated gates whose key slot sees the record's value token and whose value
//     slot sees the filler after it → write dilution.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/study/needle_probe.hpp"
#include "phasekv/study/phase_sweep.hpp"

namespace test_diag_needle_records {

using namespace phasekv;
using namespace phasekv::diag;
using phasekv::diag::probe::needle_config;
using phasekv::diag::probe::needle_outcome;
using phasekv::diag::probe::needle_policy;
using phasekv::diag::probe::needle_probe;

namespace {

needle_config base_config(needle_policy policy, std::int64_t S) {
  needle_config c;
  c.tokens = 8192;
  c.records = 400;
  c.channels = 128;
  c.policy = policy;
  c.stride = c.window = S;
  c.seed = 7;
  c.isolate_targets = true;
  return c;
}

sweep_config sweep_of(const needle_config& c, std::int64_t trials, layout_mode layout = layout_mode::any) {
  sweep_config sc;
  sc.stride = c.effective_stride();
  sc.window = c.effective_window();
  sc.modulus = sc.stride;
  sc.trials_per_residue = trials;
  sc.query_position = c.tokens - 1;
  sc.span = c.tokens - 128;
  sc.min_distance = 16;
  sc.seed = 3;
  sc.record = c.record;
  sc.layout = layout;
  return sc;
}

sweep_result sweep(const needle_config& c, std::int64_t trials, layout_mode layout = layout_mode::any,
                   needle_outcome kind = needle_outcome::success) {
  needle_probe p(c);
  return probe::needle_sweep(p, sweep_of(c, trials, layout), kind);
}

void show(const char* name, const sweep_result& r) {
  std::printf("%-24s", name);
  for (const auto& row : r.residues) {
    if (row.planned == 0) std::printf("    - ");
    else std::printf(" %5.2f", row.estimate);
  }
  std::printf("\n%-24s", "  sel/read/write/readout");
  for (const auto& row : r.residues)
    std::printf(" %lld/%lld/%lld/%lld", static_cast<long long>(row.failures[1]), static_cast<long long>(row.failures[2]),
                static_cast<long long>(row.failures[3]), static_cast<long long>(row.failures[4]));
  std::printf("\n");
}

std::int64_t failures(const residue_outcome& row) { return row.planned == 0 ? 0 : row.valid - row.successes; }
std::int64_t count(const residue_outcome& row, failure_cause c) { return row.failures[static_cast<std::size_t>(c)]; }

// Spearman's rank correlation (ties get their mean rank).
double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  auto ranks = [](const std::vector<double>& v) {
    std::vector<std::size_t> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
    std::vector<double> r(v.size());
    for (std::size_t i = 0; i < order.size();) {
      std::size_t j = i;
      while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
      for (std::size_t k = i; k <= j; ++k) r[order[k]] = 0.5 * static_cast<double>(i + j);
      i = j + 1;
    }
    return r;
  };
  const auto a = ranks(x), b = ranks(y);
  const double ma = std::accumulate(a.begin(), a.end(), 0.0) / static_cast<double>(a.size());
  const double mb = std::accumulate(b.begin(), b.end(), 0.0) / static_cast<double>(b.size());
  double sab = 0.0, saa = 0.0, sbb = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

}  // namespace

TEST_CASE("needle records: mean pooling gives a flat contained-only profile at every record length", "[needle][records]") {
  const record_shape shapes[] = {{1, 1, 0}, {2, 2, 1}, {1, 3, 0}};
  for (const record_shape& shape : shapes) {
    needle_config c = base_config(needle_policy::mean_pool, 8);
    c.channels = shape.length() == 2 ? 256 : 64;  // longer records are easier: keep the accuracy off its ceiling
    c.record = shape;
    const auto r = sweep(c, 160, layout_mode::contained);
    show("mean contained", r);
    const profile_summary& contained = *r.profile("contained");
    REQUIRE(contained.valid);
    // A record fits a block of 8 at offsets 0 … 8 − L.
    CHECK(contained.residues.size() == static_cast<std::size_t>(8 - shape.length() + 1));
    CHECK(contained.homogeneity.p_value > 0.05);
    CHECK(contained.phase_test.p_value > 0.05);
    CHECK(contained.debiased_gap.low <= 0.0);
    CHECK(contained.mean > 0.3);
    CHECK(contained.mean < 0.95);
  }
}

TEST_CASE("needle records: one-hot fixed weights fail exactly the records whose value misses the offset",
          "[needle][records]") {
  const std::int64_t S = 8, o = 5;
  for (const record_shape shape : {record_shape{1, 1, 0}, record_shape{1, 2, 0}, record_shape{2, 1, 1}}) {
    needle_config c = base_config(needle_policy::fixed_weight, S);
    c.record = shape;
    c.slot_profile.assign(S, 0.0f);
    c.slot_profile[o] = 1.0f;
    const auto r = sweep(c, 48, layout_mode::any, needle_outcome::attributed);
    show("fixed one-hot", r);
    REQUIRE(r.valid);
    for (const auto& row : r.residues) {
      // Some value token of the record at offset o (of this block or, for a straddling record,
      // of the next) — the only way the entry at o returns the value.
      bool hit = false;
      for (std::int64_t v = 0; v < shape.value_tokens; ++v) hit |= (row.residue + shape.value_offset() + v) % S == o;
      INFO("residue " << row.residue);
      if (hit) {
        CHECK(row.estimate > 0.9);
        continue;
      }
      CHECK(row.estimate < 0.1);
      // A record token at o that carries the whole key (a one-token key, or a gap token, which
      // carries the key summary) addresses the record but holds no value: written badly.
      // Otherwise the entry at o does not match the query: read badly.
      bool addresses = false;
      for (std::int64_t t = 0; t < shape.length(); ++t)
        addresses |= (row.residue + t) % S == o && (t >= shape.key_tokens || shape.key_tokens == 1);
      const failure_cause expected = addresses ? failure_cause::write_dilution : failure_cause::read_dilution;
      CHECK(count(row, expected) >= failures(row) * 9 / 10);
      CHECK(count(row, failure_cause::selection_miss) == 0);  // top_k = 0 selects every entry
    }
    const profile_summary& contained = *r.profile("contained");
    REQUIRE(contained.valid);
    CHECK(contained.phase_test.p_value < 0.01);
    CHECK((contained.best_residue + shape.value_offset()) % S <= o);
  }
}

TEST_CASE("needle records: positional gate biases shape the contained profile", "[needle][records]") {
  const std::int64_t S = 8;
  // The default profile (a fixed N(0, 1) draw per slot) and two more draws.
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int draw = 0; draw < 3; ++draw) {
    needle_config c = base_config(needle_policy::positional_gates, S);
    if (draw > 0)
      for (int i = 0; i < S; ++i) c.slot_profile.push_back(normal(rng));
    const std::vector<float> bias = c.resolved_slot_profile();
    REQUIRE(bias.size() == static_cast<std::size_t>(S));
    if (draw == 0) {
      c.seed = 99;
      CHECK(c.resolved_slot_profile() == bias);  // the model's, whatever the haystack's seed
    }
    const auto r = sweep(c, 64, layout_mode::contained);
    show("positional gates", r);
    const profile_summary& contained = *r.profile("contained");
    REQUIRE(contained.valid);
    // A record at offset r: its key (slots r, r + 1 carry it) is matched with weight w_r + w_{r+1}
    // and its value read with w_{r+1}, w = exp(bias) up to the content part of the logits.
    std::vector<double> observed, predicted;
    for (const std::int64_t residue : contained.residues) {
      const auto r0 = static_cast<std::size_t>(residue);
      observed.push_back(r.residues[r0].estimate);
      predicted.push_back(std::exp(bias[r0 + 1]) * (std::exp(bias[r0]) + std::exp(bias[r0 + 1])));
    }
    const double rho = spearman(observed, predicted);
    std::printf("  profile %d: Spearman %.2f\n", draw, rho);
    CHECK(rho > 0.8);
    CHECK(contained.phase_test.p_value < 0.01);
  }
  // The bias alone (no content logits) is fixed_weight with weights exp(bias): the same probe.
  needle_config gates = base_config(needle_policy::positional_gates, S);
  gates.gate_content = 0.0f;
  gates.slot_profile = {0.0f, 0.5f, -1.0f, 2.0f, 0.25f, -0.5f, 1.0f, 1.5f};
  needle_config fixed = base_config(needle_policy::fixed_weight, S);
  for (float b : gates.slot_profile) fixed.slot_profile.push_back(std::exp(b));
  needle_probe a(gates), b(fixed);
  const std::vector<std::int64_t> targets = {1000, 2003, 4006, 6101, 7000};
  a.prepare(targets, gates.tokens - 1);
  b.prepare(targets, fixed.tokens - 1);
  const auto pa = a.probabilities(targets), pb = b.probabilities(targets);
  for (std::size_t i = 0; i < targets.size(); ++i) CHECK(pa[i] == Approx(pb[i]).margin(1e-4));
  // And uniform fixed weights are mean pooling.
  needle_config uniform = base_config(needle_policy::fixed_weight, S), mean = base_config(needle_policy::mean_pool, S);
  needle_probe u(uniform), m(mean);
  u.prepare(targets, uniform.tokens - 1);
  m.prepare(targets, mean.tokens - 1);
  const auto pu = u.probabilities(targets), pm = m.probabilities(targets);
  for (std::size_t i = 0; i < targets.size(); ++i) CHECK(pu[i] == Approx(pm[i]).margin(1e-5));
}

TEST_CASE("needle records: failures built to come from selection, the read or the write are classified so",
          "[needle][records][attribution]") {
  const std::int64_t S = 4;
  SECTION("selection: top-1 on records split by a block boundary") {
    needle_config c = base_config(needle_policy::mean_pool, S);
    c.top_k = 1;
    const auto r = sweep(c, 48, layout_mode::any, needle_outcome::attributed);
    show("mean top-1", r);
    REQUIRE(r.valid);
    const auto& split = r.residues[S - 1];  // key at the block's last offset, value in the next block
    REQUIRE(split.layout == layout_class::straddle_split);
    CHECK(failures(split) >= 12);
    CHECK(count(split, failure_cause::selection_miss) >= failures(split) * 9 / 10);
    for (const auto& row : r.residues) CHECK(count(row, failure_cause::read_dilution) == 0);  // one entry read: all its mass
  }
  SECTION("read: every entry selected, the split match loses the attention") {
    needle_config c = base_config(needle_policy::mean_pool, S);
    const auto r = sweep(c, 48, layout_mode::any, needle_outcome::attributed);
    show("mean all entries", r);
    REQUIRE(r.valid);
    const auto& split = r.residues[S - 1];
    CHECK(failures(split) >= 12);
    CHECK(count(split, failure_cause::read_dilution) >= failures(split) * 9 / 10);
    for (const auto& row : r.residues) CHECK(count(row, failure_cause::selection_miss) == 0);
  }
  SECTION("write: the key gate sees the record, the value gate the filler after it") {
    needle_config c = base_config(needle_policy::concentrated_gates, S);
    c.gate_offset = 2;  // key stream reads slot 2, value stream slot 3
    const auto r = sweep(c, 48, layout_mode::any, needle_outcome::attributed);
    show("gates at 2", r);
    REQUIRE(r.valid);
    CHECK(r.residues[2].estimate > 0.9);  // key at 2, value at 3: both gates see the record
    const auto& written = r.residues[1];  // key at 1, value at 2: the value stream's slot 3 is filler
    CHECK(failures(written) >= 40);
    CHECK(count(written, failure_cause::write_dilution) >= failures(written) * 9 / 10);
    CHECK(count(r.residues[0], failure_cause::read_dilution) >= failures(r.residues[0]) * 9 / 10);
  }
}

TEST_CASE("needle records: isolated targets have no other record in their entries", "[needle][records]") {
  for (const bool isolate : {false, true}) {
    needle_config c = base_config(needle_policy::mean_pool, 8);
    c.record = {2, 2, 1};
    c.records = 700;
    c.isolate_targets = isolate;
    needle_probe p(c);
    std::vector<std::int64_t> targets;
    for (std::int64_t t = 100; t + 100 < c.tokens; t += 97) targets.push_back(t);
    p.prepare(targets, c.tokens - 1);
    std::int64_t crowded = 0;
    for (std::int64_t t : targets) crowded += p.crowding(t) > 0 ? 1 : 0;
    if (isolate) CHECK(crowded == 0);
    else CHECK(crowded > static_cast<std::int64_t>(targets.size()) / 4);  // 43% of the tokens are records
  }
}

TEST_CASE("needle records: bad records, profiles and selection name the field; a failed prepare changes nothing",
          "[needle][records]") {
  auto rejects = [](needle_config c, const char* field) {
    INFO(field);
    CHECK_THROWS_WITH(needle_probe(c), Catch::Contains(field));
  };
  needle_config c = base_config(needle_policy::mean_pool, 8);
  {
    auto d = c;
    d.record.key_tokens = 0;
    rejects(d, "record_shape.key_tokens");
    d = c;
    d.record = {2, 2, 1};
    d.records = 900;  // 2 · 5 · 900 > 8192
    rejects(d, "needle_config.records");
    d = c;
    d.slot_profile = {1.0f, 1.0f};
    rejects(d, "needle_config.slot_profile.size()");  // mean_pool takes none
    d.policy = needle_policy::fixed_weight;
    rejects(d, "needle_config.slot_profile.size()");  // not W floats
    d.slot_profile.assign(8, 0.0f);
    rejects(d, "needle_config.slot_profile (sum)");
    d.slot_profile[3] = -1.0f;
    rejects(d, "needle_config.slot_profile[3]");
    d = c;
    d.top_k = -1;
    rejects(d, "needle_config.top_k");
    d = c;
    d.policy = needle_policy::concentrated_gates;
    d.heads = 2;
    d.top_k = 4;
    rejects(d, "needle_config.top_k");
  }
  // needle_sweep needs the probe's record.
  {
    needle_probe p(c);
    sweep_config sc = sweep_of(c, 16);
    sc.record = {2, 1, 0};
    CHECK_THROWS_AS(probe::needle_sweep(p, sc), config_error);
  }
  // Too many isolated targets for the room left: an input error, and the previous preparation stands.
  {
    needle_config d = c;
    d.records = 2000;
    d.tokens = 8192;
    needle_probe p(d);
    const std::vector<std::int64_t> few = {1000, 3000};
    p.prepare(few, d.tokens - 1);
    const auto before = p.probabilities(few);
    std::vector<std::int64_t> many;
    for (std::int64_t t = 0; t + 2 < d.tokens - 1; t += 12) many.push_back(t);
    CHECK_THROWS_WITH(p.prepare(many, d.tokens - 1), Catch::Contains("too little room"));
    CHECK(p.probabilities(few) == before);
    CHECK_THROWS_WITH(p.trial(12), Catch::Contains("not among the prepared targets"));
  }
}

}  // namespace test_diag_needle_records
