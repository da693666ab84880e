// The tools as a product of their own (phasekv::tools: the engine alone, no Eigen): the
// microbenchmark's umbrella compiles, and a read floor prices the bytes and multiply-adds of a
// small layer as read_cost's formula states.
#include <phasekv/tools.hpp>

int main() {
  phasekv::layer_shape shape;
  shape.geom = phasekv::geometry{4, 4};
  phasekv::stream_shape kv;
  kv.channels = 8;
  shape.streams = {kv};
  phasekv::reader_config rc;
  rc.query_heads = 2;
  const phasekv::bench::roofline r = phasekv::bench::read_cost::of(shape, rc, {32}).floor(10);
  // Every entry (10 of 32 bytes) and the queries and output (2 heads × (8 + 8) floats); q·k and p·v.
  return r.bytes == 10.0 * 32 + 4.0 * 2 * 16 && r.flops == 2.0 * 2 * 16 * 10 ? 0 : 1;
}
