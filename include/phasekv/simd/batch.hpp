#pragma once
// The one place phasekv touches xsimd's spelling differences. Kernels are templates on the
// xsimd architecture (default: the best the compiler enables), so a header-only build compiles
// for whatever the host's flags allow.

#include <xsimd/xsimd.hpp>

namespace phasekv::simd {

using default_arch = xsimd::default_arch;

template <class Arch>
using float_batch = xsimd::batch<float, Arch>;

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
