#pragma once
// The raw local window of one sequence: the key (and, untied, value) rows of its last
// window.tokens tokens as the host hands them over — already RoPE'd at their own positions,
// kv_heads × channels each — in a ring of window.tokens + history rows, token t in row t mod rows.
// The history rows let remove_suffix roll back that far; tokens [first(), tokens) have their rows.
//
// A row is kept in the window's precision (raw_window_config::precision): f32 copies the host's
// floats; fp8_e4m3_block quantizes each head to DeepSeek-V4's FP8 format (format/fp8.hpp: e4m3
// codes with a UE8M0 scale per 64 channels, a key head's last rope_channels in bf16) and keeps the
// bytes, 584 a row for DeepSeek-V4. The rounding happens once, when a row is written; the reader
// reads the bytes in its attention kernel (window_view), and copy_key/copy_value give the values
// a read sees, in either precision. These are the window's two encodings, and this class is the
// only place that tells them apart.
//
// A raw_window is a plain value: copying it forks the sequence's window. paged_cache keeps one per
// sequence and validates the configuration (cache_config::validate) before it makes one.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/cache/sequence_view.hpp"
#include "phasekv/format/detail/byte_io.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/format/fp8.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/kernels/finite.hpp"

namespace phasekv {

// Floats of one token's key row, and of its untied value row, in a window of `config`
// (kv_heads × channels; 0 without a window).
inline std::int64_t window_key_floats(const raw_window_config& config) noexcept {
  return config.tokens > 0 ? config.kv_heads * config.key_channels : 0;
}
inline std::int64_t window_value_floats(const raw_window_config& config) noexcept {
  return config.tokens > 0 ? config.kv_heads * config.value_channels : 0;
}

namespace detail {
// A host's window rows for `tokens` tokens: not null unless empty, and tokens × per_token floats
// (the product formed only when it cannot overflow). field() names them ("cache.append:
// window_keys"); it is called only on failure: this runs on every decode step.
template <class Field>
void check_window_input(span<const float> in, std::int64_t tokens, std::int64_t per_token, Field&& field) {
  if (in.data() == nullptr && in.size() != 0)
    fail<input_error>(field() + ".data()", "null", "must not be null when the size is " + std::to_string(in.size()));
  std::int64_t expected = 0;
  const bool representable = product_within(std::max<std::int64_t>(tokens, 0), per_token, limits::max_bytes, expected);
  if (!representable || in.size() != static_cast<std::size_t>(expected))
    fail<input_error>(field() + ".size()", in.size(),
                      "must be " + (representable ? std::to_string(expected) : std::string("tokens × ") + std::to_string(per_token)) +
                          " (tokens × window.kv_heads × channels)");
}
}  // namespace detail

class raw_window {
 public:
  // No window: holds no rows.
  raw_window() = default;
  // A ring for `config` (validated) with `history` rows beyond config.tokens, every row zero; none
  // when config.tokens = 0. Throws std::bad_alloc when the ring cannot be allocated.
  raw_window(const raw_window_config& config, std::int64_t history)
      : config_(config), rows_(config.tokens > 0 ? config.tokens + history : 0) {
    if (fp8()) {
      key_bytes_.assign(static_cast<std::size_t>(rows_ * key_row_bytes()), std::byte{0});
      value_bytes_.assign(static_cast<std::size_t>(rows_ * value_row_bytes()), std::byte{0});
    } else {
      keys_.assign(static_cast<std::size_t>(rows_ * key_floats()), 0.0f);
      values_.assign(static_cast<std::size_t>(rows_ * value_floats()), 0.0f);
    }
  }

  // Bytes of the ring a window of `config` with `history` allocates, for messages before it does.
  static std::int64_t ring_bytes(const raw_window_config& config, std::int64_t history) noexcept {
    if (config.tokens == 0) return 0;
    const bool tied = config.value_channels == 0;
    const std::int64_t row =
        config.precision == storage_type::fp8_e4m3_block
            ? config.kv_heads * (fp8_head_layout::of(config.key_channels, config.rope_channels).bytes +
                                 (tied ? 0 : fp8_head_layout::of(config.value_channels, 0).bytes))
            : config.kv_heads * (config.key_channels + config.value_channels) * static_cast<std::int64_t>(sizeof(float));
    return (config.tokens + history) * row;
  }

