#pragma once
// What the layout test compares: the size and alignment of every public type a host may hold or
// pass between its own files, as seen by one translation unit. layout_generic.cpp and
// layout_native.cpp include this with different -march flags (tests/CMakeLists.txt); a type
// whose layout depended on the ISA (a member under #if __AVX512BF16__, an allocator aligned to
// the enabled vector width) would differ between the two — an ODR violation in a host that
// compiles some files with other flags.
//
// Only sizeof and alignof are taken, so no inline function of phasekv is instantiated here and
// the two files do not themselves break the ODR they check.

#include <cstddef>
#include <string>
#include <vector>

namespace phasekv_test {

struct type_layout {
  std::string name;
  std::size_t size = 0, alignment = 0;
};

struct layout_report {
  std::string arch;            // the xsimd architecture the file was compiled for
  bool bf16_dot = false;       // whether the bf16 indexer kernel was compiled in
  unsigned isa = 0;            // simd::compiled_isa() in that file (the PHASEKV_SIMD_* bits)
  std::vector<type_layout> types;
};

layout_report layout_generic();
layout_report layout_native();

}  // namespace phasekv_test

#ifdef PHASEKV_LAYOUT_PROBE
#include <phasekv/phasekv.hpp>

// The reader keeps per-sequence scratch in a vector of a private type: its size differing
// between files would be as bad as the reader's own (elements written with one stride, read
// with another).
struct phasekv::detail::layout_access {
  static std::size_t sequence_work_size() { return sizeof(sparse_reader::sequence_work); }
  static std::size_t sequence_work_alignment() { return alignof(sparse_reader::sequence_work); }
  static std::size_t selection_state_size() { return sizeof(entry_selector::state); }
  static std::size_t selection_state_alignment() { return alignof(entry_selector::state); }
};

namespace phasekv_test {

layout_report PHASEKV_LAYOUT_PROBE() {
  using namespace phasekv;
  using kv = stream_compressor<presets::deepseek_v4_csa_policy>;
  using cache = paged_cache<kv, kv>;
  layout_report r;
  r.arch = simd::default_arch::name();
  r.bf16_dot = kernels::has_bf16_dot;
  r.isa = simd::compiled_isa();
#define PHASEKV_LAYOUT(...) r.types.push_back({#__VA_ARGS__, sizeof(__VA_ARGS__), alignof(__VA_ARGS__)})
  PHASEKV_LAYOUT(sparse_reader);
  PHASEKV_LAYOUT(reader_config);
  PHASEKV_LAYOUT(read_request);
  PHASEKV_LAYOUT(read_item);
  PHASEKV_LAYOUT(read_trace);
  PHASEKV_LAYOUT(entry_selector);
  PHASEKV_LAYOUT(selection_config);
  PHASEKV_LAYOUT(selection_request);
  PHASEKV_LAYOUT(softmax_state);
  PHASEKV_LAYOUT(sequence_view);
  PHASEKV_LAYOUT(stream_view);
  PHASEKV_LAYOUT(layer_shape);
  PHASEKV_LAYOUT(paged_view);
  PHASEKV_LAYOUT(page_pool);
  PHASEKV_LAYOUT(page_layout);
  PHASEKV_LAYOUT(cache_config);
  PHASEKV_LAYOUT(stream_config);
  PHASEKV_LAYOUT(stream_state);
  PHASEKV_LAYOUT(geometry);
  PHASEKV_LAYOUT(kv);
  PHASEKV_LAYOUT(cache);
  PHASEKV_LAYOUT(model_cache);
  PHASEKV_LAYOUT(openmp_executor);
  PHASEKV_LAYOUT(kernels::indexer_queries);
  PHASEKV_LAYOUT(kernels::indexer_bf16_queries);
  PHASEKV_LAYOUT(kernels::indexer_fp4_queries);
  PHASEKV_LAYOUT(kernels::attention_queries);
#undef PHASEKV_LAYOUT
  r.types.push_back({"sparse_reader::sequence_work", detail::layout_access::sequence_work_size(),
                     detail::layout_access::sequence_work_alignment()});
  r.types.push_back({"entry_selector::state", detail::layout_access::selection_state_size(),
                     detail::layout_access::selection_state_alignment()});
  return r;
}

}  // namespace phasekv_test
#endif
