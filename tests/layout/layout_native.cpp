// Compiled for the build machine (-march=native): see layout_probe.hpp.
#define PHASEKV_LAYOUT_PROBE layout_native
#include "layout_probe.hpp"
