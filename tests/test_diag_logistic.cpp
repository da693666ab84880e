// The logistic regression (study/logistic.hpp) against closed forms and simulations whose truth is
// known: in a 2 × 2 table the maximum-likelihood slope is the log odds ratio (and Firth's is the
// log odds ratio with ½ added to every cell); on simulated trials the estimates cover the true
// coefficients as often as their intervals say; under a true null the likelihood-ratio test
// rejects at its level.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/study/logistic.hpp"

namespace test_diag_logistic {

namespace {

using namespace phasekv::diag::stats;

// A 2 × 2 table as trials: covariate g ∈ {0, 1}, successes s_g of n_g.
void table(std::int64_t s0, std::int64_t n0, std::int64_t s1, std::int64_t n1, std::vector<double>& x,
           std::vector<double>& y) {
  x.clear();
  y.clear();
  for (int g = 0; g < 2; ++g)
    for (std::int64_t i = 0; i < (g ? n1 : n0); ++i) {
      x.push_back(1.0);
      x.push_back(g);
      y.push_back(i < (g ? s1 : s0) ? 1.0 : 0.0);
    }
}

double logit(double a, double b) { return std::log(a / b); }

logistic_options plain() {
  logistic_options o;
  o.firth = false;
  return o;
}

}  // namespace

TEST_CASE("in a 2x2 table the slope is the log odds ratio, Firth's with half a trial added to every cell") {
  std::vector<double> x, y;
  struct cell { std::int64_t s0, n0, s1, n1; };
  for (const cell c : {cell{30, 50, 12, 40}, cell{5, 64, 50, 64}, cell{1, 10, 9, 10}, cell{200, 300, 100, 300}}) {
    table(c.s0, c.n0, c.s1, c.n1, x, y);
    const double a = double(c.s0), b = double(c.n0 - c.s0), d = double(c.s1), e = double(c.n1 - c.s1);
    const logistic_fit ml = fit_logistic(x, y, 2, {"one", "g"}, plain());
    REQUIRE(ml.converged);
    CHECK(ml.coefficient("one") == Approx(logit(a, b)).epsilon(1e-9));
    CHECK(ml.coefficient("g") == Approx(logit(d, e) - logit(a, b)).epsilon(1e-9));
    CHECK(ml.standard_errors[1] == Approx(std::sqrt(1 / a + 1 / b + 1 / d + 1 / e)).epsilon(1e-7));
    const logistic_fit firth = fit_logistic(x, y, 2, {"one", "g"});
    REQUIRE(firth.converged);
    CHECK(firth.coefficient("one") == Approx(logit(a + 0.5, b + 0.5)).epsilon(1e-8));
    CHECK(firth.coefficient("g") == Approx(logit(d + 0.5, e + 0.5) - logit(a + 0.5, b + 0.5)).epsilon(1e-8));
  }
}

TEST_CASE("separation: the plain fit does not converge, Firth's stays finite and is the corrected log odds") {
  std::vector<double> x, y;
  table(0, 64, 50, 64, x, y);  // every trial of group 0 fails: a record cut in two
  const logistic_fit ml = fit_logistic(x, y, 2, {}, plain());
  CHECK_FALSE((ml.converged && std::abs(ml.coefficients[1]) < 15));
  const logistic_fit firth = fit_logistic(x, y, 2);
  REQUIRE(firth.converged);
  CHECK(firth.coefficients[1] == Approx(logit(50.5, 14.5) - logit(0.5, 64.5)).epsilon(1e-8));
  CHECK(firth.p_values[1] < 1e-3);           // Wald: conservative under separation
  CHECK(test_columns(x, y, 2, {1}).p_value < 1e-12);  // the likelihood ratio sees it
}

TEST_CASE("on simulated trials the 95% intervals cover the true coefficients about 95% of the time") {
  // y ~ Bernoulli(σ(β0 + β1 phase7 + β2 crowd + β3 d)), with correlated covariates.
  const std::vector<double> truth = {1.2, -2.0, -0.8, 0.5};
  std::mt19937_64 rng(20261205);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int replications = 200;
  std::vector<int> covered(truth.size(), 0);
  double mean_slope = 0;
  for (int rep = 0; rep < replications; ++rep) {
    std::vector<double> x, y;
    for (int i = 0; i < 800; ++i) {
      const double phase7 = (i % 8 == 7) ? 1.0 : 0.0;
      const double crowd = u(rng) < 0.3 + 0.2 * phase7 ? 1.0 : 0.0;
      const double d = u(rng) * 2.0 - 1.0;
      const double z = truth[0] + truth[1] * phase7 + truth[2] * crowd + truth[3] * d;
      x.insert(x.end(), {1.0, phase7, crowd, d});
      y.push_back(u(rng) < 1.0 / (1.0 + std::exp(-z)) ? 1.0 : 0.0);
    }
    const logistic_fit f = fit_logistic(x, y, 4);
    REQUIRE(f.converged);
    mean_slope += f.coefficients[1] / replications;
    for (std::size_t j = 0; j < truth.size(); ++j)
      covered[j] += std::abs(f.coefficients[j] - truth[j]) <= 1.959963984540054 * f.standard_errors[j];
  }
  for (std::size_t j = 0; j < truth.size(); ++j) {
    INFO("coefficient " << j << " covered " << covered[j] << " of " << replications);
    CHECK(covered[j] >= 180);  // 95% of 200 = 190; binomial sd ≈ 3
    CHECK(covered[j] <= 199);
  }
  CHECK(mean_slope == Approx(truth[1]).margin(0.1));
}

TEST_CASE("the likelihood-ratio test rejects a true null at its level and finds a real effect") {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int rejected_null = 0, rejected_effect = 0;
  const int replications = 300;
  for (int rep = 0; rep < replications; ++rep) {
    for (int effect = 0; effect < 2; ++effect) {
      // 8 phases; under the null accuracy is 0.8 at every phase, otherwise phase 3 is at 0.6.
      std::vector<double> x, y;
      for (int i = 0; i < 640; ++i) {
        const int phase = i % 8;
        const double p = (effect && phase == 3) ? 0.6 : 0.8;
        y.push_back(u(rng) < p ? 1.0 : 0.0);
        x.push_back(1.0);
        for (int k = 1; k < 8; ++k) x.push_back(phase == k ? 1.0 : 0.0);
      }
      const likelihood_ratio t = test_columns(x, y, 8, {1, 2, 3, 4, 5, 6, 7});
      CHECK(t.dof == 7);
      (effect ? rejected_effect : rejected_null) += t.p_value < 0.05;
    }
  }
  CHECK(rejected_null >= 5);   // 5% of 300 = 15, sd ≈ 3.8
  CHECK(rejected_null <= 28);
  CHECK(rejected_effect >= 150);  // a 20-point dip at one phase of 80 trials is usually seen
}

TEST_CASE("bad input names the argument") {
  std::vector<double> x = {1, 0, 1, 1}, y = {0, 1};
  CHECK_THROWS_WITH(fit_logistic(x, {0.0, 1.5}, 2), Catch::Contains("y[1] = 1.5"));
  CHECK_THROWS_WITH(fit_logistic({1, 0, 1}, y, 2), Catch::Contains("x.size() = 3"));
  CHECK_THROWS_WITH(fit_logistic({1, 0, 1, 0}, y, 2), Catch::Contains("singular"));
  CHECK_THROWS_WITH(fit_logistic(x, y, 2, {"one"}), Catch::Contains("names.size() = 1"));
  CHECK_THROWS_AS(fit_logistic({1, std::nan(""), 1, 1}, y, 2), phasekv::input_error);
  const logistic_fit a = fit_logistic(x, y, 2), b = fit_logistic({1, 1}, y, 1);
  CHECK_THROWS_WITH(likelihood_ratio_test(a, b), Catch::Contains("same x and y"));
  CHECK_THROWS_WITH(likelihood_ratio_test(a, a), Catch::Contains("must hold a column"));
  logistic_options bad;
  bad.zero = {2};
  CHECK_THROWS_WITH(fit_logistic(x, y, 2, {}, bad), Catch::Contains("options.zero = 2"));
  bad.zero = {0, 1};
  CHECK_THROWS_WITH(fit_logistic(x, y, 2, {}, bad), Catch::Contains("at least one column free"));
}

}  // namespace test_diag_logistic
