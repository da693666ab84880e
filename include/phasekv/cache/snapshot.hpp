#pragma once
// Sequence snapshots: one sequence of a paged_cache as bytes, and those bytes restored into
// another cache — in another process, another page pool, another storage type when that is
// lossless — so that every later append and read is bit-identical to never having moved. This
// is what a disaggregated engine needs to move a prefilled sequence from a prefill node to a
// decode node.
//
//   std::vector<std::byte> bytes = snapshot(prefill_cache, seq);           // or snapshot_into()
//   sequence_id moved = restore(decode_cache, bytes);                      // a new sequence
//
// What a snapshot holds: every stream's entries (as stored: fp32, bf16, fp16, FP8 or FP4 blocks), every stream's
// compressor state (counts and the ring of pending inputs), the raw window ring with its first
// kept token, the token count, and a fingerprint of the configuration those bytes assume.
//
// ---- Compatibility -----------------------------------------------------------------------------
//
// restore() compares the snapshot's fingerprint with the destination cache and names the first
// field that differs. These must be equal: the geometry (stride, window, origin, anchor); the
// number of streams; per stream its compile-time policy (pooling, RoPE placement, norm), role,
// channels, kv_heads, input layout, RoPE configuration (policies with RoPE), norm_eps (policies
// with RMSNorm) and learned parameters (slot_bias, norm_weight, slot_profile: element count and
// CRC-32C of their bytes); the raw window's tokens, kv_heads and channels.
// These may differ:
//   - page_size, pool capacity, the cache's and streams' names;
//   - a stream's storage type, when the conversion is lossless: the same type (fp8_e4m3_block
//     entries are copied byte for byte, so a restored fp8 cache reads bit-identically), or
//     bf16/f16/fp8_e4m3_block into f32 (exact widening: every stored value is an fp32 value).
//     Everything else is rejected as lossy: f32 into bf16/f16/fp8, bf16 ↔ f16, and any type into
//     fp8 but fp8 (re-quantizing rounds again). fp4_e2m1_hadamard entries restore only as
//     fp4_e2m1_hadamard, byte for byte: their values are the indexer keys in the transformed
//     basis (format/fp4.hpp), which no other storage type means;
//   - cache_config::history. The rings are re-laid: the compressor ring (W + history rows) and the
//     window ring (window.tokens + history rows) keep token t in row t mod rows, so restore copies
//     each kept token's row to its row in the destination's ring. A destination with a smaller
//     history keeps the last rows it has room for; one with a larger history gains nothing
//     (the older inputs were never in the snapshot). Afterwards remove_suffix can roll back as
//     far as both histories allow — exactly as far as it could in a cache with min(source,
//     destination) history that received the same tokens — and, once history more tokens have
//     been appended, as far as the destination's own history allows. With equal histories the
//     rings are copied verbatim and the restored state equals the source's (stream_state ==);
//   - the raw window's precision (raw_window_config): a snapshot holds the rows' values as fp32
//     either way (an FP8 window's rows dequantized, exact), and a destination whose window is
//     fp8_e4m3_block quantizes them as append does — rows from an FP8 window come back as the
//     same values (and bytes, but for a block whose amax had rounded down to 224 · s: its scale
//     halves and its codes double).
// Not checked: the SIMD architecture the destination's compressors and reader run with. Later
// appends and reads are bit-identical when both sides run the same build on the same kind of
// machine; another instruction set may change summation orders (not the snapshot's meaning).
//
// ---- Validation and failure --------------------------------------------------------------------
//
// restore() throws input_error — with the cache exactly as it was — for bytes that are not a
// snapshot, a version it does not read, a snapshot truncated at any length or with bytes after
// its end, any checksum mismatch, an incompatible configuration, or counts that do not fit
// together (entries ≠ completed_entries(tokens), ring sizes, intact_from or window_first outside
// what a cache can hold); capacity_error when a destination pool lacks the pages. Every message
// starts with "snapshot: " and says what is wrong, e.g.
//   snapshot: truncated at byte 1234 of 5678
//   snapshot: section 3 (stream 1 entries) checksum mismatch (stored 0x…, computed 0x…)
//   snapshot: stride 4 does not match the cache's 2
// Order: the preamble and header (framing, checksums, fingerprint, the section table and every
// length it implies) and the small sections (compressor states, raw window) are verified before
// anything changes. The entry sections — nearly all of the bytes — are verified while they are
// copied into freshly allocated pages that no sequence references yet; if one fails its
// checksum those pages are released (in reverse order, so the pool's free list is as before) and
// the cache is as it was. Checking them in a pass of their own first would read every byte twice
// (restore would fall to about half of memcpy's speed). So a corrupt entry section restored into
// a full pool reports the capacity_error, not the corruption, and until restore returns other
// threads may see those pages in use. Memory that cannot be allocated (std::bad_alloc anywhere
// inside) is a capacity_error too, with the cache unchanged, as for the cache's own calls.
//
// Every single-bit error is detected with certainty: each byte of a snapshot lies in exactly one
// CRC-32C-protected range (preamble, header, one section), and a CRC detects every single-bit
// error (core/crc32c.hpp); the preamble's checksum is checked before any field that locates the
// rest is believed, so a flipped length cannot send the reader astray. Reserved fields must be 0.
//
// ---- Format, version 1 ------------------------------------------------------------------------
//
// All integers little-endian, fixed width (u32/u64/i64); f64 = IEEE binary64 bits as a u64;
// arrays of f32/bf16/f16 as they lie in memory on a little-endian host. Sections follow the
// header back to back, in the order of the table, with no padding.
//
//   preamble, 32 bytes (this layout is the same in every version, so any version is recognised)
//     0   magic        89 50 4B 56 53 4E 41 50  ("\x89PKVSNAP": a non-ASCII first byte, so no
//                      text file is mistaken for a snapshot)
//     8   u32 version  1
//     12  u32 header_bytes   bytes of preamble + header = offset of the first section
//     16  u64 total_bytes    of the whole snapshot
//     24  u32 reserved (0)
//     28  u32 preamble CRC-32C of bytes [0, 28)
//   header (from byte 32)
//     sequence and layer, 11 × 8 bytes:
//       u64 tokens, u64 streams (S), i64 stride, i64 window, i64 origin, u64 anchor (anchor_mode),
//       i64 history, i64 window.tokens, i64 window.kv_heads, i64 window.key_channels,
//       i64 window.value_channels (the four window fields 0 when window.tokens = 0)
//     per stream, S × 152 bytes:
//       u32 pooling (1 mean, 2 vector gates, 3 scalar gates, 4 fixed weights; a policy of the
//       host's: 0x80000000 | CRC-32C of its name, version and parameters, see pooling_identity),
//       u32 rope (1 none, 2 after pooling, 3 before pooling), u32 norm (1 none, 2 RMSNorm),
//       u32 role (stream_role + 1), i64 channels, i64 kv_heads, u32 inputs (input_layout + 1),
//       u32 storage (storage_type + 1, as the entries are written: 1 f32, 2 bf16, 3 f16,
//       4 fp8_e4m3_block, 5 fp4_e2m1_hadamard),
//       i64 rope.channels, f64 rope.base, u32 rope.layout (rope_layout + 1), u32 yarn.enabled,
//       f64 yarn.factor, i64 yarn.original_context, f64 yarn.beta_fast, f64 yarn.beta_slow
//       (the RoPE fields all 0 for a policy without RoPE, the YaRN ones 0 when it is off),
//       f64 norm_eps (0 without RMSNorm),
//       then for slot_bias, norm_weight, slot_profile: u64 float count, u32 CRC-32C of the
//       floats' bytes, u32 reserved (0)
//     section table: u64 count (2S + 1), then per section 24 bytes:
//       u32 kind (1 entries, 2 compressor state, 3 raw window), u32 stream (0xFFFFFFFF for the
//       window), u64 bytes, u32 CRC-32C of the section's bytes, u32 flags (a compressor-state
//       section's bit 0: host-fed — its last tokens' entries came from the host, so it rolls back to
//       any length, and then intact_from = tokens > 0; every other bit, and the other sections', 0)
//     u32 reserved (0), u32 header CRC-32C of bytes [0, header_bytes − 4)
//   header_bytes = 160 + 200·S.
//   sections, in this order:
//     0 … S−1     stream k entries: completed_entries(tokens) entries × kv_heads × channels
//                 elements of the stream's storage type, entry after entry (no page padding);
//                 for fp8_e4m3_block, entries × kv_heads heads of fp8_head_layout::of(channels,
//                 rope.channels).bytes bytes each (format/fp8.hpp; rope.channels as in the
//                 stream's fingerprint, 0 without RoPE); for fp4_e2m1_hadamard, entries ×
//                 kv_heads heads of fp4_head_layout::of(channels).bytes bytes each (format/fp4.hpp)
//     S … 2S−1    stream k compressor state: i64 tokens, i64 entries, i64 ring_rows (= window +
//                 history), i64 intact_from (tokens [intact_from, tokens) have their inputs in
//                 the ring), then f32 payload ring [ring_rows][kv_heads·views·channels] and f32
//                 logit ring [ring_rows][kv_heads·views·gate_channels]; token t in row t mod ring_rows
//     2S          raw window: i64 window_first (tokens [window_first, tokens) are held), i64 rows
//                 (window.tokens + history, or 0), f32 keys [rows][window.kv_heads·key_channels],
//                 f32 values [rows][window.kv_heads·value_channels] (none when tied); token t in
//                 row t mod rows
//
// Thread safety: snapshot() reads one sequence — like the cache's const queries it may run
// concurrently with other readers of that sequence, not with its writer. restore() adds a new
// sequence; it may run concurrently with calls on other sequences (the pools and the sequence
// table synchronise themselves).
//
// Speed: a snapshot copies each page's entries and computes their checksum in one pass
// (crc32c_copy), and restore copies them into the new pages the same way, so both run close to
// memcpy of the same bytes (bench/bench_cache.cpp: BM_snapshot, BM_restore).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/compress/policies.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/core/crc32c.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/limits.hpp"
#include "phasekv/core/span.hpp"

