// knockout_phase_test (study/interventions.hpp) on simulated knockouts whose truth is known: a head
// whose knockout changes nothing (the test rejects at its level), and one that serves only half the
// phases (it must be found).

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>

#include "phasekv/study/interventions.hpp"

namespace test_diag_knockout_phase {

namespace {

using namespace phasekv::diag;

sweep_config config(std::uint64_t seed) {
  sweep_config c;
  c.stride = 8;
  c.modulus = 16;
  c.trials_per_residue = 64;
  c.query_position = 2000;
  c.span = 1500;
  c.seed = seed;
  return c;
}

// Accuracy 0.85 at every phase but the last (0.1); head 0's knockout multiplies it by
// (1 − head0_cost) at every phase; head 1's costs 0.6 at phases 0–3 only.
knockout_map simulate(std::uint64_t seed, double head0_cost) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  return head_knockout_map(config(seed), 2, [&](const placement& p, std::int64_t head) {
    const std::int64_t phase = p.target_position % 8;
    double acc = phase == 7 ? 0.1 : 0.85;
    if (head == 0) acc *= 1.0 - head0_cost;
    if (head == 1 && phase < 4) acc -= 0.6;
    return u(rng) < acc;
  });
}

}  // namespace

TEST_CASE("knockout_phase_test finds a head that serves some phases and not a head that serves all alike") {
  int null_rejections = 0, found = 0;
  const int maps = 30;
  for (int m = 0; m < maps; ++m) {
    // Head 0's knockout changes nothing: the test's null.
    const knockout_map map = simulate(1000 + static_cast<std::uint64_t>(m), 0.0);
    const auto uniform = knockout_phase_test(map, 0);
    const auto serving = knockout_phase_test(map, 1);
    CHECK(uniform.dof == 7);
    null_rejections += uniform.p_value < 0.05;
    found += serving.p_value < 1e-6;
  }
  CHECK(null_rejections <= 5);  // 5% of 30 = 1.5
  CHECK(found == maps);
}

TEST_CASE("knockout_phase_test checks its head") {
  const knockout_map map = simulate(1, 0.0);
  CHECK_THROWS_WITH(knockout_phase_test(map, 2), Catch::Contains("head = 2"));
  CHECK_THROWS_AS(knockout_phase_test(map, -1), phasekv::input_error);
}

}  // namespace test_diag_knockout_phase
