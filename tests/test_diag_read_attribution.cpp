// Read attribution (slot_weight_log, attribute, find_target) and the intervention helpers
// (head_knockout_map, cycle_slot_profile, predicted_shift, staggered_origins).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/study/interventions.hpp"
#include "phasekv/diag/read_attribution.hpp"

namespace test_diag_read_attribution {

using namespace phasekv;
using namespace phasekv::diag;

namespace {

// A hand-built entry with weights [kv_heads][window] (values unused by the log).
struct fake_entry {
  std::vector<float> values, weights;
  entry_view view;
  fake_entry(std::int64_t index, std::int64_t window, std::vector<float> w, std::int64_t kv_heads = 1)
      : values(static_cast<std::size_t>(kv_heads), 0.0f), weights(std::move(w)) {
    REQUIRE(static_cast<std::int64_t>(weights.size()) == kv_heads * window);
    view.index = index;
    view.kv_heads = kv_heads;
    view.channels = 1;
    view.window = window;
    view.values = values.data();
    view.slot_weights = weights.data();
  }
};

std::vector<float> one_hot(std::int64_t window, std::int64_t slot, float value = 1.0f) {
  std::vector<float> w(static_cast<std::size_t>(window), 0.0f);
  w[static_cast<std::size_t>(slot)] = value;
  return w;
}

std::vector<float> uniform(std::int64_t window, std::int64_t first = 0) {
  std::vector<float> w(static_cast<std::size_t>(window), 0.0f);
  for (std::int64_t i = first; i < window; ++i) w[static_cast<std::size_t>(i)] = 1.0f / static_cast<float>(window - first);
  return w;
}

void log_entry(slot_weight_log& log, std::int64_t j, std::int64_t window, std::vector<float> w, std::int64_t heads = 1) {
  fake_entry e(j, window, std::move(w), heads);
  log(e.view);
}

// DeepSeek-V4 shape: S = 4, W = 8. Entry j covers tokens [4j − 4, 4j + 4); entry 0 has 4 padding slots.
geometry v4() {
  geometry g;
  g.stride = 4;
  g.window = 8;
  return g;
}

}  // namespace

TEST_CASE("attribute: one-hot slot profile puts an entry's whole mass on one token and phase") {
  const geometry g = v4();
  slot_weight_log log(8);
  log_entry(log, 2, 8, one_hot(8, 5));  // entry 2: slot 5 = token 4·3 − 8 + 5 = 9, phase 1
  read_trace tr;
  tr.candidates = 3;
  tr.selected = {2};
  tr.entry_mass = {0.4f};
  const token_attribution a = attribute(g, log, tr);
  REQUIRE(a.tokens.size() == 8);  // tokens 4 … 11 reached
  CHECK(a.tokens.front().token == 4);
  CHECK(a.tokens.back().token == 11);
  CHECK(a.mass_of(9) == Approx(0.4).epsilon(1e-6));
  for (std::int64_t t = 4; t < 12; ++t)
    if (t != 9) CHECK(a.mass_of(t) == 0.0);
  REQUIRE(a.phases.size() == 4);
  CHECK(a.phases[1].sum == Approx(0.4).epsilon(1e-6));
  CHECK(a.phases[1].tokens == 2);  // tokens 5 and 9
  CHECK(a.phases[1].mean == Approx(0.2).epsilon(1e-6));
  CHECK(a.phases[0].sum == 0.0);
  CHECK(a.phases[2].sum == 0.0);
  CHECK(a.phases[3].sum == 0.0);
  CHECK(a.total == Approx(0.4).epsilon(1e-6));
}

TEST_CASE("attribute: mean pool spreads an entry's mass evenly") {
  const geometry g = v4();
  slot_weight_log log(8);
  log_entry(log, 3, 8, uniform(8));  // tokens 8 … 15
  read_trace tr;
  tr.selected = {3};
  tr.entry_mass = {0.4f};
  const token_attribution a = attribute(g, log, tr);
  REQUIRE(a.tokens.size() == 8);
  for (const auto& t : a.tokens) {
    CHECK(t.mass == Approx(0.05).epsilon(1e-6));
    CHECK(t.from_window == 0.0);
    CHECK(t.phase == t.token % 4);
  }
  for (const auto& p : a.phases) {
    CHECK(p.tokens == 2);
    CHECK(p.sum == Approx(0.1).epsilon(1e-6));
    CHECK(p.mean == Approx(0.05).epsilon(1e-6));
  }
}

TEST_CASE("attribute: a padded first entry normalises over its real slots") {
  const geometry g = v4();
  slot_weight_log log(8);
  // Hand-built: padding slots 0–3 carry (bogus) weight 5; real slots 4–7 carry 1, 1, 2, 0.
  log_entry(log, 0, 8, {5, 5, 5, 5, 1, 1, 2, 0});
  read_trace tr;
  tr.selected = {0};
  tr.entry_mass = {0.8f};
  const token_attribution a = attribute(g, log, tr);
  REQUIRE(a.tokens.size() == 4);  // tokens 0 … 3 only, no negative tokens
  CHECK(a.tokens.front().token == 0);
  CHECK(a.mass_of(0) == Approx(0.2).epsilon(1e-6));
  CHECK(a.mass_of(1) == Approx(0.2).epsilon(1e-6));
  CHECK(a.mass_of(2) == Approx(0.4).epsilon(1e-6));
  CHECK(a.mass_of(3) == 0.0);
  CHECK(a.total == Approx(0.8).epsilon(1e-6));
  CHECK(a.mass_of(-1) == 0.0);
}

TEST_CASE("attribute: mass conservation with several entries, the raw window and overlap") {
  const geometry g = v4();
  slot_weight_log log(8);
  log_entry(log, 0, 8, {0, 0, 0, 0, 0.1f, 0.2f, 0.3f, 0.4f});
  log_entry(log, 1, 8, {0.05f, 0.1f, 0.15f, 0.2f, 0.1f, 0.1f, 0.2f, 0.1f});
  log_entry(log, 2, 8, {0.3f, 0.0f, 0.1f, 0.2f, 0.1f, 0.1f, 0.1f, 0.1f});
  log_entry(log, 3, 8, {0.7f, 0.1f, 0.0f, 0.0f, 0.0f, 0.1f, 0.0f, 0.1f});
  read_trace tr;
  tr.candidates = 4;  // query at 16 or so
  tr.selected = {2, 0, 3};
  tr.entry_mass = {0.3f, 0.1f, 0.2f};
  tr.window_first = 14;  // overlaps entry 3 (tokens 8 … 15) on 14, 15
  tr.window_token_mass = {0.1f, 0.15f, 0.05f, 0.1f};
  tr.window_mass = 0.4f;
  tr.sink_mass = 0.0f;
  const token_attribution a = attribute(g, log, tr);
  CHECK(a.entry_mass == Approx(0.6).epsilon(1e-6));
  CHECK(a.window_mass == Approx(0.4).epsilon(1e-6));
  double sum = 0.0, phase_sum = 0.0;
  for (const auto& t : a.tokens) {
    sum += t.mass;
    CHECK(t.mass == Approx(t.from_entries + t.from_window));
  }
  for (const auto& p : a.phases) phase_sum += p.sum;
  CHECK(sum == Approx(1.0).epsilon(1e-6));
  CHECK(phase_sum == Approx(1.0).epsilon(1e-6));
  CHECK(a.total == Approx(a.entry_mass + a.window_mass).epsilon(1e-9));
  // Tokens 0 … 15 from entries 0, 2, 3 (entry 1 not selected: 0 … 7 come from 0 and 2), plus window 14 … 17.
  CHECK(a.tokens.front().token == 0);
  CHECK(a.tokens.back().token == 17);
  CHECK(a.tokens.size() == 18);
  // Token 15: last slot of entry 3 (0.1 / 1.0 of 0.2) plus window mass 0.15.
  const auto& t15 = a.tokens[15];
  REQUIRE(t15.token == 15);
  CHECK(t15.from_entries == Approx(0.02).epsilon(1e-5));
  CHECK(t15.from_window == Approx(0.15).epsilon(1e-6));
  // Token 8: slot 0 of entry 3 (0.7 of 0.2) + slot 4 of entry 2 (0.1 / 1.0 of 0.3).
  CHECK(a.mass_of(8) == Approx(0.14 + 0.03).epsilon(1e-5));
  CHECK(a.mass_of(16) == Approx(0.05).epsilon(1e-6));
}

TEST_CASE("slot_weight_log: mean over KV heads or one head") {
  const geometry g = v4();
  std::vector<float> w(16, 0.0f);
  w[0 * 8 + 0] = 1.0f;  // head 0: slot 0 (token 4 of entry 2)
  w[1 * 8 + 7] = 1.0f;  // head 1: slot 7 (token 11)
  slot_weight_log mean_log(8), head1(8, 1);
  log_entry(mean_log, 2, 8, w, 2);
  log_entry(head1, 2, 8, w, 2);
  CHECK(mean_log.recorded() == 1);
  CHECK(mean_log.has(2));
  CHECK_FALSE(mean_log.has(1));
  CHECK(mean_log.weights(2)[0] == Approx(0.5f));
  CHECK(mean_log.weights(2)[7] == Approx(0.5f));
  read_trace tr;
  tr.selected = {2};
  tr.entry_mass = {1.0f};
  const auto am = attribute(g, mean_log, tr);
  CHECK(am.mass_of(4) == Approx(0.5));
  CHECK(am.mass_of(11) == Approx(0.5));
  const auto a1 = attribute(g, head1, tr);
  CHECK(a1.mass_of(4) == 0.0);
  CHECK(a1.mass_of(11) == Approx(1.0));
  // A head index the entry does not have.
  slot_weight_log head5(8, 5);
  fake_entry e(2, 8, w, 2);
  CHECK_THROWS_AS(head5(e.view), input_error);
  CHECK(head5.recorded() == 0);
}

TEST_CASE("read attribution errors name what is wrong") {
  const geometry g = v4();
  slot_weight_log log(8);
  SECTION("entries without slot weights") {
    fake_entry e(0, 8, uniform(8));
    e.view.slot_weights = nullptr;
    CHECK_THROWS_AS(log(e.view), input_error);
    CHECK_THROWS_WITH(log(e.view), Catch::Contains("slot_weights"));
    CHECK(log.recorded() == 0);
  }
  SECTION("wrong window, negative or NaN weights leave the log unchanged") {
    fake_entry e(0, 4, uniform(4));
    CHECK_THROWS_AS(log(e.view), input_error);
    std::vector<float> bad = uniform(8);
    bad[3] = std::nanf("");
    fake_entry n(1, 8, bad);
    CHECK_THROWS_AS(log(n.view), input_error);
    bad[3] = -0.1f;
    fake_entry m(1, 8, bad);
    CHECK_THROWS_AS(log(m.view), input_error);
    CHECK(log.recorded() == 0);
    CHECK_FALSE(log.has(1));
  }
  SECTION("a selected entry the log never saw") {
    log_entry(log, 1, 8, uniform(8));
    read_trace tr;
    tr.selected = {1, 7};
    tr.entry_mass = {0.5f, 0.5f};
    CHECK_THROWS_AS(attribute(g, log, tr), input_error);
    CHECK_THROWS_WITH(attribute(g, log, tr), Catch::Contains("entry = 7"));
    CHECK_THROWS_WITH(log.weights(7), Catch::Contains("entry = 7"));
  }
  SECTION("mismatched trace or geometry") {
    log_entry(log, 1, 8, uniform(8));
    read_trace tr;
    tr.selected = {1};
    tr.entry_mass = {0.5f, 0.5f};
    CHECK_THROWS_AS(attribute(g, log, tr), input_error);
    tr.entry_mass = {-0.5f};
    CHECK_THROWS_AS(attribute(g, log, tr), input_error);
    tr.entry_mass = {0.5f};
    geometry g16 = g;
    g16.window = 16;
    CHECK_THROWS_WITH(attribute(g16, log, tr), Catch::Contains("window"));
    log_entry(log, 2, 8, std::vector<float>(8, 0.0f));  // all-zero weights cannot carry mass
    tr.selected = {2};
    CHECK_THROWS_WITH(attribute(g, log, tr), Catch::Contains("entry 2"));
  }
}

TEST_CASE("find_target: best rank of a selected covering entry, and the window") {
  const geometry g = v4();
  read_trace tr;
  tr.candidates = 4;
  tr.selected = {3, 0, 2};
  tr.entry_mass = {0.3f, 0.2f, 0.1f};
  tr.window_first = 16;
  tr.window_token_mass = {0.1f, 0.1f, 0.1f, 0.1f};  // tokens 16 … 19

  auto s = find_target(g, tr, 9);  // covered by entries 2, 3
  CHECK(s.selected);
  CHECK(s.rank == 0);
  CHECK(s.entry == 3);
  CHECK(s.entry_mass == 0.3f);
  CHECK(s.covering_selected == 2);
  CHECK(s.covering_candidates == 2);
  CHECK(s.phase == 1);
  CHECK_FALSE(s.in_window);

  s = find_target(g, tr, 5);  // covered by entries 1, 2: only 2 selected, at rank 2
  CHECK(s.selected);
  CHECK(s.rank == 2);
  CHECK(s.entry == 2);
  CHECK(s.covering_selected == 1);

  s = find_target(g, tr, 1);  // entries 0, 1: entry 0 at rank 1
  CHECK(s.rank == 1);
  CHECK(s.entry == 0);

  s = find_target(g, tr, 13);  // entries 3, 4: entry 4 is not a candidate
  CHECK(s.covering_candidates == 1);
  CHECK(s.rank == 0);
  CHECK(s.entry == 3);

  s = find_target(g, tr, 17);  // entries 4, 5: none; in the raw window
  CHECK_FALSE(s.selected);
  CHECK(s.rank == -1);
  CHECK(s.entry == -1);
  CHECK(s.covering_candidates == 0);
  CHECK(s.in_window);
  CHECK_FALSE(find_target(g, tr, 20).in_window);
  CHECK(find_target(g, tr, 16).in_window);
  CHECK_FALSE(find_target(g, tr, 15).in_window);

  tr.selected = {1};
  tr.entry_mass = {1.0f};
  s = find_target(g, tr, 9);  // entries 2, 3 both unselected
  CHECK_FALSE(s.selected);
  CHECK(s.covering_selected == 0);
  CHECK_THROWS_AS(find_target(g, tr, -1), input_error);
}

TEST_CASE("head_knockout_map: knocking head h kills residues ≡ h (mod S)") {
  sweep_config cfg;
  cfg.stride = 4;
  cfg.modulus = 8;
  cfg.trials_per_residue = 10;
  cfg.query_position = 200;
  cfg.span = 24;
  cfg.seed = 3;
  std::int64_t calls = 0, baseline_calls = 0;
  const auto km = head_knockout_map(cfg, 4, [&](const placement& p, std::int64_t h) {
    ++calls;
    if (h < 0) ++baseline_calls;
    return !(h >= 0 && p.target_position % 4 == h);
  });
  CHECK(calls == 5 * 8 * 10);
  CHECK(baseline_calls == 8 * 10);
  REQUIRE(km.heads == 4);
  REQUIRE(km.modulus == 8);
  REQUIRE(km.delta.size() == 32);
  REQUIRE(km.knocked.size() == 4);
  for (std::int64_t r = 0; r < 8; ++r) CHECK(km.baseline.residues[static_cast<std::size_t>(r)].estimate == 1.0);
  for (std::int64_t h = 0; h < 4; ++h)
    for (std::int64_t r = 0; r < 8; ++r) {
      INFO("head " << h << " residue " << r);
      CHECK(km.at(h, r) == (r % 4 == h ? -1.0 : 0.0));
    }

  // A probability trial: baseline 0.75, the knocked residues drop to 0.25.
  const auto kp = head_knockout_map(cfg, 2, [](const placement& p, std::int64_t h) {
    return (h >= 0 && p.target_position % 4 == h) ? 0.25 : 0.75;
  });
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t r = 0; r < 8; ++r) CHECK(kp.at(h, r) == Approx(r % 4 == h ? -0.5 : 0.0).margin(1e-12));