  const raw_window_config& config() const noexcept { return config_; }
  std::int64_t rows() const noexcept { return rows_; }
  // The oldest token whose row is intact (0 without a window).
  std::int64_t first() const noexcept { return first_; }
  bool tied() const noexcept { return config_.value_channels == 0; }
  bool fp8() const noexcept { return config_.precision == storage_type::fp8_e4m3_block; }
  // Floats of one token's key row and of its untied value row (kv_heads × channels; 0 without a window).
  std::int64_t key_floats() const noexcept { return window_key_floats(config_); }
  std::int64_t value_floats() const noexcept { return window_value_floats(config_); }
  // Bytes the ring holds, for memory accounting.
  std::size_t bytes() const noexcept {
    return (keys_.capacity() + values_.capacity()) * sizeof(float) + key_bytes_.capacity() + value_bytes_.capacity();
  }

  // ---- writing ---------------------------------------------------------------------------------

  // The rows of tokens [t0, t0 + tokens): keys token-major (tokens × key_floats()), values likewise
  // (ignored when tied). Only the last rows() of them can be kept; first() moves up to what is.
  void write(span<const float> keys, span<const float> values, std::int64_t t0, std::int64_t tokens) noexcept {
    if (rows_ == 0) return;
    const std::int64_t t_end = t0 + tokens;
    for (std::int64_t t = std::max(t0, t_end - rows_); t < t_end; ++t)
      write_row(t % rows_, keys.data() + (t - t0) * key_floats(),
                tied() ? nullptr : values.data() + (t - t0) * value_floats());
    first_ = std::max(first_, t_end - rows_);
  }

  // The rows of tokens [begin, end) copied from `from`, a ring of the same configuration (any
  // number of rows) that holds them; this ring must have room for them (end − begin ≤ rows()).
  // Then first() = max(first(), end − rows()), or `first` when given (a fresh ring taking a tail).
  // Rows are copied as stored (FP8 bytes too), so reads of them are bit-identical to `from`'s.
  void copy_rows(const raw_window& from, std::int64_t begin, std::int64_t end, std::int64_t first = -1) noexcept {
    if (rows_ == 0) return;
    const auto copy = [&](const auto& src, auto& dst, std::int64_t size) {
      for (std::int64_t t = std::max(begin, end - rows_); t < end; ++t)
        std::copy_n(src.data() + (t % from.rows_) * size, size, dst.data() + (t % rows_) * size);
    };
    if (fp8()) {
      copy(from.key_bytes_, key_bytes_, key_row_bytes());
      copy(from.value_bytes_, value_bytes_, value_row_bytes());
    } else {
      copy(from.keys_, keys_, key_floats());
      copy(from.values_, values_, value_floats());
    }
    first_ = first >= 0 ? first : std::max(first_, end - rows_);
  }

  // append_options::check_finite for window rows: every element of the rows of `tokens` tokens
  // (laid out as write() takes them) must be finite, and so must what a read will see of it — an
  // FP8 window stores a key head's RoPE channels in bf16 (±inf beyond about 3.39e38) and its e4m3
  // blocks come back as ±inf from |x| ≥ 1.9375 · 2^127 (format/fp8.hpp). The first offender is an
  // input_error naming `owner`, the token and the element; nothing is written either way.
  void check_rows(span<const float> keys, span<const float> values, std::int64_t tokens, const std::string& owner) const {
    if (rows_ == 0) return;
    std::vector<std::byte> bytes;
    std::vector<float> back;
    if (fp8()) {
      bytes.resize(static_cast<std::size_t>(std::max(key_row_bytes(), value_row_bytes())));
      back.resize(static_cast<std::size_t>(std::max(key_floats(), value_floats())));
    }
    const auto check = [&](const float* row, std::int64_t floats, const fp8_head_layout& head, std::int64_t channels,
                           std::int64_t t, const char* what) {
      const float* seen = row;
      if (kernels::all_finite(row, floats)) {
        if (!fp8()) return;
        encode_row(row, head, channels, bytes.data());
        decode_row(bytes.data(), head, channels, back.data());
        if (kernels::all_finite(back.data(), floats)) return;
        seen = back.data();
      }
      for (std::int64_t i = 0; i < floats; ++i)
        if (!std::isfinite(seen[i]))
          detail::fail<input_error>(owner + ": " + what + "[token " + std::to_string(t) + ", element " + std::to_string(i) + "]",
                                    row[i],
                                    seen == row ? "must be finite (append_options.check_finite is on)"
                                                : std::string("is not representable in the window's ") + to_string(config_.precision) +
                                                      " storage (append_options.check_finite is on)");
    };
    for (std::int64_t t = 0; t < tokens; ++t) {
      check(keys.data() + t * key_floats(), key_floats(), key_head(), config_.key_channels, t, "window_keys");
      if (!tied()) check(values.data() + t * value_floats(), value_floats(), value_head(), config_.value_channels, t, "window_values");
    }
  }

