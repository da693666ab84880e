// march_probe.cpp built with -march=native (tests/CMakeLists.txt sets the flag on this file).
#include "march_probe.cpp"
