#pragma once
// Entries in and out of their stored form, for the pool that writes them and the reader that loads
// them (neither needs the other): store_entries/load_entries convert whole entries between fp32
// and a page_layout's storage, and check_storable is append_options::check_finite's rule.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/cache/page_layout.hpp"
#include "phasekv/compress/entry_view.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/format/fp4.hpp"
#include "phasekv/format/fp8.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/kernels/finite.hpp"

namespace phasekv {

// Converts `count` entries of fp32 values (values_per_entry() each, head-major) into the layout's
// storage at dst, entry after entry entry_stride_bytes apart (fp8: quantized; fp4: transformed
// and quantized); load_entries converts back — exactly, every stored value being an fp32 value;
// for fp4_e2m1_hadamard the stored values are those of the transformed keys (format/fp4.hpp).
// dst and src need the alignment of the storage's element (2 bytes for bf16/f16, 4 for f32;
// none for the block types).
inline void store_entries(const page_layout& layout, const float* values, std::int64_t count, std::byte* dst) {
  const auto head_values = [&](std::int64_t e, std::int64_t h) { return values + (e * layout.kv_heads + h) * layout.channels; };
  const auto head_bytes = [&](std::int64_t e, std::int64_t h) { return dst + e * layout.entry_stride_bytes + h * layout.head_stride_bytes; };
  if (layout.storage == storage_type::fp8_e4m3_block) {
    const fp8_head_layout head = layout.fp8();
    for (std::int64_t e = 0; e < count; ++e)
      for (std::int64_t h = 0; h < layout.kv_heads; ++h) fp8_quantize_head(head_values(e, h), head, head_bytes(e, h));
  } else if (layout.storage == storage_type::fp4_e2m1_hadamard) {
    const fp4_head_layout head = layout.fp4();
    for (std::int64_t e = 0; e < count; ++e)
      for (std::int64_t h = 0; h < layout.kv_heads; ++h) fp4_quantize_head(head_values(e, h), head, head_bytes(e, h));
  } else {
    store_row(values, dst, count * layout.values_per_entry(), layout.storage);
  }
}

inline void load_entries(const page_layout& layout, const std::byte* src, std::int64_t count, float* values) {
  const auto head_values = [&](std::int64_t e, std::int64_t h) { return values + (e * layout.kv_heads + h) * layout.channels; };
  const auto head_bytes = [&](std::int64_t e, std::int64_t h) { return src + e * layout.entry_stride_bytes + h * layout.head_stride_bytes; };
  if (layout.storage == storage_type::fp8_e4m3_block) {
    const fp8_head_layout head = layout.fp8();
    for (std::int64_t e = 0; e < count; ++e)
      for (std::int64_t h = 0; h < layout.kv_heads; ++h) fp8_dequantize_head(head_bytes(e, h), head, head_values(e, h));
  } else if (layout.storage == storage_type::fp4_e2m1_hadamard) {
    const fp4_head_layout head = layout.fp4();
    for (std::int64_t e = 0; e < count; ++e)
      for (std::int64_t h = 0; h < layout.kv_heads; ++h) fp4_dequantize_head(head_bytes(e, h), head, head_values(e, h));
  } else {
    load_row(src, values, count * layout.values_per_entry(), layout.storage);
  }
}

namespace detail {
// Under append_options::check_finite, an entry is stored only if what a read will see of it is
// finite: its values (a finite input can pool to ±inf, a host's entry may hold NaN) and their
// stored form — f16 rounds |x| ≥ 65520 to ±inf, bf16 beyond about 3.39e38, FP8 its bf16 RoPE
// channels likewise and its e4m3 blocks from |x| ≥ 1.9375 · 2^127, FP4 wherever the Hadamard
// transform of finite keys leaves fp32's range. One rule for every storage type: the entry is
// stored into scratch and loaded back. field() names the entry ("cache.append: stream 0 entry 7");
// called from a sink before the entry is written, so the append changes nothing.
template <class Field>
void check_storable(const page_layout& layout, const entry_view& e, Field&& field) {
  const std::int64_t n = e.kv_heads * e.channels;
  // Whole floats, so a 16-bit or fp32 store has its alignment.
  std::vector<float> stored(static_cast<std::size_t>((layout.entry_stride_bytes + 3) / 4)), back(static_cast<std::size_t>(n));
  const float* seen = e.values;
  if (kernels::all_finite(e.values, n)) {
    store_entries(layout, e.values, 1, reinterpret_cast<std::byte*>(stored.data()));
    load_entries(layout, reinterpret_cast<const std::byte*>(stored.data()), 1, back.data());
    if (kernels::all_finite(back.data(), n)) return;
    seen = back.data();
  }
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::isfinite(seen[i])) continue;
    if (seen == e.values)
      fail<input_error>(field() + " value[" + std::to_string(i) + "]", e.values[i],
                        "must be finite (append_options.check_finite is on)");
    if (layout.storage != storage_type::fp4_e2m1_hadamard)
      fail<input_error>(field() + " value[" + std::to_string(i) + "]", e.values[i],
                        std::string("is not representable in ") + to_string(layout.storage) +
                            " storage (append_options.check_finite is on)");
    // FP4 stores the head's transform, which mixes every channel: name the head's largest value.
    const std::int64_t head = i / e.channels;
    const float* h = e.values + head * e.channels;
    const std::int64_t big = std::max_element(h, h + e.channels, [](float a, float b) { return std::fabs(a) < std::fabs(b); }) - h;
    fail<input_error>(field() + " value[" + std::to_string(head * e.channels + big) + "]", h[big],
                      "makes its head's Hadamard transform leave fp32's range in fp4_e2m1_hadamard storage "
                      "(append_options.check_finite is on)");
  }
}
}  // namespace detail

}  // namespace phasekv