namespace phasekv {

namespace detail::snapshot_format {

inline constexpr unsigned char magic[8] = {0x89, 'P', 'K', 'V', 'S', 'N', 'A', 'P'};
inline constexpr std::uint32_t version = 1;
inline constexpr std::size_t preamble_bytes = 32;
inline constexpr std::size_t layer_bytes = 11 * 8;
inline constexpr std::size_t stream_bytes = 152;
inline constexpr std::size_t section_entry_bytes = 24;
inline constexpr std::size_t state_fields_bytes = 4 * 8;
inline constexpr std::size_t window_fields_bytes = 2 * 8;
inline constexpr std::uint32_t no_stream_index = 0xFFFFFFFFu;
// More streams than any layer has; bounds the header a corrupt count could describe.
inline constexpr std::uint64_t max_streams = 1024;

enum section_kind : std::uint32_t { entries_section = 1, state_section = 2, window_section = 3 };

constexpr std::size_t header_bytes(std::size_t streams) noexcept {
  return preamble_bytes + layer_bytes + streams * stream_bytes + 8 + (2 * streams + 1) * section_entry_bytes + 8;
}
static_assert(header_bytes(0) == 160 && header_bytes(1) == 360, "the header size the format comment states");

// Arrays are copied as they lie in memory, which is the format's byte order only on a
// little-endian host. (Every x86 and ARM host phasekv targets is one.)
inline constexpr bool host_little_endian =
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
#else
    true;  // MSVC's targets are all little-endian
#endif

// ---- policy codes --------------------------------------------------------------------------------

template <class>
inline constexpr bool always_false = false;

template <class P, class = void>
struct has_parameters : std::false_type {};
template <class P>
struct has_parameters<P, std::void_t<decltype(std::declval<const P&>().parameters())>> : std::true_type {};

template <class Pooling>
constexpr std::uint32_t pooling_code() noexcept {
  if constexpr (std::is_same_v<Pooling, mean_pool>) return 1;
  else if constexpr (std::is_same_v<Pooling, vector_gated_pool>) return 2;
  else if constexpr (std::is_same_v<Pooling, scalar_gated_pool>) return 3;
  else if constexpr (std::is_same_v<Pooling, fixed_weight_pool>) return 4;
  else static_assert(always_false<Pooling>, "snapshot.hpp needs a code for this pooling policy");
}
template <class Rope>
constexpr std::uint32_t rope_code() noexcept {
  if constexpr (std::is_same_v<Rope, no_rope>) return 1;
  else if constexpr (std::is_same_v<Rope, rope_after_pool>) return 2;
  else if constexpr (std::is_same_v<Rope, rope_before_pool>) return 3;
  else static_assert(always_false<Rope>, "snapshot.hpp needs a code for this RoPE placement");
}
template <class Norm>
constexpr std::uint32_t norm_code() noexcept {
  if constexpr (std::is_same_v<Norm, no_norm>) return 1;
  else if constexpr (std::is_same_v<Norm, rms_norm>) return 2;
  else static_assert(always_false<Norm>, "snapshot.hpp needs a code for this norm");
}

// A pooling policy of the host's (compress/policies.hpp) has no fixed code: its identity is the
// CRC-32C of its name, version and learned parameters (when it exposes parameters()), with the
// top bit set — so a snapshot restores only into a cache with the same policy, version and weights.
template <class Pooling>
std::uint32_t pooling_identity(const Pooling& pool) noexcept {
  if constexpr (is_custom_pool_v<Pooling>) {
    const std::string name = Pooling::name;
    const std::uint32_t policy_version = Pooling::version;
    std::uint32_t crc = phasekv::crc32c(name.data(), name.size() + 1);
    crc = phasekv::crc32c(&policy_version, sizeof policy_version, crc);
    if constexpr (has_parameters<Pooling>::value) {
      const auto w = pool.parameters();
      crc = phasekv::crc32c(w.data(), w.size() * sizeof(float), crc);
    }
    return 0x80000000u | crc;
  } else {
    (void)pool;
    return pooling_code<Pooling>();
  }
}

inline std::string pooling_name(std::uint32_t code) {
  if (code & 0x80000000u) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", code);
    return std::string("a policy of the host's (identity 0x") + hex + ")";
  }
  switch (code) {
    case 1: return "mean";
    case 2: return "vector gates";
    case 3: return "scalar gates";
    case 4: return "fixed weights";
  }
  return "unknown (" + std::to_string(code) + ")";
}
inline std::string rope_name(std::uint32_t code) {
  switch (code) {
    case 1: return "none";
    case 2: return "after pooling";
    case 3: return "before pooling";
  }
  return "unknown (" + std::to_string(code) + ")";
}
inline std::string norm_name(std::uint32_t code) {
  switch (code) {
    case 1: return "none";
    case 2: return "RMSNorm";
  }
  return "unknown (" + std::to_string(code) + ")";
}
inline std::string role_name(std::uint32_t code) {
  switch (code) {
    case 1: return "key";
    case 2: return "value";
    case 3: return "key_value";
    case 4: return "indexer";
  }
  return "unknown (" + std::to_string(code) + ")";
}
inline std::string inputs_name(std::uint32_t code) {
  switch (code) {
    case 1: return "per_branch";
    case 2: return "per_slot";
  }
  return "unknown (" + std::to_string(code) + ")";
}
inline std::string storage_name(std::uint32_t code) {
  switch (code) {
    case 1: return "f32";
    case 2: return "bf16";
    case 3: return "f16";
    case 4: return "fp8_e4m3_block";
    case 5: return "fp4_e2m1_hadamard";
  }
  return "unknown (" + std::to_string(code) + ")";
}
inline std::string anchor_name(std::uint64_t code) {
  return code <= 2 ? to_string(static_cast<anchor_mode>(code)) : "unknown (" + std::to_string(code) + ")";
}
inline std::string rope_layout_name(std::uint32_t code) {
  switch (code) {
    case 1: return "interleaved";
    case 2: return "half_split";
  }
  return "unknown (" + std::to_string(code) + ")";
}
inline storage_type storage_of(std::uint32_t code) noexcept { return static_cast<storage_type>(code - 1); }
inline std::uint32_t code_of(storage_type type) noexcept { return static_cast<std::uint32_t>(type) + 1; }

// ---- bytes ------------------------------------------------------------------------------------------

inline std::uint64_t f64_bits(double v) noexcept {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}
inline double f64_from_bits(std::uint64_t bits) noexcept {
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// Writes little-endian fields at a cursor. The caller sized the buffer.
class writer {
 public:
  explicit writer(unsigned char* at) noexcept : at_(at) {}
  void bytes(const void* p, std::size_t n) noexcept {
    if (n > 0) std::memcpy(at_, p, n);
    at_ += n;
  }
  void u32(std::uint32_t v) noexcept {
    for (int k = 0; k < 4; ++k) *at_++ = static_cast<unsigned char>(v >> (8 * k));
  }
  void u64(std::uint64_t v) noexcept {
    for (int k = 0; k < 8; ++k) *at_++ = static_cast<unsigned char>(v >> (8 * k));
  }
  void i64(std::int64_t v) noexcept { u64(static_cast<std::uint64_t>(v)); }
  void f64(double v) noexcept { u64(f64_bits(v)); }
  unsigned char* position() const noexcept { return at_; }

 private:
  unsigned char* at_;
};

// Reads little-endian fields within [begin, end); reading past the end is an input_error (the
// callers check lengths first, so this is a second line of defence).
class reader {
 public:
  reader(const unsigned char* begin, const unsigned char* end) noexcept : at_(begin), end_(end) {}
  std::uint32_t u32() {
    need(4);
    std::uint32_t v = 0;
    for (int k = 3; k >= 0; --k) v = (v << 8) | at_[k];
    at_ += 4;
    return v;
  }
  std::uint64_t u64() {
    need(8);
    std::uint64_t v = 0;
    for (int k = 7; k >= 0; --k) v = (v << 8) | at_[k];
    at_ += 8;
    return v;
  }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  double f64() { return f64_from_bits(u64()); }
  // A reserved u32, which must be 0; where() names it (called only on failure).
  template <class Where>
  void reserved(Where&& where) {
    const std::uint32_t v = u32();
    if (v != 0) fail<input_error>("snapshot: reserved field of " + std::string(where()), v, "must be 0");
  }

 private:
  void need(std::size_t n) const {
    if (static_cast<std::size_t>(end_ - at_) < n)
      throw input_error("snapshot: a field runs past the end of its part of the snapshot");
  }
  const unsigned char* at_;
  const unsigned char* end_;
};

// a · b, or false when it does not fit in 63 bits (a count a corrupt field made absurd).
inline bool multiply(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  constexpr std::uint64_t limit = std::uint64_t{1} << 62;
  if (a != 0 && b > limit / a) return false;
  out = a * b;
  return true;
}

inline std::string hex(std::uint32_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s = "0x";
  for (int k = 7; k >= 0; --k) s += digits[(v >> (4 * k)) & 0xFu];
  return s;
}

inline std::string number(double v) {
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.17g", v);
  return buffer;
}

// ---- the fingerprint --------------------------------------------------------------------------

struct parameter_digest {
  std::uint64_t floats = 0;
  std::uint32_t crc = 0;
  bool operator==(const parameter_digest& o) const noexcept { return floats == o.floats && crc == o.crc; }
  bool operator!=(const parameter_digest& o) const noexcept { return !(*this == o); }
};

inline parameter_digest digest(const std::vector<float>& values) noexcept {
  return {values.size(), crc32c(values.data(), values.size() * sizeof(float))};
}

struct stream_fingerprint {
  std::uint32_t pooling = 0, rope = 0, norm = 0, role = 0;
  std::int64_t channels = 0, kv_heads = 0;
  std::uint32_t inputs = 0, storage = 0;
  std::int64_t rope_channels = 0;
  double rope_base = 0.0;
  std::uint32_t rope_layout = 0, yarn_enabled = 0;
  double yarn_factor = 0.0;
  std::int64_t yarn_original_context = 0;
  double yarn_beta_fast = 0.0, yarn_beta_slow = 0.0;
  double norm_eps = 0.0;
  parameter_digest slot_bias, norm_weight, slot_profile;
  std::string name;  // the destination's stream name, for messages (not part of the format)
};

struct fingerprint {
  std::uint64_t tokens = 0;  // of the sequence (snapshot only)
  std::int64_t stride = 0, window = 0, origin = 0;
  std::uint64_t anchor = 0;
  std::int64_t history = 0;
  std::int64_t window_tokens = 0, window_kv_heads = 0, window_key_channels = 0, window_value_channels = 0;
  std::vector<stream_fingerprint> streams;
};

template <class Compressor>
stream_fingerprint stream_fingerprint_of(const Compressor& c, storage_type storage) {
  using policy = typename Compressor::policy;
  stream_fingerprint f;
  const stream_config& config = c.config();
  f.pooling = pooling_identity(c.pool());
  f.rope = rope_code<typename policy::rope>();
  f.norm = norm_code<typename policy::norm>();
  f.role = static_cast<std::uint32_t>(config.role) + 1;
  f.channels = config.channels;
  f.kv_heads = config.kv_heads;
  f.inputs = static_cast<std::uint32_t>(config.inputs) + 1;
  f.storage = code_of(storage);
  if constexpr (has_rope_v<policy>) {
    f.rope_channels = config.rope.channels;
    f.rope_base = config.rope.base;
    f.rope_layout = static_cast<std::uint32_t>(config.rope.layout) + 1;
    if (config.rope.yarn.enabled) {
      f.yarn_enabled = 1;
      f.yarn_factor = config.rope.yarn.factor;
      f.yarn_original_context = config.rope.yarn.original_context;
      f.yarn_beta_fast = config.rope.yarn.beta_fast;
      f.yarn_beta_slow = config.rope.yarn.beta_slow;
    }
  }
  if constexpr (has_norm_v<policy>) f.norm_eps = config.norm_eps;
  f.slot_bias = digest(c.params().slot_bias);
  f.norm_weight = digest(c.params().norm_weight);
  f.slot_profile = digest(c.params().slot_profile);
  f.name = config.name;
  return f;
}

inline void write_parameter(writer& w, const parameter_digest& d) noexcept {
  w.u64(d.floats);
  w.u32(d.crc);
  w.u32(0);
}

inline void write_fingerprint(writer& w, const fingerprint& f) noexcept {
  w.u64(f.tokens);
  w.u64(f.streams.size());
  w.i64(f.stride);
  w.i64(f.window);
  w.i64(f.origin);
  w.u64(f.anchor);
  w.i64(f.history);
  w.i64(f.window_tokens);
  w.i64(f.window_kv_heads);
  w.i64(f.window_key_channels);
  w.i64(f.window_value_channels);
  for (const stream_fingerprint& s : f.streams) {
    w.u32(s.pooling);
    w.u32(s.rope);
    w.u32(s.norm);
    w.u32(s.role);
    w.i64(s.channels);
    w.i64(s.kv_heads);
    w.u32(s.inputs);
    w.u32(s.storage);
    w.i64(s.rope_channels);
    w.f64(s.rope_base);
    w.u32(s.rope_layout);
    w.u32(s.yarn_enabled);
    w.f64(s.yarn_factor);
    w.i64(s.yarn_original_context);
    w.f64(s.yarn_beta_fast);
    w.f64(s.yarn_beta_slow);
    w.f64(s.norm_eps);
    write_parameter(w, s.slot_bias);
    write_parameter(w, s.norm_weight);
    write_parameter(w, s.slot_profile);
  }
}

inline parameter_digest read_parameter(reader& r, std::size_t stream, const char* name) {
  parameter_digest d;
  d.floats = r.u64();
  d.crc = r.u32();
  r.reserved([&] { return "stream " + std::to_string(stream) + " " + name; });
  return d;
}

// The layer block and `streams` stream records (the caller read the stream count already).
inline fingerprint read_fingerprint(reader& r, std::size_t streams) {
  fingerprint f;
  f.tokens = r.u64();
  (void)r.u64();  // the stream count
  f.stride = r.i64();
  f.window = r.i64();
  f.origin = r.i64();
  f.anchor = r.u64();
  f.history = r.i64();
  f.window_tokens = r.i64();
  f.window_kv_heads = r.i64();
  f.window_key_channels = r.i64();
  f.window_value_channels = r.i64();
  f.streams.resize(streams);
  for (std::size_t k = 0; k < streams; ++k) {
    stream_fingerprint& s = f.streams[k];
    s.pooling = r.u32();
    s.rope = r.u32();
    s.norm = r.u32();
    s.role = r.u32();
    s.channels = r.i64();
    s.kv_heads = r.i64();
    s.inputs = r.u32();
    s.storage = r.u32();
    s.rope_channels = r.i64();
    s.rope_base = r.f64();
    s.rope_layout = r.u32();
    s.yarn_enabled = r.u32();
    s.yarn_factor = r.f64();
    s.yarn_original_context = r.i64();
    s.yarn_beta_fast = r.f64();
    s.yarn_beta_slow = r.f64();
    s.norm_eps = r.f64();
    s.slot_bias = read_parameter(r, k, "slot_bias");
    s.norm_weight = read_parameter(r, k, "norm_weight");
    s.slot_profile = read_parameter(r, k, "slot_profile");
  }
  return f;
}

[[noreturn]] inline void mismatch(const std::string& field, const std::string& theirs, const std::string& ours) {
  throw input_error("snapshot: " + field + " " + theirs + " does not match the cache's " + ours);
}

// Throws input_error naming the first field of the snapshot's fingerprint `s` the cache's `c`
// cannot take (see the header comment for what may differ). Messages are built only on failure:
// this runs for every restore.
inline void check_compatible(const fingerprint& s, const fingerprint& c) {
  constexpr std::size_t layer_field = static_cast<std::size_t>(-1);
  const auto name = [&](std::size_t k, const char* field) -> std::string {
    if (k == layer_field) return field;
    return "stream " + std::to_string(k) + " (" + c.streams[k].name + ") " + field;
  };
  const auto same = [&](std::size_t k, const char* field, auto theirs, auto ours, auto show) {
    if (theirs != ours) mismatch(name(k, field), show(theirs), show(ours));
  };
  const auto same_real = [&](std::size_t k, const char* field, double theirs, double ours) {
    if (f64_bits(theirs) != f64_bits(ours)) mismatch(name(k, field), number(theirs), number(ours));
  };
  const auto integer = [](auto v) { return std::to_string(v); };
  const auto parameter = [](const parameter_digest& d) {
    return "(" + std::to_string(d.floats) + " floats, CRC-32C " + hex(d.crc) + ")";
  };
  constexpr std::size_t L = layer_field;
  same(L, "stride", s.stride, c.stride, integer);
  same(L, "window", s.window, c.window, integer);
  same(L, "origin", s.origin, c.origin, integer);
  same(L, "anchor", s.anchor, c.anchor, anchor_name);
  same(L, "stream count", s.streams.size(), c.streams.size(), integer);
  same(L, "window.tokens", s.window_tokens, c.window_tokens, integer);
  same(L, "window.kv_heads", s.window_kv_heads, c.window_kv_heads, integer);
  same(L, "window.key_channels", s.window_key_channels, c.window_key_channels, integer);
  same(L, "window.value_channels", s.window_value_channels, c.window_value_channels, integer);
  for (std::size_t k = 0; k < s.streams.size(); ++k) {
    const stream_fingerprint &a = s.streams[k], &b = c.streams[k];
    same(k, "pooling", a.pooling, b.pooling, pooling_name);
    same(k, "RoPE placement", a.rope, b.rope, rope_name);
    same(k, "norm", a.norm, b.norm, norm_name);
    same(k, "role", a.role, b.role, role_name);
    same(k, "channels", a.channels, b.channels, integer);
    same(k, "kv_heads", a.kv_heads, b.kv_heads, integer);
    same(k, "inputs", a.inputs, b.inputs, inputs_name);
    same(k, "rope.channels", a.rope_channels, b.rope_channels, integer);
    same_real(k, "rope.base", a.rope_base, b.rope_base);
    same(k, "rope.layout", a.rope_layout, b.rope_layout, rope_layout_name);
    same(k, "rope.yarn.enabled", a.yarn_enabled, b.yarn_enabled, integer);
    same_real(k, "rope.yarn.factor", a.yarn_factor, b.yarn_factor);
    same(k, "rope.yarn.original_context", a.yarn_original_context, b.yarn_original_context, integer);
    same_real(k, "rope.yarn.beta_fast", a.yarn_beta_fast, b.yarn_beta_fast);
    same_real(k, "rope.yarn.beta_slow", a.yarn_beta_slow, b.yarn_beta_slow);
    same_real(k, "norm_eps", a.norm_eps, b.norm_eps);
    same(k, "slot_bias", a.slot_bias, b.slot_bias, parameter);
    same(k, "norm_weight", a.norm_weight, b.norm_weight, parameter);
    same(k, "slot_profile", a.slot_profile, b.slot_profile, parameter);
    if (a.storage < 1 || a.storage > 5) fail<input_error>("snapshot: " + name(k, "storage"), a.storage, "is not a storage type");
    if (a.storage != b.storage && a.storage == code_of(storage_type::fp4_e2m1_hadamard))
      throw input_error("snapshot: " + name(k, "entries are stored as ") + storage_name(a.storage) +
                        "; the cache stores " + storage_name(b.storage) +
                        " (FP4 indexer keys hold the keys in the transformed basis: they restore only as fp4_e2m1_hadamard)");
    if (a.storage != b.storage && b.storage != code_of(storage_type::f32))
      throw input_error("snapshot: " + name(k, "entries are stored as ") + storage_name(a.storage) +
                        "; the cache stores " + storage_name(b.storage) +
                        ", a lossy conversion (restore converts only to the same type, or to f32)");
  }
  // The source's history may differ (restore re-lays the rings); it only has to be a history.
  if (s.history < 0 || s.history > limits::max_history)
    fail<input_error>("snapshot: history", s.history, "must lie in [0, 2^40]");
}

struct section {
  std::uint32_t kind = 0;
  std::uint32_t stream = 0;
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
  std::uint32_t flags = 0;  // a compressor-state section's: bit 0 host-fed; 0 for the others
};
inline constexpr std::uint32_t host_fed_flag = 1;

inline std::string section_name(std::size_t index, std::uint32_t kind, std::uint32_t stream) {
  std::string what = kind == entries_section ? "stream " + std::to_string(stream) + " entries"
                     : kind == state_section ? "stream " + std::to_string(stream) + " compressor state"
                                             : "raw window";
  return "section " + std::to_string(index) + " (" + what + ")";
}

}  // namespace detail::snapshot_format

namespace detail {

// The one place that reads and rebuilds a paged_cache's per-sequence record and a stream_state's
// private members (both name it a friend).
struct snapshot_access {
  // ---- sizes --------------------------------------------------------------------------------------