  // What write() of `tokens` tokens from t0 overwrites — first() and the rows — so that a model
  // step can put the ring back when a later layer fails (allocates; nothing changes if it throws).
  struct undo_record {
    std::int64_t first = 0, from = 0, count = 0;  // first(); the rows of tokens [from, from + count)
    std::vector<float> keys, values;
    std::vector<std::byte> key_bytes, value_bytes;
  };
  void save(std::int64_t t0, std::int64_t tokens, undo_record& u) const {
    u.first = first_;
    u.from = rows_ > 0 ? std::max(t0, t0 + tokens - rows_) : t0 + tokens;
    u.count = t0 + tokens - u.from;
    const auto n = static_cast<std::size_t>(u.count);
    if (fp8()) {
      u.key_bytes.resize(n * static_cast<std::size_t>(key_row_bytes()));
      u.value_bytes.resize(n * static_cast<std::size_t>(value_row_bytes()));
    } else {
      u.keys.resize(n * static_cast<std::size_t>(key_floats()));
      u.values.resize(n * static_cast<std::size_t>(value_floats()));
    }
    if (fp8())
      move_rows(key_bytes_.data(), value_bytes_.data(), u.key_bytes.data(), u.value_bytes.data(), key_row_bytes(),
                value_row_bytes(), u, true);
    else
      move_rows(keys_.data(), values_.data(), u.keys.data(), u.values.data(), key_floats(), value_floats(), u, true);
  }
  void restore(undo_record& u) noexcept {
    if (fp8())
      move_rows(key_bytes_.data(), value_bytes_.data(), u.key_bytes.data(), u.value_bytes.data(), key_row_bytes(),
                value_row_bytes(), u, false);
    else
      move_rows(keys_.data(), values_.data(), u.keys.data(), u.values.data(), key_floats(), value_floats(), u, false);
    first_ = u.first;
  }

  // After the sequence is cut back to p0 tokens: rows from p0 on are rewritten before they are read.
  void roll_back(std::int64_t p0) noexcept { first_ = std::min(first_, p0); }

  // Whether a sequence cut back to p0 tokens still has the rows a read at p0 − 1 needs,
  // [p0 − window.tokens, p0).
  bool can_roll_back(std::int64_t p0) const noexcept {
    const std::int64_t needed = std::max<std::int64_t>(0, p0 - config_.tokens);
    return !(config_.tokens > 0 && needed < p0 && needed < first_);
  }

  // ---- reading ---------------------------------------------------------------------------------

  // The ring row of token t of a sequence of `tokens` tokens; input_error, naming `owner`, unless
  // t lies in [first(), tokens).
  std::int64_t row_of(std::int64_t t, std::int64_t tokens, const std::string& owner) const {
    if (config_.tokens == 0 || t < first_ || t >= tokens)
      detail::fail<input_error>(owner + ": window token", t,
                                "must lie in the raw window [" + std::to_string(first_) + ", " +
                                    std::to_string(tokens) + ")");
    return t % rows_;
  }

  // An f32 window's rows (the key row when tied); an FP8 window's rows of heads.
  const float* key(std::int64_t row) const noexcept { return keys_.data() + row * key_floats(); }
  const float* value(std::int64_t row) const noexcept {
    return tied() ? key(row) : values_.data() + row * value_floats();
  }
  const std::byte* key_bytes(std::int64_t row) const noexcept { return key_bytes_.data() + row * key_row_bytes(); }
  const std::byte* value_bytes(std::int64_t row) const noexcept {
    return tied() ? key_bytes(row) : value_bytes_.data() + row * value_row_bytes();
  }

