#pragma once
// Logistic regression of a trial's success on its covariates — phase, whether the record straddles
// a block boundary, how crowded its entries are, its distance to the query — so that an effect of
// one can be told from the others (they are correlated in any real haystack).
//
// Model: P(y = 1 | x) = σ(xᵀβ), σ(z) = 1 / (1 + e^{−z}); x_0 = 1 is the caller's (an intercept
// column is not added). Log-likelihood l(β) = Σ_i y_i log p_i + (1 − y_i) log(1 − p_i); y_i may be
// a probability in [0, 1] (a soft outcome) as well as 0/1.
//
// Fitting: Newton–Raphson on the Fisher information I(β) = Xᵀ W X, W = diag(p_i (1 − p_i)), with
// step halving whenever the objective does not rise, until the largest step is below 1e-10.
//
// Firth's penalty (firth = true, the default): maximise l*(β) = l(β) + ½ log det I(β). Its score
// is U*_j = Σ_i (y_i − p_i + h_i (½ − p_i)) x_ij with h_i the leverages, the diagonal of
// W^½ X I⁻¹ Xᵀ W^½. Why: a phase at which every trial fails (a record cut in two, 0 of 64) makes
// the plain maximum-likelihood estimate run off to −∞ (separation); Firth's estimate stays finite
// and removes the O(1/n) bias of the plain one. In a 2 × 2 table it is the log odds ratio with ½
// added to every cell (tests/test_diag_logistic.cpp holds it to that).
//
// Inference: standard errors √diag(I⁻¹) at the estimate, Wald z = β/se with two-sided normal
// p-values (poor under separation, where se is large: use the likelihood ratio). A null
// hypothesis "these columns do not matter" is a fit of the same model with those coefficients held
// at 0 (logistic_options::zero); likelihood_ratio_test compares it with the free fit through
// 2 (l*_free − l*_held) against χ² with as many degrees of freedom as columns held. With Firth's
// penalty the held fit keeps the free model's penalty ½ log det I(β) over ALL k columns (Heinze and
// Schemper's penalised likelihood ratio): a fit of fewer columns would carry a penalty of another
// dimension, and the difference would be no χ² at all (it rejects every true null).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/core/random.hpp"
#include "phasekv/study/statistics.hpp"

namespace phasekv::diag::stats {

struct logistic_options {
  bool firth = true;
  std::vector<std::size_t> zero;           // columns whose coefficient is held at 0 (a null hypothesis)
  std::int64_t max_iterations = 100;
};

struct logistic_fit {
  std::vector<std::string> names;          // one per column (as given, or x0, x1, …)
  std::vector<bool> held;                  // held at 0 (options.zero)
  std::vector<double> coefficients;        // β
  std::vector<double> standard_errors;     // √diag(I(β)⁻¹)
  std::vector<double> z;                   // β / se
  std::vector<double> p_values;            // two-sided Wald
  double log_likelihood = std::numeric_limits<double>::quiet_NaN();            // l(β)
  double penalized_log_likelihood = std::numeric_limits<double>::quiet_NaN();  // l*(β) (= l without Firth)
  std::int64_t observations = 0;
  std::uint64_t data_hash = 0;             // of x and y: a likelihood ratio needs the same data
  std::int64_t iterations = 0;
  bool converged = false;
  bool firth = true;

