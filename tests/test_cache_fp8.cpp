// FP8 entries (include/phasekv/format/fp8.hpp): DeepSeek-V4's e4m3fn/UE8M0 block format.
//
// Held to oracle/fp8_format.hpp, a double-precision twin written from the format's description:
//   - every one of the 256 e4m3 codes decodes to its value and encodes back;
//   - encoding equals the nearest-even oracle on a dense sample of fp32 patterns (every exponent,
//     every top mantissa bit pattern, the low bits at and around the rounding boundaries) and on
//     random patterns; ties go to the even code; ±448 and beyond saturate; NaN stays NaN;
//   - the block scale on its edge cases (amax exactly 448 · 2^k, amax at and below the 1e-4 floor,
//     zeros, the largest fp32) and on random amax;
//   - whole heads byte for byte against the oracle's encoder, for DeepSeek's 512/64 shape and
//     for generic shapes (partial last block, odd code counts, no RoPE channels, only RoPE
//     channels, multi-head entries), including negative zero, subnormal codes, NaN and Inf;
//   - a hand-made 512-channel entry whose every byte is written out here: codes at [0, 448),
//     bf16 at [448, 576), scales at [576, 583), byte 583 zero;
//   - SIMD dequantization equals the scalar functions for every code at every scale byte, and
//     for every channel range of generic layouts;
//   - page pools and paged caches: the 584-byte stride in the pool, the sequence views and the
//     CSR view, entries quantized exactly as the oracle quantizes the compressor's fp32 output;
//   - errors that name the field.

#include <catch2/catch.hpp>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/prelude.hpp"
#include "support/common.hpp"
#include "oracle/fp8_format.hpp"
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
#include "phasekv/format/fp8.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/models/deepseek_v4.hpp"

namespace test_cache_fp8 {

namespace {

using namespace phasekv_test::prelude;
namespace oracle = phasekv_test::fp8;

// The library's bytes of one head.
std::vector<std::uint8_t> quantize(const std::vector<float>& x, i64 channels, i64 rope) {
  const fp8_head_layout l = fp8_head_layout::of(channels, rope);
  std::vector<std::byte> out(sz(l.bytes), std::byte{0xAB});
  fp8_quantize_head(x.data(), l, out.data());
  std::vector<std::uint8_t> bytes(out.size());
  std::memcpy(bytes.data(), out.data(), out.size());
  return bytes;
}

// "" when the library's decoding of a head equals the oracle's values bit for bit (NaN as NaN).
std::string decodes_like_oracle(const std::vector<std::uint8_t>& bytes, i64 channels, i64 rope) {
  const fp8_head_layout l = fp8_head_layout::of(channels, rope);
  std::vector<float> got(sz(channels));
  fp8_dequantize_head(reinterpret_cast<const std::byte*>(bytes.data()), l, got.data());
  const std::vector<double> want = oracle::decode_head(bytes.data(), {channels, rope});
  for (i64 c = 0; c < channels; ++c) {
    const double w = want[sz(c)];
    const float g = got[sz(c)];
    const bool same = std::isnan(w) ? std::isnan(g) : (static_cast<double>(g) == w && std::signbit(g) == std::signbit(w));
    if (!same) return "channel " + std::to_string(c) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
  }
  return "";
}

}  // namespace

// ---- e4m3fn ---------------------------------------------------------------------------------

TEST_CASE("fp8: every e4m3 code decodes to its value and encodes back to itself", "[cache][fp8]") {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    INFO("code 0x" << std::hex << c);
    const double want = oracle::e4m3_value(code);
    const float got = e4m3_to_float(code);
    if (std::isnan(want)) {
      CHECK((code & 0x7F) == 0x7F);
      CHECK(std::isnan(got));
      CHECK(std::signbit(got) == ((code & 0x80) != 0));
      CHECK(float_to_e4m3(got) == code);  // NaN keeps its sign
      continue;
    }
    CHECK(static_cast<double>(got) == want);
    CHECK(std::signbit(got) == ((code & 0x80) != 0));  // ±0 included
    CHECK(float_to_e4m3(got) == code);
    CHECK(oracle::e4m3_nearest(want) == code);
  }
  CHECK(e4m3_to_float(0x7E) == 448.0f);
  CHECK(e4m3_to_float(0x01) == std::ldexp(1.0f, -9));  // the smallest subnormal
  CHECK(e4m3_to_float(0x08) == std::ldexp(1.0f, -6));  // the smallest normal
}

TEST_CASE("fp8: float_to_e4m3 equals the nearest-even oracle on a dense sample of fp32", "[cache][fp8]") {
  // Every exponent (Inf and NaN included), every pattern of the top 11 mantissa bits, the low 12
  // bits at and around 0 and their midpoint, both signs: the rounding boundaries of every binade
  // e4m3 covers (normal results drop 20 bits, subnormal ones 21 to 24).
  const std::uint32_t lows[] = {0x000, 0x001, 0x7FF, 0x800, 0x801, 0xFFF};
  std::size_t wrong = 0, checked = 0;
  std::uint32_t first_wrong = 0;
  for (std::uint32_t sign = 0; sign < 2; ++sign)
    for (std::uint32_t exponent = 0; exponent < 256; ++exponent)
      for (std::uint32_t high = 0; high < 2048; ++high)
        for (std::uint32_t low : lows) {
          const std::uint32_t bits = sign << 31 | exponent << 23 | high << 12 | low;
          const float x = float_of(bits);
          const std::uint8_t want = oracle::e4m3_nearest(static_cast<double>(x));
          if (float_to_e4m3(x) != want && wrong++ == 0) first_wrong = bits;
          ++checked;
        }
  INFO("first wrong pattern 0x" << std::hex << first_wrong);
  CHECK(wrong == 0);
  CHECK(checked == 2u * 256u * 2048u * 6u);

  std::mt19937 rng(1301);
  std::uniform_int_distribution<std::uint32_t> any;
  wrong = 0;
  for (int i = 0; i < 4'000'000; ++i) {
    const float x = float_of(any(rng));
    if (float_to_e4m3(x) != oracle::e4m3_nearest(static_cast<double>(x)) && wrong++ == 0) first_wrong = bits_of(x);
  }
  INFO("first wrong random pattern 0x" << std::hex << first_wrong);
  CHECK(wrong == 0);
}

