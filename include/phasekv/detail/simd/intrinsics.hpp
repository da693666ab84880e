#pragma once
// The x86 intrinsics, included so that GCC 12 keeps quiet about them in code that uses phasekv.
//
// GCC 12 reports -Wuninitialized / -Wmaybe-uninitialized inside its own AVX-512 intrinsics (their
// "undefined" vectors are written `__m512 __Y = __Y;`) wherever they are inlined — thousands of
// warnings for one call into the reader (GCC bug 105593). Whether a warning is shown depends on
// the diagnostic state at its location, which is the intrinsics header, so wrapping its
// #include silences exactly those and nothing of the host's own code, without any flag. Every
// phasekv header that needs the intrinsics, or includes Eigen or xsimd (which include them
// too), includes this first. A host that includes <immintrin.h> itself before phasekv keeps its
// own state for it (the header is included once).

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
