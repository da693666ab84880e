#pragma once
// The statistics a phase sweep reports: per-residue
// accuracy with a Wilson interval, a test that accuracy is the same at every residue, the
// dominant period of the per-residue profile, and its best/worst/mean summary.
//
//   wilson_interval        score interval of a binomial proportion
//   chi_square_homogeneity Pearson χ² on the k×2 table (successes, failures) of k residues
//   anova_homogeneity      one-way ANOVA F test, for per-trial probabilities instead of 0/1
//   fold_fraction          share of a profile's variation its fold onto P classes explains
//   dominant_period        the smallest divisor P of M whose fold explains the profile
//   summarize_residues     best and worst residue, the gap in points, the mean
//
// and the special functions under them, in double:
//
//   P(a, x) = γ(a, x) / Γ(a)   regularized lower incomplete gamma; Q = 1 − P
//   I_x(a, b) = B(x; a, b) / B(a, b)   regularized incomplete beta
//
// P and Q use the power series of γ for x < a + 1 and the continued fraction of Γ(a, x)
// otherwise (evaluated with the modified Lentz method), so whichever of P, Q is small is
// computed directly rather than as 1 − (something near 1): tail p-values keep their relative
// precision down to the underflow limit. I_x(a, b) uses the continued fraction of
// Numerical Recipes §6.4 on whichever side of the mean a/(a+b) converges fast, again keeping the
// small tail direct. Iteration limits grow like √a (the convergence rate of both expansions
// near x ≈ a); the tests reach a = 1e8. Not converging throws input_error.
// Precision: the prefactors e^(−x) x^a / Γ(a) and x^a (1−x)^b / B(a, b) are formed from logs of
// size ~a, so their relative error grows like a·ε: ~1e-13 for shapes up to 1e2, ~1e-11 at 1e4,
// ~1e-7 at 1e7 — far below what a p-value is read to, but not full double precision.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/core/span.hpp"