TEST_CASE("fp8: ties go to the even code; beyond 448 saturates; zeros, NaN and Inf", "[cache][fp8]") {
  // Between every two neighbouring magnitudes: the midpoint (exact in fp32) goes to the even
  // code, one ulp either side to the nearer value.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = e4m3_to_float(static_cast<std::uint8_t>(c)), hi = e4m3_to_float(static_cast<std::uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;
    REQUIRE(static_cast<double>(mid) == (static_cast<double>(lo) + hi) / 2);
    INFO("between codes " << c << " and " << c + 1);
    const int even = c % 2 == 0 ? c : c + 1;
    CHECK(float_to_e4m3(mid) == even);
    CHECK(float_to_e4m3(-mid) == (0x80 | even));
    CHECK(float_to_e4m3(std::nextafter(mid, 0.0f)) == c);
    CHECK(float_to_e4m3(std::nextafter(mid, 1000.0f)) == c + 1);
  }
  // Subnormal ties: 2^-10 between 0 and 2^-9 goes to 0, 3 · 2^-10 to 2 · 2^-9.
  CHECK(float_to_e4m3(std::ldexp(1.0f, -10)) == 0x00);
  CHECK(float_to_e4m3(-std::ldexp(1.0f, -10)) == 0x80);
  CHECK(float_to_e4m3(std::ldexp(3.0f, -10)) == 0x02);
  CHECK(float_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)) == 0x01);
  // Saturation: 448 and everything above, Inf included; 464 (the midpoint to the would-be 480).
  const float big[] = {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, std::numeric_limits<float>::max(),
                       std::numeric_limits<float>::infinity()};
  for (float x : big) {
    CHECK(float_to_e4m3(x) == 0x7E);
    CHECK(float_to_e4m3(-x) == 0xFE);
  }
  CHECK(float_to_e4m3(std::nextafter(448.0f, 0.0f)) == 0x7E);  // rounds up to 448, not into NaN
  CHECK(float_to_e4m3(0.0f) == 0x00);
  CHECK(float_to_e4m3(-0.0f) == 0x80);
  CHECK(float_to_e4m3(-1e-30f) == 0x80);  // rounds to zero, keeps the sign
  CHECK(float_to_e4m3(std::numeric_limits<float>::denorm_min()) == 0x00);
  CHECK(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()) == 0x7F);
  CHECK(float_to_e4m3(-std::numeric_limits<float>::quiet_NaN()) == 0xFF);
  CHECK(float_to_e4m3(std::numeric_limits<float>::signaling_NaN()) == 0x7F);
}

// ---- scales ---------------------------------------------------------------------------------

TEST_CASE("fp8: UE8M0 bytes and the block scale formula on its edge cases", "[cache][fp8]") {
  for (int b = 1; b < 255; ++b) CHECK(ue8m0_to_float(static_cast<std::uint8_t>(b)) == std::ldexp(1.0f, b - 127));
  CHECK(ue8m0_to_float(0) == std::ldexp(1.0f, -127));
  CHECK(std::isnan(ue8m0_to_float(0xFF)));
  CHECK(1.0f / 448.0f == static_cast<float>(1.0 / 448.0));  // the constant the oracle assumes

  auto byte_of = [](float amax) {
    const int k = oracle::scale_exponent(&amax, 1);
    return k + 127;
  };
  // amax exactly 448 · 2^k: the scale is 2^k and the block's largest value encodes as ±448.
  for (int k = -22; k <= 119; ++k) {  // 448 · 2^120 is beyond fp32
    const float amax = std::ldexp(448.0f, k);
    INFO("amax = 448 * 2^" << k);
    CHECK(fp8_scale_byte(amax) == 127 + k);
    CHECK(byte_of(amax) == 127 + k);
    // One ulp more needs the next scale; one ulp less stays at 2^k.
    const float above = std::nextafter(amax, std::numeric_limits<float>::infinity());
    CHECK(fp8_scale_byte(above) == 128 + k);
    CHECK(fp8_scale_byte(std::nextafter(amax, 0.0f)) == 127 + k);
    CHECK(byte_of(above) == 128 + k);
  }
  // The floor: fp32(1e-4) · (1/448) ≈ 2.2e-7 lies in (2^-23, 2^-22], so k = -22.
  CHECK(fp8_scale_byte(fp8_amax_floor) == 105);
  CHECK(byte_of(0.0f) == 105);
  CHECK(fp8_scale_byte(std::numeric_limits<float>::max()) == 247);
  CHECK(byte_of(std::numeric_limits<float>::max()) == 247);

  std::mt19937 rng(1302);
  std::uniform_real_distribution<float> exponent(-13.3f, 128.0f), mantissa(1.0f, 2.0f);
  std::size_t wrong = 0;
  for (int i = 0; i < 1'000'000; ++i) {
    float amax = std::min(std::ldexp(mantissa(rng), static_cast<int>(exponent(rng))), std::numeric_limits<float>::max());
    amax = std::max(amax, fp8_amax_floor);
    wrong += fp8_scale_byte(amax) != byte_of(amax);
  }
  CHECK(wrong == 0);
}

