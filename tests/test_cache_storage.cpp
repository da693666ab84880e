// Storage types and their conversions (include/phasekv/format/storage.hpp).
//
// The oracles here are written from the IEEE definitions, not from the implementation:
//   - a 16-bit pattern is decoded to double by the textbook formula (sign, biased exponent,
//     implicit bit, subnormals);
//   - the correctly rounded narrowing of x is found by locating x between its two neighbouring
//     representable values (for f16: in the sorted table of all finite f16 values; for bf16: the
//     truncation of x and the next pattern up) and comparing with their exact midpoint, ties to
//     the even pattern. Overflow follows IEEE 754: round as if the exponent were unbounded, and
//     a result beyond the largest finite value is Inf.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "support/common.hpp"
#include "phasekv/format/storage.hpp"

namespace test_cache_storage {

namespace {

using phasekv::storage_type;

using phasekv_test::bits_of;
using phasekv_test::float_of;

// ---- decoding by the IEEE formula ----------------------------------------------------------

double decode_f16(std::uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);  // subnormal: 0.m · 2^-14
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    magnitude = std::ldexp(1024 + mantissa, exponent - 15 - 10);  // 1.m · 2^(e-15)
  }
  return (bits & 0x8000) ? -magnitude : magnitude;
}

double decode_bf16(std::uint16_t bits) {
  const int exponent = (bits >> 7) & 0xFF;
  const int mantissa = bits & 0x7F;
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -126 - 7);
  } else if (exponent == 255) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    magnitude = std::ldexp(128 + mantissa, exponent - 127 - 7);
  }
  return (bits & 0x8000) ? -magnitude : magnitude;
}

// ---- correctly rounded narrowing, by neighbours -------------------------------------------

struct neighbour {
  double value;         // magnitude, with the exponent treated as unbounded
  std::uint16_t bits;   // the pattern the rounded result is encoded as
};

// Picks between lower ≤ magnitude ≤ upper: nearer one wins, a tie goes to the even pattern.
std::uint16_t nearest_of(double magnitude, const neighbour& lower, const neighbour& upper) {
  if (magnitude == lower.value) return lower.bits;
  if (magnitude == upper.value) return upper.bits;
  const double midpoint = (lower.value + upper.value) / 2;  // exact: both have few significant bits
  if (magnitude < midpoint) return lower.bits;
  if (magnitude > midpoint) return upper.bits;
  return (lower.bits & 1) == 0 ? lower.bits : upper.bits;
}

// Every finite non-negative f16 value, sorted, followed by 2^16 — the next value if the exponent
// were unbounded — which encodes as +Inf.
const std::vector<neighbour>& f16_magnitudes() {
  static const std::vector<neighbour> table = [] {
    std::vector<neighbour> values;
    for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
      const double value = decode_f16(static_cast<std::uint16_t>(bits));
      if (std::isfinite(value) && !std::signbit(value)) values.push_back({value, static_cast<std::uint16_t>(bits)});
    }
    std::sort(values.begin(), values.end(), [](const neighbour& a, const neighbour& b) { return a.value < b.value; });
    values.push_back({65536.0, 0x7C00});
    return values;
  }();
  return table;
}

// Correctly rounded f16 pattern of a finite x.
std::uint16_t oracle_f16(float x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double magnitude = std::fabs(static_cast<double>(x));
  const auto& table = f16_magnitudes();
  if (magnitude >= table.back().value) return sign | 0x7C00;
  const auto upper = std::lower_bound(table.begin(), table.end(), magnitude,
                                      [](const neighbour& entry, double m) { return entry.value < m; });
  if (upper->value == magnitude) return sign | upper->bits;
  return sign | nearest_of(magnitude, *(upper - 1), *upper);
}

// Correctly rounded bf16 pattern of a finite x: between the truncated pattern and the next one
// up (which is +Inf, worth 2^128 with an unbounded exponent, above the largest finite bf16).
std::uint16_t oracle_bf16(float x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double magnitude = std::fabs(static_cast<double>(x));
  const auto truncated = static_cast<std::uint16_t>((bits_of(x) >> 16) & 0x7FFF);
  const auto next = static_cast<std::uint16_t>(truncated + 1);
  const double next_value = next == 0x7F80 ? std::ldexp(1.0, 128) : decode_bf16(next);
  return sign | nearest_of(magnitude, {decode_bf16(truncated), truncated}, {next_value, next});
}