namespace phasekv::diag::stats {

// z for a two-sided 95% interval: Φ⁻¹(0.975).
inline constexpr double z_95 = 1.959963984540054;

// ---------------------------------------------------------------------------------------------
// Special functions
// ---------------------------------------------------------------------------------------------

// ln Γ(a) for a > 0 (std::lgamma; the sign it reports through `signgam` is always + here).
inline double log_gamma(double a) {
  phasekv::detail::require<input_error>(std::isfinite(a) && a > 0.0, "log_gamma: a", a, "must be finite and positive");
  return std::lgamma(a);
}

namespace detail {

inline constexpr double special_eps = 2 * std::numeric_limits<double>::epsilon();  // a step of ≤ 2 ulps
inline constexpr double lentz_tiny = 1e-300;  // Lentz's stand-in for a zero denominator

inline std::int64_t iteration_limit(double scale) {
  return 1000 + static_cast<std::int64_t>(50.0 * std::sqrt(scale));
}

[[noreturn]] inline void no_convergence(const std::string& function, double a, double x) {
  phasekv::detail::fail<input_error>(function + ": a", a,
                                     "did not converge at x = " + std::to_string(x) + " (argument too large)");
}

// e^(−x) x^a / Γ(a), the common factor of both expansions, in logs so it cannot overflow.
inline double gamma_prefactor(double a, double x) { return std::exp(a * std::log(x) - x - std::lgamma(a)); }

// P(a, x) by the series γ(a, x) = e^(−x) x^a Σ_n x^n / (a (a+1) … (a+n)); for x < a + 1.
inline double gamma_p_series(double a, double x) {
  double denominator = a, term = 1.0 / a, sum = term;
  const std::int64_t limit = iteration_limit(a);
  for (std::int64_t n = 1; n <= limit; ++n) {
    denominator += 1.0;
    term *= x / denominator;
    sum += term;
    if (std::fabs(term) < std::fabs(sum) * special_eps) return sum * gamma_prefactor(a, x);
  }
  no_convergence("regularized_gamma_p", a, x);
}

// Q(a, x) by the continued fraction
//   Γ(a, x) = e^(−x) x^a · 1/(x+1−a− 1·(1−a)/(x+3−a− 2·(2−a)/(x+5−a− …)))
// evaluated with the modified Lentz method; for x ≥ a + 1.
inline double gamma_q_continued_fraction(double a, double x) {
  double b = x + 1.0 - a;
  double c = 1.0 / lentz_tiny;
  double d = 1.0 / b;
  double h = d;
  const std::int64_t limit = iteration_limit(a);
  for (std::int64_t n = 1; n <= limit; ++n) {
    const double an = -static_cast<double>(n) * (static_cast<double>(n) - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < lentz_tiny) d = lentz_tiny;
    c = b + an / c;
    if (std::fabs(c) < lentz_tiny) c = lentz_tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < special_eps) return h * gamma_prefactor(a, x);
  }
  no_convergence("regularized_gamma_q", a, x);
}

inline void check_gamma_arguments(const char* function, double a, double x) {
  using phasekv::detail::require;
  require<input_error>(std::isfinite(a) && a > 0.0, std::string(function) + ": a", a, "must be finite and positive");
  require<input_error>(!std::isnan(x) && x >= 0.0, std::string(function) + ": x", x, "must be non-negative");
}

// The continued fraction of I_x(a, b) (Numerical Recipes §6.4, modified Lentz):
//   I_x(a, b) = x^a (1−x)^b / (a B(a, b)) · 1/(1+ d1/(1+ d2/(1+ …)))
//   d_{2m+1} = −(a+m)(a+b+m) x / ((a+2m)(a+2m+1)),  d_{2m} = m(b−m) x / ((a+2m−1)(a+2m))
// It converges fast for x < (a+1)/(a+b+2). `y` is 1 − x, passed separately so a caller that
// knows it exactly (the F distribution) does not lose it to rounding.
inline double beta_continued_fraction(double a, double b, double x) {
  const double qab = a + b, qap = a + 1.0, qam = a - 1.0;
  double c = 1.0;
  double d = 1.0 - qab * x / qap;
  if (std::fabs(d) < lentz_tiny) d = lentz_tiny;
  d = 1.0 / d;
  double h = d;
  const std::int64_t limit = iteration_limit(std::max(a, b));
  for (std::int64_t m = 1; m <= limit; ++m) {
    const double md = static_cast<double>(m), m2 = 2.0 * md;
    double aa = md * (b - md) * x / ((qam + m2) * (a + m2));
    d = 1.0 + aa * d;
    if (std::fabs(d) < lentz_tiny) d = lentz_tiny;
    c = 1.0 + aa / c;
    if (std::fabs(c) < lentz_tiny) c = lentz_tiny;
    d = 1.0 / d;
    h *= d * c;
    aa = -(a + md) * (qab + md) * x / ((a + m2) * (qap + m2));
    d = 1.0 + aa * d;
    if (std::fabs(d) < lentz_tiny) d = lentz_tiny;
    c = 1.0 + aa / c;
    if (std::fabs(c) < lentz_tiny) c = lentz_tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < special_eps) return h;
  }
  no_convergence("regularized_beta", std::max(a, b), x);
}

// {I_x(a, b), 1 − I_x(a, b)}, each computed directly where it is the small one.
struct beta_pair {
  double lower = 0.0;  // I_x(a, b)
  double upper = 0.0;  // 1 − I_x(a, b) = I_y(b, a)
};

inline beta_pair regularized_beta_pair(double x, double y, double a, double b) {
  if (x <= 0.0) return {0.0, 1.0};
  if (y <= 0.0) return {1.0, 0.0};
  // x^a y^b / B(a, b), in logs.
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log(y));
  if (x < (a + 1.0) / (a + b + 2.0)) {
    const double lower = std::min(1.0, front * beta_continued_fraction(a, b, x) / a);
    return {lower, 1.0 - lower};
  }
  const double upper = std::min(1.0, front * beta_continued_fraction(b, a, y) / b);
  return {1.0 - upper, upper};
}

inline void check_beta_shape(const char* function, double a, double b) {
  using phasekv::detail::require;
  require<input_error>(std::isfinite(a) && a > 0.0, std::string(function) + ": a", a, "must be finite and positive");
  require<input_error>(std::isfinite(b) && b > 0.0, std::string(function) + ": b", b, "must be finite and positive");
}

}  // namespace detail

// P(a, x) = γ(a, x)/Γ(a) = (1/Γ(a)) ∫_0^x t^(a−1) e^(−t) dt, for a > 0, x ≥ 0 (x = ∞ gives 1).
inline double regularized_gamma_p(double a, double x) {
  detail::check_gamma_arguments("regularized_gamma_p", a, x);
  if (x == 0.0) return 0.0;
  if (std::isinf(x)) return 1.0;
  if (x < a + 1.0) return std::min(1.0, detail::gamma_p_series(a, x));
  return std::max(0.0, 1.0 - detail::gamma_q_continued_fraction(a, x));
}