// ---- whole heads ------------------------------------------------------------------------------

TEST_CASE("fp8: head layouts, DeepSeek-V4's 584 bytes and generic shapes", "[cache][fp8]") {
  struct expected {
    i64 channels, rope, rope_offset, scale_offset, blocks, bytes;
  };
  const expected cases[] = {
      {512, 64, 448, 576, 7, 584},  // DeepSeek-V4: FlashMLA's layout
      {512, 0, 512, 512, 8, 520},   // no RoPE channels: eight blocks
      {128, 64, 64, 192, 1, 200},
      {100, 36, 64, 136, 1, 144},   // one full block
      {130, 2, 128, 132, 2, 136},
      {129, 0, 130, 130, 3, 136},   // odd code count: a zero byte before the (absent) bf16; partial block of 1
      {65, 1, 64, 66, 1, 72},
      {1, 0, 2, 2, 1, 8},
      {6, 6, 0, 12, 0, 16},         // only RoPE channels: no codes, no scales
      {7, 4, 4, 12, 1, 16},         // 3 codes, 1 pad byte, 4 bf16, 1 scale
  };
  for (const expected& e : cases) {
    INFO("channels " << e.channels << ", rope " << e.rope);
    const fp8_head_layout l = fp8_head_layout::of(e.channels, e.rope);
    const oracle::head_format f{e.channels, e.rope};
    CHECK(l.quantized == e.channels - e.rope);
    CHECK(l.rope_offset == e.rope_offset);
    CHECK(l.scale_offset == e.scale_offset);
    CHECK(l.blocks == e.blocks);
    CHECK(l.bytes == e.bytes);
    CHECK(l.bytes == f.bytes());
    CHECK(l.bytes % 8 == 0);
  }
}

TEST_CASE("fp8: heads quantize byte for byte like the oracle, and decode to its values", "[cache][fp8]") {
  std::mt19937 rng(1303);
  const std::pair<i64, i64> shapes[] = {{512, 64}, {512, 0}, {128, 64}, {100, 36}, {130, 2}, {129, 0},
                                        {65, 1},   {1, 0},   {6, 6},    {7, 4},    {64, 0},  {448, 0}};
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), decade(-12.0f, 12.0f);
  for (const auto& [channels, rope] : shapes) {
    for (int trial = 0; trial < 60; ++trial) {
      INFO("channels " << channels << ", rope " << rope << ", trial " << trial);
      // Each block gets its own magnitude, from 1e-12 to 1e12, and some extremes.
      std::vector<float> x(sz(channels));
      float magnitude = 1.0f;
      for (i64 c = 0; c < channels; ++c) {
        if (c % 64 == 0) magnitude = std::pow(10.0f, decade(rng));
        x[sz(c)] = unit(rng) * magnitude;
      }
      switch (trial % 12) {
        case 1: std::fill(x.begin(), x.end(), 0.0f); break;                              // zeros: scale 2^-22
        case 2: std::fill(x.begin(), x.end(), -0.0f); break;                             // negative zeros
        case 3: for (float& v : x) v *= 1e-9f; break;                                    // amax below 1e-4
        case 4: x[0] = 448.0f * 1024.0f, x[sz(channels - 1)] = -448.0f * 1024.0f; break; // ±448 · s exactly
        case 5: for (float& v : x) v = std::ldexp(std::round(v * 8.0f), -12); break;     // e4m3 subnormals at amax ≥ 1e-4
        case 6: x[sz(channels / 2)] = std::numeric_limits<float>::quiet_NaN(); break;
        case 7: x[0] = std::numeric_limits<float>::infinity(); break;
        case 8: for (float& v : x) v *= 3e37f; break;                                     // scales near the top
        case 9: x[sz(channels - 1)] = 1e-40f; break;                                      // an fp32 subnormal
        default: break;
      }
      const std::vector<std::uint8_t> got = quantize(x, channels, rope);
      const std::vector<std::uint8_t> want = oracle::encode_head(x.data(), {channels, rope});
      REQUIRE(got.size() == want.size());
      i64 first_difference = -1;
      for (std::size_t i = 0; i < got.size() && first_difference < 0; ++i)
        if (got[i] != want[i]) first_difference = static_cast<i64>(i);
      INFO("first differing byte " << first_difference);
      CHECK(first_difference == -1);
      CHECK(decodes_like_oracle(got, channels, rope) == "");

      // Rounding in place (the FP8 raw window) gives the values the oracle's bytes decode to,
      // and rounds them to themselves unless one came back as Inf (none of these trials).
      std::vector<float> rounded = x;
      fp8_round_head(rounded.data(), fp8_head_layout::of(channels, rope));
      const std::vector<double> decoded = oracle::decode_head(want.data(), {channels, rope});
      std::vector<float> again = rounded;
      fp8_round_head(again.data(), fp8_head_layout::of(channels, rope));
      i64 wrong = -1, moved = -1;
      for (i64 c = 0; c < channels && wrong < 0; ++c) {
        const double d = decoded[sz(c)], r = rounded[sz(c)];
        if (std::isnan(d) ? !std::isnan(r) : bits_of(static_cast<float>(d)) != bits_of(rounded[sz(c)])) wrong = c;
      }
      for (i64 c = 0; c < channels && moved < 0; ++c)
        if (std::isnan(rounded[sz(c)]) ? !std::isnan(again[sz(c)]) : bits_of(rounded[sz(c)]) != bits_of(again[sz(c)]))
          moved = c;
      INFO("first wrongly rounded channel " << wrong << ", first channel moved by a second rounding " << moved);
      CHECK(wrong == -1);
      CHECK(moved == -1);
    }
  }
}

