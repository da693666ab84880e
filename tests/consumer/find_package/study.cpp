// The study as a product of its own (phasekv::study: the engine and Eigen): its umbrella compiles
// and a Wilson interval computes what the formula gives.
#include <phasekv/study.hpp>

#include <cmath>

int main() {
  // 8 of 10 at z = 1.96: centre (p + z²/2n) / (1 + z²/n), half width z·sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n).
  const double z = 1.959963984540054, n = 10.0, p = 0.8;
  const double centre = (p + z * z / (2 * n)) / (1 + z * z / n);
  const double half = z * std::sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n);
  const phasekv::diag::stats::proportion_interval w = phasekv::diag::stats::wilson_interval(8, 10);
  return std::abs(w.low - (centre - half)) < 1e-9 && std::abs(w.high - (centre + half)) < 1e-9 ? 0 : 1;
}