// Q(a, x) = 1 − P(a, x) = Γ(a, x)/Γ(a), the upper tail.
inline double regularized_gamma_q(double a, double x) {
  detail::check_gamma_arguments("regularized_gamma_q", a, x);
  if (x == 0.0) return 1.0;
  if (std::isinf(x)) return 0.0;
  if (x < a + 1.0) return std::max(0.0, 1.0 - detail::gamma_p_series(a, x));
  return std::min(1.0, detail::gamma_q_continued_fraction(a, x));
}

// I_x(a, b) = (1/B(a, b)) ∫_0^x t^(a−1) (1−t)^(b−1) dt, for a, b > 0 and x ∈ [0, 1]. Shapes
// first, x last, like regularized_gamma_p(a, x) (and Boost's ibeta, SciPy's betainc).
inline double regularized_beta(double a, double b, double x) {
  detail::check_beta_shape("regularized_beta", a, b);
  phasekv::detail::require<input_error>(x >= 0.0 && x <= 1.0, "regularized_beta: x", x, "must lie in [0, 1]");
  return detail::regularized_beta_pair(x, 1.0 - x, a, b).lower;
}

// Upper tail of the χ² distribution with `dof` degrees of freedom: Pr(X ≥ statistic) = Q(dof/2, statistic/2).
inline double chi_square_upper_tail(double statistic, double dof) {
  using phasekv::detail::require;
  require<input_error>(std::isfinite(dof) && dof > 0.0, "chi_square_upper_tail: dof", dof, "must be positive");
  require<input_error>(!std::isnan(statistic) && statistic >= 0.0, "chi_square_upper_tail: statistic", statistic,
                       "must be non-negative");
  return regularized_gamma_q(0.5 * dof, 0.5 * statistic);
}

// Upper tail of the F distribution with (dof1, dof2) degrees of freedom:
//   Pr(X ≥ f) = I_y(dof2/2, dof1/2),  y = dof2 / (dof2 + dof1·f)
// (1 − y = dof1·f / (dof2 + dof1·f) is formed directly, not by subtraction).
inline double f_upper_tail(double f, double dof1, double dof2) {
  using phasekv::detail::require;
  require<input_error>(std::isfinite(dof1) && dof1 > 0.0, "f_upper_tail: dof1", dof1, "must be positive");
  require<input_error>(std::isfinite(dof2) && dof2 > 0.0, "f_upper_tail: dof2", dof2, "must be positive");
  require<input_error>(!std::isnan(f) && f >= 0.0, "f_upper_tail: f", f, "must be non-negative");
  if (f == 0.0) return 1.0;
  if (std::isinf(f)) return 0.0;
  const double denominator = dof2 + dof1 * f;
  return detail::regularized_beta_pair(dof2 / denominator, dof1 * f / denominator, 0.5 * dof2, 0.5 * dof1).lower;
}

// ---------------------------------------------------------------------------------------------
// Per-residue accuracy
// ---------------------------------------------------------------------------------------------

struct proportion_interval {
  double estimate = 0.0;  // successes / trials
  double low = 0.0;
  double high = 0.0;
};

// Wilson score interval for a binomial proportion p̂ = s/n:
//   centre = (p̂ + z²/(2n)) / (1 + z²/n)
//   half   = z / (1 + z²/n) · √(p̂(1 − p̂)/n + z²/(4n²))
//   [low, high] = [centre − half, centre + half]
// Unlike the normal (Wald) interval it never leaves [0, 1] and is not empty at 0/n or n/n;
// there the bound on the observed side is exactly 0 or 1 (set so, not left to rounding).
inline proportion_interval wilson_interval(std::int64_t successes, std::int64_t trials, double z = z_95) {
  using phasekv::detail::require;
  require<input_error>(trials >= 1, "wilson_interval: trials", trials, "must be at least 1");
  require<input_error>(successes >= 0 && successes <= trials, "wilson_interval: successes", successes,
                       "must lie in [0, trials = " + std::to_string(trials) + "]");
  require<input_error>(std::isfinite(z) && z > 0.0, "wilson_interval: z", z, "must be finite and positive");
  const double n = static_cast<double>(trials);
  const double p = static_cast<double>(successes) / n;
  const double z2 = z * z;
  const double scale = 1.0 / (1.0 + z2 / n);
  const double centre = (p + z2 / (2.0 * n)) * scale;
  const double half = z * scale * std::sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n));
  proportion_interval out;
  out.estimate = p;
  out.low = successes == 0 ? 0.0 : std::max(0.0, centre - half);
  out.high = successes == trials ? 1.0 : std::min(1.0, centre + half);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Homogeneity across residues