  // The coefficient of a named column (NaN if there is none).
  double coefficient(const std::string& name) const {
    for (std::size_t j = 0; j < names.size(); ++j)
      if (names[j] == name) return coefficients[j];
    return std::numeric_limits<double>::quiet_NaN();
  }
  std::size_t index(const std::string& name) const {
    for (std::size_t j = 0; j < names.size(); ++j)
      if (names[j] == name) return j;
    return names.size();
  }
};

struct likelihood_ratio {
  double statistic = std::numeric_limits<double>::quiet_NaN();  // 2 (l_full − l_reduced), ≥ 0
  std::int64_t dof = 0;
  double p_value = std::numeric_limits<double>::quiet_NaN();
};

namespace detail {

// Cholesky factor of a symmetric positive-definite k × k matrix (row-major, in place: the lower
// triangle becomes L); false when it is not positive definite.
inline bool cholesky(std::vector<double>& a, std::size_t k) {
  for (std::size_t j = 0; j < k; ++j) {
    double d = a[j * k + j];
    for (std::size_t m = 0; m < j; ++m) d -= a[j * k + m] * a[j * k + m];
    if (!(d > 0.0) || !std::isfinite(d)) return false;
    const double l = std::sqrt(d);
    a[j * k + j] = l;
    for (std::size_t i = j + 1; i < k; ++i) {
      double s = a[i * k + j];
      for (std::size_t m = 0; m < j; ++m) s -= a[i * k + m] * a[j * k + m];
      a[i * k + j] = s / l;
    }
  }
  return true;
}

// Solves L Lᵀ x = b for the factor of `cholesky` (b overwritten by x).
inline void cholesky_solve(const std::vector<double>& l, std::size_t k, double* b) {
  for (std::size_t i = 0; i < k; ++i) {
    double s = b[i];
    for (std::size_t m = 0; m < i; ++m) s -= l[i * k + m] * b[m];
    b[i] = s / l[i * k + i];
  }
  for (std::size_t i = k; i-- > 0;) {
    double s = b[i];
    for (std::size_t m = i + 1; m < k; ++m) s -= l[m * k + i] * b[m];
    b[i] = s / l[i * k + i];
  }
}

inline double sigmoid(double z) { return z >= 0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z)); }

// log σ(z) and log(1 − σ(z)) without cancellation.
inline double log_sigmoid(double z) { return z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z)); }

struct logistic_state {
  std::vector<double> p, info, factor;  // fitted probabilities, I(β), its Cholesky factor
  double log_likelihood = 0, objective = 0;
  bool ok = false;
};

inline logistic_state evaluate(const std::vector<double>& x, const std::vector<double>& y, std::size_t n,
                               std::size_t k, const std::vector<double>& beta, bool firth) {
  logistic_state s;
  s.p.resize(n);
  s.info.assign(k * k, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    double z = 0;
    for (std::size_t j = 0; j < k; ++j) z += x[i * k + j] * beta[j];
    s.p[i] = sigmoid(z);
    s.log_likelihood += y[i] * log_sigmoid(z) + (1.0 - y[i]) * log_sigmoid(-z);
    const double w = s.p[i] * (1.0 - s.p[i]);
    for (std::size_t a = 0; a < k; ++a)
      for (std::size_t b = 0; b <= a; ++b) s.info[a * k + b] += w * x[i * k + a] * x[i * k + b];
  }
  for (std::size_t a = 0; a < k; ++a)
    for (std::size_t b = 0; b < a; ++b) s.info[b * k + a] = s.info[a * k + b];
  s.factor = s.info;
  s.ok = cholesky(s.factor, k) && std::isfinite(s.log_likelihood);
  s.objective = s.log_likelihood;
  if (s.ok && firth) {
    double log_det = 0;
    for (std::size_t j = 0; j < k; ++j) log_det += 2.0 * std::log(s.factor[j * k + j]);
    s.objective += 0.5 * log_det;
  }
  return s;
}

}  // namespace detail

