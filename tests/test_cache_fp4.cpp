// FP4 indexer keys (include/phasekv/format/fp4.hpp): DeepSeek-V4's Hadamard + e2m1/UE8M0 format.
//
// Held to oracle/fp4_format.hpp, a double-precision twin written from the format's description:
//   - every e2m1 code decodes to its value and encodes back; e2m1 rounding equals the scanning
//     oracle at every boundary and tie (and one ulp either side, at every scale), on a dense
//     sample of doubles and on random values; saturation, signed zeros;
//   - the scale byte at every exponent from 2^−126 to 2^126: amax exactly 6 · 2^k and one ulp
//     either side, the amax floor, fp32 subnormals, the largest fp32, random amax; and that it
//     equals DeepSeek's fp32 evaluation (amax / 6 rounded, the ceiling of its log2 from its bits);
//   - blocks quantized at every scale exponent, their bytes equal to the oracle's;
//   - the Hadamard transform against a dense matrix product in double: bit for bit on inputs whose
//     sums are exact in double (every size 1 … 1024), within the stated bound on others; its
//     scale is the double nearest n^−1/2; applying it twice gives the input back;
//   - the unpacked quantizer the reader's queries use (doubled codes and scale bytes) against the
//     same oracle bytes, at every scale exponent, boundary and tie and on whole heads;
//   - whole heads byte for byte against the oracle (every channel count 32 … 1024; zeros, signed
//     zeros, tiny and huge magnitudes, NaN, Inf, a transform that overflows fp32), and their
//     dequantization equal to the oracle's values for every code at every scale byte;
//   - a hand-made 128-channel key whose every byte is written out here (the nibble order);
//   - page pools and paged caches: the 68-byte stride in the pool, the sequence views and the CSR
//     view; entries quantized as the oracle quantizes the compressor's fp32 output; 17 bytes per
//     token of indexer keys in memory(); snapshots that restore FP4 streams byte for byte and
//     refuse to turn them into anything else;
//   - errors that name the field.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/prelude.hpp"
#include "support/common.hpp"
#include "oracle/fp4_format.hpp"
#include "support/deepseek_layer.hpp"
#include "support/block_formats.hpp"
#include "support/configs.hpp"
#include "support/message_of.hpp"
#include "support/random_inputs.hpp"
#include "phasekv/cache/page_pool.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/format/fp4.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/models/deepseek_v4.hpp"