// ---------------------------------------------------------------------------------------------

struct chi_square_test {
  double statistic = 0.0;     // Pearson χ²
  std::int64_t dof = 0;       // groups − 1
  double p_value = 1.0;       // Pr(χ²_dof ≥ statistic)
  double min_expected = 0.0;  // smallest expected cell count; below ~5 the χ² approximation is rough
};

// Pearson χ² test that k groups (residues) share one success rate. Table: row i =
// (successes_i, trials_i − successes_i); pooled rate p = Σs / Σn; expected cells n_i·p and
// n_i·(1 − p);
//   χ² = Σ_i Σ_cells (O − E)²/E = Σ_i (s_i − n_i p)² / (n_i p (1 − p)),  dof = k − 1,
//   p-value = Q((k − 1)/2, χ²/2).
// When every trial succeeded (or every one failed) the table has no variation to test and the
// formula is 0/0: the result is statistic 0, p-value 1.
inline chi_square_test chi_square_homogeneity(span<const std::int64_t> successes, span<const std::int64_t> trials) {
  using phasekv::detail::require;
  require<input_error>(successes.size() == trials.size(), "chi_square_homogeneity: successes.size()", successes.size(),
                       "must equal trials.size() = " + std::to_string(trials.size()));
  require<input_error>(trials.size() >= 2, "chi_square_homogeneity: groups", trials.size(), "must be at least 2");
  double total_successes = 0.0, total_trials = 0.0;
  for (std::size_t i = 0; i < trials.size(); ++i) {
    const std::string group = "[" + std::to_string(i) + "]";
    require<input_error>(trials[i] >= 1, "chi_square_homogeneity: trials" + group, trials[i],
                         "must be at least 1 (a residue without trials cannot be tested)");
    require<input_error>(successes[i] >= 0 && successes[i] <= trials[i], "chi_square_homogeneity: successes" + group,
                         successes[i], "must lie in [0, trials" + group + " = " + std::to_string(trials[i]) + "]");
    total_successes += static_cast<double>(successes[i]);
    total_trials += static_cast<double>(trials[i]);
  }
  chi_square_test out;
  out.dof = static_cast<std::int64_t>(trials.size()) - 1;
  const double rate = total_successes / total_trials;
  out.min_expected = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < trials.size(); ++i) {
    const double n = static_cast<double>(trials[i]);
    out.min_expected = std::min(out.min_expected, std::min(n * rate, n * (1.0 - rate)));
  }
  if (total_successes == 0.0 || total_successes == total_trials) return out;  // statistic 0, p 1
  double statistic = 0.0;
  for (std::size_t i = 0; i < trials.size(); ++i) {
    const double n = static_cast<double>(trials[i]);
    const double deviation = static_cast<double>(successes[i]) - n * rate;
    statistic += deviation * deviation / (n * rate * (1.0 - rate));
  }
  out.statistic = statistic;
  out.p_value = chi_square_upper_tail(statistic, static_cast<double>(out.dof));
  return out;
}

struct anova_test {
  double f_statistic = 0.0;           // (SSB/(k−1)) / (SSW/(N−k)); +∞ or 0 in the degenerate cases
  std::int64_t dof_between = 0;       // k − 1
  std::int64_t dof_within = 0;        // N − k
  double p_value = 1.0;               // Pr(F_{k−1, N−k} ≥ f_statistic)
  double between_sum_squares = 0.0;   // SSB = Σ_i n_i (m_i − m)²
  double within_sum_squares = 0.0;    // SSW = Σ_i Σ_j (x_ij − m_i)²
};

