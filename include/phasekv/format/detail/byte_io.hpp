#pragma once
// Fixed-width little-endian fields in a byte buffer: a writer and a reader, each with a cursor and
// an end, for formats that must mean the same on every host (snapshots: cache/snapshot.hpp,
// docs/SNAPSHOT.md).
//
// Integers go byte by byte (u32, u64; i64 as its two's-complement u64; f64 as the u64 of its IEEE
// binary64 bits), so they do not depend on the host's byte order. Arrays of floats are copied as
// they lie in memory, which is the little-endian order only on a little-endian host
// (host_little_endian; every x86 and ARM host phasekv targets is one).
//
// The writer keeps the CRC-32C (detail/crc32c.hpp) of what it wrote since it was made or since
// restart_checksum(), computed while the bytes are copied, so a checksummed array is read once.
// The reader throws input_error, naming its context, when a field would run past its end. Both
// check their bounds: a writer is sized by its caller, so running past its end is a bug of that
// caller (std::length_error), never a write out of bounds.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "phasekv/detail/crc32c.hpp"
#include "phasekv/core/error.hpp"

namespace phasekv {

inline constexpr bool host_little_endian =
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
#else
    true;  // MSVC's targets are all little-endian
#endif

// The bits of a value as another type of the same size (an f64 as its u64 and back).
template <class To, class From>
To bits_as(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From), "bits_as keeps every bit");
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

class byte_writer {
 public:
  byte_writer(unsigned char* begin, std::size_t size) noexcept : begin_(begin), at_(begin), end_(begin + size) {}

  void u32(std::uint32_t v) { field(v, 4); }
  void u64(std::uint64_t v) { field(v, 8); }
  void i64(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
  void f64(double v) { u64(bits_as<std::uint64_t>(v)); }
  // n bytes from p, checksummed as they are copied.
  void bytes(const void* p, std::size_t n) {
    need(n);
    crc_ = crc32c_copy(at_, p, n, crc_);
    at_ += n;
  }
  void floats(const float* p, std::size_t count) { bytes(p, count * sizeof(float)); }

  std::uint32_t checksum() const noexcept { return crc_; }
  void restart_checksum() noexcept { crc_ = 0; }
  std::size_t written() const noexcept { return static_cast<std::size_t>(at_ - begin_); }
  std::size_t remaining() const noexcept { return static_cast<std::size_t>(end_ - at_); }

 private:
  void field(std::uint64_t v, int width) {
    need(static_cast<std::size_t>(width));
    for (int k = 0; k < width; ++k) at_[k] = static_cast<unsigned char>(v >> (8 * k));
    crc_ = crc32c(at_, static_cast<std::size_t>(width), crc_);
    at_ += width;
  }
  void need(std::size_t n) const {
    if (remaining() < n)
      throw std::length_error("byte_writer: " + std::to_string(n) + " bytes do not fit in the " +
                              std::to_string(remaining()) + " left of the buffer its caller sized");
  }

  unsigned char* begin_;
  unsigned char* at_;
  unsigned char* end_;
  std::uint32_t crc_ = 0;
};

class byte_reader {
 public:
  // `context` names the bytes in messages ("snapshot"); it must outlive the reader.
  byte_reader(const unsigned char* begin, const unsigned char* end, const char* context = "bytes") noexcept
      : at_(begin), end_(end), context_(context) {}

  std::uint32_t u32() { return static_cast<std::uint32_t>(field(4)); }
  std::uint64_t u64() { return field(8); }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  double f64() { return bits_as<double>(u64()); }
  // The next n bytes, in place (the reader moves past them).
  const unsigned char* bytes(std::size_t n) {
    need(n);
    const unsigned char* p = at_;
    at_ += n;
    return p;
  }

  const unsigned char* position() const noexcept { return at_; }
  std::size_t remaining() const noexcept { return static_cast<std::size_t>(end_ - at_); }
  const char* context() const noexcept { return context_; }

 private:
  std::uint64_t field(int width) {
    need(static_cast<std::size_t>(width));
    std::uint64_t v = 0;
    for (int k = width - 1; k >= 0; --k) v = (v << 8) | at_[k];
    at_ += width;
    return v;
  }
  void need(std::size_t n) const {
    if (remaining() < n)
      throw input_error(std::string(context_) + ": a field runs past the end of its part of the " + context_);
  }

  const unsigned char* at_;
  const unsigned char* end_;
  const char* context_;
};

// Reads a ring of `from_rows` rows of `per_row` floats (token t in row t mod rows) into a ring of
// `to_rows` rows at `to`: verbatim when the row counts are equal, else only the rows of tokens
// [first, tokens), each to its own row of the destination (which keeps the rest as it was). The
// reader moves past the whole source ring.
inline void read_ring_rows(byte_reader& r, std::int64_t from_rows, float* to, std::int64_t to_rows, std::int64_t per_row,
                           std::int64_t first, std::int64_t tokens) {
  const auto row_bytes = static_cast<std::size_t>(per_row) * sizeof(float);
  const unsigned char* from = r.bytes(static_cast<std::size_t>(from_rows) * row_bytes);
  if (row_bytes == 0 || to_rows <= 0) return;
  if (from_rows == to_rows) {
    std::memcpy(to, from, static_cast<std::size_t>(to_rows) * row_bytes);
    return;
  }
  for (std::int64_t t = first; t < tokens; ++t)
    std::memcpy(to + (t % to_rows) * per_row, from + static_cast<std::size_t>(t % from_rows) * row_bytes, row_bytes);
}

}  // namespace phasekv
