#pragma once
// The instruction sets phasekv's kernels choose between, as 0/1 macros in one place. A kernel
// picks its path at compile time from the target's flags (-march), so one build has one path per
// kernel. (core/crc32c.hpp keeps its own SSE4.2 / PCLMUL / VPCLMULQDQ tiers.)

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
