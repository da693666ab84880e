#pragma once
// The exceptions phasekv throws. Every message names the field (or argument) that was wrong and
// the value it had, so a caller can fix the call without reading the library.
//
//   config_error   — a configuration that cannot describe a valid compressor/cache/reader
//   input_error    — a call whose arguments do not fit the configuration (shape, span, NaN…)
//   capacity_error — a resource ran out (a page pool is full)
//
// A function that throws any of them — or std::bad_alloc — leaves every object it was given exactly
// as it was. docs/RELIABILITY.md lists which call may throw what.

#include <stdexcept>
#include <string>
#include <utility>

#include "phasekv/detail/text.hpp"

namespace phasekv {

class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class config_error : public error {
 public:
  using error::error;
};

class input_error : public error {
 public:
  using error::error;
};

class capacity_error : public error {
 public:
  using error::error;
};

namespace detail {

// "<field> = <value>: <requirement>", e.g. "stride = 0: must be at least 1".
template <class Value>
std::string field_message(const std::string& field, const Value& value, const std::string& requirement) {
  classic_stream out;  // the same message under any locale
  out << field << " = " << value << ": " << requirement;
  return out.str();
}

template <class Error = config_error, class Value>
[[noreturn]] void fail(const std::string& field, const Value& value, const std::string& requirement) {
  throw Error(field_message(field, value, requirement));
}

// Throws Error naming `field` and `value` unless `ok`.
template <class Error = config_error, class Value>
void require(bool ok, const std::string& field, const Value& value, const std::string& requirement) {
  if (!ok) fail<Error>(field, value, requirement);
}

}  // namespace detail
}  // namespace phasekv