  // The values a read sees for a row's keys (key_floats() floats) or untied values (value_floats()),
  // in either precision.
  void copy_key(std::int64_t row, float* out) const noexcept {
    if (fp8())
      decode_row(key_bytes(row), key_head(), config_.key_channels, out);
    else
      std::copy_n(key(row), key_floats(), out);
  }
  void copy_value(std::int64_t row, float* out) const noexcept {
    if (tied())
      copy_key(row, out);
    else if (fp8())
      decode_row(value_bytes_.data() + row * value_row_bytes(), value_head(), config_.value_channels, out);
    else
      std::copy_n(values_.data() + row * value_floats(), value_floats(), out);
  }

  // The window as the reader reads it (sequence_view.hpp), for a sequence of `tokens` tokens.
  window_view view(std::int64_t tokens) const noexcept {
    window_view w;
    if (config_.tokens == 0) return w;
    if (fp8()) {
      w.storage = storage_type::fp8_e4m3_block;
      w.rope_channels = config_.rope_channels;
      w.key_bytes = key_bytes_.data();
      w.value_bytes = tied() ? key_bytes_.data() : value_bytes_.data();
    } else {
      w.keys = keys_.data();
      w.values = tied() ? keys_.data() : values_.data();
    }
    w.rows = rows_;
    w.first = first_;
    w.tokens = tokens;
    w.kv_heads = config_.kv_heads;
    w.key_channels = config_.key_channels;
    w.value_channels = tied() ? config_.key_channels : config_.value_channels;
    return w;
  }

  // ---- snapshots (docs/SNAPSHOT.md, "Raw window") -------------------------------------------------

  // The section: i64 first, i64 rows, then the fp32 key rows and the untied value rows, ring
  // order. An FP8 window writes the values its rows hold (exact in fp32), so a snapshot's window
  // is the same whatever the precision of the window that wrote it.
  static constexpr std::uint64_t saved_fields_bytes = 2 * 8;
  // Bytes state_write writes for a ring of `rows` rows of key_floats + value_floats floats.
  static std::uint64_t saved_bytes(std::uint64_t rows, std::uint64_t floats_per_row) noexcept {
    return saved_fields_bytes + rows * floats_per_row * sizeof(float);
  }
  std::uint64_t saved_bytes() const noexcept {
    return saved_bytes(static_cast<std::uint64_t>(rows_), static_cast<std::uint64_t>(key_floats() + value_floats()));
  }

  void state_write(byte_writer& w) const {
    w.i64(first_);
    w.i64(rows_);
    if (!fp8()) {
      w.floats(keys_.data(), keys_.size());
      w.floats(values_.data(), values_.size());
      return;
    }
    std::vector<float> row(static_cast<std::size_t>(std::max(key_floats(), value_floats())));
    for (std::int64_t r = 0; r < rows_; ++r) {
      copy_key(r, row.data());
      w.floats(row.data(), static_cast<std::size_t>(key_floats()));
    }
    if (!tied())
      for (std::int64_t r = 0; r < rows_; ++r) {
        copy_value(r, row.data());
        w.floats(row.data(), static_cast<std::size_t>(value_floats()));
      }
  }