// Fits the model to `x` (n rows of k covariates, row-major: x[i·k + j]) and outcomes `y` (n values
// in [0, 1]). Throws input_error naming the argument for a shape or value that is wrong, and when
// the information matrix is singular at the start (a column that is constant zero, or two that
// are collinear).
inline logistic_fit fit_logistic(const std::vector<double>& x, const std::vector<double>& y, std::size_t k,
                                 std::vector<std::string> names = {}, const logistic_options& options = {}) {
  using phasekv::detail::require;
  const bool firth = options.firth;
  const std::int64_t max_iterations = options.max_iterations;
  require<input_error>(k >= 1 && k <= 256, "fit_logistic: k", k, "must lie in [1, 256]");
  const std::size_t n = y.size();
  require<input_error>(x.size() == n * k, "fit_logistic: x.size()", x.size(),
                       "must be y.size() · k = " + std::to_string(n * k));
  require<input_error>(n >= k, "fit_logistic: y.size()", n, "must be at least k = " + std::to_string(k));
  require<input_error>(names.empty() || names.size() == k, "fit_logistic: names.size()", names.size(),
                       "must be 0 or k = " + std::to_string(k));
  require<input_error>(max_iterations >= 1 && max_iterations <= 10000, "fit_logistic: max_iterations", max_iterations,
                       "must lie in [1, 10^4]");
  for (std::size_t i = 0; i < n; ++i)
    require<input_error>(y[i] >= 0.0 && y[i] <= 1.0, "fit_logistic: y[" + std::to_string(i) + "]", y[i],
                         "must lie in [0, 1]");
  for (std::size_t i = 0; i < x.size(); ++i)
    require<input_error>(std::isfinite(x[i]), "fit_logistic: x[" + std::to_string(i) + "]", x[i], "must be finite");
  logistic_fit out;
  out.held.assign(k, false);
  for (std::size_t j : options.zero) {
    require<input_error>(j < k, "fit_logistic: options.zero", j, "must name a column below k = " + std::to_string(k));
    out.held[j] = true;
  }
  out.firth = firth;
  out.observations = static_cast<std::int64_t>(n);
  {
    std::uint64_t hash = 0x6a09e667f3bcc908ull;
    const auto mix = [&](double v) {
      std::uint64_t bits = 0;
      std::memcpy(&bits, &v, sizeof bits);
      hash = phasekv::detail::mix64(hash ^ bits, 1);
    };
    for (double v : x) mix(v);
    for (double v : y) mix(v);
    out.data_hash = hash;
  }
  // The free columns: Newton steps solve the information's free block.
  std::vector<std::size_t> free_columns;
  for (std::size_t j = 0; j < k; ++j)
    if (!out.held[j]) free_columns.push_back(j);
  const std::size_t f = free_columns.size();
  require<input_error>(f >= 1, "fit_logistic: options.zero", options.zero.size(), "must leave at least one column free");
  if (names.empty())
    for (std::size_t j = 0; j < k; ++j) names.push_back("x" + std::to_string(j));
  out.names = std::move(names);
  std::vector<double> beta(k, 0.0);
  detail::logistic_state s = detail::evaluate(x, y, n, k, beta, firth);
  require<input_error>(s.ok, "fit_logistic: x", 0, "has a singular information matrix (a zero or collinear column)");
  std::vector<double> score(k), step(k, 0.0), v(k), block(f * f);
  for (out.iterations = 0; out.iterations < max_iterations; ++out.iterations) {
    // Score (Firth-modified): Σ (y − p + h (½ − p)) x, h_i = w_i x_iᵀ I⁻¹ x_i (the full I).
    std::fill(score.begin(), score.end(), 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      double hi = 0;
      if (firth) {
        for (std::size_t j = 0; j < k; ++j) v[j] = x[i * k + j];
        detail::cholesky_solve(s.factor, k, v.data());
        for (std::size_t j = 0; j < k; ++j) hi += x[i * k + j] * v[j];
        hi *= s.p[i] * (1.0 - s.p[i]);
      }
      const double r = y[i] - s.p[i] + hi * (0.5 - s.p[i]);
      for (std::size_t j = 0; j < k; ++j) score[j] += r * x[i * k + j];
    }
    // Newton step on the free columns: I_ff δ_f = U*_f.
    for (std::size_t a = 0; a < f; ++a)
      for (std::size_t b = 0; b < f; ++b) block[a * f + b] = s.info[free_columns[a] * k + free_columns[b]];
    if (!detail::cholesky(block, f)) break;
    std::vector<double> delta(f);
    for (std::size_t a = 0; a < f; ++a) delta[a] = score[free_columns[a]];
    detail::cholesky_solve(block, f, delta.data());
    std::fill(step.begin(), step.end(), 0.0);
    for (std::size_t a = 0; a < f; ++a) step[free_columns[a]] = delta[a];
    double largest = 0;
    for (double d : step) largest = std::max(largest, std::abs(d));
    if (largest < 1e-10) {
      out.converged = true;
      break;
    }
    // Step halving: accept the first step that does not lower the objective (Firth's score is not
    // the gradient of l* exactly where the leverages move, so allow rounding-level slack).
    double scale = 1.0;
    detail::logistic_state next;
    std::vector<double> trial(k);
    for (int halvings = 0; halvings < 40; ++halvings, scale *= 0.5) {
      for (std::size_t j = 0; j < k; ++j) trial[j] = beta[j] + scale * step[j];
      next = detail::evaluate(x, y, n, k, trial, firth);
      if (next.ok && next.objective >= s.objective - 1e-12 * std::max(1.0, std::abs(s.objective))) break;
    }
    if (!next.ok) break;
    beta = trial;
    s = std::move(next);
    if (largest * scale < 1e-10) {
      out.converged = true;
      break;
    }
  }
  out.coefficients = beta;
  out.log_likelihood = s.log_likelihood;
  out.penalized_log_likelihood = s.objective;
  out.standard_errors.resize(k);
  out.z.resize(k);
  out.p_values.resize(k);
  for (std::size_t j = 0; j < k; ++j) {
    if (out.held[j]) {
      out.standard_errors[j] = out.z[j] = out.p_values[j] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    std::fill(v.begin(), v.end(), 0.0);
    v[j] = 1.0;
    detail::cholesky_solve(s.factor, k, v.data());
    out.standard_errors[j] = std::sqrt(v[j]);
    out.z[j] = beta[j] / out.standard_errors[j];
    out.p_values[j] = std::erfc(std::abs(out.z[j]) / std::sqrt(2.0));
  }
  return out;
}

// 2 (l*_free − l*_held) against χ²(dof): whether the columns `held` holds at 0 (and `free` does not)
// matter. Both must be fits of the same columns to the same data with the same penalty.
inline likelihood_ratio likelihood_ratio_test(const logistic_fit& free, const logistic_fit& held) {
  using phasekv::detail::require;
  require<input_error>(free.names == held.names && free.data_hash == held.data_hash,
                       "likelihood_ratio_test: held", held.names.size(),
                       "columns must be the free fit's, fitted to the same x and y");
  require<input_error>(free.firth == held.firth, "likelihood_ratio_test: held.firth", held.firth,
                       "must equal free.firth (compare like with like)");
  likelihood_ratio out;
  for (std::size_t j = 0; j < free.held.size(); ++j) {
    require<input_error>(!free.held[j] || held.held[j], "likelihood_ratio_test: held.held[" + std::to_string(j) + "]",
                         false, "must hold every column the free fit holds");
    out.dof += held.held[j] && !free.held[j];
  }
  require<input_error>(out.dof >= 1, "likelihood_ratio_test: held", out.dof, "must hold a column the free fit does not");
  out.statistic = std::max(0.0, 2.0 * (free.penalized_log_likelihood - held.penalized_log_likelihood));
  out.p_value = chi_square_upper_tail(out.statistic, static_cast<double>(out.dof));
  return out;
}

// Fits with and without `columns` held at 0 and tests them (see likelihood_ratio_test).
inline likelihood_ratio test_columns(const std::vector<double>& x, const std::vector<double>& y, std::size_t k,
                                     const std::vector<std::size_t>& columns, bool firth = true) {
  logistic_options free_options, held_options;
  free_options.firth = held_options.firth = firth;
  held_options.zero = columns;
  return likelihood_ratio_test(fit_logistic(x, y, k, {}, free_options), fit_logistic(x, y, k, {}, held_options));
}

}  // namespace phasekv::diag::stats
