#pragma once
// The codes that identify a compressor policy in snapshots (docs/SNAPSHOT.md, "Header"): each
// built-in pooling, RoPE placement and norm by its position in a fixed table, a pooling of the
// host's by the CRC-32C of its name, version and learned parameters. cache/snapshot_fingerprint.hpp
// writes them; the pooling registry's erased streams report them.

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "phasekv/compress/policies.hpp"
#include "phasekv/detail/crc32c.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/detail/limits.hpp"

namespace phasekv::detail::snapshot_format {

// The code of T among the types of a table: its position + 1, or 0 when it is not there.
template <class T, class... Table>
constexpr std::uint32_t code_in() noexcept {
  std::uint32_t code = 0, position = 0;
  ((++position, code = code == 0 && std::is_same_v<T, Table> ? position : code), ...);
  return code;
}

template <class Pooling>
constexpr std::uint32_t pooling_code() noexcept {
  constexpr std::uint32_t code = code_in<Pooling, mean_pool, vector_gated_pool, scalar_gated_pool, fixed_weight_pool>();
  static_assert(code != 0, "policy_codes.hpp needs a code for this pooling policy");
  return code;
}
template <class Rope>
constexpr std::uint32_t rope_code() noexcept {
  constexpr std::uint32_t code = code_in<Rope, no_rope, rope_after_pool, rope_before_pool>();
  static_assert(code != 0, "policy_codes.hpp needs a code for this RoPE placement");
  return code;
}
template <class Norm>
constexpr std::uint32_t norm_code() noexcept {
  constexpr std::uint32_t code = code_in<Norm, no_norm, rms_norm>();
  static_assert(code != 0, "policy_codes.hpp needs a code for this norm");
  return code;
}
static_assert(code_in<rope_before_pool, no_rope, rope_after_pool, rope_before_pool>() == 3 &&
                  code_in<rms_norm, no_rope>() == 0,
              "a type's code is its position in the table, from 1");

// A pooling policy of the host's (compress/policies.hpp) has no fixed code: its identity is the
// CRC-32C of its name, version and learned parameters (when it exposes parameters()), with the
// top bit set — so a snapshot restores only into a cache with the same policy, version and weights.
// parameters() is asked again here (a policy may change its weights after construction): a null
// span of non-zero size is an input_error, not a read through null.
template <class Pooling>
std::uint32_t pooling_identity(const Pooling& pool) {
  if constexpr (is_custom_pool_v<Pooling>) {
    const char* name = Pooling::name;
    const std::uint32_t policy_version = Pooling::version;
    std::uint32_t crc = phasekv::crc32c(name, std::strlen(name) + 1);
    crc = phasekv::crc32c(&policy_version, sizeof policy_version, crc);
    if constexpr (has_pool_parameters<Pooling>::value) {
      const auto w = pool.parameters();
      const std::string field = std::string("snapshot: ") + name + "::parameters()";
      if (w.data() == nullptr && w.size() != 0)
        detail::fail<input_error>(field + ".data()", "null", "must not be null when the size is " + std::to_string(w.size()));
      if (w.size() > static_cast<std::size_t>(limits::max_bytes / 4))
        detail::fail<input_error>(field + ".size()", w.size(), "must be at most 2^46 floats");
      crc = phasekv::crc32c(w.data(), w.size() * sizeof(float), crc);
    }
    return 0x80000000u | crc;
  } else {
    (void)pool;
    return pooling_code<Pooling>();
  }
}

}  // namespace phasekv::detail::snapshot_format
