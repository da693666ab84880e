// The smallest real use of phasekv: the umbrella header compiles and one call links and runs.
#include <phasekv/phasekv.hpp>

int main() {
  phasekv::geometry g{4, 8};  // DeepSeek-V4 CSA: stride 4, window 8
  g.validate();
  return g.branches() == 2 ? 0 : 1;
}
