#pragma once
// The one place phasekv touches xsimd's spelling differences. Kernels are templates on the
// xsimd architecture (default: the best the compiler enables), so a header-only build compiles
// for whatever the host's flags allow.

#include <cstddef>
#include <type_traits>
#include <vector>

#include "phasekv/detail/simd/config.hpp"
#include "phasekv/detail/simd/intrinsics.hpp"  // before xsimd, which includes the intrinsics too

#include <xsimd/xsimd.hpp>

namespace phasekv::simd {

using default_arch = xsimd::default_arch;

// Scratch that kernels load with aligned loads. The alignment is fixed at 64 bytes (the widest
// vector, AVX-512) rather than xsimd's default for the enabled ISA, so a type that holds one has
// the same layout and type in every file, whatever flags each was compiled with.
inline constexpr std::size_t vector_alignment = 64;
template <class T>
using aligned_vector = std::vector<T, xsimd::aligned_allocator<T, vector_alignment>>;

template <class Arch>
using float_batch = xsimd::batch<float, Arch>;

// x · y + z rounded once. xsimd 8.1 has no AVX-512 fma: its generic fallback computes x * y + z,
// which GCC contracts into vfmadd231ps but Clang evaluates as a multiply and an add — two
// roundings (other bits than the GCC build, and than the kernels' documented sums) and about
// half the speed of every FMA loop. Every kernel calls this instead of xsimd::fma.
template <class Arch>
inline xsimd::batch<float, Arch> fma(const xsimd::batch<float, Arch>& x, const xsimd::batch<float, Arch>& y,
                                     const xsimd::batch<float, Arch>& z) noexcept {
#if PHASEKV_HAS_AVX512
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) return _mm512_fmadd_ps(x, y, z);
#endif
  return xsimd::fma(x, y, z);
}

// Keeps a loaded batch in a register. GCC folds a load into each FMA that uses it when it can,
// even in a tile that reuses the batch four times: one load of 64 bytes becomes four, and the
// tile waits on the load ports. An empty asm that claims to change the value leaves the compiler
// no copy in memory to fold. No effect on the value, or outside GCC/Clang on x86.
template <class Arch>
inline void keep_in_register(xsimd::batch<float, Arch>& x) noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  typename xsimd::batch<float, Arch>::register_type r = x;
  __asm__("" : "+v"(r));
  x = r;
#else
  (void)x;
#endif
}

// Horizontal sum: xsimd 8.x calls it hadd, later releases reduce_add.
template <class Arch>
inline float reduce_add(const xsimd::batch<float, Arch>& x) noexcept {
#if XSIMD_VERSION_MAJOR >= 9
  return xsimd::reduce_add(x);
#else
  return xsimd::hadd(x);
#endif
}

}  // namespace phasekv::simd
