#pragma once
// An independent twin of DeepSeek-V4's FP8 entry format (format/fp8.hpp states it), for
// the tests to hold phasekv's quantizer and byte layout to. Written from the format's
// description in double precision, using nothing from the library:
//
//   e4m3fn value of a code   (−1)^s · (1 + m/8) · 2^(e − 7) for e ≥ 1, (−1)^s · m · 2^−9 for
//                            e = 0, NaN for e = 15 and m = 7 (so 448 is the largest finite)
//   e4m3fn of a real x       the nearest of the 253 finite values, found among the sorted
//                            magnitudes by comparing with the exact midpoint; a tie goes to the
//                            code whose last bit is 0 (even mantissa); |x| ≥ 448 gives ±448
//                            (saturation); the sign of x is kept, also on ±0; NaN gives 0x7F|s
//   scale of a block         amax = max(max|x|, fp32(1e-4)); r = amax · fp32(1/448) rounded to
//                            fp32; k = ceil(log2 r) found with frexp (r = f · 2^e, f ∈ [0.5, 1):
//                            k = e − 1 when f = 0.5, else e); byte b = k + 127
//   code of x                e4m3fn(clamp(x / 2^k, −448, 448))
//   bf16 of x                the nearer of the two bf16 values around x (truncated pattern and
//                            the next one up), ties to the even pattern
//   head bytes               codes [0, N), N = C − R; bf16 values little-endian from N rounded up
//                            to even; B = ceil(N/64) scale bytes; zeros up to a multiple of 8
//   non-finite block         phasekv's documented choice: every code 0x7F, scale byte 0xFF

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace phasekv_test::fp8 {

inline double e4m3_value(std::uint8_t code) {
  const int e = (code >> 3) & 0xF, m = code & 0x7;
  double magnitude;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (e == 0) magnitude = std::ldexp(static_cast<double>(m), -9);
  else magnitude = std::ldexp(1.0 + m / 8.0, e - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}

// Non-negative finite magnitudes in increasing order, with their codes (0x00 … 0x7E).
struct magnitude_table {
  std::vector<double> value;
  std::vector<std::uint8_t> code;
  magnitude_table() {
    for (int c = 0; c < 0x80; ++c) {
      const double v = e4m3_value(static_cast<std::uint8_t>(c));
      if (std::isnan(v)) continue;
      value.push_back(v);
      code.push_back(static_cast<std::uint8_t>(c));
    }
    // Sort by value, not assuming codes are monotonic.
    std::vector<std::size_t> order(value.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return value[a] < value[b]; });
    std::vector<double> v;
    std::vector<std::uint8_t> c;
    for (std::size_t i : order) {
      v.push_back(value[i]);
      c.push_back(code[i]);
    }
    value = v;
    code = c;
  }
};

inline const magnitude_table& magnitudes() {
  static const magnitude_table table;
  return table;
}

inline std::uint8_t e4m3_nearest(double x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | 0x7F);
  const double a = std::fabs(x);
  const magnitude_table& t = magnitudes();
  if (a >= t.value.back()) return static_cast<std::uint8_t>(sign | t.code.back());
  const std::size_t upper =
      static_cast<std::size_t>(std::upper_bound(t.value.begin(), t.value.end(), a) - t.value.begin());
  const std::size_t lower = upper - 1;  // value[lower] ≤ a < value[upper]
  if (a == t.value[lower]) return static_cast<std::uint8_t>(sign | t.code[lower]);
  const double midpoint = (t.value[lower] + t.value[upper]) / 2;  // exact: few significant bits
  std::uint8_t code;
  if (a < midpoint) code = t.code[lower];
  else if (a > midpoint) code = t.code[upper];
  else code = (t.code[lower] & 1) == 0 ? t.code[lower] : t.code[upper];
  return static_cast<std::uint8_t>(sign | code);
}

