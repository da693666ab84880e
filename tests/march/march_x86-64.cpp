// march_probe.cpp built with -march=x86-64 (tests/CMakeLists.txt sets the flag on this file).
#include "march_probe.cpp"