  CHECK_THROWS_AS(head_knockout_map(cfg, 0, [](const placement&, std::int64_t) { return true; }), config_error);
  sweep_config bad = cfg;
  bad.span = 3;
  std::int64_t ran = 0;
  CHECK_THROWS_AS(head_knockout_map(bad, 2,
                                    [&](const placement&, std::int64_t) {
                                      ++ran;
                                      return true;
                                    }),
                  config_error);
  CHECK(ran == 0);
}

TEST_CASE("cycle_slot_profile moves per-slot parameters by delta") {
  const std::vector<float> hot = {0, 1, 0, 0};  // slot 1
  CHECK(cycle_slot_profile(hot, 4, 4, 2) == std::vector<float>{0, 0, 0, 1});
  CHECK(cycle_slot_profile(hot, 4, 4, -1) == std::vector<float>{1, 0, 0, 0});
  CHECK(cycle_slot_profile(hot, 4, 4, 6) == std::vector<float>{0, 0, 0, 1});
  CHECK(cycle_slot_profile(hot, 4, 4, 0) == hot);
  // Bias rows of G = 2 floats per slot move whole.
  const std::vector<float> bias = {0, 1, 10, 11, 20, 21};  // W = S = 3
  CHECK(cycle_slot_profile(bias, 3, 3, 1) == std::vector<float>{20, 21, 0, 1, 10, 11});
  // Two heads, each block cycled on its own.
  const std::vector<float> two = {1, 2, 3, 4, 5, 6};  // [2][3][1]
  CHECK(cycle_slot_profile(two, 3, 3, 1, 2) == std::vector<float>{3, 1, 2, 6, 4, 5});
  CHECK_THROWS_AS(cycle_slot_profile(hot, 8, 4, 1), input_error);
  CHECK_THROWS_AS(cycle_slot_profile(std::vector<float>{1, 2, 3}, 4, 4, 1), input_error);
  CHECK_THROWS_AS(cycle_slot_profile(std::vector<float>{}, 4, 4, 1), input_error);
}

