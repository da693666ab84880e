// The phase-sweep statistics (study/statistics.hpp) against hand-computed values, closed forms
// and reference values computed once with mpmath at 40 digits (quoted to 17 here).

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "phasekv/study/statistics.hpp"

namespace test_diag_statistics {

namespace {

using namespace phasekv;
using namespace phasekv::diag::stats;

const double inf = std::numeric_limits<double>::infinity();
const double not_a_number = std::numeric_limits<double>::quiet_NaN();
const double pi = 3.14159265358979323846;

// Relative closeness for values that may be tiny (Approx's default margin is 0).
bool close(double got, double want, double relative) {
  return std::fabs(got - want) <= relative * std::fabs(want);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Wilson interval
// ---------------------------------------------------------------------------------------------

TEST_CASE("stats: Wilson interval matches hand-computed values", "[diag][stats]") {
  SECTION("8/10, z = 1.96: centre 0.71674, half-width 0.22658") {
    const auto w = wilson_interval(8, 10, 1.96);
    CHECK(w.estimate == 0.8);
    CHECK(w.low == Approx(0.49015684672072339).epsilon(1e-13));
    CHECK(w.high == Approx(0.94331905201930666).epsilon(1e-13));
    CHECK(w.low == Approx(0.4902).margin(5e-5));  // the textbook's rounding
    CHECK(w.high == Approx(0.9433).margin(5e-5));
  }
  SECTION("0/n and n/n: the observed side is exactly 0 or 1, the other z²/n / (1 + z²/n) away") {
    const auto none = wilson_interval(0, 10, 1.96);
    CHECK(none.low == 0.0);
    CHECK(none.high == Approx(0.38416 / 1.38416).epsilon(1e-14));
    const auto all = wilson_interval(10, 10, 1.96);
    CHECK(all.high == 1.0);
    CHECK(all.low == Approx(1.0 / 1.38416).epsilon(1e-14));
  }
  SECTION("more points, default z = Φ⁻¹(0.975)") {
    const auto a = wilson_interval(1, 3);
    CHECK(a.low == Approx(0.061491944720396242).epsilon(1e-13));
    CHECK(a.high == Approx(0.79234039919795225).epsilon(1e-13));
    const auto b = wilson_interval(112, 256);  // residue 0 of the study's V4-Flash profile, 43.75%
    CHECK(b.low == Approx(0.37809929934301558).epsilon(1e-13));
    CHECK(b.high == Approx(0.49874868271021834).epsilon(1e-13));
    const auto c = wilson_interval(5000, 10000, 2.5758293035489);  // 99%: symmetric about 1/2
    CHECK(c.low == Approx(0.48712512394758849).epsilon(1e-12));
    CHECK(c.high == Approx(0.51287487605241151).epsilon(1e-12));
  }
  SECTION("a wider z gives a wider interval; both contain the estimate") {
    for (std::int64_t s : {0, 1, 7, 50, 99, 100}) {
      const auto narrow = wilson_interval(s, 100, 1.0), wide = wilson_interval(s, 100, 3.0);
      CHECK(wide.low <= narrow.low);
      CHECK(wide.high >= narrow.high);
      CHECK(narrow.low <= narrow.estimate);
      CHECK(narrow.high >= narrow.estimate);
      CHECK(wide.low >= 0.0);
      CHECK(wide.high <= 1.0);
    }
  }
}

TEST_CASE("stats: Wilson interval rejects impossible counts", "[diag][stats][errors]") {
  CHECK_THROWS_AS(wilson_interval(0, 0), input_error);
  CHECK_THROWS_WITH(wilson_interval(0, 0), Catch::Contains("trials = 0"));
  CHECK_THROWS_WITH(wilson_interval(11, 10), Catch::Contains("successes = 11"));
  CHECK_THROWS_AS(wilson_interval(-1, 10), input_error);
  CHECK_THROWS_WITH(wilson_interval(5, 10, 0.0), Catch::Contains("z = 0"));
  CHECK_THROWS_AS(wilson_interval(5, 10, not_a_number), input_error);
}

// ---------------------------------------------------------------------------------------------
// Special functions
// ---------------------------------------------------------------------------------------------

TEST_CASE("stats: incomplete gamma against closed forms", "[diag][stats][special]") {
  SECTION("P(1, x) = 1 − e^(−x) (both branches: x < 2 series, x ≥ 2 continued fraction)") {
    for (double x : {1e-8, 0.01, 0.5, 1.0, 1.99, 2.0, 3.5, 10.0, 40.0}) {
      INFO("x = " << x);
      CHECK(close(regularized_gamma_p(1.0, x), -std::expm1(-x), 1e-14));
      CHECK(close(regularized_gamma_q(1.0, x), std::exp(-x), 1e-14));
    }
  }
  SECTION("P(1/2, x) = erf(√x), Q(1/2, x) = erfc(√x)") {
    for (double x : {1e-6, 0.1, 0.9, 1.5, 2.0, 5.0, 30.0, 300.0}) {
      INFO("x = " << x);
      CHECK(close(regularized_gamma_p(0.5, x), std::erf(std::sqrt(x)), 1e-14));
      CHECK(close(regularized_gamma_q(0.5, x), std::erfc(std::sqrt(x)), 1e-13));  // down to 1e-132
    }
  }
  SECTION("integer a: Q(n, x) = e^(−x) Σ_{k<n} x^k/k!") {
    for (int n : {2, 3, 7}) {
      for (double x : {0.3, 3.0, 9.0}) {
        double sum = 0.0, term = 1.0;
        for (int k = 0; k < n; ++k) {
          sum += term;
          term *= x / (k + 1);
        }
        INFO("n = " << n << ", x = " << x);
        CHECK(close(regularized_gamma_q(n, x), std::exp(-x) * sum, 1e-14));
      }
    }
  }
  SECTION("reference values (mpmath)") {
    CHECK(close(regularized_gamma_p(100, 100), 0.51329879827914866486, 1e-13));
    CHECK(close(regularized_gamma_p(3, 0.5), 0.014387677966970686644, 1e-14));
    CHECK(close(regularized_gamma_p(30, 10), 2.5099512015279078234e-7, 1e-13));
    CHECK(close(regularized_gamma_p(0.1, 1e-5), 0.3323984050405032954, 1e-14));
    CHECK(close(regularized_gamma_p(5, 5.9), 0.70133521323838041176, 1e-14));  // series side of a + 1
    CHECK(close(regularized_gamma_p(5, 6.1), 0.72810573468104531792, 1e-14));  // fraction side
  }
  SECTION("P + Q = 1 and the ends") {
    for (double a : {0.05, 0.5, 1.0, 4.5, 60.0})
      for (double x : {0.0, 0.01, 1.0, 4.0, 5.5, 61.0, 500.0}) {
        INFO("a = " << a << ", x = " << x);
        CHECK(regularized_gamma_p(a, x) + regularized_gamma_q(a, x) == Approx(1.0).epsilon(1e-14));
      }
    CHECK(regularized_gamma_p(3.0, 0.0) == 0.0);
    CHECK(regularized_gamma_q(3.0, 0.0) == 1.0);
    CHECK(regularized_gamma_p(3.0, inf) == 1.0);
    CHECK(regularized_gamma_q(3.0, inf) == 0.0);
  }
}

TEST_CASE("stats: incomplete gamma stays accurate for large arguments", "[diag][stats][special]") {
  // Tails are computed directly, not as 1 − (something close to 1).
  CHECK(close(regularized_gamma_q(2.5, 200), 2.9666446590828848785e-84, 1e-12));
  CHECK(close(regularized_gamma_q(0.5, 700), std::erfc(std::sqrt(700.0)), 1e-12));
  CHECK(regularized_gamma_q(0.5, 1e6) == 0.0);  // underflows cleanly, no NaN
  CHECK(regularized_gamma_p(1e5, 10.0) == 0.0);
  // a ~ x large: both expansions need O(√a) terms; the log-space prefactor loses ~a·ε.
  CHECK(close(regularized_gamma_p(1e4, 1e4), 0.50132980833995520038, 1e-11));
  CHECK(close(regularized_gamma_p(1e6, 1e6 + 1000), 0.84134478636834029163, 1e-9));
  CHECK(close(regularized_gamma_p(1e6, 1e6 - 3000), 0.0013381041673135996923, 1e-8));
  // a = 1e8 at x = a + √a: the Wilson–Hilferty/normal limit Φ(1) ≈ 0.8413 (to O(1/√a)).
  const double big = regularized_gamma_p(1e8, 1e8 + 1e4);
  CHECK(std::isfinite(big));
  CHECK(big == Approx(0.8413).margin(1e-3));
}

TEST_CASE("stats: incomplete beta against closed forms", "[diag][stats][special]") {
  SECTION("I_x(1, 1) = x; I_x(a, 1) = x^a; I_x(1, b) = 1 − (1 − x)^b") {
    for (double x : {0.0, 1e-9, 0.1, 0.37, 0.5, 0.8, 0.999, 1.0}) {
      INFO("x = " << x);
      CHECK(regularized_beta(1, 1, x) == Approx(x).epsilon(1e-14).margin(1e-300));
      CHECK(regularized_beta(3.5, 1, x) == Approx(std::pow(x, 3.5)).epsilon(1e-13).margin(1e-300));
      CHECK(regularized_beta(1, 4, x) == Approx(-std::expm1(4 * std::log1p(-x))).epsilon(1e-13).margin(1e-300));
    }
  }
  SECTION("I_x(2, 3) = 6x²(1−x)² + 4x³(1−x) + x⁴ (binomial sum, n = 4)") {
    for (double x : {0.05, 0.2, 0.4, 0.5, 0.6, 0.9}) {
      const double y = 1 - x;
      INFO("x = " << x);
      CHECK(regularized_beta(2, 3, x) == Approx(6 * x * x * y * y + 4 * x * x * x * y + x * x * x * x).epsilon(1e-14));
    }
  }
  SECTION("symmetry I_x(a, b) = 1 − I_{1−x}(b, a)") {
    for (double a : {0.3, 2.0, 17.5})
      for (double b : {0.7, 5.0, 40.0})
        for (double x : {0.01, 0.25, 0.5, 0.75, 0.99}) {
          INFO("a = " << a << ", b = " << b << ", x = " << x);
          CHECK(regularized_beta(a, b, x) == Approx(1 - regularized_beta(b, a, 1 - x)).epsilon(1e-13).margin(1e-15));
        }
  }
  SECTION("reference values (mpmath)") {
    CHECK(close(regularized_beta(50, 80, 0.3), 0.020700287911373348498, 1e-12));
    CHECK(close(regularized_beta(2.5, 0.7, 0.2), 0.01053222458940925798, 1e-13));
    CHECK(close(regularized_beta(0.5, 0.5, 0.999), 0.97986495836662250008, 1e-13));
    CHECK(close(regularized_beta(3, 200, 0.01), 0.32876182896161063335, 1e-12));
    // I_x(1/2, 1/2) = (2/π) asin(√x)
    CHECK(close(regularized_beta(0.5, 0.5, 0.3), 2 / pi * std::asin(std::sqrt(0.3)), 1e-14));
  }
  SECTION("large shapes: symmetric midpoint and a far tail") {
    CHECK(regularized_beta(1000, 1000, 0.5) == Approx(0.5).epsilon(1e-12));
    CHECK(close(regularized_beta(1000, 1000, 0.4), 8.2316113548693078904e-20, 1e-10));
    // The log-space prefactor costs ~max(a, b)·ε relative: 5e-8 here, documented in the header.
    CHECK(regularized_beta(1e7, 1e7, 0.5) == Approx(0.5).epsilon(1e-6));
  }
}

TEST_CASE("stats: special functions reject bad arguments", "[diag][stats][errors]") {
  CHECK_THROWS_AS(regularized_gamma_p(0.0, 1.0), input_error);
  CHECK_THROWS_WITH(regularized_gamma_q(-1.0, 1.0), Catch::Contains("a = -1"));
  CHECK_THROWS_WITH(regularized_gamma_p(1.0, -0.5), Catch::Contains("x = -0.5"));
  CHECK_THROWS_AS(regularized_gamma_p(1.0, not_a_number), input_error);
  CHECK_THROWS_WITH(regularized_beta(1, 1, 1.5), Catch::Contains("x = 1.5"));
  CHECK_THROWS_WITH(regularized_beta(1, 0, 0.5), Catch::Contains("b = 0"));
  CHECK_THROWS_AS(regularized_beta(1, 1, not_a_number), input_error);
  CHECK_THROWS_AS(log_gamma(0.0), input_error);
  CHECK(log_gamma(5.0) == Approx(std::log(24.0)).epsilon(1e-15));
  CHECK_THROWS_AS(chi_square_upper_tail(1.0, 0.0), input_error);
  CHECK_THROWS_AS(f_upper_tail(-1.0, 1.0, 1.0), input_error);
}

TEST_CASE("stats: χ² and F upper tails hit textbook critical values", "[diag][stats]") {
  CHECK(chi_square_upper_tail(3.8414588206941258653, 1) == Approx(0.05).epsilon(1e-12));
  CHECK(chi_square_upper_tail(3.841, 1) == Approx(0.050013683763956704798).epsilon(1e-12));
  CHECK(chi_square_upper_tail(11.070497693516354035, 5) == Approx(0.05).epsilon(1e-12));
  CHECK(chi_square_upper_tail(11.07, 5) == Approx(0.05).margin(1e-4));
  CHECK(chi_square_upper_tail(18.475306906582363681, 7) == Approx(0.01).epsilon(1e-12));
  CHECK(chi_square_upper_tail(0.0, 3) == 1.0);
  CHECK(f_upper_tail(3.8852938346523942148, 2, 12) == Approx(0.05).epsilon(1e-12));
  CHECK(f_upper_tail(3.0983912121407800993, 3, 20) == Approx(0.05).epsilon(1e-12));
  CHECK(f_upper_tail(0.0, 3, 20) == 1.0);
  CHECK(f_upper_tail(inf, 3, 20) == 0.0);
  // F(1, d) = t² with d dof; d = 1 is Cauchy: Pr(|t| ≥ √f) = 1 − (2/π) atan(√f).
  for (double f : {0.2, 1.0, 9.0, 1e6})
    CHECK(close(f_upper_tail(f, 1, 1), 1 - 2 / pi * std::atan(std::sqrt(f)), 1e-12));
}

// ---------------------------------------------------------------------------------------------
// Homogeneity tests
// ---------------------------------------------------------------------------------------------

TEST_CASE("stats: χ² homogeneity of success counts", "[diag][stats]") {
  SECTION("2×2 by hand: 8/10 vs 2/10 → pooled 1/2, χ² = 2·3²/2.5 = 7.2, p = erfc(√3.6)") {
    const auto t = chi_square_homogeneity(std::vector<std::int64_t>{8, 2}, std::vector<std::int64_t>{10, 10});
    CHECK(t.statistic == Approx(7.2).epsilon(1e-14));
    CHECK(t.dof == 1);
    CHECK(t.p_value == Approx(std::erfc(std::sqrt(3.6))).epsilon(1e-13));
    CHECK(t.p_value == Approx(0.0072903580915356414814).epsilon(1e-13));
    CHECK(t.min_expected == 5.0);
  }
  SECTION("three unequal groups (mpmath)") {
    const auto t = chi_square_homogeneity(std::vector<std::int64_t>{30, 45, 20}, std::vector<std::int64_t>{60, 70, 50});
    CHECK(t.statistic == Approx(7.1808934099955772).epsilon(1e-13));
    CHECK(t.dof == 2);
    CHECK(t.p_value == Approx(0.027586004864267956).epsilon(1e-12));
  }
  SECTION("homogeneous: four residues near 50% → p ≈ 0.95") {
    const auto t = chi_square_homogeneity(std::vector<std::int64_t>{48, 52, 50, 51}, std::vector<std::int64_t>(4, 100));
    CHECK(t.statistic == Approx(0.35000875021875547).epsilon(1e-12));
    CHECK(t.p_value == Approx(0.95036438371127226).epsilon(1e-12));
    CHECK(t.p_value > 0.5);
  }
  SECTION("strongly heterogeneous: the study's V4-Flash residue profile, 256 trials each") {
    // 43.75 69.53 66.02 29.69 44.92 69.92 64.45 32.81 % = these counts out of 256.
    const std::vector<std::int64_t> s = {112, 178, 169, 76, 115, 179, 165, 84};
    const auto t = chi_square_homogeneity(s, std::vector<std::int64_t>(8, 256));
    CHECK(t.statistic == Approx(201.36466537880382).epsilon(1e-12));
    CHECK(t.dof == 7);
    CHECK(close(t.p_value, 5.8997694265636966e-40, 1e-10));  // a tail this deep stays exact
  }
  SECTION("all successes or all failures: nothing to test → statistic 0, p 1") {
    for (std::int64_t fill : {0, 1}) {
      const std::vector<std::int64_t> trials = {5, 9, 3};
      std::vector<std::int64_t> s = trials;
      if (fill == 0) s.assign(3, 0);
      const auto t = chi_square_homogeneity(s, trials);
      CHECK(t.statistic == 0.0);
      CHECK(t.p_value == 1.0);
      CHECK(t.dof == 2);
      CHECK(t.min_expected == 0.0);
    }
  }
  SECTION("identical rates → statistic 0, p 1") {
    const auto t = chi_square_homogeneity(std::vector<std::int64_t>{3, 6, 9}, std::vector<std::int64_t>{10, 20, 30});
    CHECK(t.statistic == Approx(0.0).margin(1e-13));
    CHECK(t.p_value == Approx(1.0).epsilon(1e-12));
  }
}

TEST_CASE("stats: χ² homogeneity rejects bad tables", "[diag][stats][errors]") {
  using v = std::vector<std::int64_t>;
  CHECK_THROWS_WITH(chi_square_homogeneity(v{1, 2}, v{3, 0}), Catch::Contains("trials[1] = 0"));
  CHECK_THROWS_WITH(chi_square_homogeneity(v{1, 5}, v{3, 4}), Catch::Contains("successes[1] = 5"));
  CHECK_THROWS_WITH(chi_square_homogeneity(v{1, -1}, v{3, 4}), Catch::Contains("successes[1] = -1"));
  CHECK_THROWS_WITH(chi_square_homogeneity(v{1}, v{3}), Catch::Contains("groups = 1"));
  CHECK_THROWS_WITH(chi_square_homogeneity(v{1, 2}, v{3, 4, 5}), Catch::Contains("successes.size() = 2"));
}

TEST_CASE("stats: one-way ANOVA", "[diag][stats]") {
  SECTION("by hand: {1,2,3} {4,5,6} {7,8,9} → SSB 54, SSW 6, F = 27 on (2, 6), p = 0.1³") {
    // y = 6/(6 + 2·27) = 0.1 and I_y(3, 1) = y³.
    const auto t = anova_homogeneity({{1, 2, 3}, {4, 5, 6}, {7, 8, 9}});
    CHECK(t.between_sum_squares == Approx(54.0).epsilon(1e-14));
    CHECK(t.within_sum_squares == Approx(6.0).epsilon(1e-14));
    CHECK(t.f_statistic == Approx(27.0).epsilon(1e-14));
    CHECK(t.dof_between == 2);
    CHECK(t.dof_within == 6);
    CHECK(t.p_value == Approx(0.001).epsilon(1e-12));
  }
  SECTION("unequal group sizes (mpmath)") {
    const auto t = anova_homogeneity({{0.2, 0.4, 0.3, 0.5}, {0.6, 0.7, 0.65}, {0.3, 0.2, 0.25, 0.35, 0.4}});
    CHECK(t.between_sum_squares == Approx(0.24729166666666652).epsilon(1e-12));
    CHECK(t.within_sum_squares == Approx(0.08).epsilon(1e-12));
    CHECK(t.f_statistic == Approx(13.910156249999992).epsilon(1e-12));
    CHECK(t.dof_within == 9);
    CHECK(t.p_value == Approx(0.0017648088663060216).epsilon(1e-10));
  }
  SECTION("homogeneous groups → large p") {
    const auto t = anova_homogeneity({{0.5, 0.52, 0.49}, {0.51, 0.5, 0.48}, {0.5, 0.5, 0.53}});
    CHECK(t.f_statistic == Approx(0.52173913043478261).epsilon(1e-10));
    CHECK(t.p_value == Approx(0.6181476400955139).epsilon(1e-10));
  }
  SECTION("degenerate: no within-group variance") {
    const auto same = anova_homogeneity({{0.1, 0.1, 0.1}, {0.1, 0.1}});  // 0.1·3/3 ≠ 0.1 in double
    CHECK(same.f_statistic == 0.0);
    CHECK(same.p_value == 1.0);
    CHECK(same.within_sum_squares == 0.0);
    CHECK(same.between_sum_squares == 0.0);
    const auto differ = anova_homogeneity({{0.1, 0.1}, {0.3, 0.3, 0.3}});
    CHECK(std::isinf(differ.f_statistic));
    CHECK(differ.p_value == 0.0);
    CHECK(differ.between_sum_squares > 0.0);
  }
  SECTION("a single-value group is fine while another group has spread") {
    const auto t = anova_homogeneity({{0.5}, {0.2, 0.4}});
    CHECK(t.dof_within == 1);
    // means 0.5, 0.3; grand 1.1/3: SSB = (2/15)² + 2·(1/15)² = 6/225, SSW = 0.02, F = 4/3 on (1, 1);
    // F(1, 1) is a squared Cauchy variable: Pr(F ≥ f) = 1 − (2/π) atan(√f).
    CHECK(t.between_sum_squares == Approx(6.0 / 225).epsilon(1e-12));
    CHECK(t.f_statistic == Approx(4.0 / 3).epsilon(1e-12));
    CHECK(t.p_value == Approx(1 - 2 / pi * std::atan(std::sqrt(4.0 / 3))).epsilon(1e-12));
  }
}

TEST_CASE("stats: ANOVA rejects groups it cannot test", "[diag][stats][errors]") {
  CHECK_THROWS_WITH(anova_homogeneity({{1, 2, 3}}), Catch::Contains("groups = 1"));
  CHECK_THROWS_WITH(anova_homogeneity({{1, 2}, {}}), Catch::Contains("groups[1].size() = 0"));
  CHECK_THROWS_WITH(anova_homogeneity({{1}, {2}}), Catch::Contains("values = 2"));
  CHECK_THROWS_WITH(anova_homogeneity({{1, 2}, {3, not_a_number}}), Catch::Contains("groups[1][1]"));
}

// ---------------------------------------------------------------------------------------------
// Period and summary
// ---------------------------------------------------------------------------------------------

namespace {

// Reference for fold_fraction: the DFT power of the mean-removed profile summed over the
// multiples k·M/P, k = 1 … P − 1 (both conjugate bins of a pair, the Nyquist bin once), over the
// total non-DC power M·Σd² (Parseval).
double dft_harmonic_sum(const std::vector<double>& x, std::size_t period) {
  const std::size_t m = x.size();
  double mean = 0.0;
  for (double v : x) mean += v / static_cast<double>(m);
  double squares = 0.0;
  for (double v : x) squares += (v - mean) * (v - mean);
  double power = 0.0;
  for (std::size_t k = m / period; k < m; k += m / period) {
    double re = 0.0, im = 0.0;
    for (std::size_t t = 0; t < m; ++t) {
      const double angle = 2 * pi * static_cast<double>((k * t) % m) / static_cast<double>(m);
      re += (x[t] - mean) * std::cos(angle);
      im -= (x[t] - mean) * std::sin(angle);
    }
    power += re * re + im * im;
  }
  return power / (static_cast<double>(m) * squares);
}

// 0.9 everywhere but one weak residue (0.2) per period P, at phase P − 1, over M residues.
std::vector<double> one_weak_residue(int period, int m) {
  std::vector<double> x(static_cast<std::size_t>(m), 0.9);
  for (int t = period - 1; t < m; t += period) x[static_cast<std::size_t>(t)] = 0.2;
  return x;
}

// Uniform noise in [−half, half] from raw mt19937 output (whose sequence the standard fixes,
// unlike the distributions'), so the draws are the same on every platform.
std::vector<double> uniform_noise(std::mt19937& rng, std::size_t n, double half) {
  std::vector<double> out(n);
  for (auto& x : out) x = half * (2.0 * (static_cast<double>(rng()) / 4294967295.0) - 1.0);
  return out;
}

}  // namespace

TEST_CASE("stats: fold_fraction is the DFT power at the multiples of M/P", "[diag][stats]") {
  using v = std::vector<double>;
  SECTION("period 4 over M = 8: F(4) = 1, F(2) = 1/3, F(1) = 0") {
    const v x{1, 0, 0, 0, 1, 0, 0, 0};
    CHECK(fold_fraction(x, 8) == 1.0);
    CHECK(fold_fraction(x, 4) == Approx(1.0).epsilon(1e-12));
    CHECK(fold_fraction(x, 2) == Approx(1.0 / 3.0).epsilon(1e-12));
    CHECK(fold_fraction(x, 1) == 0.0);
  }
  SECTION("the Nyquist bin is counted once, the others twice (Parseval)") {
    // cos(2πt/8) has Σd² = 4, 0.6·(−1)^t has Σd² = 8·0.36 = 2.88: the fold onto 2 (the Nyquist
    // bin alone) explains 2.88/6.88; so does the fold onto 4 (bins 2 and 4: nothing at 2).
    v x;
    for (int t = 0; t < 8; ++t) x.push_back(std::cos(2 * pi * t / 8) + (t % 2 == 0 ? 0.6 : -0.6));
    CHECK(fold_fraction(x, 2) == Approx(2.88 / 6.88).epsilon(1e-12));
    CHECK(fold_fraction(x, 4) == Approx(2.88 / 6.88).epsilon(1e-12));
    CHECK(fold_fraction(x, 8) == 1.0);
  }
  SECTION("against a reference DFT, every divisor of several profiles; monotone along divisibility") {
    std::mt19937 rng(11);
    for (std::size_t m : {6u, 8u, 12u, 16u, 30u}) {
      for (int draw = 0; draw < 4; ++draw) {
        const v x = uniform_noise(rng, m, 1.0);
        for (std::size_t p = 1; p <= m; ++p) {
          if (m % p != 0) continue;
          INFO("M = " << m << ", P = " << p);
          const double f = fold_fraction(x, static_cast<std::int64_t>(p));
          CHECK(f == Approx(p == 1 ? 0.0 : dft_harmonic_sum(x, p)).margin(1e-12));
          for (std::size_t q = 2 * p; q <= m; q += p)
            if (m % q == 0) CHECK(f <= fold_fraction(x, static_cast<std::int64_t>(q)) + 1e-12);
        }
      }
    }
  }
  SECTION("no variation: nothing to explain; errors") {
    CHECK(fold_fraction(v(6, 0.4), 3) == 0.0);  // its mean does not round-trip: not 0/0 by luck
    CHECK(fold_fraction(v(6, 0.4), 6) == 0.0);
    CHECK_THROWS_WITH(fold_fraction(v{1, 2, 3, 4}, 3), Catch::Contains("period = 3"));
    CHECK_THROWS_WITH(fold_fraction(v{1, 2, 3, 4}, 0), Catch::Contains("period = 0"));
    CHECK_THROWS_WITH(fold_fraction(v{1}, 1), Catch::Contains("profile.size() = 1"));
    CHECK_THROWS_WITH(fold_fraction(v{1, not_a_number}, 1), Catch::Contains("profile[1]"));
  }
}

TEST_CASE("stats: dominant period of a residue profile", "[diag][stats]") {
  using v = std::vector<double>;
  SECTION("period 4 over M = 8 (power on k = 2 and its harmonic k = 4; the fold onto 4 has both)") {
    const auto p = dominant_period(v{1, 0, 0, 0, 1, 0, 0, 0});
    CHECK(p.frequency == 2);
    CHECK(p.period == 4.0);
    CHECK(p.power_fraction == Approx(1.0).epsilon(1e-12));  // a single DFT bin had 2/3
    CHECK_FALSE(p.flat);
  }
  SECTION("period 2 over M = 8: all power at the Nyquist frequency") {
    const auto p = dominant_period(v{0.9, 0.1, 0.9, 0.1, 0.9, 0.1, 0.9, 0.1});
    CHECK(p.frequency == 4);
    CHECK(p.period == 2.0);
    CHECK(p.power_fraction == Approx(1.0).epsilon(1e-12));
  }
  SECTION("a strong period-2 part is not enough when the rest needs a longer period") {
    // The Parseval profile above: the fold onto 2 (and 4) explains 42%, only 8 explains it.
    v profile;
    for (int t = 0; t < 8; ++t) profile.push_back(std::cos(2 * pi * t / 8) + (t % 2 == 0 ? 0.6 : -0.6));
    const auto p = dominant_period(profile);
    CHECK(p.frequency == 1);
    CHECK(p.period == 8.0);
    CHECK(p.power_fraction == 1.0);
  }
  SECTION("a cosine of frequency 1 → period M, whatever its phase") {
    for (int M : {6, 8, 13}) {
      v profile;
      for (int t = 0; t < M; ++t) profile.push_back(0.5 + 0.2 * std::cos(2 * pi * t / M + 0.7));
      const auto p = dominant_period(profile);
      INFO("M = " << M);
      CHECK(p.frequency == 1);
      CHECK(p.period == Approx(M));
      CHECK(p.power_fraction == Approx(1.0).epsilon(1e-12));
    }
  }
  SECTION("a sinusoid of period P sampled over M = 2P or 4P → P") {
    for (int P : {2, 3, 4, 6, 8}) {
      for (int M : {2 * P, 4 * P}) {
        v profile;
        for (int t = 0; t < M; ++t) profile.push_back(0.6 + 0.25 * std::cos(2 * pi * t / P + 0.4));
        const auto p = dominant_period(profile);
        INFO("P = " << P << ", M = " << M);
        CHECK(p.period == static_cast<double>(P));
        CHECK(p.frequency == M / P);
        CHECK(p.power_fraction == Approx(1.0).epsilon(1e-9));
      }
    }
  }
  SECTION("frequency 3 over M = 8: 8/3 is no divisor, so only the whole profile explains it") {
    // The old DFT argmax reported the non-integer period 8/3; a period is now a divisor of M.
    v profile;
    for (int t = 0; t < 8; ++t) profile.push_back(std::sin(2 * pi * 3 * t / 8));
    CHECK(fold_fraction(profile, 4) == Approx(0.0).margin(1e-12));
    const auto p = dominant_period(profile);
    CHECK(p.frequency == 1);
    CHECK(p.period == 8.0);
    CHECK(p.power_fraction == 1.0);
  }
  SECTION("flat profiles are flagged, including ones whose mean does not round-trip") {
    for (const v& flat : {v(8, 0.7), v(8, 0.0), v(5, 0.1), v(16, 1.0)}) {
      for (bool with_errors : {false, true}) {
        const auto p = with_errors ? dominant_period(flat, v(flat.size(), 0.05)) : dominant_period(flat);
        CHECK(p.flat);
        CHECK(p.period == 0.0);
        CHECK(p.frequency == 0);
        CHECK(p.power_fraction == 0.0);
      }
    }
  }
  SECTION("two frequencies of equal power: the smallest fold that holds both") {
    // Equal-amplitude cosines at k = 1 and k = 2 over M = 8: the fold onto 4 holds only k = 2
    // (half the variation), so the period is 8 — where the argmax's tie rule also ended up.
    v profile;
    for (int t = 0; t < 8; ++t) profile.push_back(std::cos(2 * pi * t / 8) + std::cos(2 * pi * 2 * t / 8));
    CHECK(fold_fraction(profile, 4) == Approx(0.5).epsilon(1e-12));
    const auto p = dominant_period(profile);
    CHECK(p.frequency == 1);
    CHECK(p.period == 8.0);
    // k = 2 and k = 4 are both multiples of 2: the fold onto 4 holds them, period 4.
    v harmonics;
    for (int t = 0; t < 8; ++t) harmonics.push_back(std::cos(2 * pi * 2 * t / 8) + std::cos(pi * t));
    CHECK(dominant_period(harmonics).period == 4.0);
  }
  SECTION("a period-8 pattern with a minor period-16 part: below 10% of the variation is ignored") {
    v profile;
    for (int t = 0; t < 16; ++t)
      profile.push_back((t % 8 == 7 ? 0.2 : 0.9) + (t < 8 ? 0.03 : -0.03));  // the ±0.03 step: 1.6% of the variation
    CHECK(fold_fraction(profile, 8) > period_explained_fraction);
    CHECK(dominant_period(profile).period == 8.0);
  }
  SECTION("a noisy period-4 profile over M = 16 still gives 4") {
    const v shape = {0.45, 0.70, 0.66, 0.30};
    const v noise = {0.03, -0.02, 0.04, -0.05, 0.01, 0.05, -0.03, 0.02,
                     -0.04, 0.00, 0.02, -0.01, 0.05, -0.03, -0.02, 0.04};
    v profile;
    for (int t = 0; t < 16; ++t) profile.push_back(shape[t % 4] + noise[static_cast<std::size_t>(t)]);
    const auto p = dominant_period(profile);
    CHECK(p.frequency == 4);
    CHECK(p.period == 4.0);
    CHECK(p.power_fraction > 0.9);
    CHECK(p.power_fraction < 1.0);
    // With standard errors that cover the noise (|noise| ≤ 0.05 = se): also 4.
    CHECK(dominant_period(profile, v(16, 0.05)).period == 4.0);
  }
  SECTION("the study's V4-Flash residue profile (S = 4, M = 8) has period 4") {
    const auto p = dominant_period(v{0.4375, 0.6953, 0.6602, 0.2969, 0.4492, 0.6992, 0.6445, 0.3281});
    CHECK(p.period == 4.0);
    CHECK(p.power_fraction > 0.9);
  }
  SECTION("errors") {
    CHECK_THROWS_WITH(dominant_period(v{1.0}), Catch::Contains("profile.size() = 1"));
    CHECK_THROWS_WITH(dominant_period(v{1.0, not_a_number, 0.0}), Catch::Contains("profile[1]"));
    const v x{0.9, 0.2, 0.9, 0.2};
    CHECK_THROWS_WITH(dominant_period(x, v{0.1, 0.1, 0.1}), Catch::Contains("standard_errors.size() = 3"));
    CHECK_THROWS_WITH(dominant_period(x, v{0.1, -0.1, 0.1, 0.1}), Catch::Contains("standard_errors[1] = -0.1"));
    CHECK_THROWS_WITH(dominant_period(x, v{0.1, 0.1, not_a_number, 0.1}), Catch::Contains("standard_errors[2]"));
    CHECK_THROWS_WITH(dominant_period(x, v{0.1, 0.1, 0.1, inf}), Catch::Contains("standard_errors[3]"));
    CHECK_THROWS_AS(dominant_period(x, v{0.1, 0.1, 0.1, 0.1, 0.1}), input_error);
  }
}

TEST_CASE("stats: one weak residue per period gives the fundamental, not a harmonic", "[diag][stats]") {
  using v = std::vector<double>;
  SECTION("exact profiles, P ∈ {2, 4, 8}, M = 2P and 4P, with and without standard errors") {
    for (int P : {2, 4, 8}) {
      for (int M : {2 * P, 4 * P}) {
        INFO("P = " << P << ", M = " << M);
        const v x = one_weak_residue(P, M);
        const auto p = dominant_period(x);
        CHECK(p.period == static_cast<double>(P));
        CHECK(p.frequency == M / P);
        CHECK(p.power_fraction == Approx(1.0).epsilon(1e-12));
        CHECK(dominant_period(x, v(x.size(), 0.05)).period == static_cast<double>(P));
        // A proper divisor explains (P/2 − 1)/(P − 1) < 1/2 of a single dip (the 0.9 rule's margin).
        if (P > 2) CHECK(fold_fraction(x, P / 2) == Approx((P / 2 - 1.0) / (P - 1.0)).epsilon(1e-12));
      }
    }
  }
  SECTION("M = 16, P = 8 with noise: the fold never picks a harmonic (the DFT argmax did, 70% of draws)") {
    // Noise uniform in ±0.02: sd 0.02/√3. Without errors the fold onto 8 explains ~99.7% every
    // time. With the true se the χ² fit of the fold onto 8 (8 dof) fails in ~5% of draws by design,
    // and then the answer is 16, never a divisor of 8.
    std::mt19937 rng(2024);
    const int draws = 400;
    int eight_with_errors = 0;
    const double se = 0.02 / std::sqrt(3.0);
    for (int d = 0; d < draws; ++d) {
      v x = one_weak_residue(8, 16);
      const v noise = uniform_noise(rng, 16, 0.02);
      for (std::size_t t = 0; t < 16; ++t) x[t] += noise[t];
      const auto plain = dominant_period(x);
      REQUIRE(plain.period == 8.0);
      const auto fitted = dominant_period(x, v(16, se));
      REQUIRE((fitted.period == 8.0 || fitted.period == 16.0));
      eight_with_errors += fitted.period == 8.0;
    }
    // Binomial(400, 0.95): mean 380, sd 4.4; 360 is 4.6 sd below.
    CHECK(eight_with_errors >= 360);
    CHECK(eight_with_errors < draws);  // the test has a size: some true periods are rejected
  }
  SECTION("a two-level square profile of period P → P") {
    for (int P : {2, 4, 6, 8}) {
      for (int M : {2 * P, 4 * P}) {
        v x;
        for (int t = 0; t < M; ++t) x.push_back(t % P < P / 2 ? 0.9 : 0.3);
        INFO("P = " << P << ", M = " << M);
        CHECK(dominant_period(x).period == static_cast<double>(P));
        CHECK(dominant_period(x, v(x.size(), 0.05)).period == static_cast<double>(P));
      }
    }
  }
}

TEST_CASE("stats: dominant period with standard errors (χ² fit of the fold)", "[diag][stats]") {
  using v = std::vector<double>;
  SECTION("hand-computed χ² of the weighted fold") {
    const v x{1.0, 0.0, 1.0, 0.5};
    // se 0.5: fold onto 2 = {1, 0.25}, χ² = 2·0.25²/0.25 = 0.5 on 2 dof, p = e^(−0.25) → period 2.
    CHECK(dominant_period(x, v(4, 0.5)).period == 2.0);
    // se 0.1: χ² = 12.5, p = e^(−6.25) = 0.0019 → the fold onto 2 is rejected → period 4.
    CHECK(dominant_period(x, v(4, 0.1)).period == 4.0);
    // se {0.1, 0.1, 0.1, 0.2}: the odd class's weighted mean is (0·100 + 0.5·25)/125 = 0.1, so
    // χ² = 100·0.1² + 25·0.4² = 5, p = e^(−2.5) = 0.082 → period 2. (An unweighted class mean
    // would give χ² = 7.8125, p = 0.020, and period 4.)
    CHECK(chi_square_upper_tail(5.0, 2.0) == Approx(std::exp(-2.5)).epsilon(1e-12));
    CHECK(dominant_period(x, v{0.1, 0.1, 0.1, 0.2}).period == 2.0);
    // Without errors F(2) = 0.5625/0.6875 = 0.82, below 0.9 → 4.
    CHECK(fold_fraction(x, 2) < period_explained_fraction);
    CHECK(dominant_period(x).period == 4.0);
  }
  const v noise = {0.03, -0.02, 0.04, -0.05, 0.01, 0.05, -0.03, 0.02,
                   -0.04, 0.00, 0.02, -0.01, 0.05, -0.03, -0.02, 0.04};  // |noise| ≤ 0.05
  const v se(16, 0.05);
  SECTION("a period-8 profile plus noise within its errors gives 8") {
    v x = one_weak_residue(8, 16);
    for (std::size_t t = 0; t < 16; ++t) x[t] += noise[t];
    const auto p = dominant_period(x, se);
    CHECK(p.period == 8.0);
    CHECK(p.frequency == 2);
    CHECK(p.power_fraction > 0.95);  // F(8), the same share as without errors
    CHECK(p.power_fraction == Approx(fold_fraction(x, 8)).epsilon(1e-12));
  }
  SECTION("a flat profile plus noise within its errors: the smallest divisor (no period is needed)") {
    // Consistent with a constant, hence with every fold: the smallest, 2. Whether there is a
    // phase effect at all is the homogeneity test's question; the small power_fraction says the
    // same. Without errors all of the noise counts as signal, and no fold short of 16 explains it.
    v x;
    for (double n : noise) x.push_back(0.7 + n);
    const auto p = dominant_period(x, se);
    CHECK(p.period == 2.0);
    CHECK(p.frequency == 8);
    CHECK(p.power_fraction < 0.2);
    CHECK(dominant_period(x).period == 16.0);
  }
  SECTION("standard errors of 0 are floored: an exact period is still found, any departure rejected") {
    v x = one_weak_residue(4, 16);
    CHECK(dominant_period(x, v(16, 0.0)).period == 4.0);
    x[3] += 1e-6;  // a departure far below any real se, but above the floor (1e-9 · 0.9)
    CHECK(dominant_period(x, v(16, 0.0)).period == 16.0);
    CHECK(dominant_period(x, v(16, 0.01)).period == 4.0);
  }
}

TEST_CASE("stats: residue summary", "[diag][stats]") {
  using v = std::vector<double>;
  const auto s = summarize_residues(v{0.4375, 0.6953, 0.6602, 0.2969, 0.4492, 0.6992, 0.6445, 0.3281});
  CHECK(s.best_residue == 5);
  CHECK(s.worst_residue == 3);
  CHECK(s.best == 0.6992);
  CHECK(s.worst == 0.2969);
  CHECK(s.gap_points == Approx(40.23).epsilon(1e-12));  // the study's 40.2-point gap
  CHECK(s.mean == Approx(4.2109 / 8).epsilon(1e-12));

  SECTION("ties pick the lowest residue; one residue has gap 0") {
    const auto t = summarize_residues(v{0.5, 0.9, 0.1, 0.9, 0.1});
    CHECK(t.best_residue == 1);
    CHECK(t.worst_residue == 2);
    const auto one = summarize_residues(v{0.25});
    CHECK(one.gap_points == 0.0);
    CHECK(one.mean == 0.25);
  }
  SECTION("errors: empty, percentages, NaN") {
    CHECK_THROWS_AS(summarize_residues(v{}), input_error);
    CHECK_THROWS_WITH(summarize_residues(v{0.5, 43.75}), Catch::Contains("accuracy[1] = 43.75"));
    CHECK_THROWS_AS(summarize_residues(v{0.5, not_a_number}), input_error);
  }
}

}  // namespace test_diag_statistics