  // Bytes of each section of one sequence, in table order.
  template <class... C, class Sequence>
  static std::vector<std::uint64_t> section_bytes(const paged_cache<C...>& cache, const Sequence& s) {
    constexpr std::size_t streams = sizeof...(C);
    std::vector<std::uint64_t> bytes;
    bytes.reserve(2 * streams + 1);
    for (std::size_t k = 0; k < streams; ++k)
      bytes.push_back(static_cast<std::uint64_t>(s.states[k].entries()) *
                      static_cast<std::uint64_t>(cache.pools_[k]->layout().entry_stride_bytes));
    for (std::size_t k = 0; k < streams; ++k)
      bytes.push_back(snapshot_format::state_fields_bytes +
                      (s.states[k].payload_ring_.size() + s.states[k].logit_ring_.size()) * sizeof(float));
    bytes.push_back(snapshot_format::window_fields_bytes +
                    static_cast<std::uint64_t>(cache.window_rows()) *
                        static_cast<std::uint64_t>(cache.window_key_floats() + cache.window_value_floats()) * sizeof(float));
    return bytes;
  }

  template <class... C>
  static std::size_t size(const paged_cache<C...>& cache, sequence_id id) {
    const auto& s = cache.find(id, "snapshot_size");
    std::uint64_t total = snapshot_format::header_bytes(sizeof...(C));
    for (std::uint64_t b : section_bytes(cache, s)) total += b;
    return static_cast<std::size_t>(total);
  }