// One-way ANOVA: do k groups (residues) of real outcomes (per-trial probabilities) share one
// mean? With group means m_i, sizes n_i, grand mean m and N = Σ n_i:
//   F = (SSB/(k − 1)) / (SSW/(N − k)),  p-value = Pr(F_{k−1, N−k} ≥ F) = I_y((N−k)/2, (k−1)/2),
//   y = (N−k)/((N−k) + (k−1)F).
// Needs k ≥ 2 and N > k (at least one within-group degree of freedom).
// Degenerate case: when every group is constant (all its values exactly equal) there is no
// within-group variance and F is x/0. Then: all groups the same constant → F = 0, p = 1
// (nothing differs); otherwise → F = +∞, p = 0 (the groups differ and nothing is noise).
// Groups that are nearly but not exactly constant take the ordinary path (huge F, p ≈ 0).
inline anova_test anova_homogeneity(const std::vector<std::vector<double>>& groups) {
  using phasekv::detail::require;
  require<input_error>(groups.size() >= 2, "anova_homogeneity: groups", groups.size(), "must be at least 2");
  std::size_t total = 0;
  double grand_sum = 0.0;
  bool all_constant = true;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const std::string group = "anova_homogeneity: groups[" + std::to_string(i) + "]";
    require<input_error>(!groups[i].empty(), group + ".size()", 0, "must be at least 1");
    for (std::size_t j = 0; j < groups[i].size(); ++j) {
      require<input_error>(std::isfinite(groups[i][j]), group + "[" + std::to_string(j) + "]", groups[i][j],
                           "must be finite");
      grand_sum += groups[i][j];
      all_constant = all_constant && groups[i][j] == groups[i][0];
    }
    total += groups[i].size();
  }
  const std::size_t k = groups.size();
  require<input_error>(total > k, "anova_homogeneity: values", total,
                       "must exceed the number of groups (" + std::to_string(k) + ") for a within-group variance");
  anova_test out;
  out.dof_between = static_cast<std::int64_t>(k) - 1;
  out.dof_within = static_cast<std::int64_t>(total - k);
  const double grand_mean = grand_sum / static_cast<double>(total);
  double between = 0.0, within = 0.0;
  bool means_equal = true;
  for (const auto& g : groups) {
    double sum = 0.0;
    for (double x : g) sum += x;
    const double mean = sum / static_cast<double>(g.size());
    between += static_cast<double>(g.size()) * (mean - grand_mean) * (mean - grand_mean);
    for (double x : g) within += (x - mean) * (x - mean);
    means_equal = means_equal && g[0] == groups[0][0];
  }
  out.between_sum_squares = between;
  out.within_sum_squares = within;
  if (all_constant) {
    out.within_sum_squares = 0.0;
    if (means_equal) {
      out.between_sum_squares = 0.0;
      out.f_statistic = 0.0;
      out.p_value = 1.0;
    } else {
      out.f_statistic = std::numeric_limits<double>::infinity();
      out.p_value = 0.0;
    }
    return out;
  }
  out.f_statistic = (between / static_cast<double>(out.dof_between)) / (within / static_cast<double>(out.dof_within));
  out.p_value = f_upper_tail(out.f_statistic, static_cast<double>(out.dof_between), static_cast<double>(out.dof_within));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Period and summary of a per-residue profile
// ---------------------------------------------------------------------------------------------

struct periodicity {
  double period = 0.0;           // P, a divisor of M in [2, M]; 0 when the profile is flat
  std::int64_t frequency = 0;    // M / P, the DFT bin of the fundamental; 0 when flat
  double power_fraction = 0.0;   // F(P): share of the profile's variation the P-fold explains; 0 when flat
  bool flat = false;             // no variation to speak of (see dominant_period)
};

// With standard errors, a fold is adequate when its χ² goodness-of-fit p-value is at least this.
inline constexpr double period_fit_alpha = 0.05;
// Without them, a fold is adequate when it explains at least this share of the variation.
inline constexpr double period_explained_fraction = 0.9;

namespace detail {

// Σ_c n_c (m_c − x̄)², the between-class sum of squares of the fold of x onto `period` classes
// (class c = {t : t mod period = c}, n_c = M / period since period | M, m_c its plain mean).
inline double fold_between_squares(span<const double> x, std::size_t period, double mean) {
  std::vector<double> sums(period, 0.0);
  for (std::size_t t = 0; t < x.size(); ++t) sums[t % period] += x[t];
  const double n = static_cast<double>(x.size() / period);
  double between = 0.0;
  for (double s : sums) between += n * (s / n - mean) * (s / n - mean);
  return between;
}

// χ² of the weighted P-fold: Σ_t w_t (x_t − m̂_{t mod P})², m̂_c = Σ_{t∈c} w_t x_t / Σ_{t∈c} w_t —
// the weighted least-squares P-periodic fit, so with w_t = 1/se_t² it is χ²-distributed with
// M − P degrees of freedom when the profile is P-periodic and the se are right.
inline double fold_chi_square(span<const double> x, const std::vector<double>& weight, std::size_t period) {
  std::vector<double> weighted(period, 0.0), total(period, 0.0);
  for (std::size_t t = 0; t < x.size(); ++t) {
    weighted[t % period] += weight[t] * x[t];
    total[t % period] += weight[t];
  }
  double statistic = 0.0;
  for (std::size_t t = 0; t < x.size(); ++t) {
    const double d = x[t] - weighted[t % period] / total[t % period];
    statistic += weight[t] * d * d;
  }
  return statistic;
}

inline double check_profile(const char* function, span<const double> profile) {
  using phasekv::detail::require;
  require<input_error>(profile.size() >= 2, std::string(function) + ": profile.size()", profile.size(),
                       "must be at least 2 residues");
  double sum = 0.0;
  for (std::size_t t = 0; t < profile.size(); ++t) {
    require<input_error>(std::isfinite(profile[t]), std::string(function) + ": profile[" + std::to_string(t) + "]",
                         profile[t], "must be finite");
    sum += profile[t];
  }
  return sum / static_cast<double>(profile.size());
}

}  // namespace detail