  // The fields of a saved window, read before its rows.
  struct saved_fields {
    std::int64_t first = 0;
    std::int64_t rows = 0;
  };
  static saved_fields read_fields(byte_reader& r) {
    saved_fields f;
    f.first = r.i64();
    f.rows = r.i64();
    return f;
  }
  // Throws input_error unless `f` is what a window of `config` writes for a sequence of `tokens`
  // tokens in a cache whose ring has `rows` rows (window.tokens + its history, or 0). Checked
  // before anything is allocated.
  static void check_saved(const raw_window_config& config, const saved_fields& f, std::int64_t rows, std::int64_t tokens) {
    if (f.rows != rows)
      detail::fail<input_error>("snapshot: raw window rows", f.rows, "must be window.tokens + history = " + std::to_string(rows));
    const std::int64_t lowest = config.tokens > 0 ? std::max<std::int64_t>(0, tokens - rows) : 0;
    const std::int64_t highest = config.tokens > 0 ? std::max<std::int64_t>(0, tokens - config.tokens) : 0;
    if (f.first < lowest || f.first > highest)
      detail::fail<input_error>("snapshot: raw window window_first", f.first,
                                "must lie in [" + std::to_string(lowest) + ", " + std::to_string(highest) +
                                    "] (within the ring, and early enough for a read at the last token)");
  }
  // Reads the rows of a saved window (its checked fields `f`; the reader just past them) into this
  // fresh window, of a sequence of `tokens` tokens. Rings of other sizes are re-laid: this one
  // keeps the rows it has room for (token t in row t mod rows()). An FP8 window quantizes the rows
  // as write() does: rows an FP8 window wrote come back as the same values (bytes too, but for a
  // block whose amax had rounded down to 224 · s: its scale halves and its codes double). A kept
  // row that would read back as ±inf — a finite value of magnitude 1.9375 · 2^127 or more in an
  // e4m3 block, or beyond bf16's range (or ±inf) in a RoPE channel, as an FP8 window fed such
  // values without check_finite holds and snapshots — is refused (input_error naming the token and
  // the element): its codes cannot be recovered from the values, so the restored sequence would
  // not snapshot to what it was given (requantized, ±inf turns its whole block into NaN). NaN, and
  // ±inf in an e4m3 block, make the block NaN, which a round trip keeps.
  void state_read(byte_reader& r, const saved_fields& f, std::int64_t tokens) {
    const bool sized = fp8() ? key_bytes_.size() == static_cast<std::size_t>(rows_ * key_row_bytes()) &&
                                   value_bytes_.size() == static_cast<std::size_t>(rows_ * value_row_bytes())
                             : keys_.size() == static_cast<std::size_t>(rows_ * key_floats()) &&
                                   values_.size() == static_cast<std::size_t>(rows_ * value_floats());
    if (!sized) throw input_error("raw_window::state_read: the window must be made for its configuration");
    first_ = rows_ == 0 || rows_ == f.rows ? f.first : std::max(f.first, tokens - rows_);
    if (!fp8()) {
      read_ring_rows(r, f.rows, keys_.data(), rows_, key_floats(), first_, tokens);
      read_ring_rows(r, f.rows, values_.data(), rows_, value_floats(), first_, tokens);
      return;
    }
    // FP8: each ring row quantized from its saved row, in token order, through one row of scratch
    // (the snapshot's floats need not be aligned). The rows of the ring hold what the f32 path's
    // read_ring_rows would: the saved ring verbatim when the row counts agree, else each kept
    // token's row and zeros elsewhere.
    const auto key_size = static_cast<std::size_t>(key_floats()) * sizeof(float);
    const auto value_size = static_cast<std::size_t>(value_floats()) * sizeof(float);
    const unsigned char* saved_keys = r.bytes(static_cast<std::size_t>(f.rows) * key_size);
    const unsigned char* saved_values = r.bytes(static_cast<std::size_t>(f.rows) * value_size);
    if (rows_ == 0) return;
    std::vector<float> key(static_cast<std::size_t>(key_floats())), value(static_cast<std::size_t>(value_floats())), back;
    const auto check = [&](const std::byte* stored, const float* given, const fp8_head_layout& head, std::int64_t channels,
                           std::int64_t floats, std::int64_t t, const char* what) {
      if (below_2_120(given, floats)) return;
      back.resize(static_cast<std::size_t>(floats));
      decode_row(stored, head, channels, back.data());
      for (std::int64_t i = 0; i < floats; ++i)
        if (std::isinf(back[static_cast<std::size_t>(i)]))
          detail::fail<input_error>(std::string("snapshot: raw window ") + what + " row of token " + std::to_string(t) +
                                        ", element " + std::to_string(i),
                                    given[i],
                                    "reads back as " + std::string(back[static_cast<std::size_t>(i)] > 0 ? "+" : "-") +
                                        "inf from the window's fp8_e4m3_block storage: an FP8 window cannot hold it");
    };
    for (std::int64_t t = tokens - rows_; t < tokens; ++t) {  // every ring row once
      const std::int64_t row = (t % rows_ + rows_) % rows_;
      const bool kept = t >= first_;
      const std::int64_t from = f.rows == rows_ ? row : kept ? t % f.rows : -1;
      if (from >= 0) {
        std::memcpy(key.data(), saved_keys + static_cast<std::size_t>(from) * key_size, key_size);
        if (value_size > 0)  // a tied window has no value rows (and no scratch for them)
          std::memcpy(value.data(), saved_values + static_cast<std::size_t>(from) * value_size, value_size);
      } else {
        std::fill(key.begin(), key.end(), 0.0f);
        std::fill(value.begin(), value.end(), 0.0f);
      }
      write_row(row, key.data(), tied() ? nullptr : value.data());
      if (!kept) continue;
      check(key_bytes_.data() + row * key_row_bytes(), key.data(), key_head(), config_.key_channels, key_floats(), t, "key");
      if (!tied())
        check(value_bytes_.data() + row * value_row_bytes(), value.data(), value_head(), config_.value_channels, value_floats(), t,
              "value");
    }
  }

