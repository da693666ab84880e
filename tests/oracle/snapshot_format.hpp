#pragma once
// The snapshot format from the outside (docs/SNAPSHOT.md), for tests that
// craft hostile snapshots: the CRC-32C by its definition, the byte offsets of the fields, and
// reseal(), which recomputes every checksum so a patched field reaches the parser's checks of
// its value rather than a checksum mismatch. Written from the format's description, using
// nothing from the library.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace phasekv_test {

// The definition, one bit at a time: reflected polynomial 0x82F63B78, init and final XOR ~0.
inline std::uint32_t crc32c_bitwise(const unsigned char* p, std::size_t n, std::uint32_t crc = 0) {
  std::uint32_t r = ~crc;
  for (std::size_t i = 0; i < n; ++i) {
    r ^= p[i];
    for (int b = 0; b < 8; ++b) r = (r & 1u) ? (r >> 1) ^ 0x82F63B78u : r >> 1;
  }
  return ~r;
}

// Offsets of the format (docs/SNAPSHOT.md, "Layout"), for crafting snapshots.
constexpr std::size_t kLayer = 32, kStreams = kLayer + 88;
inline std::size_t table_at(std::size_t streams) { return kStreams + 152 * streams + 8; }

inline std::uint64_t get_u64(const std::vector<std::byte>& b, std::size_t at) {
  std::uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | std::to_integer<std::uint64_t>(b[at + static_cast<std::size_t>(k)]);
  return v;
}
inline void put_u64(std::vector<std::byte>& b, std::size_t at, std::uint64_t v) {
  for (int k = 0; k < 8; ++k) b[at + static_cast<std::size_t>(k)] = static_cast<std::byte>(v >> (8 * k));
}
inline void put_u32(std::vector<std::byte>& b, std::size_t at, std::uint32_t v) {
  for (int k = 0; k < 4; ++k) b[at + static_cast<std::size_t>(k)] = static_cast<std::byte>(v >> (8 * k));
}

// Recomputes every checksum of a (patched) snapshot from its bytes, with the bitwise CRC. Safe on
// any bytes (a fuzzer's edits): a checksum whose field or range lies outside them is left alone.
inline void reseal(std::vector<std::byte>& b, std::size_t streams) {
  if (b.size() < 32) return;
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  const std::size_t header = static_cast<std::size_t>(get_u64(b, 12) & 0xFFFFFFFFu);
  const std::size_t table = table_at(streams);
  if (header >= 4 && header <= b.size()) {
    std::size_t at = header;
    for (std::size_t i = 0; i < 2 * streams + 1; ++i) {
      const std::size_t row = table + 24 * i;
      if (row + 24 > header) break;
      const std::uint64_t n = get_u64(b, row + 8);
      if (n > b.size() - at) break;
      put_u32(b, row + 16, crc32c_bitwise(p + at, static_cast<std::size_t>(n)));
      at += static_cast<std::size_t>(n);
    }
    put_u32(b, header - 4, crc32c_bitwise(p, header - 4));
  }
  put_u32(b, 28, crc32c_bitwise(p, 28));
}

}  // namespace phasekv_test
