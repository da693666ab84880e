#pragma once
// Rotary position embedding on the last R channels of a vector.
//
//   θ_k = base^(−2k/R),  k ∈ [0, R/2)                       (optionally YaRN-scaled, below)
//   pair k = (a, b) is rotated by the angle p·θ_k:  a' = a·cos − b·sin,  b' = a·sin + b·cos
//   interleaved pairs: (2k, 2k+1) (DeepSeek-V4);  half-split pairs: (k, k + R/2) (Llama, NeoX)
//
// YaRN (as in DeepSeek's reference code): with d_r = R·ln(L / (2π·r)) / (2·ln base),
//   low = max(floor(d_{beta_fast}), 0),  high = min(ceil(d_{beta_slow}), R − 1),
//   ramp_k = clamp((k − low) / (high − low), 0, 1)   (high += 0.001 when equal),
//   θ_k ← θ_k / factor · ramp_k + θ_k · (1 − ramp_k):
// fast-rotating pairs keep their frequency, slow ones are interpolated by `factor`.
//
// Angles are formed and reduced in double (p·θ_k loses too much in float at 128K positions);
// sin/cos of the reduced angle and the rotation itself run in float.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/simd/batch.hpp"

namespace phasekv {

enum class rope_layout { interleaved, half_split };

inline const char* to_string(rope_layout layout) {
  return layout == rope_layout::interleaved ? "interleaved" : "half_split";
}

struct yarn_config {
  bool enabled = false;
  double factor = 1.0;                 // context extension factor, ≥ 1
  std::int64_t original_context = 0;   // training context the frequencies were made for
  double beta_fast = 32.0;             // rotations above which a pair keeps its frequency
  double beta_slow = 1.0;              // rotations below which a pair is fully interpolated
};

struct rope_config {
  std::int64_t channels = 0;  // R: the last R channels rotate; even
  double base = 10000.0;
  rope_layout layout = rope_layout::interleaved;
  yarn_config yarn;

  // `prefix` names the owner in messages (e.g. "keys.rope"); `vector_channels` is the length
  // of the vectors the rotation will be applied to.
  void validate(const std::string& prefix, std::int64_t vector_channels) const {
    using detail::require;
    require(channels >= 0 && channels % 2 == 0, prefix + ".channels", channels, "must be even and non-negative");
    require(channels <= vector_channels, prefix + ".channels", channels,
            "must be at most the vector's channels (" + std::to_string(vector_channels) + ")");
    require(std::isfinite(base) && base > 1.0, prefix + ".base", base, "must be finite and greater than 1");
    if (!yarn.enabled) return;
    require(std::isfinite(yarn.factor) && yarn.factor >= 1.0, prefix + ".yarn.factor", yarn.factor,
            "must be finite and at least 1");
    require(yarn.original_context >= 1, prefix + ".yarn.original_context", yarn.original_context,
            "must be at least 1");
    require(std::isfinite(yarn.beta_slow) && yarn.beta_slow > 0.0, prefix + ".yarn.beta_slow", yarn.beta_slow,
            "must be finite and positive");
    require(std::isfinite(yarn.beta_fast) && yarn.beta_fast > yarn.beta_slow, prefix + ".yarn.beta_fast",
            yarn.beta_fast, "must be finite and greater than yarn.beta_slow");
  }
};

// The frequencies of one rope_config, applied to vectors of a given length.
class rope_rotation {
 public:
  rope_rotation() = default;
  rope_rotation(const rope_config& config, std::int64_t vector_channels)
      : layout_(config.layout), rotated_(config.channels), offset_(vector_channels - config.channels) {
    const std::int64_t pairs = rotated_ / 2;
    inv_freq_.resize(static_cast<std::size_t>(pairs));
    const double r = static_cast<double>(rotated_);
    for (std::int64_t k = 0; k < pairs; ++k)
      inv_freq_[k] = std::pow(config.base, -2.0 * static_cast<double>(k) / r);
    if (config.yarn.enabled && pairs > 0) apply_yarn(config);
  }

  std::int64_t pairs() const noexcept { return rotated_ / 2; }
  std::int64_t rotated_channels() const noexcept { return rotated_; }
  const std::vector<double>& inverse_frequencies() const noexcept { return inv_freq_; }

  // cos/sin of p·θ_k for every pair, into two arrays of pairs() floats. The angle is formed and
  // reduced to [−π, π] in double, then xsimd's float sincos runs on whole batches: a libm
  // double sincos per pair would cost more than pooling the entry.
  void angles(double position, float* cos_out, float* sin_out) const noexcept {
    using batch = xsimd::batch<float>;
    constexpr std::size_t lanes = batch::size;
    constexpr double two_pi = 6.283185307179586476925;
    alignas(64) float reduced[lanes];
    for (std::size_t k0 = 0; k0 < inv_freq_.size(); k0 += lanes) {
      const std::size_t n = std::min(lanes, inv_freq_.size() - k0);
      for (std::size_t l = 0; l < lanes; ++l) {
        const double angle = l < n ? position * inv_freq_[k0 + l] : 0.0;
        reduced[l] = static_cast<float>(angle - two_pi * std::nearbyint(angle / two_pi));
      }
      const auto [s, c] = xsimd::sincos(batch::load_aligned(reduced));
      alignas(64) float sv[lanes], cv[lanes];
      s.store_aligned(sv);
      c.store_aligned(cv);
      std::copy_n(sv, n, sin_out + k0);
      std::copy_n(cv, n, cos_out + k0);
    }
  }

  // Rotates the last R channels of x by the angles from angles(); sign = −1 rotates back.
  void apply(float* x, const float* cos_in, const float* sin_in, float sign = 1.0f) const noexcept {
    float* r = x + offset_;
    const std::int64_t n = pairs();
    const std::int64_t step = layout_ == rope_layout::interleaved ? 2 : 1;
    const std::int64_t partner = layout_ == rope_layout::interleaved ? 1 : n;
    for (std::int64_t k = 0; k < n; ++k) {
      float& a = r[k * step];
      float& b = r[k * step + partner];
      const float c = cos_in[k], s = sign * sin_in[k];
      const float a0 = a, b0 = b;
      a = a0 * c - b0 * s;
      b = a0 * s + b0 * c;
    }
  }

 private:
  void apply_yarn(const rope_config& config) {
    const double r = static_cast<double>(rotated_);
    const double two_pi = 2.0 * 3.14159265358979323846;
    const double context = static_cast<double>(config.yarn.original_context);
    auto correction_dim = [&](double rotations) {
      return r * std::log(context / (rotations * two_pi)) / (2.0 * std::log(config.base));
    };
    const double low = std::max(std::floor(correction_dim(config.yarn.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(config.yarn.beta_slow)), r - 1.0);
    // When even the slowest pair turns more than beta_fast times over the context, low lands
    // above high and the reference code would interpolate every pair; keep them all instead.
    if (high < low) high = low;
    if (high == low) high += 0.001;
    for (std::size_t k = 0; k < inv_freq_.size(); ++k) {
      const double ramp = std::clamp((static_cast<double>(k) - low) / (high - low), 0.0, 1.0);
      inv_freq_[k] = inv_freq_[k] / config.yarn.factor * ramp + inv_freq_[k] * (1.0 - ramp);
    }
  }

  rope_layout layout_ = rope_layout::interleaved;
  std::int64_t rotated_ = 0;
  std::int64_t offset_ = 0;
  std::vector<double> inv_freq_;
};

}  // namespace phasekv