// ---- inputs ---------------------------------------------------------------------------------

std::vector<float> edge_cases() {
  const std::uint32_t patterns[] = {
      0x00000000, 0x80000000,              // ±0
      0x00000001, 0x80000001, 0x007FFFFF,  // f32 subnormals
      0x00008000, 0x00018000, 0x00007FFF,  // f32 subnormals that are bf16 ties / near ties
      0x00800000, 0x3F800000, 0xBF800000,  // smallest normal, ±1
      0x3F808000, 0x3F818000, 0x3F807FFF,  // bf16 ties to even (down, up) and a near tie
      0x7F7F0000, 0x7F7F7FFF, 0x7F7F8000,  // largest finite bf16; just below / at the tie to Inf
      0x7F7FFFFF, 0xFF7FFFFF,              // ±FLT_MAX
      0x7F800000, 0xFF800000,              // ±Inf
      0x477FE000, 0x477FEFFF, 0x477FF000,  // 65504; just below the f16 overflow tie; the tie
      0x477FF001, 0x47800000, 0xC77FF000,  // above it; 65536; −65520
      0x38800000, 0x387FFFFF, 0x387FF000,  // 2^-14 (smallest normal f16), just below, f16 tie
      0x33800000, 0x33000000, 0x33000001,  // 2^-24 (smallest subnormal f16), 2^-25 (tie to 0), above
      0x32FFFFFF, 0xB3000000, 0xB3000001,  // below 2^-25; −2^-25; just past it
      0x33C00000, 0x34200000,              // 1.5 · 2^-24 (tie to 2 · 2^-24), 2.5 · 2^-24 (tie to 2)
      0x3A800000, 0x3A801000, 0x3A803000,  // exact f16 1/1024 region, ties down and up
  };
  std::vector<float> values;
  for (std::uint32_t bits : patterns) values.push_back(float_of(bits));
  return values;
}

std::vector<std::uint32_t> nan_patterns() {
  return {0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0x7F802000, 0x7FA5A5A5};
}

// Edge cases, uniform bit patterns (every exponent, NaNs included), floats whose exponents span
// f16's range from underflow to overflow, and exact f16 and bf16 midpoints with their float
// neighbours.
std::vector<float> test_inputs(std::uint64_t seed, std::size_t per_kind) {
  std::mt19937_64 random(seed);
  std::vector<float> values = edge_cases();
  for (std::uint32_t bits : nan_patterns()) values.push_back(float_of(bits));
  std::uniform_int_distribution<std::uint32_t> any_bits;
  std::uniform_int_distribution<std::uint32_t> f16_range_exponent(127 - 28, 127 + 17);
  std::uniform_int_distribution<std::uint32_t> mantissa(0, 0x7FFFFF);
  std::uniform_int_distribution<std::uint32_t> finite_f16(0, 0x7BFE);
  std::uniform_int_distribution<std::uint32_t> finite_bf16(0, 0x7F7E);
  for (std::size_t i = 0; i < per_kind; ++i) {
    values.push_back(float_of(any_bits(random)));
    const std::uint32_t sign = (any_bits(random) & 1u) << 31;
    values.push_back(float_of(sign | (f16_range_exponent(random) << 23) | mantissa(random)));

    const auto f16 = static_cast<std::uint16_t>(finite_f16(random));
    const auto f16_midpoint = static_cast<float>((decode_f16(f16) + decode_f16(static_cast<std::uint16_t>(f16 + 1))) / 2);
    const auto bf16_midpoint = (finite_bf16(random) << 16) | 0x8000u;
    for (std::uint32_t tie_bits : {bits_of(f16_midpoint), bf16_midpoint}) {
      values.push_back(float_of(sign | tie_bits));
      values.push_back(float_of(sign | (tie_bits + 1)));
      if ((tie_bits & 0x7FFFFFFF) != 0) values.push_back(float_of(sign | (tie_bits - 1)));
    }
  }
  return values;
}