  // ---- fingerprint of a cache -----------------------------------------------------------------------

  template <class... C>
  static snapshot_format::fingerprint fingerprint_of(const paged_cache<C...>& cache) {
    snapshot_format::fingerprint f;
    const geometry& g = cache.compressors().geom();
    const cache_config& config = cache.config();
    f.stride = g.stride;
    f.window = g.window;
    f.origin = g.origin;
    f.anchor = static_cast<std::uint64_t>(g.anchor);
    f.history = config.history;
    if (config.window.tokens > 0) {
      f.window_tokens = config.window.tokens;
      f.window_kv_heads = config.window.kv_heads;
      f.window_key_channels = config.window.key_channels;
      f.window_value_channels = config.window.value_channels;
    }
    f.streams.resize(sizeof...(C));
    cache.for_each_stream([&](std::size_t k, const auto& c) {
      f.streams[k] = snapshot_format::stream_fingerprint_of(c, cache.pools_[k]->layout().storage);
    });
    return f;
  }

  // ---- snapshot ---------------------------------------------------------------------------------------

  template <class... C>
  static std::size_t write(const paged_cache<C...>& cache, sequence_id id, span<std::byte> out) {
    static_assert(snapshot_format::host_little_endian, "phasekv snapshots need a little-endian host");
    namespace format = snapshot_format;
    constexpr std::size_t streams = sizeof...(C);
    const auto& s = cache.find(id, "snapshot");
    const std::vector<std::uint64_t> bytes = section_bytes(cache, s);
    const std::size_t header = format::header_bytes(streams);
    std::uint64_t total = header;
    for (std::uint64_t b : bytes) total += b;
    if (out.data() == nullptr && out.size() != 0)
      fail<input_error>("snapshot: out.data()", "null", "must not be null when the size is " + std::to_string(out.size()));
    if (out.size() < total)
      fail<input_error>("snapshot: out.size()", out.size(),
                        "must be at least the snapshot's " + std::to_string(total) + " bytes (snapshot_size)");

    auto* base = reinterpret_cast<unsigned char*>(out.data());
    std::vector<format::section> table(2 * streams + 1);
    unsigned char* at = base + header;

    for (std::size_t k = 0; k < streams; ++k) {  // entries, page after page
      const page_pool& pool = *cache.pools_[k];
      const std::int64_t page_size = pool.layout().page_size, entries = s.states[k].entries();
      std::uint32_t crc = 0;
      for (std::int64_t first = 0, page = 0; first < entries; first += page_size, ++page) {
        const auto n = static_cast<std::size_t>(std::min(page_size, entries - first) * pool.layout().entry_stride_bytes);
        crc = crc32c_copy(at, pool.data(s.tables[k][static_cast<std::size_t>(page)]), n, crc);
        at += n;
      }
      table[k] = {format::entries_section, static_cast<std::uint32_t>(k), bytes[k], crc};
    }
    for (std::size_t k = 0; k < streams; ++k) {  // compressor states
      const stream_state& state = s.states[k];
      unsigned char* start = at;
      format::writer w(at);
      w.i64(state.tokens_);
      w.i64(state.entries_);
      w.i64(state.ring_rows_);
      w.i64(state.intact_from_);
      std::uint32_t crc = crc32c(start, format::state_fields_bytes);
      at = w.position();
      crc = copy_floats(at, state.payload_ring_, crc);
      crc = copy_floats(at, state.logit_ring_, crc);
      table[streams + k] = {format::state_section, static_cast<std::uint32_t>(k), bytes[streams + k], crc,
                            state.host_fed_ ? format::host_fed_flag : 0u};
    }
    {  // raw window
      unsigned char* start = at;
      format::writer w(at);
      w.i64(s.window_first);
      w.i64(cache.window_rows());
      std::uint32_t crc = crc32c(start, format::window_fields_bytes);
      at = w.position();
      if (cache.fp8_window()) {  // the values the FP8 rows hold, as fp32 rows
        std::vector<float> row(static_cast<std::size_t>(std::max(cache.window_key_floats(), cache.window_value_floats())));
        const raw_window_config& wc = cache.config().window;
        const auto put = [&](const std::byte* from, const fp8_head_layout& head, std::int64_t channels, std::int64_t floats) {
          cache.decode_window_row(from, head, channels, row.data());
          crc = crc32c_copy(at, row.data(), static_cast<std::size_t>(floats) * sizeof(float), crc);
          at += static_cast<std::size_t>(floats) * sizeof(float);
        };
        for (std::int64_t r = 0; r < cache.window_rows(); ++r)
          put(s.window_key_bytes.data() + r * cache.window_key_row_bytes(), cache.window_key_head(), wc.key_channels,
              cache.window_key_floats());
        if (!cache.tied_window())
          for (std::int64_t r = 0; r < cache.window_rows(); ++r)
            put(s.window_value_bytes.data() + r * cache.window_value_row_bytes(), cache.window_value_head(),
                wc.value_channels, cache.window_value_floats());
      } else {
        crc = copy_floats(at, s.window_keys, crc);
        crc = copy_floats(at, s.window_values, crc);
      }
      table[2 * streams] = {format::window_section, format::no_stream_index, bytes[2 * streams], crc};
    }

    format::fingerprint f = fingerprint_of(cache);
    f.tokens = static_cast<std::uint64_t>(s.tokens);
    format::writer w(base);
    w.bytes(format::magic, sizeof format::magic);
    w.u32(format::version);
    w.u32(static_cast<std::uint32_t>(header));
    w.u64(total);
    w.u32(0);
    w.u32(crc32c(base, 28));
    format::write_fingerprint(w, f);
    w.u64(table.size());
    for (const format::section& t : table) {
      w.u32(t.kind);
      w.u32(t.stream);
      w.u64(t.bytes);
      w.u32(t.crc);
      w.u32(t.flags);
    }
    w.u32(0);
    w.u32(crc32c(base, header - 4));
    return static_cast<std::size_t>(total);
  }

