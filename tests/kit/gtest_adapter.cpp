// The conformance kit's GoogleTest adapter (phasekv/testing/gtest.hpp) in a GoogleTest binary: a
// layer that conforms passes, and a planted off-by-one window (tests/kit/planted_bugs.hpp) fails
// with the report as GoogleTest's message.

#include <gtest/gtest.h>

#include <phasekv/phasekv.hpp>
#include <phasekv/testing/conformance.hpp>
#include <phasekv/testing/gtest.hpp>

#include <sstream>
#include <string>

#include "kit/planted_bugs.hpp"

namespace {

// Not `using namespace phasekv`: its `testing` would clash with GoogleTest's.
namespace kit = phasekv::testing;
using phasekv::compressor_policy;
using phasekv::geometry;

phasekv::stream_config stream(const char* name) {
  phasekv::stream_config c;
  c.name = name;
  c.channels = 8;
  return c;
}

}  // namespace

TEST(ConformanceKit, MeanPoolingConforms) {
  EXPECT_TRUE(kit::conforms(kit::check_stream<compressor_policy<phasekv::mean_pool>>(geometry{2, 4}, stream("mean"))));
}

TEST(ConformanceKit, AnOffByOneWindowFailsWithTheReport) {
  const kit::report r = kit::check_stream<compressor_policy<phasekv_test::planted::short_mean_pool>>(
      geometry{2, 4}, stream("short"), {}, {}, {}, phasekv_test::planted::mean_oracle);
  const ::testing::AssertionResult result = kit::conforms(r);
  EXPECT_FALSE(result);
  const std::string message = result.message();
  EXPECT_NE(message.find("entries against the double-precision oracle"), std::string::npos) << message;
  EXPECT_NE(message.find("counterexample"), std::string::npos) << message;
  std::ostringstream printed;
  PrintTo(r, &printed);
  EXPECT_EQ(printed.str(), "\n" + r.to_string());
}