// F(P) = between-class SS / total SS of the fold of a profile x_0 … x_{M−1} onto P classes
// (t mod P): the share of the profile's variation that the best P-periodic pattern (each class
// replaced by its mean) explains. It equals the summed DFT power of the mean-removed profile at
// the multiples of M/P, the harmonic sum of the fundamental M/P (the P-periodic sequences are
// exactly those the bins k·M/P span, and the fold is the orthogonal projection onto them). So F
// grows along divisibility (P | P' ⇒ F(P) ≤ F(P')), F(1) = 0 and F(M) = 1. A profile with no
// variation (flat by dominant_period's rule: only the rounding of its mean) has nothing to
// explain: F = 0. `period` must divide M.
inline double fold_fraction(span<const double> profile, std::int64_t period) {
  using phasekv::detail::require;
  const double mean = detail::check_profile("fold_fraction", profile);
  const std::int64_t m = static_cast<std::int64_t>(profile.size());
  require<input_error>(period >= 1 && m % period == 0, "fold_fraction: period", period,
                       "must be a divisor of profile.size() = " + std::to_string(m));
  double total = 0.0, largest = 0.0;
  for (double x : profile) {
    total += (x - mean) * (x - mean);
    largest = std::max(largest, std::fabs(x));
  }
  if (std::sqrt(total / static_cast<double>(m)) <= 1e-12 * largest) return 0.0;
  if (period == m) return 1.0;
  return std::min(1.0, detail::fold_between_squares(profile, static_cast<std::size_t>(period), mean) / total);
}