TEST_CASE("fp8: only values of magnitude 1.9375 * 2^127 and above come back as Inf", "[cache][fp8]") {
  // At the largest scale, 2^120, x / s = 248 is the midpoint of 240 and 256 and goes to the even
  // 256 (e = 15, m = 0), whose product with 2^120 is 2^128: beyond fp32.
  const fp8_head_layout l = fp8_head_layout::of(64, 0);
  const float limit = std::ldexp(248.0f, 120);
  for (const float x : {limit, std::nextafter(limit, 0.0f), std::numeric_limits<float>::max()}) {
    std::vector<float> values(64, 1.0f);
    values[5] = -x;
    const std::vector<std::uint8_t> bytes = quantize(values, 64, 0);
    CHECK(bytes[sz(l.scale_offset)] == 247);  // 2^120
    std::vector<float> back(64);
    fp8_dequantize_head(reinterpret_cast<const std::byte*>(bytes.data()), l, back.data());
    INFO("x = " << x);
    CHECK(std::isinf(back[5]) == (x >= limit));
    CHECK(std::signbit(back[5]));
    CHECK(back[0] == 0.0f);  // 1 / 2^120 is far below the smallest code
  }
}

TEST_CASE("fp8: a hand-made DeepSeek-V4 entry, byte by byte", "[cache][fp8]") {
  // Block b (b = 0 … 6) has the scale 2^(b − 3), byte 124 + b: its channel 0 is 448 · 2^(b−3)
  // (code 0x7E), channel 1 its negative (0xFE), channel 2 is 2^(b−3) (1.0: 0x38), channel 3 is
  // −0 (0x80), channel 4 is 2^-9 · 2^(b−3) (the smallest subnormal: 0x01), channel 5 is
  // 1.5 · 2^(b−3) (0x3C), channel 6 is −3.125 · 2^(b−3) (midway between −3 and −3.25, a tie to
  // the even −3: 0xC4), the rest 0. RoPE channel r is (r − 32) / 4, exact in bf16.
  std::vector<float> x(512, 0.0f), stored_values;
  std::vector<std::uint8_t> want(584, 0);
  for (int b = 0; b < 7; ++b) {
    const float s = std::ldexp(1.0f, b - 3);
    float* block = x.data() + 64 * b;
    block[0] = 448.0f * s, block[1] = -448.0f * s, block[2] = s, block[3] = -0.0f;
    block[4] = std::ldexp(1.0f, -9) * s, block[5] = 1.5f * s, block[6] = -3.125f * s;
    const std::uint8_t codes[] = {0x7E, 0xFE, 0x38, 0x80, 0x01, 0x3C, 0xC4};
    for (int i = 0; i < 7; ++i) want[sz(64 * b + i)] = codes[i];
    want[sz(576 + b)] = static_cast<std::uint8_t>(124 + b);
  }
  for (int r = 0; r < 64; ++r) {
    const float v = static_cast<float>(r - 32) / 4.0f;
    x[sz(448 + r)] = v;
    const std::uint32_t bits = bits_of(v);
    want[sz(448 + 2 * r)] = static_cast<std::uint8_t>((bits >> 16) & 0xFF);  // little-endian bf16
    want[sz(448 + 2 * r + 1)] = static_cast<std::uint8_t>(bits >> 24);
  }
  // want[583] stays 0: the padding. Every value but the ties reads back as written.
  stored_values = x;
  for (int b = 0; b < 7; ++b) stored_values[sz(64 * b + 6)] = -3.0f * std::ldexp(1.0f, b - 3);
  CHECK(quantize(x, 512, 64) == want);
  CHECK(oracle::encode_head(x.data(), {512, 64}) == want);

  // Through a page pool: the entry lies at page + slot · 584, unchanged.
  page_pool_config pc;
  pc.name = "dsv4";
  pc.page_size = 64;
  pc.kv_heads = 1;
  pc.channels = 512;
  pc.storage = storage_type::fp8_e4m3_block;
  pc.rope_channels = 64;
  pc.capacity = 2;
  page_pool pool(pc);
  const page_id page = pool.allocate();
  pool.write_entry(page, 5, x.data());
  std::vector<std::uint8_t> stored(584);
  std::memcpy(stored.data(), pool.data(page) + 5 * 584, 584);
  CHECK(stored == want);
  std::vector<float> back(512);
  pool.read_entry(page, 5, back.data());
  for (int c = 0; c < 512; ++c) {
    INFO("channel " << c);
    CHECK(bits_of(back[sz(c)]) == bits_of(stored_values[sz(c)]));
  }
}

// ---- SIMD dequantization ------------------------------------------------------------------------

