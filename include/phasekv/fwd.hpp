#pragma once
// Declarations of the engine's types a host names in its own headers — a member holding a
// model_cache*, a function taking a sequence_view& — without the cost of engine.hpp in every file
// that sees them. The ids are the real aliases; everything else is declared only: include the
// header that defines a type (or engine.hpp) where it is used. Default template arguments stay with
// the definitions (a stream_compressor<Policy> names its Arch once the header is included).

#include "phasekv/core/types.hpp"  // sequence_id, page_id

namespace phasekv {

// core
class executor;
class config_error;
class input_error;
class capacity_error;
struct geometry;
template <class T>
class span;

// compress
struct token_chunk;
struct append_options;
struct stream_config;
template <class Pooling, class Rope, class Norm>
struct compressor_policy;
template <class Policy, class Arch>
class stream_compressor;
template <class... Compressors>
class layer_compressor;
class stream_kernel;
class pooling_registry;
class erased_stream;

// cache
class page_memory;
struct page_pool_config;
struct page_layout;
class page_pool;
struct cache_config;
struct layer_shape;
struct sequence_view;
template <class... Compressors>
class paged_cache;

// read
struct reader_config;
struct read_request;
struct read_item;
class sparse_reader;

// models
struct layer_kind;
struct model_spec;
struct layer_append;
struct layer_read;
class model_cache;
class model_step;

}  // namespace phasekv
