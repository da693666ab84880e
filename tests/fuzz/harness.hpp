#pragma once
// What the fuzz targets fuzz_snapshot, fuzz_view and fuzz_diag share: the failure report (the
// harness's message and what the input decoded to, then abort, so libFuzzer keeps the input) and
// a reader of the input's bytes that reads zeros past the end, so every input decodes.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace phasekv_fuzz {

// What the current input decoded to, for a failure's message; each target fills it.
inline std::string& setup() {
  static std::string text;
  return text;
}

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "\nphasekv fuzz: FAILED: %s\n  input: %s\n", what.c_str(), setup().c_str());
  std::fflush(stderr);
  std::abort();
}

struct input_bytes {
  const std::uint8_t* data;
  std::size_t size, at = 0;
  std::uint8_t byte() { return at < size ? data[at++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(byte() | (byte() << 8)); }
};

}  // namespace phasekv_fuzz