namespace test_cache_fp4 {

namespace {

using namespace phasekv_test::prelude;
namespace oracle = phasekv_test::fp4;

std::vector<std::uint8_t> as_bytes(const std::vector<std::byte>& b) {
  std::vector<std::uint8_t> out(b.size());
  std::memcpy(out.data(), b.data(), b.size());
  return out;
}

// The library's bytes of one head (transform + quantization), and of already transformed values.
std::vector<std::uint8_t> quantize(const std::vector<float>& x) {
  const fp4_head_layout l = fp4_head_layout::of(static_cast<i64>(x.size()));
  std::vector<std::byte> out(sz(l.bytes), std::byte{0xAB});
  fp4_quantize_head(x.data(), l, out.data());
  return as_bytes(out);
}
std::vector<std::uint8_t> quantize_transformed(const std::vector<float>& y) {
  const fp4_head_layout l = fp4_head_layout::of(static_cast<i64>(y.size()));
  std::vector<std::byte> out(sz(l.bytes), std::byte{0xAB});
  fp4_quantize_transformed(y.data(), l, out.data());
  return as_bytes(out);
}

// The unpacked form (fp4_quantize_*_twice) packed back into the stored layout: the code of each
// doubled value (its sign from the sign of the value; a 0 becomes code 0 — callers compare it
// with bytes whose zeros they map the same way, see packed_like) and the scale bytes.
std::vector<std::uint8_t> pack_twice(const std::vector<std::int8_t>& twice, const std::vector<std::uint8_t>& scales) {
  std::vector<std::uint8_t> out(twice.size() / 2 + scales.size(), 0);
  for (std::size_t c = 0; c < twice.size(); ++c) {
    std::uint8_t code = 0;
    while (code < 16 && e2m1_twice[code] != twice[c]) ++code;  // 0 → code 0; 16: not a code
    out[c / 2] = static_cast<std::uint8_t>(out[c / 2] | (code << (c % 2 == 0 ? 0 : 4)));
  }
  std::copy(scales.begin(), scales.end(), out.begin() + static_cast<std::ptrdiff_t>(twice.size() / 2));
  return out;
}
// Stored bytes with −0's code 8 turned into 0 (the unpacked form cannot tell the zeros apart).
std::vector<std::uint8_t> packed_like(std::vector<std::uint8_t> bytes, i64 channels) {
  for (i64 i = 0; i < channels / 2; ++i) {
    std::uint8_t& b = bytes[sz(i)];
    if ((b & 0x0Fu) == 8) b = static_cast<std::uint8_t>(b & 0xF0u);
    if ((b >> 4) == 8) b = static_cast<std::uint8_t>(b & 0x0Fu);
  }
  return bytes;
}
// The unpacked quantization of a head (transformed or not), packed back.
std::vector<std::uint8_t> quantize_twice(const std::vector<float>& x, bool transformed) {
  const fp4_head_layout l = fp4_head_layout::of(static_cast<i64>(x.size()));
  std::vector<std::int8_t> twice(x.size(), 99);
  std::vector<std::uint8_t> scales(sz(l.blocks), 0xAB);
  if (transformed) fp4_quantize_transformed_twice(x.data(), l, twice.data(), scales.data());
  else fp4_quantize_head_twice(x.data(), l, twice.data(), scales.data());
  return pack_twice(twice, scales);
}

// The index of the first byte that differs, or −1.
i64 first_difference(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  if (a.size() != b.size()) return -2;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<i64>(i);
  return -1;
}

// "" when the library's dequantization of a head equals the oracle's values bit for bit (NaN as NaN).
std::string decodes_like_oracle(const std::vector<std::uint8_t>& bytes, i64 channels) {
  std::vector<float> got(sz(channels));
  fp4_dequantize_head(reinterpret_cast<const std::byte*>(bytes.data()), fp4_head_layout::of(channels), got.data());
  const std::vector<double> want = oracle::decode_head(bytes.data(), channels);
  for (i64 c = 0; c < channels; ++c) {
    const double w = want[sz(c)];
    const float g = got[sz(c)];
    // Beyond fp32's range the oracle's value is finite and the library's ±Inf, as documented.
    const double expected = std::fabs(w) >= std::ldexp(1.0, 128) ? std::copysign(HUGE_VAL, w) : w;
    const bool same = std::isnan(w) ? std::isnan(g)
                                     : (static_cast<double>(g) == expected && std::signbit(g) == std::signbit(w));
    if (!same) return "channel " + std::to_string(c) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
  }
  return "";
}

// Random values whose transform is exact in double (one scale per head), so every butterfly and
// every dense sum is exact.
using phasekv_test::exact_sum_values;

}  // namespace

// ---- e2m1 ------------------------------------------------------------------------------------

TEST_CASE("fp4: every e2m1 code decodes to its value and encodes back to itself", "[cache][fp4]") {
  const double magnitudes[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    INFO("code " << c);
    const double want = oracle::e2m1_value(code);
    CHECK(std::fabs(want) == magnitudes[c % 8]);
    CHECK(static_cast<double>(e2m1_to_float(code)) == want);
    CHECK(std::signbit(e2m1_to_float(code)) == (c >= 8));  // −0 is code 8
    CHECK(e2m1_twice[c] == static_cast<int>(2 * want));
    CHECK(e2m1_code(want) == code);
    CHECK(oracle::e2m1_nearest(want) == code);
  }
}

TEST_CASE("fp4: e2m1 rounding equals the oracle at every boundary and tie, and on dense samples", "[cache][fp4]") {
  // The ties, each going to the code with mantissa bit 0.
  const std::pair<double, int> ties[] = {{0.25, 0}, {0.75, 2}, {1.25, 2}, {1.75, 4}, {2.5, 4}, {3.5, 6}, {5.0, 6}};
  for (const auto& [tie, code] : ties) {
    INFO("tie " << tie);
    CHECK(e2m1_code(tie) == code);
    CHECK(e2m1_code(-tie) == (8 | code));
    CHECK(oracle::e2m1_nearest(tie) == code);
    // One double ulp either side goes to the nearer neighbour.
    CHECK(e2m1_code(std::nextafter(tie, 0.0)) == oracle::e2m1_nearest(std::nextafter(tie, 0.0)));
    CHECK(e2m1_code(std::nextafter(tie, 10.0)) == oracle::e2m1_nearest(std::nextafter(tie, 10.0)));
    CHECK(e2m1_code(std::nextafter(tie, 0.0)) != e2m1_code(std::nextafter(tie, 10.0)));
  }
  // Saturation, zeros, the sign of a value rounding to zero.
  CHECK(e2m1_code(6.0) == 7);
  CHECK(e2m1_code(7.5) == 7);
  CHECK(e2m1_code(-1e300) == 15);
  CHECK(e2m1_code(0.0) == 0);
  CHECK(e2m1_code(-0.0) == 8);
  CHECK(e2m1_code(-0.1) == 8);
  CHECK(e2m1_code(1e-300) == 0);

  // Dense: every multiple of 2^-12 in [−7, 7] (every boundary and tie among them) and its neighbours.
  std::size_t wrong = 0;
  for (int i = -7 * 4096; i <= 7 * 4096; ++i) {
    const double v = std::ldexp(static_cast<double>(i), -12);
    for (const double x : {v, std::nextafter(v, -10.0), std::nextafter(v, 10.0)}) wrong += e2m1_code(x) != oracle::e2m1_nearest(x);
  }
  std::mt19937 rng(1501);
  std::uniform_real_distribution<double> any(-6.5, 6.5);
  for (int i = 0; i < 1'000'000; ++i) {
    const double x = any(rng);
    wrong += e2m1_code(x) != oracle::e2m1_nearest(x);
  }
  CHECK(wrong == 0);
}

// ---- scales ---------------------------------------------------------------------------------

namespace {

// DeepSeek's evaluation: amax / 6 in fp32, then ceil(log2) off the quotient's bits.
int deepseek_scale_byte(float amax) {
  const std::uint32_t bits = bits_of(amax / 6.0f);
  return static_cast<int>((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0 ? 1 : 0) + 127;
}

int oracle_scale_byte(float amax) {
  float block[32] = {};
  block[7] = -amax;
  return oracle::scale_exponent(block) + 127;
}

}  // namespace

TEST_CASE("fp4: the scale byte at every exponent from 2^-126 up, and DeepSeek's fp32 evaluation", "[cache][fp4]") {
  CHECK(fp4_amax_floor == std::ldexp(6.0f, -126));
  CHECK(fp4_scale_byte(fp4_amax_floor) == 1);  // k = −126
  CHECK(oracle_scale_byte(0.0f) == 1);
  CHECK(oracle_scale_byte(std::numeric_limits<float>::denorm_min()) == 1);
  CHECK(fp4_scale_byte(std::numeric_limits<float>::max()) == 253);  // k = 126
  CHECK(oracle_scale_byte(std::numeric_limits<float>::max()) == 253);
  for (int k = -126; k <= 125; ++k) {  // 6 · 2^126 is beyond fp32
    const float amax = std::ldexp(6.0f, k);
    INFO("amax = 6 * 2^" << k);
    CHECK(fp4_scale_byte(amax) == 127 + k);
    CHECK(oracle_scale_byte(amax) == 127 + k);
    CHECK(deepseek_scale_byte(amax) == 127 + k);
    const float above = std::nextafter(amax, HUGE_VALF), below = std::nextafter(amax, 0.0f);
    CHECK(fp4_scale_byte(above) == 128 + k);
    CHECK(oracle_scale_byte(above) == 128 + k);
    CHECK(deepseek_scale_byte(above) == 128 + k);
    if (k > -126) {  // below the floor the floor decides
      CHECK(fp4_scale_byte(below) == 127 + k);
      CHECK(oracle_scale_byte(below) == 127 + k);
      CHECK(deepseek_scale_byte(below) == 127 + k);
      // Powers of two and 1.5-multiples around the boundary.
      for (const float x : {std::ldexp(1.0f, k + 2), std::ldexp(1.0f, k + 3), std::ldexp(1.25f, k + 2)}) {
        if (!std::isfinite(x)) continue;
        CHECK(fp4_scale_byte(x) == oracle_scale_byte(x));
        CHECK(deepseek_scale_byte(x) == oracle_scale_byte(x));
      }
    }
  }
  std::mt19937 rng(1502);
  std::uniform_int_distribution<std::uint32_t> pattern(bits_of(fp4_amax_floor), 0x7F7FFFFFu);
  std::size_t wrong = 0;
  for (int i = 0; i < 2'000'000; ++i) {
    float amax;
    const std::uint32_t b = pattern(rng);
    std::memcpy(&amax, &b, sizeof amax);
    wrong += fp4_scale_byte(amax) != oracle_scale_byte(amax) || deepseek_scale_byte(amax) != oracle_scale_byte(amax);
  }
  CHECK(wrong == 0);
}

TEST_CASE("fp4: blocks at every scale exponent quantize like the oracle, boundaries and ties included",
          "[cache][fp4]") {
  // Per block: channel 0 carries the amax that fixes k, the rest walk the boundaries and ties of
  // the e2m1 grid times 2^k and one fp32 ulp either side of them, with both signs.
  const double points[] = {0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0};
  std::size_t wrong = 0;
  for (int k = -126; k <= 126; ++k) {
    std::vector<float> values;
    for (double p : points) {
      const auto v = static_cast<float>(std::ldexp(p, k));
      if (!std::isfinite(std::nextafter(v, HUGE_VALF))) continue;  // 4 · 2^126 and above: beyond fp32
      values.push_back(values.size() % 2 == 0 ? v : -v);
      values.push_back(-std::nextafter(v, 0.0f));
      values.push_back(std::nextafter(v, HUGE_VALF));
    }
    // Two blocks, each led by the amax that fixes k, then 31 of the values.
    std::vector<float> y(64, 0.0f);
    y[0] = y[32] = k < 126 ? std::ldexp(6.0f, k) : std::numeric_limits<float>::max();
    for (std::size_t i = 0; i < values.size(); ++i) y[1 + i + (i >= 31 ? 1 : 0)] = values[i];
    const std::vector<std::uint8_t> got = quantize_transformed(y), want = oracle::encode_transformed(y.data(), 64);
    // The unpacked quantizer (the reader's queries; AVX-512 in builds that have it) agrees.
    CHECK(first_difference(quantize_twice(y, true), packed_like(want, 64)) == -1);
    if (got != want) {
      ++wrong;
      INFO("k = " << k << ", first differing byte " << first_difference(got, want));
      CHECK(got == want);
    }
    CHECK(got[32] == 127 + k);
    CHECK(got[33] == 127 + k);
    CHECK(decodes_like_oracle(got, 64) == "");
  }
  CHECK(wrong == 0);
  // Values at the floor's scale: 2^−127 is 0.5 · 2^−126 (code 1), 2^−128 a tie that goes to 0.
  std::vector<float> tiny(32, 0.0f);
  tiny[0] = std::ldexp(1.0f, -127), tiny[1] = std::ldexp(1.0f, -128), tiny[2] = -std::numeric_limits<float>::denorm_min();
  CHECK(quantize_twice(tiny, true) == packed_like(oracle::encode_transformed(tiny.data(), 32), 32));
  const std::vector<std::uint8_t> t = quantize_transformed(tiny);
  CHECK(t[0] == (1 | (0 << 4)));
  CHECK(t[1] == 8);  // −denorm_min rounds to −0
  CHECK(t[16] == 1);
  CHECK(t == oracle::encode_transformed(tiny.data(), 32));
}

// ---- the Hadamard transform ---------------------------------------------------------------------

TEST_CASE("fp4: the Hadamard transform equals a dense matrix product in double", "[cache][fp4]") {
  for (i64 n = 1; n <= 1024; n *= 2) CHECK(hadamard_scale(n) == oracle::hadamard_scale(n));
  CHECK(hadamard_scale(2) != 1.0 / std::sqrt(2.0));  // one ulp apart: the nearest is sqrt(0.5)
  std::mt19937 rng(1503);
  for (i64 n = 1; n <= 1024; n *= 2) {
    for (int trial = 0; trial < (n <= 128 ? 20 : 3); ++trial) {
      INFO("n = " << n << ", trial " << trial);
      // Exact sums: bit for bit.
      const std::vector<float> x = exact_sum_values(rng, n, trial * 7 - 60);
      std::vector<float> got(sz(n));
      hadamard_transform(x.data(), n, got.data());
      const std::vector<float> want = oracle::hadamard(x.data(), n);
      std::size_t wrong = 0;
      for (i64 i = 0; i < n; ++i) wrong += bits_of(got[sz(i)]) != bits_of(want[sz(i)]);
      CHECK(wrong == 0);
      // Any fp32 values, magnitudes from 2^-60 to 2^60: within the double roundings of the
      // butterflies and one fp32 rounding of the oracle's value.
      std::uniform_real_distribution<float> unit(-1.0f, 1.0f), octave(-60.0f, 60.0f);
      std::vector<float> wide(sz(n));
      double norm = 0.0;
      for (float& v : wide) {
        v = std::ldexp(unit(rng), static_cast<int>(octave(rng)));
        norm += static_cast<double>(v) * v;
      }
      hadamard_transform(wide.data(), n, got.data());
      // Where the sums round, the result is still the stated butterflies' in double, bit for bit
      // (whatever SIMD width ran them): passes h = 1, 2, 4, … over pairs (j, j + h).
      std::vector<double> butterflies(wide.begin(), wide.end());
      for (i64 h = 1; h < n; h *= 2)
        for (i64 i = 0; i < n; i += 2 * h)
          for (i64 j = i; j < i + h; ++j) {
            const double a = butterflies[sz(j)], b = butterflies[sz(j + h)];
            butterflies[sz(j)] = a + b;
            butterflies[sz(j + h)] = a - b;
          }
      std::size_t differ = 0;
      for (i64 i = 0; i < n; ++i)
        differ += bits_of(got[sz(i)]) != bits_of(static_cast<float>(butterflies[sz(i)] * hadamard_scale(n) + 0.0));
      CHECK(differ == 0);
      const std::vector<double> exact = oracle::hadamard_double(wide.data(), n);
      std::size_t outside = 0;
      for (i64 i = 0; i < n; ++i) {
        // (2^−40 ‖x‖: the oracle's own dense sums round too.)
        const double bound = std::ldexp(std::fabs(exact[sz(i)]), -24) + std::ldexp(std::sqrt(norm), -40);
        outside += std::fabs(static_cast<double>(got[sz(i)]) - exact[sz(i)]) > bound;
      }
      CHECK(outside == 0);
      // In place, and twice gives the input back (C^−1/2 H is an involution) up to rounding.
      std::vector<float> twice = x;
      hadamard_transform(twice.data(), n, twice.data());
      CHECK(twice == want);
      hadamard_transform(twice.data(), n, twice.data());
      double max_x = 0.0, max_error = 0.0;
      for (i64 i = 0; i < n; ++i) {
        max_x = std::max(max_x, std::fabs(static_cast<double>(x[sz(i)])));
        max_error = std::max(max_error, std::fabs(static_cast<double>(twice[sz(i)]) - x[sz(i)]));
      }
      CHECK(max_error <= max_x * std::ldexp(1.0, -20));
    }
  }
  // A unit vector: every channel n^−1/2 (fp32 of the double nearest), signs by the Sylvester order.
  std::vector<float> e(128, 0.0f), y(128);
  e[3] = 1.0f;
  hadamard_transform(e.data(), 128, y.data());
  for (int i = 0; i < 128; ++i) {
    const int sign = oracle::popcount(static_cast<std::uint64_t>(i & 3)) % 2 == 0 ? 1 : -1;
    CHECK(y[sz(i)] == sign * static_cast<float>(std::sqrt(0.5) / 8.0));
  }
}

// ---- whole heads ------------------------------------------------------------------------------

TEST_CASE("fp4: head layouts", "[cache][fp4]") {
  for (i64 c = 32; c <= 1024; c *= 2) {
    const fp4_head_layout l = fp4_head_layout::of(c);
    CHECK(is_fp4_channel_count(c));
    CHECK(l.blocks == c / 32);
    CHECK(l.scale_offset == c / 2);
    CHECK(l.bytes == oracle::head_bytes(c));
    CHECK(l.bytes == 17 * c / 32);
  }
  CHECK(fp4_head_layout::of(128).bytes == 68);
  for (i64 c : {0, 1, 16, 31, 33, 48, 96, 100, 2048, 4096}) CHECK(!is_fp4_channel_count(c));
}

TEST_CASE("fp4: heads quantize byte for byte like the oracle, and decode to its values", "[cache][fp4]") {
  std::mt19937 rng(1504);
  for (i64 channels = 32; channels <= 1024; channels *= 2) {
    for (int trial = 0; trial < (channels <= 256 ? 48 : 12); ++trial) {
      INFO("channels " << channels << ", trial " << trial);
      std::vector<float> x = exact_sum_values(rng, channels, -20 + (trial % 9) * 5);
      switch (trial % 12) {
        case 1: std::fill(x.begin(), x.end(), 0.0f); break;   // zeros: every scale at the floor
        case 2: std::fill(x.begin(), x.end(), -0.0f); break;  // negative zeros: the transform's zeros are +0
        case 3: for (float& v : x) v = std::ldexp(v, -150); break;  // down to fp32 subnormals
        case 4: for (float& v : x) v = std::ldexp(v, 95); break;    // scales near the top
        case 5: x[sz(channels / 3)] = std::numeric_limits<float>::quiet_NaN(); break;
        case 6: x[0] = -std::numeric_limits<float>::infinity(); break;
        case 7: std::fill(x.begin(), x.end(), std::numeric_limits<float>::max()); break;  // overflows fp32
        case 8: std::fill(x.begin(), x.end(), 0.0f), x[5] = 1.0f; break;                 // a unit vector
        default: break;
      }
      const std::vector<std::uint8_t> got = quantize(x), want = oracle::encode_head(x.data(), channels);
      CHECK(first_difference(got, want) == -1);
      CHECK(first_difference(quantize_twice(x, false), packed_like(want, channels)) == -1);
      CHECK(decodes_like_oracle(got, channels) == "");
      // The transform followed by the quantizer is what fp4_quantize_head does.
      std::vector<float> y(sz(channels));
      hadamard_transform(x.data(), channels, y.data());
      CHECK(quantize_transformed(y) == got);
    }
  }
  // Non-finite input: every block NaN (the transform mixes all channels).
  std::vector<float> x(128, 1.0f);
  x[77] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::uint8_t> nan = quantize(x);
  for (int b = 0; b < 4; ++b) CHECK(nan[sz(64 + b)] == 0xFF);
  for (int i = 0; i < 64; ++i) CHECK(nan[sz(i)] == 0);
  std::vector<float> back(128);
  fp4_dequantize_head(reinterpret_cast<const std::byte*>(nan.data()), fp4_head_layout::of(128), back.data());
  for (float v : back) CHECK(std::isnan(v));
}

TEST_CASE("fp4: dequantization equals the oracle for every code at every scale byte", "[cache][fp4]") {
  // Block b of a 1024-channel head has scale byte 8b + s for the trial's s, so 32 trials × 8
  // offsets cover all 256 bytes; its 32 channels hold the 16 codes twice.
  const i64 channels = 1024;
  for (int s = 0; s < 8; ++s) {
    std::vector<std::uint8_t> bytes(sz(oracle::head_bytes(channels)));
    for (i64 i = 0; i < channels / 2; ++i) bytes[sz(i)] = static_cast<std::uint8_t>((i % 8) * 2 | ((i % 8) * 2 + 1) << 4);
    for (i64 b = 0; b < channels / 32; ++b) bytes[sz(channels / 2 + b)] = static_cast<std::uint8_t>(8 * b + s);
    INFO("scale bytes ≡ " << s << " (mod 8)");
    CHECK(decodes_like_oracle(bytes, channels) == "");
  }
}

TEST_CASE("fp4: only |y| >= 1.75 * 2^127 comes back as Inf", "[cache][fp4]") {
  // At the largest scale, 2^126, y / s = 3.5 is the tie between 3 and 4 and goes to 4: 2^128.
  const float limit = std::ldexp(1.75f, 127);
  for (const float v : {limit, std::nextafter(limit, 0.0f), std::numeric_limits<float>::max()}) {
    std::vector<float> y(32, 1.0f);
    y[9] = -v;
    const std::vector<std::uint8_t> bytes = quantize_transformed(y);
    CHECK(bytes[16] == 253);
    std::vector<float> back(32);
    fp4_dequantize_head(reinterpret_cast<const std::byte*>(bytes.data()), fp4_head_layout::of(32), back.data());
    INFO("y = " << v);
    CHECK(std::isinf(back[9]) == (v >= limit));
    CHECK(std::signbit(back[9]));
    CHECK(back[0] == 0.0f);
  }
}

TEST_CASE("fp4: a hand-made 128-channel key, byte by byte", "[cache][fp4]") {
  // Transformed values given directly: block b (b = 0 … 3) has the scale 2^(b − 1), byte 126 + b.
  // Its channel 0 is 6 · 2^(b−1) (code 7), channel 1 is −0.5 · 2^(b−1) (code 9): byte 0x97;
  // channel 2 is 1.25 · 2^(b−1), a tie that goes to 1 (code 2), channel 3 is −0 (code 8): 0x82;
  // channel 4 is 3.5 · 2^(b−1), a tie that goes to 4 (code 6), channel 5 is 5 · 2^(b−1), a tie
  // that goes to 4 (code 6): 0x66; channel 31 is −1.75 · 2^(b−1), a tie that goes to −2 (code 12),
  // with channel 30 zero: byte 15 = 0xC0. The rest are 0.
  std::vector<float> y(128, 0.0f);
  std::vector<std::uint8_t> want(68, 0);
  for (int b = 0; b < 4; ++b) {
    const float s = std::ldexp(1.0f, b - 1);
    float* block = y.data() + 32 * b;
    block[0] = 6 * s, block[1] = -0.5f * s, block[2] = 1.25f * s, block[3] = -0.0f;
    block[4] = 3.5f * s, block[5] = 5 * s, block[31] = -1.75f * s;
    want[sz(16 * b + 0)] = 0x97, want[sz(16 * b + 1)] = 0x82, want[sz(16 * b + 2)] = 0x66, want[sz(16 * b + 15)] = 0xC0;
    want[sz(64 + b)] = static_cast<std::uint8_t>(126 + b);
  }
  CHECK(quantize_transformed(y) == want);
  CHECK(oracle::encode_transformed(y.data(), 128) == want);
  // Through the transform: x = H̃ y (H̃ is its own inverse) gives y back up to fp32 rounding —
  // which moves the ties and zeros above off their boundaries, so only the oracle knows the bytes.
  std::vector<float> x(128);
  hadamard_transform(y.data(), 128, x.data());
  CHECK(quantize(x) == oracle::encode_head(x.data(), 128));
}

// ---- pools and caches ---------------------------------------------------------------------------

namespace {

page_pool_config fp4_pool(i64 kv_heads, i64 channels, i64 page_size) {
  return phasekv_test::pool_of("ix", page_size, kv_heads, channels, 4, storage_type::fp4_e2m1_hadamard);
}

}  // namespace

TEST_CASE("fp4: a page pool lays heads and entries out at the documented strides", "[cache][fp4][page_pool]") {
  struct shape {
    i64 kv_heads, channels, page_size, head_bytes;
  };
  for (const shape& s : {shape{1, 128, 64, 68}, shape{3, 32, 5, 17}, shape{2, 256, 3, 136}, shape{1, 1024, 7, 544}}) {
    INFO("kv_heads " << s.kv_heads << ", channels " << s.channels);
    page_pool pool(fp4_pool(s.kv_heads, s.channels, s.page_size));
    const page_layout& l = pool.layout();
    CHECK(l.storage == storage_type::fp4_e2m1_hadamard);
    CHECK(l.element_bytes == 1);
    CHECK(l.rope_channels == 0);
    CHECK(l.head_stride_bytes == s.head_bytes);
    CHECK(l.head_stride == s.head_bytes);
    CHECK(l.entry_stride_bytes == s.kv_heads * s.head_bytes);
    CHECK(l.page_stride_bytes == (s.page_size * l.entry_stride_bytes + 63) / 64 * 64);
    CHECK(l.page_stride == l.page_stride_bytes);
    CHECK(l.fp4().bytes == s.head_bytes);
    CHECK(l.values_per_entry() == s.kv_heads * s.channels);

    // Every slot of two pages written; each head's bytes are the oracle's, where the layout says,
    // and read back as the stored, transformed values.
    std::mt19937 rng(1505);
    const auto make_entry = [&] {
      std::vector<float> entry;
      for (i64 h = 0; h < s.kv_heads; ++h) {
        const auto x = exact_sum_values(rng, s.channels, -20 - static_cast<int>(h));
        entry.insert(entry.end(), x.begin(), x.end());
      }
      return entry;
    };
    CHECK(phasekv_test::block_pool_mismatch(
              pool, s, make_entry, [&](const float* x) { return oracle::encode_head(x, s.channels); },
              [&](const std::vector<std::uint8_t>& bytes) { return oracle::decode_head(bytes.data(), s.channels); }) ==
          "");
  }
}

TEST_CASE("fp4: shapes and calls a pool cannot take are errors that name the field", "[cache][fp4][errors]") {
  for (i64 channels : {100, 16, 48, 2048}) {
    INFO("channels " << channels);
    const auto config = fp4_pool(1, channels, 4);
    CHECK_THAT(message_of<config_error>([&] { config.validate(); }),
               Contains("ix.channels = " + std::to_string(channels) +
                        ": must be a power of two in [32, 1024] for fp4_e2m1_hadamard storage"));
  }
  auto config = fp4_pool(1, 128, 4);
  config.rope_channels = 64;
  CHECK_THAT(message_of<config_error>([&] { page_pool{config}; }),
             Contains("ix.rope_channels = 64: must be 0 for fp4_e2m1_hadamard storage"));

  phasekv_test::check_block_storage_type(storage_type::fp4_e2m1_hadamard, "fp4_e2m1_hadamard");
  CHECK(is_block_storage(storage_type::fp8_e4m3_block));
  CHECK(!is_valid(static_cast<storage_type>(5)));
}

using phasekv_test::append_random;
using phasekv_test::csa_cache;
using phasekv_test::csa_config;
using phasekv_test::make_csa_layer;

TEST_CASE("fp4: a DeepSeek-V4 cache quantizes the indexer's entries; views have the 68-byte stride; 17 bytes a token",
          "[cache][fp4]") {
  const csa_cache::layer layer = make_csa_layer();
  const storage_type fp4 = storage_type::fp4_e2m1_hadamard, fp8 = storage_type::fp8_e4m3_block;
  for (i64 page_size : {1, 7, 64}) {
    INFO("page_size " << page_size);
    csa_cache quantized(layer, csa_config("fp4", page_size, {fp8, fp4}));
    csa_cache exact(layer, csa_config("f32", page_size, {}));
    CHECK(quantized.pool(1).layout().rope_channels == 0);  // the transform mixes the RoPE channels in
    CHECK(quantized.pool(1).layout().entry_stride_bytes == 68);
    CHECK(quantized.shape().streams[1].storage == fp4);

    std::mt19937 rng(1506);
    const phasekv_test::twin_sequences twins = phasekv_test::fill_twins(quantized, exact, rng);
    const sequence_id a = twins.quantized, b = twins.exact;
    for (const auto& [seq, twin] : {std::pair<sequence_id, sequence_id>{a, b}, {twins.quantized_fork, twins.exact_fork}}) {
      const sequence_view v = quantized.view_of(seq);
      const paged_view csr = quantized.view(span<const sequence_id>(&seq, 1), 1);
      CHECK(csr.layout.entry_stride_bytes == 68);
      CHECK(csr.layout.head_stride_bytes == 68);
      CHECK(csr.layout.page_stride_bytes == (page_size * 68 + 63) / 64 * 64);
      const stream_view& sv = v.streams[1];
      CHECK(sv.layout.entry_stride_bytes == 68);
      for (i64 j = 0; j < sv.entries; ++j) {
        // The bytes a host finds by the CSR arithmetic are the oracle's transform and
        // quantization of the fp32 cache's entry (the compressor's output).
        std::vector<float> entry(128);
        exact.read_entry(twin, 1, j, entry.data());
        const auto want = oracle::encode_head(entry.data(), 128);
        const std::byte* at = phasekv_test::entry_at(sv, page_size, j);
        CHECK(phasekv_test::entry_at(csr, page_size, j) == at);
        INFO("entry " << j);
        CHECK(std::memcmp(at, want.data(), want.size()) == 0);
      }
    }
    // memory(): 584 bytes per K/V entry, 68 per indexer key: 17 bytes per token of indexer keys.
    const sequence_memory m = quantized.memory(a);
    const i64 entries = quantized.entries(a, 1);
    CHECK(quantized.entries(a, 0) == entries);
    CHECK(m.entry_bytes == entries * 584 + entries * 68);
    CHECK(68 / presets::deepseek_v4_csa_layer.geom.stride == 17);
    const sequence_memory f32 = exact.memory(b);
    CHECK(f32.entry_bytes - m.entry_bytes == entries * (2048 - 584) + entries * (512 - 68));
  }
}

TEST_CASE("fp4: only an indexer stream may be stored in FP4; shared pools must match", "[cache][fp4][errors]") {
  const csa_cache::layer layer = make_csa_layer();
  const storage_type fp4 = storage_type::fp4_e2m1_hadamard;
  // The K/V stream (512 channels: a valid FP4 count) is not an indexer.
  CHECK_THAT(message_of<config_error>([&] { csa_cache(layer, csa_config("c", 8, {fp4, fp4})); }),
             Contains("c.stream_storage[0] = fp4_e2m1_hadamard: is for indexer streams only"));
  cache_config all = csa_config("d", 8, {});
  all.storage = fp4;
  CHECK_THAT(message_of<config_error>([&] { csa_cache(layer, all); }),
             Contains("d.storage = fp4_e2m1_hadamard: is for indexer streams only"));
  auto shared = std::make_shared<page_pool>(fp4_pool(1, 128, 8));
  cache_config c = csa_config("e", 8, {storage_type::f32, storage_type::bf16});
  c.shared_pools = {nullptr, shared};
  CHECK_THAT(message_of<config_error>([&] { csa_cache cache(layer, c); }),
             Contains("e.shared_pools[1] = ix: stores fp4_e2m1_hadamard, the stream stores bf16"));
  c.stream_storage = {storage_type::f32, fp4};
  CHECK_NOTHROW(csa_cache(layer, c));
}

TEST_CASE("fp4: snapshots move FP4 streams byte for byte and into nothing else", "[cache][fp4][snapshot]") {
  const csa_cache::layer layer = make_csa_layer();
  const storage_type fp4 = storage_type::fp4_e2m1_hadamard, fp8 = storage_type::fp8_e4m3_block;
  csa_cache source(layer, csa_config("src", 7, {fp8, fp4})), twin(layer, csa_config("twin", 7, {fp8, fp4}));
  std::mt19937 rng(1507);
  const sequence_id seq = source.create(), unused = twin.create();
  append_random(source, twin, seq, unused, 61, rng);
  const std::vector<std::byte> bytes = snapshot(source, seq);

  csa_cache destination(layer, csa_config("dst", 5, {fp8, fp4}));  // another page size
  const sequence_id moved = restore(destination, bytes);
  const sequence_view a = source.view_of(seq), b = destination.view_of(moved);
  REQUIRE(a.streams[1].entries == b.streams[1].entries);
  for (i64 j = 0; j < a.streams[1].entries; ++j) {
    const auto at = [](const stream_view& s, i64 e) {
      return s.base + s.pages[sz(e / s.layout.page_size)] * s.layout.page_stride_bytes + (e % s.layout.page_size) * 68;
    };
    CHECK(std::memcmp(at(a.streams[1], j), at(b.streams[1], j), 68) == 0);
  }
  // FP4 into f32 (or anything else) is refused: the values are in the transformed basis.
  for (const storage_type other : {storage_type::f32, storage_type::bf16}) {
    csa_cache wrong(layer, csa_config("wrong", 7, {fp8, other}));
    CHECK_THAT(message_of<input_error>([&] { restore(wrong, bytes); }),
               Contains("entries are stored as fp4_e2m1_hadamard; the cache stores " + std::string(to_string(other))));
    CHECK(wrong.sequences() == 0);
  }
  // And nothing converts into FP4.
  csa_cache f32_source(layer, csa_config("f32", 7, {fp8, storage_type::f32}));
  const sequence_id s32 = f32_source.create();
  csa_cache scratch(layer, csa_config("scratch", 7, {fp8, storage_type::f32}));
  const sequence_id s_unused = scratch.create();
  append_random(f32_source, scratch, s32, s_unused, 13, rng);
  CHECK_THAT(message_of<input_error>([&] { restore(destination, snapshot(f32_source, s32)); }),
             Contains("entries are stored as f32; the cache stores fp4_e2m1_hadamard"));
}

}  // namespace test_cache_fp4
