#pragma once

// cache
#include "phasekv/cache/page_pool.hpp"
#include "phasekv/cache/storage.hpp"

// compress
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/policies.hpp"
#include "phasekv/compress/pool_kernels.hpp"
#include "phasekv/compress/presets.hpp"
#include "phasekv/compress/projection.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/compress/stream_state.hpp"

// core
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/rope.hpp"
#include "phasekv/core/span.hpp"

// diag
#include "phasekv/diag/write_profile.hpp"

// simd
#include "phasekv/simd/batch.hpp"
