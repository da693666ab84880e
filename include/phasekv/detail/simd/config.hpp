#pragma once
// The instruction sets phasekv's kernels choose between, as 0/1 macros in one place. A kernel
// picks its path at compile time from the target's flags (-march), so one build has one path per
// kernel. (detail/crc32c.hpp keeps its own SSE4.2 / PCLMUL / VPCLMULQDQ tiers.)
//
// What a host can check (docs/PLATFORMS.md), per translation unit, since each is compiled with its
// own flags:
//   PHASEKV_SIMD_KERNELS            the PHASEKV_SIMD_* bits of the paths compiled in, for #if and
//                                   static_assert: static_assert(phasekv::simd::compiled_with(
//                                   phasekv::simd::avx512 | phasekv::simd::int8_dot), "…");
//   simd::compiled_isa()            the same bits, constexpr
//   simd::cpu_isa()                 the bits this CPU supports (x86-64 with GCC or Clang; 0 elsewhere)
//   simd::unused_cpu_isa()          what the CPU has and this file was not compiled for: non-zero
//                                   means a build without -march=native (reads 2.3–2.7x slower)
//   simd::compiled_isa_report()     one line naming each kernel's path, for a log
// The functions take the compiled bits as a default argument, PHASEKV_SIMD_KERNELS, which is
// evaluated in the caller's file: their bodies are the same in every file, so files compiled with
// different -march link together without two definitions of one inline function (ODR).

#if defined(__AVX512F__)
#define PHASEKV_HAS_AVX512 1  // AVX-512 F: 16-float vectors, masked loads and stores
#else
#define PHASEKV_HAS_AVX512 0
#endif

#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define PHASEKV_HAS_AVX512_BW_VL 1  // byte and word lanes at 128/256/512 bits (FP8 encode, decode)
#else
#define PHASEKV_HAS_AVX512_BW_VL 0
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define PHASEKV_HAS_BF16_DOT 1  // vdpbf16ps: the bf16 indexer's dot products
#else
#define PHASEKV_HAS_BF16_DOT 0
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define PHASEKV_HAS_INT8_DOT 1  // vpdpbusd: the FP4 indexer's int8 dot products
#else
#define PHASEKV_HAS_INT8_DOT 0
#endif

#if defined(__AVX512VBMI__)
#define PHASEKV_HAS_AVX512_VBMI 1  // vpermb: byte permutes (the FP4 indexer's key layout)
#else
#define PHASEKV_HAS_AVX512_VBMI 0
#endif

#if defined(__AVX2__)
#define PHASEKV_HAS_AVX2 1
#else
#define PHASEKV_HAS_AVX2 0
#endif

#if defined(__F16C__)
#define PHASEKV_HAS_F16C 1  // f16 ↔ f32 conversion instructions
#else
#define PHASEKV_HAS_F16C 0
#endif

// One bit per path a kernel may take (PHASEKV_SIMD_KERNELS holds those compiled in).
#define PHASEKV_SIMD_AVX2 0x01u          // 256-bit vectors (xsimd avx2 / fma3<avx2>)
#define PHASEKV_SIMD_F16C 0x02u          // f16 storage conversions
#define PHASEKV_SIMD_AVX512 0x04u        // 512-bit vectors, masked tails, the top-k and FP8 kernels
#define PHASEKV_SIMD_AVX512_BW_VL 0x08u  // FP8 encode and decode in byte lanes
#define PHASEKV_SIMD_AVX512_VBMI 0x10u   // the FP4 indexer's key layout (vpermb)
#define PHASEKV_SIMD_BF16_DOT 0x20u      // the bf16 indexer's vdpbf16ps
#define PHASEKV_SIMD_INT8_DOT 0x40u      // the FP4 indexer's vpdpbusd (AVX-512 VNNI)

#define PHASEKV_SIMD_KERNELS                                                                    \
  ((PHASEKV_HAS_AVX2 ? PHASEKV_SIMD_AVX2 : 0u) | (PHASEKV_HAS_F16C ? PHASEKV_SIMD_F16C : 0u) |   \
   (PHASEKV_HAS_AVX512 ? PHASEKV_SIMD_AVX512 : 0u) |                                            \
   (PHASEKV_HAS_AVX512_BW_VL ? PHASEKV_SIMD_AVX512_BW_VL : 0u) |                                \
   (PHASEKV_HAS_AVX512_VBMI ? PHASEKV_SIMD_AVX512_VBMI : 0u) |                                  \
   (PHASEKV_HAS_BF16_DOT ? PHASEKV_SIMD_BF16_DOT : 0u) | (PHASEKV_HAS_INT8_DOT ? PHASEKV_SIMD_INT8_DOT : 0u))