TEST_CASE("predicted_shift shifts the profile within each period") {
  const std::vector<double> a0 = {0.9, 0.5, 0.9, 0.9, 0.8, 0.4, 0.8, 0.8};  // S = 4, M = 8: weak at phase 1
  const auto a1 = predicted_shift(a0, 4, 1);
  CHECK(a1 == std::vector<double>{0.9, 0.9, 0.5, 0.9, 0.8, 0.8, 0.4, 0.8});
  CHECK(predicted_shift(a0, 4, 0) == a0);
  CHECK(predicted_shift(a0, 4, 4) == a0);
  CHECK(predicted_shift(a0, 4, -1) == std::vector<double>{0.5, 0.9, 0.9, 0.9, 0.4, 0.8, 0.8, 0.8});
  // Consistent with cycle_slot_profile: the weak slot moves to the same place as the weak residue.
  const std::vector<float> weak = {1, 0, 1, 1};  // slot 1 weak
  const auto moved = cycle_slot_profile(weak, 4, 4, 1);
  const auto pred = predicted_shift(std::vector<double>{1, 0, 1, 1}, 4, 1);
  for (std::size_t i = 0; i < 4; ++i) CHECK(static_cast<double>(moved[i]) == pred[i]);
  CHECK_THROWS_AS(predicted_shift(std::vector<double>{1, 2, 3}, 4, 1), input_error);
}

