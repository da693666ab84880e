#pragma once
// The engine: what an inference engine embeds to compress its KV cache in chunks and read it
// back — geometry and errors (core), the number formats (format), the compressors (compress),
// the paged caches (cache), the sparse reader (read), whole models behind one front door and the
// published models as data (models), and the diagnostics a host feeds from its own reads and
// writes (diag: write profiles, read attribution, record layouts). It needs xsimd alone; nothing
// here includes the study (study.hpp), the conformance kit (testing.hpp) or the tools (tools.hpp).
// Each header also stands alone.
//
// Keep this list complete (scripts/test checks it): every public header, that is every
// include/phasekv/<part>/*.hpp of these parts, sorted, one block per part. The internals are
// included by the headers that use them, not listed here: they are not an API and may change in
// any release — detail/ under everything (the SIMD layer detail/simd/, namespace phasekv::simd;
// text, enum names, CRC-32C in phasekv::detail), a part's own detail/ (core/detail/limits.hpp,
// format/detail/byte_io.hpp, read/detail/: top-k, the reader's checks) and kernels/ (namespace
// phasekv::kernels: pooling, attention, the indexers). fwd.hpp declares the types a host names in
// its own headers; included first here, so every build that includes the engine holds its
// declarations to the definitions.

#include "phasekv/fwd.hpp"
#include "phasekv/version.hpp"

// core
#include "phasekv/core/error.hpp"
#include "phasekv/core/executor.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/openmp_executor.hpp"
#include "phasekv/core/random.hpp"
#include "phasekv/core/rope.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/core/types.hpp"

// format
#include "phasekv/format/fp4.hpp"
#include "phasekv/format/fp8.hpp"
#include "phasekv/format/storage.hpp"

// compress
#include "phasekv/compress/deepseek_checkpoint.hpp"
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/compress/entry_view.hpp"
#include "phasekv/compress/erased_stream.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/policies.hpp"
#include "phasekv/compress/policy_codes.hpp"
#include "phasekv/compress/pooling_registry.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/compress/stream_state.hpp"

// cache
#include "phasekv/cache/cache_config.hpp"
#include "phasekv/cache/entry_io.hpp"
#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/cache/page_allocator.hpp"
#include "phasekv/cache/page_arena.hpp"
#include "phasekv/cache/page_layout.hpp"
#include "phasekv/cache/page_memory.hpp"
#include "phasekv/cache/page_plan.hpp"
#include "phasekv/cache/page_pool.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/raw_window.hpp"
#include "phasekv/cache/sequence_table.hpp"
#include "phasekv/cache/sequence_view.hpp"
#include "phasekv/cache/snapshot.hpp"
#include "phasekv/cache/snapshot_fingerprint.hpp"

// read
#include "phasekv/read/read_types.hpp"
#include "phasekv/read/reader_streams.hpp"
#include "phasekv/read/selection.hpp"
#include "phasekv/read/softmax_state.hpp"
#include "phasekv/read/sparse_reader.hpp"

// models
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/models/layer_kind.hpp"
#include "phasekv/models/model_cache.hpp"
#include "phasekv/models/model_snapshot.hpp"
#include "phasekv/models/nsa.hpp"

// diag
#include "phasekv/diag/read_attribution.hpp"
#include "phasekv/diag/record_layout.hpp"
#include "phasekv/diag/write_profile.hpp"