  static std::uint32_t copy_floats(unsigned char*& at, const std::vector<float>& v, std::uint32_t crc) noexcept {
    const std::size_t n = v.size() * sizeof(float);
    crc = crc32c_copy(at, v.data(), n, crc);
    at += n;
    return crc;
  }

  // ---- restore ----------------------------------------------------------------------------------------

  // The parts of a snapshot restore() has located and verified before changing anything.
  struct parsed {
    snapshot_format::fingerprint print;
    std::vector<snapshot_format::section> table;
    std::vector<const unsigned char*> starts;  // of each section
  };

  // Framing, checksums of the preamble and header, fingerprint and section table.
  template <class... C>
  static parsed parse(const paged_cache<C...>& cache, span<const std::byte> in) {
    namespace format = snapshot_format;
    using detail::fail;
    constexpr std::size_t streams = sizeof...(C);
    if (in.data() == nullptr && in.size() != 0)
      fail<input_error>("snapshot: bytes.data()", "null", "must not be null when the size is " + std::to_string(in.size()));
    const auto* p = reinterpret_cast<const unsigned char*>(in.data());
    const std::size_t size = in.size();

    const std::size_t magic_seen = std::min(size, sizeof format::magic);
    if (magic_seen > 0 && std::memcmp(p, format::magic, magic_seen) != 0)
      throw input_error("snapshot: bad magic: these bytes are not a phasekv snapshot");
    if (size < format::preamble_bytes)
      throw input_error("snapshot: truncated at byte " + std::to_string(size) + " of at least " +
                        std::to_string(format::preamble_bytes) + " (the preamble)");
    format::reader pre(p + 8, p + format::preamble_bytes);
    const std::uint32_t version = pre.u32();
    const std::uint32_t header = pre.u32();
    const std::uint64_t total = pre.u64();
    const std::uint32_t reserved = pre.u32();
    const std::uint32_t stored_preamble_crc = pre.u32();
    const std::uint32_t preamble_crc = crc32c(p, 28);
    if (stored_preamble_crc != preamble_crc)
      throw input_error("snapshot: preamble checksum mismatch (stored " + format::hex(stored_preamble_crc) +
                        ", computed " + format::hex(preamble_crc) + "): the first 32 bytes are corrupt");
    if (version != format::version)
      throw input_error("snapshot: format version " + std::to_string(version) +
                        " is not supported (this build reads version " + std::to_string(format::version) + ")");
    if (reserved != 0) fail<input_error>("snapshot: reserved field of the preamble", reserved, "must be 0");
    if (header < format::header_bytes(0) || header > total)
      fail<input_error>("snapshot: header_bytes", header,
                        "must lie in [" + std::to_string(format::header_bytes(0)) + ", total_bytes = " +
                            std::to_string(total) + "]");
    if (size < total)
      throw input_error("snapshot: truncated at byte " + std::to_string(size) + " of " + std::to_string(total));
    if (size > total)
      throw input_error("snapshot: " + std::to_string(size - total) + " bytes follow the end of the snapshot (" +
                        std::to_string(total) + " bytes)");
    const std::uint32_t stored_header_crc = format::reader(p + header - 4, p + header).u32();
    const std::uint32_t header_crc = crc32c(p, header - 4);
    if (stored_header_crc != header_crc)
      throw input_error("snapshot: header checksum mismatch (stored " + format::hex(stored_header_crc) + ", computed " +
                        format::hex(header_crc) + ")");

    // The header is intact: its fields are what the writer wrote.
    format::reader r(p + format::preamble_bytes, p + header);
    const std::uint64_t snapshot_streams = format::reader(p + format::preamble_bytes + 8, p + header).u64();
    if (snapshot_streams > format::max_streams || header != format::header_bytes(snapshot_streams))
      fail<input_error>("snapshot: header_bytes", header,
                        "does not fit the " + std::to_string(snapshot_streams) + " streams the header declares");
    parsed out;
    out.print = format::read_fingerprint(r, static_cast<std::size_t>(snapshot_streams));
    format::fingerprint mine = fingerprint_of(cache);
    mine.tokens = out.print.tokens;
    format::check_compatible(out.print, mine);

    const std::uint64_t count = r.u64();
    if (count != 2 * streams + 1)
      fail<input_error>("snapshot: section count", count, "must be " + std::to_string(2 * streams + 1));
    out.table.resize(static_cast<std::size_t>(count));
    out.starts.resize(static_cast<std::size_t>(count));
    const unsigned char* at = p + header;
    for (std::size_t i = 0; i < out.table.size(); ++i) {
      format::section& t = out.table[i];
      t.kind = r.u32();
      t.stream = r.u32();
      t.bytes = r.u64();
      t.crc = r.u32();
      t.flags = r.u32();
      const std::uint32_t kind = i < streams ? format::entries_section
                                 : i < 2 * streams ? format::state_section
                                                   : format::window_section;
      if (t.flags != 0 && (kind != format::state_section || t.flags != format::host_fed_flag))
        fail<input_error>("snapshot: section " + std::to_string(i) + " flags", t.flags,
                          kind == format::state_section ? "must be 0 or 1 (host-fed)" : "must be 0 (reserved)");
      const std::uint32_t stream = i < 2 * streams ? static_cast<std::uint32_t>(i % streams) : format::no_stream_index;
      if (t.kind != kind || t.stream != stream)
        throw input_error("snapshot: section " + std::to_string(i) + " is kind " + std::to_string(t.kind) +
                          " of stream " + std::to_string(t.stream) + ", expected " +
                          format::section_name(i, kind, stream));
      if (t.bytes > static_cast<std::uint64_t>(p + total - at))
        throw input_error("snapshot: " + format::section_name(i, kind, stream) + " of " + std::to_string(t.bytes) +
                          " bytes runs past the end of the snapshot (" + std::to_string(total) + " bytes)");
      out.starts[i] = at;
      at += t.bytes;
    }
    r.reserved([] { return "the header"; });
    if (at != p + total)
      throw input_error("snapshot: the sections end at byte " + std::to_string(at - p) + ", total_bytes is " +
                        std::to_string(total));
    return out;
  }