TEST_CASE("fp8: dequantizing runs of channels equals the scalar functions for every code and scale", "[cache][fp8]") {
  // 256 channels without RoPE: four blocks holding codes 0 … 255, all four with scale byte b.
  const fp8_head_layout l = fp8_head_layout::of(256, 0);
  std::vector<std::byte> head(sz(l.bytes));
  for (int c = 0; c < 256; ++c) head[sz(c)] = static_cast<std::byte>(c);
  // Against the scalar functions in the same floating-point environment, and (IEEE defaults
  // only: FTZ flushes subnormal products) against the exact value.
  auto wrong_codes = [&](bool exact_too) {
    std::size_t wrong = 0;
    for (int b = 0; b < 256; ++b) {
      for (i64 i = 0; i < 4; ++i) head[sz(l.scale_offset + i)] = static_cast<std::byte>(b);
      std::vector<float> got(256);
      fp8_decode_channels(head.data(), l, 0, 256, got.data());
      for (int c = 0; c < 256; ++c) {
        const float want = e4m3_to_float(static_cast<std::uint8_t>(c)) * ue8m0_to_float(static_cast<std::uint8_t>(b));
        // NaN as NaN: which operand's sign a NaN · NaN keeps is the compiler's choice (at -O3 GCC
        // commutes the scalar product), so NaNs are not compared bit for bit.
        wrong += std::isnan(want) ? !std::isnan(got[sz(c)]) : bits_of(got[sz(c)]) != bits_of(want);
        const double exact = std::ldexp(oracle::e4m3_value(static_cast<std::uint8_t>(c)), b - 127);
        if (exact_too && b != 255 && !std::isnan(exact) && std::fabs(exact) <= std::numeric_limits<float>::max())
          wrong += static_cast<double>(got[sz(c)]) != exact;
      }
    }
    return wrong;
  };
  CHECK(wrong_codes(true) == 0);
#if defined(__SSE__)
  // DAZ and FTZ on, as hosts (PyTorch's set_flush_denormal) may run: the SIMD paths widen through
  // fp16 (exact whatever DAZ says) and must still give the scalar product's bits, subnormal scale
  // byte 0 included.
  const unsigned mxcsr = _mm_getcsr();
  _mm_setcsr(mxcsr | 0x8040u);
  const std::size_t wrong_flushing = wrong_codes(false);
  _mm_setcsr(mxcsr);
  CHECK(wrong_flushing == 0);
#endif

  // Every range [first, first + count) of generic layouts: SIMD runs where they fit, scalar
  // channels around them, against channel-by-channel scalar decoding.
  std::mt19937 rng(1304);
  const std::pair<i64, i64> shapes[] = {{512, 64}, {100, 36}, {129, 0}, {7, 4}, {200, 40}, {96, 32}};
  for (const auto& [channels, rope] : shapes) {
    const fp8_head_layout g = fp8_head_layout::of(channels, rope);
    std::vector<float> x = phasekv_test::random_uniform(rng, sz(channels), -3.0f, 3.0f);
    std::vector<std::byte> bytes(sz(g.bytes));
    fp8_quantize_head(x.data(), g, bytes.data());
    std::vector<float> want(sz(channels));  // channel by channel, from the scalar functions
    for (i64 c = 0; c < g.quantized; ++c)
      want[sz(c)] = e4m3_to_float(static_cast<std::uint8_t>(bytes[sz(c)])) *
                    ue8m0_to_float(static_cast<std::uint8_t>(bytes[sz(g.scale_offset + c / 64)]));
    for (i64 r = 0; r < rope; ++r) {
      std::uint16_t b;
      std::memcpy(&b, bytes.data() + g.rope_offset + 2 * r, 2);
      want[sz(g.quantized + r)] = bf16_to_float(b);
    }
    for (i64 first = 0; first < channels; ++first)
      for (i64 count = 0; first + count <= channels; count += 1 + count / 3) {
        std::vector<float> got(sz(count) + 1, 7.0f);
        fp8_decode_channels(bytes.data(), g, first, count, got.data());
        INFO("channels " << channels << ", rope " << rope << ", range [" << first << ", " << first + count << ")");
        REQUIRE(std::memcmp(got.data(), want.data() + first, sz(count) * sizeof(float)) == 0);
        REQUIRE(got[sz(count)] == 7.0f);
      }
  }
}

