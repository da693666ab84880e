#pragma once
// The conformance kit (conformance.hpp) in a GoogleTest test: `conforms(report)` is an
// AssertionResult whose failure message is the report's full text, and a report prints as it.
//
//   #include <gtest/gtest.h>
//   #include <phasekv/testing/gtest.hpp>
//   TEST(MyLayer, Conforms) { EXPECT_TRUE(phasekv::testing::conforms(phasekv::testing::check(layer))); }
//
// On failure GoogleTest shows the first failing property, the shrunk counterexample and its first
// difference. In a file that says `using namespace phasekv`, `testing` is ambiguous (GoogleTest's
// ::testing): name the kit with an alias instead, `namespace kit = phasekv::testing;`.

#include <gtest/gtest.h>

#include <ostream>

#include "phasekv/testing/report.hpp"

namespace phasekv::testing {

inline ::testing::AssertionResult conforms(const report& r) {
  if (r.passed()) return ::testing::AssertionSuccess() << r.to_string();
  return ::testing::AssertionFailure() << "\n" << r.to_string();
}

// GoogleTest's printer for a report (found by argument-dependent lookup).
inline void PrintTo(const report& r, std::ostream* out) { *out << "\n" << r.to_string(); }

}  // namespace phasekv::testing