// The dominant period of a profile x_0 … x_{M−1} over M residues: the SMALLEST divisor P of M,
// 2 ≤ P ≤ M, whose fold (fold_fraction) explains the profile adequately — the fundamental, not
// a harmonic. The period is therefore always a divisor of M; the result is {P, M/P, F(P)}.
//
// Why a fold and not a DFT argmax: a pattern of period P puts its power on ALL multiples of
// M/P, and one weak residue per period spreads it evenly over them (every non-Nyquist
// harmonic gets the same share as the fundamental): once noise breaks the tie the largest single
// bin is usually a harmonic (M = 16, P = 8, noise ±0.02 on a 0.7 dip: 4 or 16/6 ≈ 2.67 in 70% of
// draws instead of 8). The fold adds the harmonics up.
//
// "Adequately":
//   * with standard errors se_t of the x_t (`standard_errors`, one per residue): a χ²
//     goodness-of-fit test of the P-fold fitted by weighted least squares,
//         χ²(P) = Σ_t (x_t − m̂_{t mod P})² / se_t²,   m̂_c the 1/se²-weighted mean of class c,
//     with M − P degrees of freedom, adequate when Pr(χ²_{M−P} ≥ χ²(P)) ≥ period_fit_alpha
//     (0.05). The smallest adequate P wins; P = M fits exactly and is always adequate. So a real
//     period P is reported as P unless the profile departs from P-periodicity by more than its
//     errors (about 5% of the time by chance; then a multiple of P is reported, never a
//     divisor). An se_t below 1e-9 · max|x_t| (in particular 0: "known exactly", e.g. a residue
//     whose every probability trial returned the same value) is raised to that floor: far above
//     the rounding of a class mean, so an exactly periodic profile still fits its period, and
//     any real departure is rejected. (The floor is at least 1e-150, so se² cannot underflow.)
//   * without standard errors (empty span) there is no noise scale, so the rule is a share:
//     F(P) ≥ period_explained_fraction (0.9) — at most 10% of the variation lies outside the
//     P-periodic pattern. Why 0.9: a proper divisor of a period explains a part that stays well
//     below it for the profiles a phase effect makes (one weak residue per period P: F(P/2) =
//     (P/2 − 1)/(P − 1) < 1/2; a two-level square wave: F(P/2) = 0), while measurement noise of
//     up to a ninth of the pattern's variance still lets the true period through. Every
//     deviation counts as signal here: a profile that is all noise typically needs P = M.
//
// No phase effect. A profile that is constant within its errors fits every fold, so with
// standard errors it gets the smallest divisor of M (2 for even M) — this function answers "if
// the profile is periodic, with which period", not "is there a phase effect"; that is the
// homogeneity test the phase sweep reports next to it (a small power_fraction is the other
// hint). Period 1 (the constant) is not a candidate: "no period" is the homogeneity test's answer.
//
// Flat: when the profile's RMS deviation from its mean is at most 1e-12 of its largest |x|
// (rounding noise of the mean, e.g. a constant profile), no period is meaningful: the result
// is {period 0, frequency 0, power_fraction 0, flat = true}, with or without standard errors.
//
// Throws input_error for fewer than 2 residues, a non-finite x_t, a standard_errors span of
// another size than the profile (other than empty), or an se_t that is negative or not finite.
inline periodicity dominant_period(span<const double> profile, span<const double> standard_errors = {}) {
  using phasekv::detail::require;
  const double mean = detail::check_profile("dominant_period", profile);
  const std::size_t m = profile.size();
  const bool have_errors = !standard_errors.empty();
  if (have_errors) {
    require<input_error>(standard_errors.size() == m, "dominant_period: standard_errors.size()",
                         standard_errors.size(),
                         "must equal profile.size() = " + std::to_string(m) + " (or be empty: no errors given)");
    for (std::size_t t = 0; t < m; ++t)
      require<input_error>(std::isfinite(standard_errors[t]) && standard_errors[t] >= 0.0,
                           "dominant_period: standard_errors[" + std::to_string(t) + "]", standard_errors[t],
                           "must be finite and non-negative");
  }
  double squares = 0.0, largest = 0.0;
  for (double x : profile) {
    squares += (x - mean) * (x - mean);
    largest = std::max(largest, std::fabs(x));
  }
  periodicity out;
  if (std::sqrt(squares / static_cast<double>(m)) <= 1e-12 * largest) {
    out.flat = true;
    return out;
  }
  std::vector<double> weight;
  if (have_errors) {
    const double se_floor = std::max(1e-9 * largest, 1e-150);
    weight.resize(m);
    for (std::size_t t = 0; t < m; ++t) {
      const double se = std::max(standard_errors[t], se_floor);
      weight[t] = 1.0 / (se * se);
    }
  }
  std::size_t chosen = m;
  for (std::size_t p = 2; p < m; ++p) {
    if (m % p != 0) continue;
    const bool adequate =
        have_errors
            ? chi_square_upper_tail(detail::fold_chi_square(profile, weight, p), static_cast<double>(m - p)) >=
                  period_fit_alpha
            : detail::fold_between_squares(profile, p, mean) >= period_explained_fraction * squares;
    if (adequate) {
      chosen = p;
      break;
    }
  }
  out.period = static_cast<double>(chosen);
  out.frequency = static_cast<std::int64_t>(m / chosen);
  out.power_fraction =
      chosen == m ? 1.0 : std::min(1.0, detail::fold_between_squares(profile, chosen, mean) / squares);
  return out;
}