bool is_quiet_nan_f16(std::uint16_t bits) { return (bits & 0x7C00) == 0x7C00 && (bits & 0x0200) != 0; }
bool is_quiet_nan_bf16(std::uint16_t bits) { return (bits & 0x7F80) == 0x7F80 && (bits & 0x0040) != 0; }

}  // namespace

TEST_CASE("storage_type: element sizes and names", "[cache][storage]") {
  CHECK(phasekv::bytes_per_element(storage_type::f32) == 4);
  CHECK(phasekv::bytes_per_element(storage_type::bf16) == 2);
  CHECK(phasekv::bytes_per_element(storage_type::f16) == 2);
  CHECK(std::string(phasekv::to_string(storage_type::f32)) == "f32");
  CHECK(std::string(phasekv::to_string(storage_type::bf16)) == "bf16");
  CHECK(std::string(phasekv::to_string(storage_type::f16)) == "f16");
  std::ostringstream out;
  out << storage_type::bf16;
  CHECK(out.str() == "bf16");
}

TEST_CASE("storage: widening decodes every 16-bit pattern exactly", "[cache][storage]") {
  for (std::uint32_t pattern = 0; pattern <= 0xFFFF; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    INFO("pattern 0x" << std::hex << pattern);
    const double f16_expected = decode_f16(bits);
    const float f16_value = phasekv::f16_to_float(bits);
    const double bf16_expected = decode_bf16(bits);
    const float bf16_value = phasekv::bf16_to_float(bits);
    if (std::isnan(f16_expected)) {
      // A NaN stays NaN with its sign and payload; a signalling one comes back quiet (as F16C does).
      REQUIRE(std::isnan(f16_value));
      REQUIRE(bits_of(f16_value) == (((bits & 0x8000u) << 16) | 0x7FC00000u | ((bits & 0x3FFu) << 13)));
    } else {
      REQUIRE(static_cast<double>(f16_value) == f16_expected);
      REQUIRE(std::signbit(f16_value) == std::signbit(f16_expected));
      REQUIRE(phasekv::float_to_f16(f16_value) == bits);  // narrowing an f16 value is the identity
    }
    if (std::isnan(bf16_expected)) {
      REQUIRE(bits_of(bf16_value) == static_cast<std::uint32_t>(bits) << 16);  // bit for bit
    } else {
      REQUIRE(static_cast<double>(bf16_value) == bf16_expected);
      REQUIRE(std::signbit(bf16_value) == std::signbit(bf16_expected));
      REQUIRE(phasekv::float_to_bf16(bf16_value) == bits);
    }
  }
}

TEST_CASE("storage: narrowing rounds to nearest even like the neighbour oracle", "[cache][storage]") {
  const auto seed = GENERATE(1ull, 2ull, 3ull);
  const std::vector<float> inputs = test_inputs(seed, 100000);
  std::size_t checked = 0;
  for (float x : inputs) {
    if (std::isnan(x)) continue;
    INFO("input 0x" << std::hex << bits_of(x) << std::dec << " = " << x);
    const std::uint16_t f16 = phasekv::float_to_f16(x);
    const std::uint16_t bf16 = phasekv::float_to_bf16(x);
    if (f16 != oracle_f16(x)) REQUIRE(f16 == oracle_f16(x));  // REQUIRE only on failure: keeps the assertion count sane
    if (bf16 != oracle_bf16(x)) REQUIRE(bf16 == oracle_bf16(x));
    ++checked;
  }
  CHECK(checked > 3 * 100000);
}