TEST_CASE("staggered_origins spreads chunk origins over the stride") {
  geometry base = v4();
  auto origins = [](const std::vector<geometry>& gs) {
    std::vector<std::int64_t> o;
    for (const auto& g : gs) {
      g.validate();
      o.push_back(g.origin);
    }
    return o;
  };
  const auto four = staggered_origins(base, 4);
  CHECK(origins(four) == std::vector<std::int64_t>{0, 1, 2, 3});
  CHECK(four[3].window == 8);
  CHECK(four[3].stride == 4);
  CHECK(origins(staggered_origins(base, 3)) == std::vector<std::int64_t>{0, 1, 2});
  CHECK(origins(staggered_origins(base, 8)) == std::vector<std::int64_t>{0, 0, 1, 1, 2, 2, 3, 3});
  CHECK(origins(staggered_origins(base, 1)) == std::vector<std::int64_t>{0});
  base.origin = 3;
  CHECK(origins(staggered_origins(base, 2)) == std::vector<std::int64_t>{3, 1});
  CHECK_THROWS_AS(staggered_origins(base, 0), config_error);
}

TEST_CASE("slot_weight_log as the sink of a real mean-pool compressor") {
  const geometry g = v4();
  stream_config config;
  config.name = "attr";
  config.channels = 2;
  config.kv_heads = 2;
  const stream_compressor<compressor_policy<mean_pool>> compressor(g, config);
  const std::int64_t tokens = 16;
  std::vector<float> payload(static_cast<std::size_t>(tokens * compressor.payload_floats_per_token()), 0.5f);
  token_chunk chunk;
  chunk.tokens = tokens;
  chunk.payload = payload;
  stream_state state = compressor.make_state();
  slot_weight_log log(g.window);
  append_options with;
  with.slot_weights = true;
  CHECK(compressor.append(state, chunk, log, with) == 4);
  REQUIRE(log.recorded() == 4);
  // Entry 0 is padded: its 4 real slots (tokens 0 … 3) share the weight.
  read_trace tr;
  tr.selected = {0, 3};
  tr.entry_mass = {0.4f, 0.4f};
  const auto a = attribute(g, log, tr);
  for (std::int64_t t = 0; t < 4; ++t) CHECK(a.mass_of(t) == Approx(0.1).epsilon(1e-5));
  for (std::int64_t t = 8; t < 16; ++t) CHECK(a.mass_of(t) == Approx(0.05).epsilon(1e-5));
  CHECK(a.total == Approx(0.8).epsilon(1e-6));
  // Without slot weights the log refuses the entries.
  slot_weight_log strict(g.window);
  stream_state fresh = compressor.make_state();
  CHECK_THROWS_AS(compressor.append(fresh, chunk, strict), input_error);
  CHECK(strict.recorded() == 0);
}

