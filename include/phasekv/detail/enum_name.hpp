#pragma once
// The name of an enumerator, from the enum's names listed once in declaration order:
//
//   inline const char* to_string(layout_mode m) noexcept {
//     return phasekv::detail::enum_name(m, {"any", "contained", "straddle"});
//   }
//
// For enums whose enumerators take the values 0, 1, … (no initialisers). A value outside them —
// what a cast from a bad integer gives — is "unknown".

#include <cstddef>

namespace phasekv::detail {

template <class Enum, std::size_t N>
constexpr const char* enum_name(Enum value, const char* const (&names)[N]) noexcept {
  const auto i = static_cast<std::size_t>(value);
  return i < N ? names[i] : "unknown";
}

}  // namespace phasekv::detail