TEST_CASE("storage: special values", "[cache][storage]") {
  const float inf = std::numeric_limits<float>::infinity();
  SECTION("signed zeros keep their sign") {
    CHECK(phasekv::float_to_f16(0.0f) == 0x0000);
    CHECK(phasekv::float_to_f16(-0.0f) == 0x8000);
    CHECK(phasekv::float_to_bf16(0.0f) == 0x0000);
    CHECK(phasekv::float_to_bf16(-0.0f) == 0x8000);
    CHECK(std::signbit(phasekv::f16_to_float(0x8000)));
    CHECK(std::signbit(phasekv::bf16_to_float(0x8000)));
  }
  SECTION("infinities stay infinite") {
    CHECK(phasekv::float_to_f16(inf) == 0x7C00);
    CHECK(phasekv::float_to_f16(-inf) == 0xFC00);
    CHECK(phasekv::float_to_bf16(inf) == 0x7F80);
    CHECK(phasekv::float_to_bf16(-inf) == 0xFF80);
    CHECK(phasekv::f16_to_float(0x7C00) == inf);
    CHECK(phasekv::bf16_to_float(0xFF80) == -inf);
  }
  SECTION("f16 overflow: 65504 is the largest finite value, 65520 rounds to Inf") {
    CHECK(phasekv::float_to_f16(65504.0f) == 0x7BFF);
    CHECK(phasekv::float_to_f16(65519.996f) == 0x7BFF);
    CHECK(phasekv::float_to_f16(65520.0f) == 0x7C00);
    CHECK(phasekv::float_to_f16(-65520.0f) == 0xFC00);
    CHECK(phasekv::float_to_f16(1e6f) == 0x7C00);
    CHECK(phasekv::float_to_f16(std::numeric_limits<float>::max()) == 0x7C00);
  }
  SECTION("bf16 overflow: FLT_MAX rounds to Inf") {
    CHECK(phasekv::float_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);
    CHECK(phasekv::float_to_bf16(float_of(0x7F7F7FFF)) == 0x7F7F);
  }
  SECTION("f16 subnormals and underflow") {
    CHECK(phasekv::float_to_f16(std::ldexp(1.0f, -24)) == 0x0001);
    CHECK(phasekv::float_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and 2^-24: even
    CHECK(phasekv::float_to_f16(-std::ldexp(1.0f, -25)) == 0x8000);
    CHECK(phasekv::float_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
    CHECK(phasekv::float_to_f16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 · 2^-24: tie up to even
    CHECK(phasekv::float_to_f16(std::ldexp(1023.0f, -24)) == 0x03FF);
    CHECK(phasekv::float_to_f16(std::ldexp(2047.0f, -25)) == 0x0400);  // rounds up into the normals
    CHECK(phasekv::float_to_f16(std::numeric_limits<float>::denorm_min()) == 0x0000);
    CHECK(phasekv::f16_to_float(0x0001) == std::ldexp(1.0f, -24));
    CHECK(phasekv::f16_to_float(0x83FF) == -std::ldexp(1023.0f, -24));
  }
  SECTION("bf16 keeps f32 subnormals (no flush to zero)") {
    CHECK(phasekv::float_to_bf16(float_of(0x00010000)) == 0x0001);
    CHECK(phasekv::float_to_bf16(float_of(0x80400000)) == 0x8040);
    CHECK(phasekv::float_to_bf16(float_of(0x00008000)) == 0x0000);  // tie to even
    CHECK(phasekv::float_to_bf16(float_of(0x00018000)) == 0x0002);
  }
  SECTION("NaN stays NaN, quiet, with its sign") {
    for (std::uint32_t pattern : nan_patterns()) {
      INFO("NaN 0x" << std::hex << pattern);
      const float nan = float_of(pattern);
      const std::uint16_t f16 = phasekv::float_to_f16(nan);
      const std::uint16_t bf16 = phasekv::float_to_bf16(nan);
      CHECK(is_quiet_nan_f16(f16));
      CHECK(is_quiet_nan_bf16(bf16));
      CHECK((f16 >> 15) == (pattern >> 31));
      CHECK((bf16 >> 15) == (pattern >> 31));
      CHECK((f16 & 0x1FF) == ((pattern >> 13) & 0x1FF));  // payload below the quiet bit kept
      CHECK((bf16 & 0x3F) == ((pattern >> 16) & 0x3F));
      CHECK(std::isnan(phasekv::f16_to_float(f16)));
      CHECK(std::isnan(phasekv::bf16_to_float(bf16)));
    }
  }
}

TEST_CASE("storage: round-trip error bounds", "[cache][storage]") {
  std::mt19937_64 random(7);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> bf16_exponent(-120, 120);
  std::uniform_int_distribution<int> f16_normal_exponent(-14, 15);
  std::uniform_int_distribution<int> f16_subnormal_exponent(-26, -15);
  double worst_bf16 = 0, worst_f16 = 0, worst_f16_subnormal = 0;
  for (int i = 0; i < 200000; ++i) {
    const double mantissa = unit(random);
    const float x = static_cast<float>(std::ldexp(mantissa, bf16_exponent(random)));
    if (std::fabs(x) < std::numeric_limits<float>::min()) continue;  // f32 subnormals carry fewer bits
    worst_bf16 = std::max(worst_bf16, std::fabs(phasekv::bf16_to_float(phasekv::float_to_bf16(x)) - static_cast<double>(x)) /
                                          std::fabs(static_cast<double>(x)));

    const float y = std::clamp(static_cast<float>(std::ldexp(mantissa, f16_normal_exponent(random))), -65504.0f, 65504.0f);
    if (std::fabs(y) >= std::ldexp(1.0f, -14)) {
      worst_f16 = std::max(worst_f16, std::fabs(phasekv::f16_to_float(phasekv::float_to_f16(y)) - static_cast<double>(y)) /
                                          std::fabs(static_cast<double>(y)));
    }
    const float z = static_cast<float>(std::ldexp(mantissa, f16_subnormal_exponent(random)));
    worst_f16_subnormal = std::max(
        worst_f16_subnormal, std::fabs(phasekv::f16_to_float(phasekv::float_to_f16(z)) - static_cast<double>(z)));
  }
  // Round to nearest errs by at most the unit roundoff u = 2^-p, p the significant bits counting
  // the implicit one: bf16 has p = 8 (so 2^-8, not 2^-9), f16 has p = 11.
  CHECK(worst_bf16 <= std::ldexp(1.0, -8));
  CHECK(worst_f16 <= std::ldexp(1.0, -11));
  CHECK(worst_f16_subnormal <= std::ldexp(1.0, -25));  // half the subnormal spacing 2^-24
  CHECK(worst_bf16 > std::ldexp(1.0, -9));  // the bounds are tight, not vacuous
  CHECK(worst_f16 > std::ldexp(1.0, -12));
  CHECK(worst_f16_subnormal > std::ldexp(1.0, -26));
}

TEST_CASE("storage: row conversions are bit-identical to the scalar functions", "[cache][storage]") {
  // Millions of patterns through store_row, compared element by element: this is what allows the
  // SIMD paths (F16C / AVX-512) to be used at all.
  std::vector<float> inputs = test_inputs(11, 1 << 20);
  std::mt19937_64 random(12);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  while (inputs.size() < (std::size_t{1} << 22)) inputs.push_back(float_of(any_bits(random)));
  const auto n = static_cast<std::int64_t>(inputs.size());

  std::vector<std::uint16_t> narrow(inputs.size());
  std::vector<float> wide(inputs.size());
  std::size_t mismatches = 0;

  phasekv::store_row(inputs.data(), narrow.data(), n, storage_type::bf16);
  for (std::size_t i = 0; i < inputs.size(); ++i) mismatches += narrow[i] != phasekv::float_to_bf16(inputs[i]);
  CHECK(mismatches == 0);

  phasekv::store_row(inputs.data(), narrow.data(), n, storage_type::f16);
  mismatches = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) mismatches += narrow[i] != phasekv::float_to_f16(inputs[i]);
  CHECK(mismatches == 0);

  std::vector<float> copy(inputs.size());
  phasekv::store_row(inputs.data(), copy.data(), n, storage_type::f32);
  CHECK(std::memcmp(copy.data(), inputs.data(), inputs.size() * sizeof(float)) == 0);
  phasekv::load_row(copy.data(), wide.data(), n, storage_type::f32);
  CHECK(std::memcmp(wide.data(), inputs.data(), inputs.size() * sizeof(float)) == 0);

  // Every 16-bit pattern through load_row.
  std::vector<std::uint16_t> patterns(0x10000);
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) patterns[bits] = static_cast<std::uint16_t>(bits);
  phasekv::load_row(patterns.data(), wide.data(), 0x10000, storage_type::f16);
  mismatches = 0;
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    mismatches += bits_of(wide[bits]) != bits_of(phasekv::f16_to_float(patterns[bits]));
  }
  CHECK(mismatches == 0);
  phasekv::load_row(patterns.data(), wide.data(), 0x10000, storage_type::bf16);
  mismatches = 0;
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    mismatches += bits_of(wide[bits]) != bits_of(phasekv::bf16_to_float(patterns[bits]));
  }
  CHECK(mismatches == 0);
}

