#pragma once
// The statistics a phase sweep reports (DESIGN.md §6, "phase sweep harness"): per-residue
// accuracy with a Wilson interval, a test that accuracy is the same at every residue, the
// dominant period of the per-residue profile, and its best/worst/mean summary.
//
//   wilson_interval        score interval of a binomial proportion
//   chi_square_homogeneity Pearson χ² on the k×2 table (successes, failures) of k residues
//   anova_homogeneity      one-way ANOVA F test, for per-trial probabilities instead of 0/1
//   dominant_period        the strongest DFT frequency of a mean-removed profile
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

namespace phasekv {
namespace stats {

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
  double period = 0.0;           // M / frequency; 0 when the profile is flat
  std::int64_t frequency = 0;    // k ∈ [1, M/2]; 0 when flat
  double power_fraction = 0.0;   // share of the non-DC power at that frequency; 0 when flat
  bool flat = false;             // no variation to speak of (see below)
};

// The dominant period of a profile x_0 … x_{M−1} over M residues. With d_t = x_t − mean and
// X_k = Σ_t d_t e^(−2πi k t/M), the power at frequency k ∈ [1, M/2] counts both of its
// conjugate bins: 2|X_k|² (just |X_{M/2}|² at the Nyquist frequency of an even M). By Parseval
// these sum to the total non-DC power M Σ d_t², so each frequency's share is the fraction of the
// profile's variance it explains (a pure period-p pattern with p | M puts all its power on the
// multiples of M/p; the dominant one is usually M/p itself).
// The winner is the frequency with the largest share; shares within 1e-9 of each other count
// as tied and the lower k (longer period) wins. The period M/k is a double because k need not
// divide M.
// Flat: when the profile's RMS deviation from its mean is at most 1e-12 of its largest |x|
// (rounding noise of the mean, e.g. a constant profile), no frequency is meaningful: the
// result is {period 0, frequency 0, power_fraction 0, flat = true}.
inline periodicity dominant_period(span<const double> profile) {
  using phasekv::detail::require;
  const std::size_t m = profile.size();
  require<input_error>(m >= 2, "dominant_period: profile.size()", m, "must be at least 2 residues");
  double sum = 0.0, largest = 0.0;
  for (std::size_t t = 0; t < m; ++t) {
    require<input_error>(std::isfinite(profile[t]), "dominant_period: profile[" + std::to_string(t) + "]", profile[t],
                         "must be finite");
    sum += profile[t];
    largest = std::max(largest, std::fabs(profile[t]));
  }
  const double mean = sum / static_cast<double>(m);
  std::vector<double> deviation(m);
  double squares = 0.0;
  for (std::size_t t = 0; t < m; ++t) {
    deviation[t] = profile[t] - mean;
    squares += deviation[t] * deviation[t];
  }
  periodicity out;
  if (std::sqrt(squares / static_cast<double>(m)) <= 1e-12 * largest) {
    out.flat = true;
    return out;
  }
  const double total_power = static_cast<double>(m) * squares;
  const double two_pi = 6.283185307179586476925286766559;
  const std::int64_t M = static_cast<std::int64_t>(m);
  double best_share = -1.0;
  for (std::int64_t k = 1; 2 * k <= M; ++k) {
    double re = 0.0, im = 0.0;
    for (std::int64_t t = 0; t < M; ++t) {
      // k·t mod M keeps the angle in [0, 2π) so large M loses no precision in cos/sin.
      const double angle = two_pi * static_cast<double>((k * t) % M) / static_cast<double>(M);
      re += deviation[static_cast<std::size_t>(t)] * std::cos(angle);
      im -= deviation[static_cast<std::size_t>(t)] * std::sin(angle);
    }
    const double bins = (2 * k == M) ? 1.0 : 2.0;
    const double share = bins * (re * re + im * im) / total_power;
    if (share > best_share + 1e-9) {
      best_share = share;
      out.frequency = k;
    }
  }
  out.power_fraction = std::min(1.0, best_share);
  out.period = static_cast<double>(M) / static_cast<double>(out.frequency);
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

}  // namespace stats
}  // namespace phasekv