  static void verify(const parsed& in, std::size_t i) {
    const snapshot_format::section& t = in.table[i];
    const std::uint32_t crc = crc32c(in.starts[i], static_cast<std::size_t>(t.bytes));
    if (crc != t.crc) checksum_mismatch(i, t, crc);
  }

  [[noreturn]] static void checksum_mismatch(std::size_t i, const snapshot_format::section& t, std::uint32_t crc) {
    throw input_error("snapshot: " + snapshot_format::section_name(i, t.kind, t.stream) + " checksum mismatch (stored " +
                      snapshot_format::hex(t.crc) + ", computed " + snapshot_format::hex(crc) + ")");
  }

  // Section i must have `expected` bytes (`fits`: the product was representable); why() says
  // what they hold (called only on failure).
  template <class Why>
  static void expect_bytes(const parsed& in, std::size_t i, std::uint64_t expected, bool fits, Why&& why) {
    const snapshot_format::section& t = in.table[i];
    if (!fits || t.bytes != expected)
      throw input_error("snapshot: " + snapshot_format::section_name(i, t.kind, t.stream) + " has " +
                        std::to_string(t.bytes) + " bytes, " +
                        (fits ? "expected " + std::to_string(expected) : std::string("far fewer than")) + " (" +
                        why() + ")");
  }

  // Copies the rows of tokens [first, tokens) from a ring of `from_rows` rows to one of `to_rows`
  // rows (token t in row t mod rows), `per_row` floats each.
  static void re_ring(const unsigned char* from, std::int64_t from_rows, float* to, std::int64_t to_rows,
                      std::int64_t per_row, std::int64_t first, std::int64_t tokens) noexcept {
    const auto row_bytes = static_cast<std::size_t>(per_row) * sizeof(float);
    if (row_bytes == 0) return;
    for (std::int64_t t = first; t < tokens; ++t)
      std::memcpy(to + floor_mod(t, to_rows) * per_row, from + static_cast<std::size_t>(floor_mod(t, from_rows)) * row_bytes,
                  row_bytes);
  }

  // restore(), with std::bad_alloc (at any point: nothing has changed then) as capacity_error,
  // as the cache reports memory it cannot get.
  template <class... C>
  static sequence_id restore(paged_cache<C...>& cache, span<const std::byte> in) {
    try {
      return restore_unguarded(cache, in);
    } catch (const std::bad_alloc&) {
      throw capacity_error("snapshot: restoring into " + cache.config().name +
                           ": memory for the sequence's compressor state, raw window or page tables could not be "
                           "allocated (the cache is unchanged)");
    }
  }