TEST_CASE("storage: rows of every length and offset (SIMD bodies and scalar tails)", "[cache][storage]") {
  const std::vector<float> inputs = test_inputs(21, 64);
  const storage_type type = GENERATE(storage_type::f32, storage_type::bf16, storage_type::f16);
  const std::int64_t element_bytes = phasekv::bytes_per_element(type);
  for (std::int64_t length = 0; length <= 70; ++length) {
    for (std::int64_t offset = 0; offset < 5; ++offset) {
      INFO(phasekv::to_string(type) << " length " << length << " offset " << offset);
      // Guard elements around the destination catch writes past the row.
      std::vector<unsigned char> stored(static_cast<std::size_t>((length + offset + 8) * element_bytes), 0xAB);
      unsigned char* destination = stored.data() + offset * element_bytes;
      const float* source = inputs.data() + offset;
      phasekv::store_row(source, destination, length, type);
      std::vector<float> loaded(static_cast<std::size_t>(length) + 1, -1.0f);
      phasekv::load_row(destination, loaded.data(), length, type);
      for (std::int64_t i = 0; i < length; ++i) {
        std::uint32_t expected = bits_of(source[i]);
        if (type == storage_type::bf16) expected = bits_of(phasekv::bf16_to_float(phasekv::float_to_bf16(source[i])));
        if (type == storage_type::f16) expected = bits_of(phasekv::f16_to_float(phasekv::float_to_f16(source[i])));
        if (bits_of(loaded[static_cast<std::size_t>(i)]) != expected) {
          REQUIRE(bits_of(loaded[static_cast<std::size_t>(i)]) == expected);
        }
      }
      REQUIRE(loaded[static_cast<std::size_t>(length)] == -1.0f);
      for (std::size_t b = 0; b < stored.size(); ++b) {
        const bool inside = b >= static_cast<std::size_t>(offset * element_bytes) &&
                            b < static_cast<std::size_t>((offset + length) * element_bytes);
        if (!inside) REQUIRE(stored[b] == 0xAB);
      }
    }
  }
}

TEST_CASE("storage: row functions reject bad arguments", "[cache][storage]") {
  float source[4] = {1, 2, 3, 4};
  alignas(4) unsigned char destination[20] = {};
  using Catch::Matchers::Contains;
  CHECK_THROWS_AS(phasekv::store_row(source, destination, -1, storage_type::f32), phasekv::input_error);
  CHECK_THROWS_WITH(phasekv::store_row(source, destination, -1, storage_type::f32),
                    Contains("row length = -1") && Contains("non-negative"));
  CHECK_THROWS_AS(phasekv::load_row(destination, nullptr, 3, storage_type::bf16), phasekv::input_error);
  CHECK_THROWS_WITH(phasekv::store_row(source, destination + 1, 4, storage_type::f16),
                    Contains("row length = 4") && Contains("aligned") && Contains("f16"));
  CHECK_THROWS_AS(phasekv::store_row(source, destination, 2, static_cast<storage_type>(7)), phasekv::input_error);
  CHECK_NOTHROW(phasekv::store_row(nullptr, nullptr, 0, storage_type::f16));  // an empty row is fine
  CHECK_NOTHROW(phasekv::store_row(source, destination + 2, 4, storage_type::bf16));
}

}  // namespace test_cache_storage
