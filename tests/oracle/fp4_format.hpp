#pragma once
// An independent twin of DeepSeek-V4's FP4 indexer format and scores (format/fp4.hpp and
// kernels/indexer_fp4.hpp state them), for the tests to hold phasekv's transform, quantizer,
// byte layout and integer scorer to. Written from the description in double precision, using
// nothing from the library:
//
//   Hadamard                y_i = fp32( (Σ_j H[i][j] · x_j, in double, j ascending) · r ),
//                           H[i][j] = (−1)^popcount(i & j) (Sylvester order, a dense matrix), r the
//                           double nearest n^−1/2, found by rounding a long-double 1/sqrtl(n)
//   e2m1 value of a code    bit 3 sign, bits 2–1 exponent e (bias 1), bit 0 mantissa m:
//                           m · 0.5 for e = 0, (1 + m/2) · 2^(e − 1) otherwise
//   e2m1 of a real v        the nearest of the 8 magnitudes by |a − v| (a scan, no thresholds);
//                           a tie goes to the code whose mantissa bit is 0; |v| ≥ 6 gives 6; the
//                           sign of v is kept, also on 0
//   scale of a block        amax = max(max |y|, 6 · 2^−126); k the least integer with 6 · 2^k ≥
//                           amax, found by counting up from −126 with exact ldexp comparisons;
//                           byte k + 127
//   code of y               e2m1(clamp(y / 2^k, −6, 6))
//   head bytes              channels 2i and 2i + 1 in the low and high nibble of byte i; then one
//                           scale byte per block of 32; a block holding NaN or ±Inf: codes 0,
//                           scale byte 0xFF (phasekv's documented choice)
//   dot product             Σ_c q̂_c · k̂_c of the dequantized values, in double, c ascending
//   score                   r_h = fp32(dot) if > 0 else 0 (NaN → 0); heads in blocks of 64, lane
//                           l = h mod 16 of a block accumulating fma(r_h, w_h, a_l) for h = l,
//                           l + 16, l + 32, l + 48; the block's a halved pairwise at distance 8,
//                           4, 2, 1; the blocks' sums added in order from 0 (the documented order)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace phasekv_test::fp4 {

inline double e2m1_value(std::uint8_t code) {
  const int e = (code >> 1) & 0x3, m = code & 0x1;
  const double magnitude = e == 0 ? m * 0.5 : (1.0 + m / 2.0) * std::ldexp(1.0, e - 1);
  return (code & 0x8) ? -magnitude : magnitude;
}

inline std::uint8_t e2m1_nearest(double v) {
  const std::uint8_t sign = std::signbit(v) ? 0x8 : 0x0;
  const double a = std::min(std::fabs(v), 6.0);
  std::uint8_t best = 0;
  for (std::uint8_t c = 1; c < 8; ++c) {
    const double d = std::fabs(e2m1_value(c) - a), d_best = std::fabs(e2m1_value(best) - a);
    if (d < d_best || (d == d_best && (c & 1) == 0)) best = c;
  }
  return static_cast<std::uint8_t>(sign | best);
}

inline double hadamard_scale(std::int64_t n) {
  return static_cast<double>(1.0L / sqrtl(static_cast<long double>(n)));
}

inline int popcount(std::uint64_t v) {
  int n = 0;
  for (; v != 0; v &= v - 1) ++n;
  return n;
}

// The dense transform, in double before the final rounding to fp32.
inline std::vector<double> hadamard_double(const float* x, std::int64_t n) {
  std::vector<double> y(static_cast<std::size_t>(n));
  const double r = hadamard_scale(n);
  for (std::int64_t i = 0; i < n; ++i) {
    double sum = 0.0;
    for (std::int64_t j = 0; j < n; ++j) {
      const double v = static_cast<double>(x[j]);
      sum += popcount(static_cast<std::uint64_t>(i & j)) % 2 == 0 ? v : -v;
    }
    y[static_cast<std::size_t>(i)] = sum * r;
  }
  return y;
}

inline std::vector<float> hadamard(const float* x, std::int64_t n) {
  const std::vector<double> d = hadamard_double(x, n);
  return std::vector<float>(d.begin(), d.end());
}

// k of a block of 32 finite values.
inline int scale_exponent(const float* y) {
  double amax = std::ldexp(6.0, -126);
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(static_cast<double>(y[i])));
  int k = -126;
  while (std::ldexp(6.0, k) < amax) ++k;
  return k;
}

inline std::int64_t head_bytes(std::int64_t channels) { return channels / 2 + channels / 32; }

// The bytes of a head whose transformed values are y.
inline std::vector<std::uint8_t> encode_transformed(const float* y, std::int64_t channels) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(head_bytes(channels)), 0);
  for (std::int64_t b = 0; b < channels / 32; ++b) {
    const float* x = y + 32 * b;
    bool finite = true;
    for (int i = 0; i < 32; ++i) finite = finite && std::isfinite(x[i]);
    std::uint8_t codes[32] = {};
    if (finite) {
      const int k = scale_exponent(x);
      out[static_cast<std::size_t>(channels / 2 + b)] = static_cast<std::uint8_t>(k + 127);
      for (int i = 0; i < 32; ++i) codes[i] = e2m1_nearest(std::clamp(std::ldexp(static_cast<double>(x[i]), -k), -6.0, 6.0));
    } else {
      out[static_cast<std::size_t>(channels / 2 + b)] = 0xFF;
    }
    for (int i = 0; i < 32; i += 2)
      out[static_cast<std::size_t>(16 * b + i / 2)] = static_cast<std::uint8_t>(codes[i] | (codes[i + 1] << 4));
  }
  return out;
}

inline std::vector<std::uint8_t> encode_head(const float* x, std::int64_t channels) {
  const std::vector<float> y = hadamard(x, channels);
  return encode_transformed(y.data(), channels);
}

// The values the bytes stand for (NaN for a block with scale byte 0xFF).
inline std::vector<double> decode_head(const std::uint8_t* bytes, std::int64_t channels) {
  std::vector<double> out(static_cast<std::size_t>(channels));
  for (std::int64_t c = 0; c < channels; ++c) {
    const std::uint8_t scale = bytes[channels / 2 + c / 32];
    const std::uint8_t code = c % 2 == 0 ? bytes[c / 2] & 0x0F : bytes[c / 2] >> 4;
    out[static_cast<std::size_t>(c)] =
        scale == 0xFF ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(e2m1_value(code), scale - 127);
  }
  return out;
}

// Σ_c q̂_c · k̂_c in double.
inline double dot(const std::vector<double>& q, const std::vector<double>& k) {
  double sum = 0.0;
  for (std::size_t c = 0; c < q.size(); ++c) sum += q[c] * k[c];
  return sum;
}

// The score of one key from its heads' dot products (dots[h]) and the weights, in the documented
// order.
inline float score(const std::vector<double>& dots, const std::vector<float>& weights) {
  const std::size_t heads = dots.size();
  float total = 0.0f;
  for (std::size_t first = 0; first < heads; first += 64) {
    float a[16] = {};
    for (std::size_t h = first; h < std::min(heads, first + 64); ++h) {
      const auto d = static_cast<float>(dots[h]);
      const float r = d > 0.0f ? d : 0.0f;  // NaN > 0 is false
      a[(h - first) % 16] = std::fma(r, weights[h], a[(h - first) % 16]);
    }
    for (int width = 8; width >= 1; width /= 2)
      for (int l = 0; l < width; ++l) a[l] = a[l] + a[l + width];
    total += a[0];
  }
  return total;
}

}  // namespace phasekv_test::fp4