TEST_CASE("fp8: quantizing equals the oracle and the scalar functions for every code at every scale", "[cache][fp8]") {
  // For every scale byte the quantizer makes (105 … 247: amax from the 1e-4 floor to fp32's top)
  // a head whose blocks each open with the anchor 448 · s (so the block's scale is s exactly) and
  // go on with y · s for y on both sides of zero: every e4m3 value, every midpoint between
  // neighbouring values (a tie: to the even code) and the fp32 values just around it, the ties
  // at and around 2^-10 (→ 0), values below the smallest code, ±0. The RoPE channels (bf16) get
  // their own ties, both parities of the kept bit, the carry into Inf, ±Inf. Then: the
  // head's bytes against the oracle, each code against the scalar float_to_e4m3, and the in-place
  // rounding (the FP8 raw window) against the oracle's decoding.
  std::vector<float> y;  // quotients x / s
  for (int q = 0; q < 0x7E; ++q) {
    const float here = static_cast<float>(oracle::e4m3_value(static_cast<std::uint8_t>(q)));
    const float next = static_cast<float>(oracle::e4m3_value(static_cast<std::uint8_t>(q + 1)));
    const float mid = 0.5f * (here + next);  // exact: neighbours share or straddle one binade
    for (const float v : {here, std::nextafter(mid, 0.0f), mid, std::nextafter(mid, 1e3f)}) {
      y.push_back(v);
      y.push_back(-v);
    }
  }
  for (const float v : {448.0f, std::ldexp(1.0f, -11), std::ldexp(1.0f, -12), std::ldexp(1.5f, -10), -0.0f})
    y.push_back(v);
  const i64 per_block = 63, blocks = (static_cast<i64>(y.size()) + per_block - 1) / per_block;
  const i64 quantized = blocks * 64;

  std::vector<float> rope;  // bf16 patterns: the tie 0x8000 below the kept half, both parities, …
  for (const std::uint32_t high : {0x3F80u, 0x3F81u, 0xC2FFu, 0x0001u, 0x7F7Fu, 0xFF7Fu})
    for (const std::uint32_t low : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) rope.push_back(float_of(high << 16 | low));
  for (const float v : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), -0.0f, 1e-40f})
    rope.push_back(v);
  const i64 rope_channels = static_cast<i64>(rope.size());  // 34: a SIMD run of 32 and a scalar tail
  const i64 channels = quantized + rope_channels;
  const fp8_head_layout l = fp8_head_layout::of(channels, rope_channels);

  i64 wrong_bytes = 0, wrong_codes = 0, wrong_rounding = 0;
  for (int b = 105; b <= 247; ++b) {
    INFO("scale byte " << b);
    const int k = b - 127;
    std::vector<float> x(sz(channels), 0.0f);
    // At 2^120 (b = 247) 448 · s is beyond fp32: the anchor is then the largest float (scale
    // 2^120 still) and the quotients are kept below 256.
    const float anchor = b == 247 ? std::numeric_limits<float>::max() : std::ldexp(448.0f, k);
    for (i64 block = 0; block < blocks; ++block) {
      x[sz(block * 64)] = anchor;
      for (i64 i = 0; i < per_block; ++i) {
        const i64 at = block * per_block + i;
        if (at < static_cast<i64>(y.size()) && (b < 247 || std::fabs(y[sz(at)]) < 256.0f))
          x[sz(block * 64 + 1 + i)] = std::ldexp(y[sz(at)], k);  // exact
      }
    }
    std::copy(rope.begin(), rope.end(), x.begin() + quantized);

    const std::vector<std::uint8_t> got = quantize(x, channels, rope_channels);
    const std::vector<std::uint8_t> want = oracle::encode_head(x.data(), {channels, rope_channels});
    for (std::size_t i = 0; i < got.size(); ++i) wrong_bytes += got[i] != want[i];
    for (i64 block = 0; block < blocks; ++block) REQUIRE(got[sz(l.scale_offset + block)] == b);
    for (i64 c = 0; c < quantized; ++c)
      wrong_codes += got[sz(c)] != float_to_e4m3(std::clamp(x[sz(c)] / std::ldexp(1.0f, k), -e4m3_max, e4m3_max));

    std::vector<float> rounded = x;
    fp8_round_head(rounded.data(), l);
    const std::vector<double> decoded = oracle::decode_head(want.data(), {channels, rope_channels});
    for (i64 c = 0; c < channels; ++c) {
      const double d = decoded[sz(c)];
      wrong_rounding += std::isnan(d) ? !std::isnan(rounded[sz(c)])
                                      : bits_of(static_cast<float>(d)) != bits_of(rounded[sz(c)]);
    }
  }
  CHECK(wrong_bytes == 0);
  CHECK(wrong_codes == 0);
  CHECK(wrong_rounding == 0);
}

// ---- pools and caches ---------------------------------------------------------------------------

namespace {

page_pool_config fp8_pool(i64 kv_heads, i64 channels, i64 rope, i64 page_size) {
  return phasekv_test::pool_of("kv", page_size, kv_heads, channels, 4, storage_type::fp8_e4m3_block, rope);
}

}  // namespace

TEST_CASE("fp8: a page pool lays heads and entries out at the documented strides", "[cache][fp8][page_pool]") {
  struct shape {
    i64 kv_heads, channels, rope, page_size, head_bytes;
  };
  for (const shape& s : {shape{1, 512, 64, 64, 584}, shape{3, 100, 36, 5, 144}, shape{2, 129, 0, 3, 136},
                         shape{1, 6, 6, 7, 16}}) {
    INFO("kv_heads " << s.kv_heads << ", channels " << s.channels << ", rope " << s.rope);
    page_pool pool(fp8_pool(s.kv_heads, s.channels, s.rope, s.page_size));
    const page_layout& l = pool.layout();
    CHECK(l.storage == storage_type::fp8_e4m3_block);
    CHECK(l.element_bytes == 1);
    CHECK(l.rope_channels == s.rope);
    CHECK(l.head_stride_bytes == s.head_bytes);
    CHECK(l.head_stride == s.head_bytes);
    CHECK(l.entry_stride_bytes == s.kv_heads * s.head_bytes);
    CHECK(l.entry_stride == l.entry_stride_bytes);
    CHECK(l.page_stride_bytes == (s.page_size * l.entry_stride_bytes + 63) / 64 * 64);
    CHECK(l.page_stride == l.page_stride_bytes);
    CHECK(l.values_per_entry() == s.kv_heads * s.channels);
    CHECK(l.fp8().bytes == s.head_bytes);

    // Every slot of two pages written; each head's bytes are the oracle's, where the layout says,
    // and read back as the oracle decodes them; copy on write copies the bytes as they are.
    std::mt19937 rng(1305);
    const oracle::head_format format{s.channels, s.rope};
    CHECK(phasekv_test::block_pool_mismatch(
              pool, s, [&] { return phasekv_test::random_uniform(rng, sz(s.kv_heads * s.channels), -5.0f, 5.0f); },
              [&](const float* x) { return oracle::encode_head(x, format); },
              [&](const std::vector<std::uint8_t>& bytes) { return oracle::decode_head(bytes.data(), format); }) == "");
  }
}

