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
//
// Host tables (rope_config::table): a host that must match its own RoPE bit for bit supplies
// cos/sin per position and pair, fp32, [positions][R/2] — e.g. DeepSeek's fp32 freqs_cis
// (torch.polar of t·θ_k formed in fp32), which differ from phasekv's double-reduced angles by
// ~1e-5 within the first 256 positions (fp32 t·θ_k is off by up to half an ulp of the angle).
// The write path (post-pool RoPE at the anchor, pre-pool RoPE at each slot's token) and the
// reader's output de-rotation then take cos and sin from the table instead of computing them;
// a position outside [0, positions) is an input_error naming it, raised before anything
// changes. make_rope_table() builds the table of phasekv's own angles: with it every result is
// bit-identical to the computed path.
//
// The rotation is the same either way and defined to the bit: each product is rounded to fp32,
// then the pair is combined with one fp32 add, a' = fl(fl(a·cos) − fl(b·sin)),
// b' = fl(fl(a·sin) + fl(b·cos)) — torch's complex64 multiply on the CPU — never contracted
// into an FMA, whatever -ffp-contract or -march the host compiles with (GCC and Clang).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/detail/simd/batch.hpp"

namespace phasekv {

namespace detail {

// x, materialised as an fp32 value the compiler cannot fuse into a following add or subtract
// (GCC contracts across statements under -ffp-contract=fast, its default outside ISO mode;
// Clang within an expression under its default -ffp-contract=on). An empty asm that claims to
// modify the register costs one instruction slot and nothing else.
inline float rounded(float x) noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__)
  __asm__("" : "+x"(x));
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
  __asm__("" : "+w"(x));
#elif defined(__GNUC__) || defined(__clang__)
  __asm__("" : "+m"(x));
#endif
  return x;
}

}  // namespace detail

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

// cos and sin of the angle of every position and pair, supplied by the host (see the header
// comment): row p holds pair k's cos(p·θ_k), sin(p·θ_k) at [p·pairs + k].
struct rope_table {
  std::int64_t positions = 0;  // rows: positions [0, positions)
  std::int64_t pairs = 0;      // R/2
  std::vector<float> cos, sin;  // [positions][pairs]

  bool covers(std::int64_t position) const noexcept { return position >= 0 && position < positions; }

  // `prefix` names the owner in messages (e.g. "csa.kv.rope.table"). O(positions · pairs): every
  // value must be finite.
  void validate(const std::string& prefix, std::int64_t expected_pairs) const {
    using detail::require;
    require(positions >= 1 && positions <= (std::int64_t{1} << 40), prefix + ".positions", positions,
            "must lie in [1, 2^40]");
    require(pairs == expected_pairs, prefix + ".pairs", pairs,
            "must be rope.channels / 2 = " + std::to_string(expected_pairs));
    const auto n = static_cast<std::size_t>(positions * pairs);
    require(cos.size() == n, prefix + ".cos.size()", cos.size(),
            "must be positions × pairs = " + std::to_string(n));
    require(sin.size() == n, prefix + ".sin.size()", sin.size(),
            "must be positions × pairs = " + std::to_string(n));
    for (std::size_t i = 0; i < n; ++i) {
      if (!std::isfinite(cos[i]))
        detail::fail(prefix + ".cos[" + std::to_string(i / static_cast<std::size_t>(pairs)) + "][" +
                         std::to_string(i % static_cast<std::size_t>(pairs)) + "]",
                     cos[i], "must be finite");
      if (!std::isfinite(sin[i]))
        detail::fail(prefix + ".sin[" + std::to_string(i / static_cast<std::size_t>(pairs)) + "][" +
                         std::to_string(i % static_cast<std::size_t>(pairs)) + "]",
                     sin[i], "must be finite");
    }
  }
};

struct rope_config {
  std::int64_t channels = 0;  // R: the last R channels rotate; even
  double base = 10000.0;
  rope_layout layout = rope_layout::interleaved;
  yarn_config yarn;
  // Optional host-supplied cos/sin (rope_table); null: computed from base and yarn. Shared, so
  // the streams, layers and readers of a model can hold one table. base and yarn are then not
  // used for angles (still validated, and still recorded in snapshots); the table is not.
  std::shared_ptr<const rope_table> table;

  // `prefix` names the owner in messages (e.g. "keys.rope"); `vector_channels` is the length
  // of the vectors the rotation will be applied to.
  void validate(const std::string& prefix, std::int64_t vector_channels) const {
    using detail::require;
    require(channels >= 0 && channels % 2 == 0, prefix + ".channels", channels, "must be even and non-negative");
    require(channels <= vector_channels, prefix + ".channels", channels,
            "must be at most the vector's channels (" + std::to_string(vector_channels) + ")");
    require(std::isfinite(base) && base > 1.0, prefix + ".base", base, "must be finite and greater than 1");
    require(layout == rope_layout::interleaved || layout == rope_layout::half_split, prefix + ".layout",
            static_cast<int>(layout), "is not a rope_layout");
    if (table) table->validate(prefix + ".table", channels / 2);
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
      : layout_(config.layout), rotated_(config.channels), offset_(vector_channels - config.channels),
        table_(config.table) {
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
  // The host's table, or null when the angles are computed.
  const rope_table* table() const noexcept { return table_.get(); }
  // Whether angles() can serve `position`: always without a table, else inside its rows.
  bool covers(std::int64_t position) const noexcept { return !table_ || table_->covers(position); }

  // cos/sin of p·θ_k for every pair, into two arrays of pairs() floats. From the host's table
  // when there is one (row `position`, which covers() must accept). Otherwise the angle is
  // formed and reduced to [−π, π] in double, then xsimd's float sincos runs on whole batches: a
  // libm double sincos per pair would cost more than pooling the entry.
  void angles(double position, float* cos_out, float* sin_out) const noexcept {
    if (table_) {
      const std::size_t row = static_cast<std::size_t>(position) * inv_freq_.size();
      std::copy_n(table_->cos.data() + row, inv_freq_.size(), cos_out);
      std::copy_n(table_->sin.data() + row, inv_freq_.size(), sin_out);
      return;
    }
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
  // a' = fl(fl(a·c) − fl(b·s)), b' = fl(fl(a·s) + fl(b·c)): never fused (see the header comment).
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
      a = detail::rounded(a0 * c) - detail::rounded(b0 * s);
      b = detail::rounded(a0 * s) + detail::rounded(b0 * c);
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
  std::shared_ptr<const rope_table> table_;
};

// The table of phasekv's own angles (rope_rotation::angles) for positions [0, positions): a
// stream or reader given it computes bit-identically to one without a table. A starting point
// for a host that patches some rows, and the reference its tests compare against.
inline rope_table make_rope_table(const rope_config& config, std::int64_t positions) {
  rope_config computed = config;
  computed.table = nullptr;
  computed.validate("make_rope_table: rope", config.channels);
  detail::require(positions >= 1 && positions <= (std::int64_t{1} << 40), "make_rope_table: positions", positions,
                  "must lie in [1, 2^40]");
  const rope_rotation rotation(computed, config.channels);
  rope_table t;
  t.positions = positions;
  t.pairs = rotation.pairs();
  const auto n = static_cast<std::size_t>(positions * t.pairs);
  t.cos.resize(n);
  t.sin.resize(n);
  for (std::int64_t p = 0; p < positions; ++p)
    rotation.angles(static_cast<double>(p), t.cos.data() + p * t.pairs, t.sin.data() + p * t.pairs);
  return t;
}

}  // namespace phasekv
