// Public types have one layout whatever ISA flags a file is compiled with (layout_probe.hpp).

#include <catch2/catch.hpp>

#include <string>

#include <phasekv/detail/simd/config.hpp>

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

// A host detects a build without the vector ISAs it expects (detail/simd/config.hpp): the baseline file
// reports no kernel path and the whole CPU unused; the native file, the CPU's own paths.
TEST_CASE("each file reports the kernel paths compiled into it", "[layout][simd]") {
  const phasekv_test::layout_report generic = phasekv_test::layout_generic();
  const phasekv_test::layout_report native = phasekv_test::layout_native();
  INFO("generic: " << phasekv::simd::compiled_isa_report(generic.isa));
  INFO("native: " << phasekv::simd::compiled_isa_report(native.isa));
  CHECK(generic.isa == 0u);  // -march=x86-64: SSE2 only
  CHECK(phasekv::simd::unused_cpu_isa(generic.isa) == phasekv::simd::cpu_isa());
  CHECK(phasekv::simd::compiled_isa_report(generic.isa).find("128-bit") != std::string::npos);
  CHECK(native.isa == phasekv::simd::cpu_isa());  // -march=native compiles in every path this CPU has
  CHECK(phasekv::simd::unused_cpu_isa(native.isa) == 0u);
  CHECK(native.bf16_dot == ((native.isa & phasekv::simd::bf16_dot) != 0));
  CHECK(phasekv::simd::compiled_isa_report(native.isa).find("unused by this build") == std::string::npos);
  if (phasekv::simd::cpu_isa() != 0)
    CHECK(phasekv::simd::compiled_isa_report(generic.isa).find("unused by this build (compile with -march=native)") !=
          std::string::npos);
}