TEST_CASE("fp8: shapes and calls a pool cannot take are errors that name the field", "[cache][fp8][errors]") {
  auto config = fp8_pool(1, 8, 10, 4);
  CHECK_THAT(message_of<config_error>([&] { config.validate(); }),
             Contains("kv.rope_channels = 10: must lie in [0, channels = 8]"));
  config.rope_channels = -2;
  CHECK_THAT(message_of<config_error>([&] { page_pool{config}; }), Contains("kv.rope_channels = -2"));
  config.rope_channels = 4;
  config.storage = storage_type::bf16;
  CHECK_THAT(message_of<config_error>([&] { config.validate(); }),
             Contains("kv.rope_channels = 4: must be 0 for bf16 storage"));
  config = fp8_pool(1, std::int64_t{1} << 47, 0, 1);
  CHECK_THAT(message_of<config_error>([&] { config.validate(); }), Contains("kv.channels = 140737488355328"));

  // Rows of fp8 do not exist: the row functions say so instead of writing anything.
  phasekv_test::check_block_storage_type(storage_type::fp8_e4m3_block, "fp8_e4m3_block");
}

using phasekv_test::append_random;
using phasekv_test::csa_cache;
using phasekv_test::csa_config;
using phasekv_test::make_csa_layer;

TEST_CASE("fp8: a DeepSeek-V4 cache quantizes the compressor's entries; views have the 584-byte stride",
          "[cache][fp8]") {
  const csa_cache::layer layer = make_csa_layer();
  const storage_type fp8 = storage_type::fp8_e4m3_block;
  for (i64 page_size : {1, 7, 64}) {
    INFO("page_size " << page_size);
    csa_cache quantized(layer, csa_config("fp8", page_size, {fp8, fp8}));
    csa_cache exact(layer, csa_config("f32", page_size, {}));
    CHECK(quantized.pool(0).layout().rope_channels == 64);
    CHECK(quantized.pool(0).layout().entry_stride_bytes == 584);
    CHECK(quantized.pool(1).layout().rope_channels == 64);  // the indexer's RoPE channels, as configured
    CHECK(quantized.pool(1).layout().entry_stride_bytes == 200);
    CHECK(quantized.shape().streams[0].storage == fp8);

    std::mt19937 rng(1306);
    const phasekv_test::twin_sequences twins = phasekv_test::fill_twins(quantized, exact, rng);
    const sequence_id a = twins.quantized;
    for (const auto& [seq, twin] :
         {std::pair<sequence_id, sequence_id>{a, twins.exact}, {twins.quantized_fork, twins.exact_fork}}) {
      const sequence_view v = quantized.view_of(seq);
      const paged_view csr = quantized.view(span<const sequence_id>(&seq, 1), 0);
      CHECK(csr.layout.entry_stride_bytes == 584);
      CHECK(csr.layout.head_stride_bytes == 584);
      CHECK(csr.layout.page_stride_bytes == (page_size * 584 + 63) / 64 * 64);
      CHECK(v.streams[0].layout.entry_stride_bytes == 584);
      for (std::size_t k = 0; k < 2; ++k) {
        const stream_view& sv = v.streams[k];
        const i64 channels = k == 0 ? 512 : 128;
        for (i64 j = 0; j < sv.entries; ++j) {
          // The bytes a host finds by the CSR arithmetic are the oracle's quantization of the
          // fp32 cache's entry (the compressor's output).
          std::vector<float> entry(sz(channels));
          exact.read_entry(twin, k, j, entry.data());
          const auto want = oracle::encode_head(entry.data(), {channels, 64});
          const std::byte* at = phasekv_test::entry_at(sv, page_size, j);
          if (k == 0) CHECK(phasekv_test::entry_at(csr, page_size, j) == at);
          INFO("stream " << k << ", entry " << j);
          CHECK(std::memcmp(at, want.data(), want.size()) == 0);
        }
      }
    }
    const sequence_memory m = quantized.memory(a);
    CHECK(m.entry_bytes == quantized.entries(a, 0) * 584 + quantized.entries(a, 1) * 200);
  }
}

TEST_CASE("fp8: a pool shared by an fp8 stream must keep the same RoPE channels", "[cache][fp8][errors]") {
  const csa_cache::layer layer = make_csa_layer();
  auto shared = std::make_shared<page_pool>(fp8_pool(1, 512, 0, 8));  // 512 channels, no RoPE channels
  cache_config c = csa_config("fp8", 8, {storage_type::fp8_e4m3_block, storage_type::bf16});
  c.shared_pools = {shared, nullptr};
  CHECK_THAT(message_of<config_error>([&] { csa_cache cache(layer, c); }),
             Contains("fp8.shared_pools[0] = kv: has rope_channels = 0, the stream needs 64"));
  auto right = std::make_shared<page_pool>(fp8_pool(1, 512, 64, 8));
  c.shared_pools = {right, nullptr};
  CHECK_NOTHROW(csa_cache(layer, c));
}

