// detail/simd/config.hpp's report of the kernel paths compiled in: the macro, the constexpr functions a
// host static_asserts on, the CPU's own report and the line for a log agree with each other and
// with the compiler's flags. (tests/layout/ checks the same across a baseline and a native file.)

#include <catch2/catch.hpp>

#include <string>

#include <phasekv/detail/simd/config.hpp>

namespace test_simd_isa {

namespace simd = phasekv::simd;

// What a host writes to refuse a build without the paths it expects, here for what this file has.
static_assert(simd::compiled_isa() == PHASEKV_SIMD_KERNELS, "one source of truth");
static_assert(simd::compiled_with(0u), "nothing is always compiled in");
#if defined(__AVX512F__)
static_assert(simd::compiled_with(simd::avx512), "an AVX-512 build has the 512-bit paths");
#endif
#if !defined(__AVX2__)
static_assert(!simd::compiled_with(simd::avx2), "no AVX2 path without -mavx2");
#endif

TEST_CASE("the compiled kernel paths follow the compiler's ISA macros", "[simd][isa]") {
  const unsigned c = simd::compiled_isa();
#if defined(__AVX2__)
  CHECK((c & simd::avx2) != 0u);
#else
  CHECK((c & simd::avx2) == 0u);
#endif
#if defined(__AVX512F__)
  CHECK((c & simd::avx512) != 0u);
#else
  CHECK((c & simd::avx512) == 0u);
#endif
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  CHECK((c & simd::bf16_dot) != 0u);
#else
  CHECK((c & simd::bf16_dot) == 0u);
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
  CHECK((c & simd::int8_dot) != 0u);
#else
  CHECK((c & simd::int8_dot) == 0u);
#endif
  CHECK(simd::compiled_with(c));
  CHECK_FALSE(simd::compiled_with(c | 0x80u));  // a bit no path has
}

TEST_CASE("a file never holds a path its CPU cannot run, and names what it leaves unused", "[simd][isa]") {
  const unsigned cpu = simd::cpu_isa(), c = simd::compiled_isa();
  INFO("CPU: " << simd::isa_names(cpu) << "; compiled: " << simd::isa_names(c));
  CHECK((cpu & c) == c);  // this test runs, so the CPU has what the file was compiled for
  CHECK(simd::unused_cpu_isa() == (cpu & ~c));
  const std::string report = simd::compiled_isa_report();
  INFO(report);
  CHECK(report.find("bf16 indexer: ") != std::string::npos);
  CHECK(report.find("FP4 indexer: ") != std::string::npos);
  CHECK((report.find("unused by this build") != std::string::npos) == (simd::unused_cpu_isa() != 0u));
  // A baseline file on this CPU: every path the CPU has is named as unused.
  const std::string baseline = simd::compiled_isa_report(0u);
  CHECK(baseline.find("128-bit") != std::string::npos);
  CHECK(baseline.find("scalar, same bits") != std::string::npos);
  if (cpu != 0u) CHECK(baseline.find(simd::isa_names(cpu) + ", unused by this build") != std::string::npos);
  CHECK(simd::isa_names(0u) == "none");
  CHECK(simd::isa_names(simd::avx512 | simd::int8_dot) == "AVX-512F, AVX-512VNNI");
}

}  // namespace test_simd_isa