 private:
  // An FP8 window's heads: keys with their RoPE channels in bf16, untied values without.
  fp8_head_layout key_head() const noexcept { return fp8_head_layout::of(config_.key_channels, config_.rope_channels); }
  fp8_head_layout value_head() const noexcept { return fp8_head_layout::of(config_.value_channels, 0); }
  std::int64_t key_row_bytes() const noexcept {
    return config_.tokens > 0 && fp8() ? config_.kv_heads * key_head().bytes : 0;
  }
  std::int64_t value_row_bytes() const noexcept {
    return config_.tokens > 0 && fp8() && !tied() ? config_.kv_heads * value_head().bytes : 0;
  }

  // The rows of tokens [u.from, u.from + u.count): the ring's into the record (save), or back.
  template <class Ring, class Saved>
  void move_rows(Ring* keys, Ring* values, Saved* saved_keys, Saved* saved_values, std::int64_t key_size,
                 std::int64_t value_size, const undo_record& u, bool into_record) const noexcept {
    for (std::int64_t i = 0; i < u.count; ++i) {
      const std::int64_t row = (u.from + i) % rows_;
      if (into_record) {
        std::copy_n(keys + row * key_size, key_size, saved_keys + i * key_size);
        std::copy_n(values + row * value_size, value_size, saved_values + i * value_size);
      } else if constexpr (!std::is_const_v<Ring>) {
        std::copy_n(saved_keys + i * key_size, key_size, keys + row * key_size);
        std::copy_n(saved_values + i * value_size, value_size, values + row * value_size);
      }
    }
  }

  // Ring row `row` from one token's key row and value row (null when tied): copied into an f32
  // window, quantized into an FP8 one.
  void write_row(std::int64_t row, const float* key_row, const float* value_row) noexcept {
    if (fp8()) {
      encode_row(key_row, key_head(), config_.key_channels, key_bytes_.data() + row * key_row_bytes());
      if (value_row)
        encode_row(value_row, value_head(), config_.value_channels, value_bytes_.data() + row * value_row_bytes());
      return;
    }
    std::copy_n(key_row, key_floats(), keys_.data() + row * key_floats());
    if (value_row) std::copy_n(value_row, value_floats(), values_.data() + row * value_floats());
  }
  // Whether every |x| < 2^120 (NaN fails), one integer pass over the bits. Such a row reads back
  // finite from FP8 (format/fp8.hpp: only |x| ≥ 1.9375 · 2^127 comes back as ±inf, and a bf16
  // RoPE channel below 2^120 rounds finite), so restoring a window decodes only the rows this
  // does not clear.
  static bool below_2_120(const float* x, std::int64_t n) noexcept {
    std::uint32_t largest = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, x + i, sizeof bits);
      largest = std::max(largest, bits & 0x7FFFFFFFu);
    }
    return largest < 0x7B800000u;  // 2^120: exponent field 247
  }

  // One FP8 row's kv_heads heads from, and back to, kv_heads × channels floats.
  void encode_row(const float* in, const fp8_head_layout& head, std::int64_t channels, std::byte* row) const noexcept {
    for (std::int64_t h = 0; h < config_.kv_heads; ++h) fp8_quantize_head(in + h * channels, head, row + h * head.bytes);
  }
  void decode_row(const std::byte* row, const fp8_head_layout& head, std::int64_t channels, float* out) const noexcept {
    for (std::int64_t h = 0; h < config_.kv_heads; ++h) fp8_dequantize_head(row + h * head.bytes, head, out + h * channels);
  }

  raw_window_config config_{};
  std::int64_t rows_ = 0;
  std::int64_t first_ = 0;  // oldest token whose row is still intact
  // f32: [rows][kv_heads][channels]; FP8: [rows][kv_heads][head bytes]. The other pair stays
  // empty, and so do the value rings of a tied window.
  std::vector<float> keys_, values_;
  std::vector<std::byte> key_bytes_, value_bytes_;
};

}  // namespace phasekv