  template <class... C>
  static sequence_id restore_unguarded(paged_cache<C...>& cache, span<const std::byte> in) {
    static_assert(snapshot_format::host_little_endian, "phasekv snapshots need a little-endian host");
    namespace format = snapshot_format;
    using cache_t = paged_cache<C...>;
    using record_t = typename cache_t::sequence;
    constexpr std::size_t streams = sizeof...(C);

    const parsed in_parts = parse(cache, in);
    const format::fingerprint& print = in_parts.print;
    const geometry& g = cache.compressors().geom();
    const cache_config& config = cache.config();

    // Token count and the lengths every section must have.
    if (print.tokens > static_cast<std::uint64_t>(limits::max_tokens))
      fail<input_error>("snapshot: tokens", print.tokens, "must be at most 2^48");
    const auto tokens = static_cast<std::int64_t>(print.tokens);
    const std::int64_t entries = g.completed_entries(tokens);
    const std::int64_t source_ring_rows = g.window + print.history;  // history in [0, 2^40]: checked
    for (std::size_t k = 0; k < streams; ++k) {
      std::uint64_t expected = 0;
      const std::int64_t elements = print.streams[k].channels * print.streams[k].kv_heads;
      const bool fits = format::multiply(static_cast<std::uint64_t>(entries),
                                         static_cast<std::uint64_t>(source_layout(print.streams[k]).entry_stride_bytes),
                                         expected);
      expect_bytes(in_parts, k, expected, fits, [&] {
        return std::to_string(entries) + " entries of " + std::to_string(elements) + " " +
               format::storage_name(print.streams[k].storage) + " elements";
      });
    }
    std::array<std::int64_t, streams> payload_floats{}, logit_floats{};
    cache.for_each_stream([&](std::size_t k, const auto& c) {
      payload_floats[k] = c.payload_floats_per_token();
      logit_floats[k] = c.logit_floats_per_token();
    });
    for (std::size_t k = 0; k < streams; ++k) {
      std::uint64_t ring = 0;
      const bool fits = format::multiply(static_cast<std::uint64_t>(source_ring_rows),
                                         static_cast<std::uint64_t>(payload_floats[k] + logit_floats[k]) * 4, ring);
      expect_bytes(in_parts, streams + k, format::state_fields_bytes + ring, fits, [&] {
        return std::to_string(source_ring_rows) + " ring rows of " +
               std::to_string(payload_floats[k] + logit_floats[k]) + " floats";
      });
    }
    const std::int64_t window_key_floats = print.window_tokens > 0 ? print.window_kv_heads * print.window_key_channels : 0;
    const std::int64_t window_value_floats =
        print.window_tokens > 0 ? print.window_kv_heads * print.window_value_channels : 0;
    const std::int64_t source_window_rows = print.window_tokens > 0 ? print.window_tokens + print.history : 0;
    {
      std::uint64_t rows_bytes = 0;
      const bool fits = format::multiply(static_cast<std::uint64_t>(source_window_rows),
                                         static_cast<std::uint64_t>(window_key_floats + window_value_floats) * 4,
                                         rows_bytes);
      expect_bytes(in_parts, 2 * streams, format::window_fields_bytes + rows_bytes, fits, [&] {
        return std::to_string(source_window_rows) + " window rows of " +
               std::to_string(window_key_floats + window_value_floats) + " floats";
      });
    }

    // The small sections: verify, then check their counts fit together.
    for (std::size_t i = streams; i < 2 * streams + 1; ++i) verify(in_parts, i);
    struct state_fields {
      std::int64_t tokens, entries, ring_rows, intact_from;
    };
    std::array<state_fields, streams> states{};
    for (std::size_t k = 0; k < streams; ++k) {
      const unsigned char* start = in_parts.starts[streams + k];
      format::reader r(start, start + format::state_fields_bytes);
      state_fields& f = states[k];
      f.tokens = r.i64();
      f.entries = r.i64();
      f.ring_rows = r.i64();
      f.intact_from = r.i64();
      const auto where = [k] { return "snapshot: stream " + std::to_string(k) + " compressor state: "; };
      if (f.tokens != tokens)
        fail<input_error>(where() + "tokens", f.tokens, "must equal the sequence's " + std::to_string(tokens));
      if (f.entries != entries)
        fail<input_error>(where() + "entries", f.entries,
                          "must equal completed_entries(" + std::to_string(tokens) + ") = " + std::to_string(entries));
      if (f.ring_rows != source_ring_rows)
        fail<input_error>(where() + "ring_rows", f.ring_rows,
                          "must be window + history = " + std::to_string(source_ring_rows));
      // The ring holds at most its rows' worth of tokens. A state whose entries the host
      // computed (append_entries) may hold none of the inputs its next entry needs, up to
      // intact_from = tokens: append() then refuses to continue it (stream_compressor::continues).
      const std::int64_t lowest = std::max<std::int64_t>(0, tokens - f.ring_rows);
      if (f.intact_from < lowest || f.intact_from > tokens)
        fail<input_error>(where() + "intact_from", f.intact_from,
                          "must lie in [" + std::to_string(lowest) + ", " + std::to_string(tokens) +
                              "] (within the ring)");
      // A host-fed state (skip()) keeps no inputs: intact_from = tokens > 0.
      if (in_parts.table[streams + k].flags == format::host_fed_flag && (tokens == 0 || f.intact_from != tokens))
        fail<input_error>(where() + "intact_from", f.intact_from,
                          "must equal tokens = " + std::to_string(tokens) + " > 0 in a host-fed state");
    }
    std::int64_t source_window_first = 0;
    {
      const unsigned char* start = in_parts.starts[2 * streams];
      format::reader r(start, start + format::window_fields_bytes);
      source_window_first = r.i64();
      const std::int64_t rows = r.i64();
      if (rows != source_window_rows)
        fail<input_error>("snapshot: raw window rows", rows,
                          "must be window.tokens + history = " + std::to_string(source_window_rows));
      const std::int64_t lowest = print.window_tokens > 0 ? std::max<std::int64_t>(0, tokens - rows) : 0;
      const std::int64_t highest = print.window_tokens > 0 ? std::max<std::int64_t>(0, tokens - print.window_tokens) : 0;
      if (source_window_first < lowest || source_window_first > highest)
        fail<input_error>("snapshot: raw window window_first", source_window_first,
                          "must lie in [" + std::to_string(lowest) + ", " + std::to_string(highest) +
                              "] (within the ring, and early enough for a read at the last token)");
    }

    // Build the new record (allocations only: nothing visible changes yet).
    auto record = std::make_unique<record_t>();
    record->states = cache.compressors().make_state(config.history);
    record->tokens = tokens;
    for (std::size_t k = 0; k < streams; ++k) {
      stream_state& state = record->states[k];
      const state_fields& f = states[k];
      const unsigned char* payload = in_parts.starts[streams + k] + format::state_fields_bytes;
      const unsigned char* logits =
          payload + static_cast<std::size_t>(f.ring_rows * payload_floats[k]) * sizeof(float);
      state.tokens_ = tokens;
      state.entries_ = entries;
      state.host_fed_ = in_parts.table[streams + k].flags == format::host_fed_flag;
      if (state.ring_rows_ == f.ring_rows) {  // equal histories: the rings verbatim
        state.intact_from_ = f.intact_from;
        if (!state.payload_ring_.empty())
          std::memcpy(state.payload_ring_.data(), payload, state.payload_ring_.size() * sizeof(float));
        if (!state.logit_ring_.empty())
          std::memcpy(state.logit_ring_.data(), logits, state.logit_ring_.size() * sizeof(float));
      } else {
        state.intact_from_ = std::max(f.intact_from, tokens - state.ring_rows_);
        re_ring(payload, f.ring_rows, state.payload_ring_.data(), state.ring_rows_, payload_floats[k],
                state.intact_from_, tokens);
        re_ring(logits, f.ring_rows, state.logit_ring_.data(), state.ring_rows_, logit_floats[k],
                state.intact_from_, tokens);
      }
    }
    {
      const std::int64_t rows = cache.window_rows();
      record->window_keys.assign(static_cast<std::size_t>(rows * window_key_floats), 0.0f);
      record->window_values.assign(static_cast<std::size_t>(rows * window_value_floats), 0.0f);
      const unsigned char* keys = in_parts.starts[2 * streams] + format::window_fields_bytes;
      const unsigned char* values =
          keys + static_cast<std::size_t>(source_window_rows * window_key_floats) * sizeof(float);
      if (rows == 0) {
        record->window_first = source_window_first;  // 0: a cache without a window never moves it
      } else if (rows == source_window_rows) {
        record->window_first = source_window_first;
        if (!record->window_keys.empty())
          std::memcpy(record->window_keys.data(), keys, record->window_keys.size() * sizeof(float));
        if (!record->window_values.empty())
          std::memcpy(record->window_values.data(), values, record->window_values.size() * sizeof(float));
      } else {
        record->window_first = std::max(source_window_first, tokens - rows);
        re_ring(keys, source_window_rows, record->window_keys.data(), rows, window_key_floats, record->window_first,
                tokens);
        re_ring(values, source_window_rows, record->window_values.data(), rows, window_value_floats,
                record->window_first, tokens);
      }
      // An FP8 window quantizes the rows as append does, whatever the snapshot came from: rows an
      // FP8 window wrote come back as the same values (bytes too, but for a block whose amax had
      // rounded down to 224 · s: its scale halves and its codes double, the same values).
      if (cache.fp8_window()) {
        cache.allocate_window(*record, rows);
        for (std::int64_t row = 0; row < rows; ++row)
          cache.write_window_row(*record, row, record->window_keys.data() + row * window_key_floats,
                                 cache.tied_window() ? nullptr : record->window_values.data() + row * window_value_floats);
        std::vector<float>().swap(record->window_keys);
        std::vector<float>().swap(record->window_values);
      }
    }

    // Page ids, reserved so that nothing below allocates memory until the sequence table does.
    std::array<std::vector<page_id>, streams> pages;
    std::vector<std::uint16_t> bounce;  // a page of 16-bit entries, for unaligned conversions
    for (std::size_t k = 0; k < streams; ++k) {
      const std::int64_t page_size = cache.pools_[k]->layout().page_size;
      pages[k].resize(static_cast<std::size_t>((entries + page_size - 1) / page_size));
      record->tables[k].reserve(pages[k].size());
      if (format::storage_of(print.streams[k].storage) != cache.pools_[k]->layout().storage &&
          is_row_storage(format::storage_of(print.streams[k].storage)))
        bounce.resize(std::max(bounce.size(), static_cast<std::size_t>(page_size * cache.pools_[k]->layout().entry_stride)));
    }

    // All pages, all-or-nothing across the streams.
    std::size_t allocated = 0;
    try {
      for (; allocated < streams; ++allocated) {
        page_pool& pool = *cache.pools_[allocated];
        try {
          pool.allocate(static_cast<std::int64_t>(pages[allocated].size()), pages[allocated].data());
        } catch (const capacity_error& e) {
          throw capacity_error("snapshot: restoring " + std::to_string(entries) + " entries of stream " +
                               std::to_string(allocated) + " needs " + std::to_string(pages[allocated].size()) +
                               " pages: " + e.what());
        }
      }
    } catch (...) {
      release_reversed(cache, pages, allocated);
      throw;
    }

    try {
      for (std::size_t k = 0; k < streams; ++k) {
        copy_entries(*cache.pools_[k], pages[k], entries, source_layout(print.streams[k]), in_parts.starts[k], bounce,
                     in_parts, k);
        record->tables[k].assign(pages[k].begin(), pages[k].end());  // within the reserved capacity
      }
      return cache.insert(std::move(record));  // leaves the record with us if it throws
    } catch (...) {
      release_reversed(cache, pages, streams);
      throw;
    }
  }

