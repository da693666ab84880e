// Public types have one layout whatever ISA flags a file is compiled with (layout_probe.hpp).

#include <catch2/catch.hpp>

#include "layout_probe.hpp"

TEST_CASE("public types have the same size and alignment under every -march", "[layout]") {
  const phasekv_test::layout_report generic = phasekv_test::layout_generic();
  const phasekv_test::layout_report native = phasekv_test::layout_native();
  INFO("generic file: " << generic.arch << (generic.bf16_dot ? " + bf16 dot" : "") << "; native file: " << native.arch
                        << (native.bf16_dot ? " + bf16 dot" : ""));
  // The two files must really differ in ISA, or this test could not fail. (A build machine
  // without AVX2 compiles both for SSE2; then there is nothing to compare.)
  if (generic.arch == native.arch) {
    WARN("both files were compiled for " << native.arch << ": the layout check is vacuous on this machine");
    return;
  }
  REQUIRE(generic.types.size() == native.types.size());
  for (std::size_t i = 0; i < generic.types.size(); ++i) {
    INFO(generic.types[i].name);
    CHECK(generic.types[i].size == native.types[i].size);
    CHECK(generic.types[i].alignment == native.types[i].alignment);
  }
}