#include <string>
#include <utility>
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

namespace phasekv::simd {

enum isa : unsigned {
  avx2 = PHASEKV_SIMD_AVX2,
  f16c = PHASEKV_SIMD_F16C,
  avx512 = PHASEKV_SIMD_AVX512,
  avx512_bw_vl = PHASEKV_SIMD_AVX512_BW_VL,
  avx512_vbmi = PHASEKV_SIMD_AVX512_VBMI,
  bf16_dot = PHASEKV_SIMD_BF16_DOT,
  int8_dot = PHASEKV_SIMD_INT8_DOT,
};

// The paths compiled into the calling translation unit.
constexpr unsigned compiled_isa(unsigned compiled = PHASEKV_SIMD_KERNELS) noexcept { return compiled; }
// Whether every path in `isas` (bits of `isa`) is compiled into the calling translation unit.
constexpr bool compiled_with(unsigned isas, unsigned compiled = PHASEKV_SIMD_KERNELS) noexcept {
  return (compiled & isas) == isas;
}

// The paths this CPU could run, by the CPU's own report (cpuid through the compiler's builtin):
// x86-64 with GCC or Clang only; 0 elsewhere (ARM and others have none of these paths).
inline unsigned cpu_isa() noexcept {
  unsigned bits = 0;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) bits |= avx2;
  // Clang 14's builtin does not know "f16c": CPUID leaf 1, ECX bit 29 (usable where AVX2 is).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if ((bits & avx2) && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29))) bits |= f16c;
  if (__builtin_cpu_supports("avx512f")) bits |= avx512;
  if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) bits |= avx512_bw_vl;
  if (__builtin_cpu_supports("avx512vbmi")) bits |= avx512_vbmi;
  if (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f")) bits |= bf16_dot;
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")) bits |= int8_dot;
#endif
  return bits;
}

// What this CPU offers that this translation unit was not compiled for: 0 for a -march=native
// build on the machine that runs it. Non-zero is a slower build, never a wrong one.
inline unsigned unused_cpu_isa(unsigned compiled = PHASEKV_SIMD_KERNELS) noexcept { return cpu_isa() & ~compiled; }

// The names of the bits in `isas`, comma-separated ("none" for 0).
inline std::string isa_names(unsigned isas) {
  static const std::pair<unsigned, const char*> names[] = {
      {avx2, "AVX2+FMA"},      {f16c, "F16C"},           {avx512, "AVX-512F"},       {avx512_bw_vl, "AVX-512BW/VL"},
      {avx512_vbmi, "AVX-512VBMI"}, {bf16_dot, "AVX512-BF16"}, {int8_dot, "AVX-512VNNI"}};
  std::string out;
  for (const auto& [bit, name] : names)
    if (isas & bit) out += (out.empty() ? "" : ", ") + std::string(name);
  return out.empty() ? "none" : out;
}

// One line naming the path each kernel family takes in this translation unit, e.g.
// "vectors 512-bit (AVX-512F); bf16 indexer: vdpbf16ps; FP4 indexer: vpdpbusd; FP8: AVX-512BW/VL; …".
inline std::string compiled_isa_report(unsigned compiled = PHASEKV_SIMD_KERNELS) {
  const unsigned c = compiled;
  std::string out = "vectors ";
  out += (c & avx512) ? "512-bit (AVX-512F)" : (c & avx2) ? "256-bit (AVX2)" : "128-bit (baseline SSE2 or the xsimd default)";
  out += "; bf16 indexer: ";
  out += (c & bf16_dot) ? "vdpbf16ps (AVX512-BF16)" : "fp32 products of bf16-rounded values (no AVX512-BF16)";
  out += "; FP4 indexer: ";
  out += (c & int8_dot) ? "vpdpbusd (AVX-512VNNI)" : "scalar, same bits (no AVX-512VNNI)";
  out += "; FP8 entries: ";
  out += (c & avx512_bw_vl) ? "AVX-512BW/VL" : (c & avx512) ? "AVX-512F" : "scalar";
  out += "; f16 storage: ";
  out += (c & f16c) ? "F16C" : "scalar";
  const unsigned unused = unused_cpu_isa(c);
  if (unused) out += "; this CPU also has " + isa_names(unused) + ", unused by this build (compile with -march=native)";
  return out;
}

}  // namespace phasekv::simd