TEST_CASE("fp8: an FP8 raw window holds 584-byte FP8 heads; views, forks, memory and snapshots see them",
          "[cache][fp8][window]") {
  const csa_cache::layer layer = make_csa_layer();
  cache_config fp8_window = csa_config("fp8w", 8, {storage_type::fp8_e4m3_block, storage_type::bf16});
  fp8_window.window.precision = storage_type::fp8_e4m3_block;
  fp8_window.window.rope_channels = 64;
  fp8_window.history = 5;
  cache_config plain = fp8_window;
  plain.name = "f32w";
  plain.window.precision = storage_type::f32;
  plain.window.rope_channels = 0;
  csa_cache quantized(layer, fp8_window), exact(layer, plain);
  CHECK(quantized.shape().window.precision == storage_type::fp8_e4m3_block);
  CHECK(quantized.shape().window.rope_channels == 64);

  std::mt19937 rng(1307);
  const sequence_id a = quantized.create(), b = exact.create();
  for (i64 n : {5, 1, 13, 2}) append_random(quantized, exact, a, b, n, rng);
  const sequence_id fork = quantized.fork(a);
  // Each held window row is, byte for byte, the oracle's FP8 head of the row the host handed over
  // (the fp32 cache keeps it as it came): e4m3 codes [0, 448), bf16 [448, 576), seven scales, a
  // zero byte. Its values (copy_window_key) are the oracle's decoding of those bytes.
  auto wrong_row = [&](sequence_id seq, bool bytes_too) {
    for (i64 t = quantized.window_first(seq); t < quantized.tokens(seq); ++t) {
      const auto want = oracle::encode_head(exact.window_key(b, t), {512, 64});
      if (bytes_too && std::memcmp(quantized.window_key_bytes(seq, t), want.data(), 584) != 0) return t;
      if (quantized.window_value_bytes(seq, t) != quantized.window_key_bytes(seq, t)) return t;  // tied
      std::vector<float> held(512);
      quantized.copy_window_key(seq, t, span<float>(held.data(), held.size()));
      const std::vector<double> values = oracle::decode_head(want.data(), {512, 64});
      for (i64 c = 0; c < 512; ++c)
        if (static_cast<double>(held[sz(c)]) != values[sz(c)]) return t;
    }
    return i64{-1};
  };
  CHECK(quantized.window_first(a) == 21 - 16 - 5);
  CHECK(wrong_row(a, true) == -1);
  CHECK(wrong_row(fork, true) == -1);

  // The view hands the reader the bytes; the ring's memory is 584 bytes a row, not 2048.
  const sequence_view v = quantized.view_of(a);
  CHECK(v.window.storage == storage_type::fp8_e4m3_block);
  CHECK(v.window.rope_channels == 64);
  CHECK(v.window.keys == nullptr);
  CHECK(v.window.key_bytes == quantized.window_key_bytes(a, 0));  // token 0 is in row 0
  CHECK(quantized.window_key_bytes(a, 20) - v.window.key_bytes == 20 * 584);
  CHECK(v.window.value_bytes == v.window.key_bytes);
  const i64 rows = 16 + 5;
  CHECK(exact.memory(b).state_bytes - quantized.memory(a).state_bytes == rows * (512 * 4 - 584));

  // Float rows are an f32 window's; byte rows an FP8 window's: asking the other is an error.
  CHECK_THAT(message_of<input_error>([&] { (void)quantized.window_key(a, 20); }),
             Contains("fp8w.window_key: window.precision = fp8_e4m3_block: must be f32"));
  CHECK_THAT(message_of<input_error>([&] { (void)exact.window_key_bytes(b, 20); }),
             Contains("f32w.window_key_bytes: window.precision = f32: must be fp8_e4m3_block"));
  std::vector<float> short_row(511);
  CHECK_THAT(message_of<input_error>([&] { quantized.copy_window_key(a, 20, span<float>(short_row.data(), 511)); }),
             Contains("fp8w.copy_window_key: out.size() = 511: must be 512"));
  CHECK_THROWS_AS(quantized.copy_window_key(a, 21, span<float>(short_row.data(), 511)), input_error);

  // A snapshot of the FP8 window restores the same values, into an FP8 window (the bytes too, but
  // for a block whose amax had rounded down to 224 · s: docs/SNAPSHOT.md) or an fp32 one; an fp32
  // window's snapshot restored into an FP8 window is quantized like an append, byte for byte.
  const std::vector<std::byte> image = snapshot(quantized, a);
  const sequence_id back = restore(quantized, image);
  CHECK(wrong_row(back, false) == -1);
  csa_cache other(layer, plain);
  const sequence_id widened = restore(other, image);
  for (i64 t = other.window_first(widened); t < 21; ++t) {
    std::vector<float> held(512);
    quantized.copy_window_key(a, t, span<float>(held.data(), held.size()));
    CHECK(std::memcmp(other.window_key(widened, t), held.data(), 512 * sizeof(float)) == 0);
  }
  const sequence_id requantized = restore(quantized, snapshot(exact, b));
  CHECK(wrong_row(requantized, true) == -1);
}

TEST_CASE("fp8: raw window precisions a cache cannot take are errors that name the field",
          "[cache][fp8][window][errors]") {
  const csa_cache::layer layer = make_csa_layer();
  cache_config c = csa_config("w", 8, {});
  c.window.precision = storage_type::bf16;
  CHECK_THAT(message_of<config_error>([&] { csa_cache cache(layer, c); }),
             Contains("w.window.precision = 1: must be f32 or fp8_e4m3_block"));
  c.window.precision = storage_type::fp8_e4m3_block;
  c.window.rope_channels = 513;
  CHECK_THAT(message_of<config_error>([&] { csa_cache cache(layer, c); }),
             Contains("w.window.rope_channels = 513: must lie in [0, window.key_channels]"));
  c.window.rope_channels = -1;
  CHECK_THROWS_AS(csa_cache(layer, c), config_error);
  c.window.precision = storage_type::f32;
  c.window.rope_channels = 64;
  CHECK_THAT(message_of<config_error>([&] { csa_cache cache(layer, c); }),
             Contains("w.window.rope_channels = 64: must be 0 unless window.precision is fp8_e4m3_block"));
}

}  // namespace test_cache_fp8