TEST_CASE("classify_failure: built to miss by selection, by the read, by the write, or not at all", "[diag][attribution]") {
  // S = 4, W = 8: entry j pools tokens [4j − 4, 4j + 4). The record: tokens 9 and 10 (block 2),
  // held by entries 2 and 3.
  const geometry g = v4();
  slot_weight_log log(8);
  for (std::int64_t j = 0; j < 8; ++j) log_entry(log, j, 8, uniform(8, j == 0 ? 4 : 0));
  // Entry 3 written with a profile one-hot on slot 7 (token 15): the record gets no weight there.
  log_entry(log, 3, 8, one_hot(8, 7));
  read_trace t;
  t.candidates = 8;

  t.selected = {5, 6};  // neither entry 2 nor 3
  t.entry_mass = {0.6f, 0.4f};
  CHECK(classify_failure(g, log, t, 9, 2).cause == failure_cause::selection_miss);
  // The record in the raw window is reached even when no entry holding it is selected.
  t.window_first = 8;
  t.window_token_mass = {0.0f, 0.0f, 0.0f};
  CHECK(classify_failure(g, log, t, 9, 2).cause == failure_cause::read_dilution);
  t.window_token_mass.clear();

  t.selected = {2, 6};  // entry 2 holds it (mean pooled) but gets a tenth of the mass
  t.entry_mass = {0.1f, 0.9f};
  auto a = classify_failure(g, log, t, 9, 2);
  CHECK(a.cause == failure_cause::read_dilution);
  CHECK(a.entries_selected == 1);
  CHECK(a.read_mass == Approx(0.1));
  CHECK(a.write_share == Approx(a.uniform_share));  // mean pooling: exactly the uniform share
  CHECK(a.uniform_share == Approx(2.0 / 8.0));

  t.selected = {3, 6};  // entry 3 gets the mass, but its writer gave the record's slots nothing
  t.entry_mass = {0.9f, 0.1f};
  a = classify_failure(g, log, t, 9, 2);
  CHECK(a.cause == failure_cause::write_dilution);
  CHECK(a.write_share == 0.0);

  t.selected = {2};  // read and weighted: what failed was downstream
  t.entry_mass = {0.95f};
  CHECK(classify_failure(g, log, t, 9, 2).cause == failure_cause::readout);

  CHECK_THROWS_WITH(classify_failure(g, log, t, -1, 2), Catch::Contains("first"));
  t.entry_mass.clear();
  CHECK_THROWS_WITH(classify_failure(g, log, t, 9, 2), Catch::Contains("entry_mass.size()"));
}

}  // namespace test_diag_read_attribution
