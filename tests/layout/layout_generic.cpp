// Compiled for baseline x86-64 (SSE2; no AVX-512, no bf16 dot products): see layout_probe.hpp.
#define PHASEKV_LAYOUT_PROBE layout_generic
#include "layout_probe.hpp"