  // Entries from a verified-length section into the new pages, checking the section's CRC on the
  // way; a mismatch throws (the caller releases the pages).
  // `from` is the packed layout of the snapshot's entries (source_layout).
  static void copy_entries(page_pool& pool, const std::vector<page_id>& pages, std::int64_t entries,
                           const page_layout& from, const unsigned char* src, std::vector<std::uint16_t>& bounce,
                           const parsed& in, std::size_t section_index) {
    const page_layout& layout = pool.layout();
    const std::int64_t page_size = layout.page_size;
    std::uint32_t crc = 0;
    for (std::size_t page = 0; page < pages.size(); ++page) {
      const std::int64_t n = std::min(page_size, entries - static_cast<std::int64_t>(page) * page_size);
      const auto bytes = static_cast<std::size_t>(n * from.entry_stride_bytes);
      std::byte* destination = pool.data(pages[page]);
      if (from.storage == layout.storage) {
        crc = crc32c_copy(destination, src, bytes, crc);
      } else {  // bf16/f16/fp8 into f32 (check_compatible allowed nothing else; fp4 only into fp4)
        crc = crc32c(src, bytes, crc);
        const void* row = src;
        // The 16-bit rows need aligned elements; fp8 blocks are read byte by byte.
        if (is_row_storage(from.storage) && reinterpret_cast<std::uintptr_t>(src) % alignof(std::uint16_t) != 0) {
          std::memcpy(bounce.data(), src, bytes);
          row = bounce.data();
        }
        load_entries(from, static_cast<const std::byte*>(row), n, reinterpret_cast<float*>(destination));
      }
      src += bytes;
    }
    if (crc != in.table[section_index].crc) checksum_mismatch(section_index, in.table[section_index], crc);
  }

  // The entries of a snapshot's stream as the section holds them: packed, in its storage type.
  static page_layout source_layout(const snapshot_format::stream_fingerprint& f) noexcept {
    const storage_type storage = snapshot_format::storage_of(f.storage);
    return page_layout::packed(storage, f.kv_heads, f.channels,
                               storage == storage_type::fp8_e4m3_block ? f.rope_channels : 0);
  }

  // Releases the first `streams` streams' new pages, last allocated first, so each pool's free
  // list is exactly as it was before the allocation.
  template <class... C, std::size_t N>
  static void release_reversed(paged_cache<C...>& cache, const std::array<std::vector<page_id>, N>& pages,
                               std::size_t streams) noexcept {
    for (std::size_t k = streams; k-- > 0;) {
      try {
        for (std::size_t i = pages[k].size(); i-- > 0;) cache.pools_[k]->release(pages[k][i]);
      } catch (...) {  // the pages were just allocated to nobody else: release cannot fail
      }
    }
  }
};

}  // namespace detail

// ---- the interface ---------------------------------------------------------------------------------

// Bytes snapshot() writes for a sequence (throws input_error for an unknown sequence).
template <class... Compressors>
std::size_t snapshot_size(const paged_cache<Compressors...>& cache, sequence_id id) {
  return detail::snapshot_access::size(cache, id);
}

// Writes the snapshot of a sequence into `out` (at least snapshot_size() bytes; its alignment
// does not matter) and returns the bytes written. The fast path: no allocation, one pass over
// the entries.
template <class... Compressors>
std::size_t snapshot_into(const paged_cache<Compressors...>& cache, sequence_id id, span<std::byte> out) {
  return detail::snapshot_access::write(cache, id, out);
}

// The snapshot of a sequence as a new vector. (The vector's zero-filling is an extra pass over
// the bytes; snapshot_into() a reused buffer avoids it.)
template <class... Compressors>
std::vector<std::byte> snapshot(const paged_cache<Compressors...>& cache, sequence_id id) {
  const std::size_t size = snapshot_size(cache, id);
  std::vector<std::byte> out;
  detail::allocate_or_fail([&] { out.resize(size); }, "snapshot: bytes of sequence", id,
                           static_cast<std::int64_t>(size));
  snapshot_into(cache, id, span<std::byte>(out.data(), out.size()));
  return out;
}

// Restores a snapshot into `cache` as a new sequence and returns its id. Throws input_error for
// bytes it cannot accept and capacity_error when a pool lacks the pages, with the cache as it
// was (see the header comment for what is checked, in which order).
template <class... Compressors>
sequence_id restore(paged_cache<Compressors...>& cache, span<const std::byte> bytes) {
  return detail::snapshot_access::restore(cache, bytes);
}

}  // namespace phasekv