// dominant_period of a profile some of whose residues are absent (present[t] = 0), as a phase
// sweep restricted to one layout class has: the same rule (the smallest divisor P of M whose
// weighted fold fits within the errors, χ² with n_present − n_classes degrees of freedom over
// the classes that hold a present residue; a fold with no degree of freedom left fits exactly)
// on the present residues alone. Absent residues' profile values and errors are ignored.
// Standard errors are required (there is no share rule here). Throws input_error for fewer than
// 2 present residues or sizes that differ.
inline periodicity dominant_period_present(span<const double> profile, span<const double> standard_errors,
                                           span<const char> present) {
  using phasekv::detail::require;
  const std::size_t m = profile.size();
  require<input_error>(standard_errors.size() == m && present.size() == m, "dominant_period_present: sizes",
                       standard_errors.size(), "standard_errors and present must have profile.size() = " + std::to_string(m));
  std::vector<std::size_t> idx;
  for (std::size_t t = 0; t < m; ++t)
    if (present[t]) idx.push_back(t);
  require<input_error>(idx.size() >= 2, "dominant_period_present: present residues", idx.size(), "must be at least 2");
  double mean = 0.0, largest = 0.0;
  for (std::size_t t : idx) {
    require<input_error>(std::isfinite(profile[t]) && std::isfinite(standard_errors[t]) && standard_errors[t] >= 0.0,
                         "dominant_period_present: residue " + std::to_string(t), profile[t],
                         "must have a finite value and a finite non-negative standard error");
    mean += profile[t];
    largest = std::max(largest, std::fabs(profile[t]));
  }
  mean /= static_cast<double>(idx.size());
  double squares = 0.0;
  for (std::size_t t : idx) squares += (profile[t] - mean) * (profile[t] - mean);
  periodicity out;
  if (std::sqrt(squares / static_cast<double>(idx.size())) <= 1e-12 * largest) {
    out.flat = true;
    return out;
  }
  const double se_floor = std::max(1e-9 * largest, 1e-150);
  std::vector<double> weight(m, 0.0);
  for (std::size_t t : idx) weight[t] = 1.0 / (std::max(standard_errors[t], se_floor) * std::max(standard_errors[t], se_floor));
  const auto fold = [&](std::size_t p, double& chi, double& between, std::int64_t& classes) {
    std::vector<double> wsum(p, 0.0), wtot(p, 0.0), sum(p, 0.0), cnt(p, 0.0);
    for (std::size_t t : idx) {
      wsum[t % p] += weight[t] * profile[t];
      wtot[t % p] += weight[t];
      sum[t % p] += profile[t];
      cnt[t % p] += 1.0;
    }
    chi = between = 0.0;
    classes = 0;
    for (std::size_t c = 0; c < p; ++c)
      if (cnt[c] > 0.0) {
        ++classes;
        between += cnt[c] * (sum[c] / cnt[c] - mean) * (sum[c] / cnt[c] - mean);
      }
    for (std::size_t t : idx) {
      const double d = profile[t] - wsum[t % p] / wtot[t % p];
      chi += weight[t] * d * d;
    }
  };
  std::size_t chosen = m;
  double chosen_between = squares;
  for (std::size_t p = 2; p < m; ++p) {
    if (m % p != 0) continue;
    double chi = 0.0, between = 0.0;
    std::int64_t classes = 0;
    fold(p, chi, between, classes);
    const std::int64_t dof = static_cast<std::int64_t>(idx.size()) - classes;
    if (dof <= 0 || chi_square_upper_tail(chi, static_cast<double>(dof)) >= period_fit_alpha) {
      chosen = p;
      chosen_between = between;
      break;
    }
  }
  out.period = static_cast<double>(chosen);
  out.frequency = static_cast<std::int64_t>(m / chosen);
  out.power_fraction = std::min(1.0, chosen_between / squares);
  return out;
}

struct residue_summary {
  std::int64_t best_residue = 0;   // highest accuracy (the lowest residue on ties)
  std::int64_t worst_residue = 0;  // lowest accuracy (the lowest residue on ties)
  double best = 0.0;
  double worst = 0.0;
  double gap_points = 0.0;         // (best − worst) · 100, in percentage points
  double mean = 0.0;               // unweighted mean over residues
};

// Best, worst, gap and mean of a per-residue accuracy profile. Accuracies are fractions in
// [0, 1] (a percentage passed by mistake is rejected rather than reported as a 4000-point gap).
inline residue_summary summarize_residues(span<const double> accuracy) {
  using phasekv::detail::require;
  require<input_error>(!accuracy.empty(), "summarize_residues: accuracy.size()", 0, "must be at least 1");
  residue_summary out;
  double sum = 0.0;
  for (std::size_t r = 0; r < accuracy.size(); ++r) {
    const double a = accuracy[r];
    require<input_error>(a >= 0.0 && a <= 1.0, "summarize_residues: accuracy[" + std::to_string(r) + "]", a,
                         "must be a fraction in [0, 1]");
    if (a > accuracy[static_cast<std::size_t>(out.best_residue)]) out.best_residue = static_cast<std::int64_t>(r);
    if (a < accuracy[static_cast<std::size_t>(out.worst_residue)]) out.worst_residue = static_cast<std::int64_t>(r);
    sum += a;
  }
  out.best = accuracy[static_cast<std::size_t>(out.best_residue)];
  out.worst = accuracy[static_cast<std::size_t>(out.worst_residue)];
  out.gap_points = 100.0 * (out.best - out.worst);
  out.mean = sum / static_cast<double>(accuracy.size());
  return out;
}

}  // namespace phasekv::diag::stats