inline std::uint16_t bf16_nearest(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const std::uint32_t low = bits & 0xFFFF0000u;
  float lo_f, hi_f;
  const std::uint32_t high = low + 0x10000u;
  std::memcpy(&lo_f, &low, sizeof lo_f);
  std::memcpy(&hi_f, &high, sizeof hi_f);
  const double v = std::fabs(static_cast<double>(x));
  const double lo = std::fabs(static_cast<double>(lo_f));
  // The pattern above the largest finite bf16 is Inf, worth 2^128 with an unbounded exponent.
  const double hi = std::isinf(hi_f) ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(hi_f));
  if (v == lo) return static_cast<std::uint16_t>(low >> 16);
  const double midpoint = (lo + hi) / 2;
  if (v < midpoint) return static_cast<std::uint16_t>(low >> 16);
  if (v > midpoint) return static_cast<std::uint16_t>(high >> 16);
  return static_cast<std::uint16_t>(((low >> 16) & 1) == 0 ? low >> 16 : high >> 16);
}

inline double bf16_value(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// k of a block of finite values.
inline int scale_exponent(const float* x, std::int64_t n) {
  float amax = 1e-4f;
  for (std::int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float inverse = static_cast<float>(1.0 / 448.0);
  const float r = static_cast<float>(static_cast<double>(amax) * static_cast<double>(inverse));  // exact, then one rounding
  int e = 0;
  const double f = std::frexp(static_cast<double>(r), &e);
  return f == 0.5 ? e - 1 : e;
}

struct head_format {
  std::int64_t channels = 0, rope = 0;
  std::int64_t quantized() const { return channels - rope; }
  std::int64_t blocks() const { return (quantized() + 63) / 64; }
  std::int64_t rope_offset() const { return quantized() % 2 == 0 ? quantized() : quantized() + 1; }
  std::int64_t scale_offset() const { return rope_offset() + 2 * rope; }
  std::int64_t bytes() const { return (scale_offset() + blocks() + 7) / 8 * 8; }
};

// The bytes of one head.
inline std::vector<std::uint8_t> encode_head(const float* x, const head_format& f) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(f.bytes()), 0);
  for (std::int64_t b = 0; b < f.blocks(); ++b) {
    const std::int64_t first = 64 * b, n = std::min<std::int64_t>(64, f.quantized() - first);
    bool finite = true;
    for (std::int64_t i = 0; i < n; ++i) finite = finite && std::isfinite(x[first + i]);
    if (!finite) {
      for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(first + i)] = 0x7F;
      out[static_cast<std::size_t>(f.scale_offset() + b)] = 0xFF;
      continue;
    }
    const int k = scale_exponent(x + first, n);
    out[static_cast<std::size_t>(f.scale_offset() + b)] = static_cast<std::uint8_t>(k + 127);
    for (std::int64_t i = 0; i < n; ++i) {
      const double v = std::ldexp(static_cast<double>(x[first + i]), -k);  // x / 2^k, exact
      out[static_cast<std::size_t>(first + i)] = e4m3_nearest(std::clamp(v, -448.0, 448.0));
    }
  }
  for (std::int64_t r = 0; r < f.rope; ++r) {
    const std::uint16_t b = bf16_nearest(x[f.quantized() + r]);
    out[static_cast<std::size_t>(f.rope_offset() + 2 * r)] = static_cast<std::uint8_t>(b & 0xFF);
    out[static_cast<std::size_t>(f.rope_offset() + 2 * r + 1)] = static_cast<std::uint8_t>(b >> 8);
  }
  return out;
}

// The values a head's bytes stand for: q · 2^(b − 127) and the bf16 values (NaN for a NaN code or
// scale byte 0xFF).
inline std::vector<double> decode_head(const std::uint8_t* bytes, const head_format& f) {
  std::vector<double> out(static_cast<std::size_t>(f.channels));
  for (std::int64_t c = 0; c < f.quantized(); ++c) {
    const std::uint8_t b = bytes[f.scale_offset() + c / 64];
    out[static_cast<std::size_t>(c)] =
        b == 0xFF ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(e4m3_value(bytes[c]), b - 127);
  }
  for (std::int64_t r = 0; r < f.rope; ++r) {
    const auto lo = bytes[f.rope_offset() + 2 * r], hi = bytes[f.rope_offset() + 2 * r + 1];
    out[static_cast<std::size_t>(f.quantized() + r)] = bf16_value(static_cast<std::uint16_t>(lo | (hi << 8)));
  }
  return out;
}

}  // namespace phasekv_test::fp8
