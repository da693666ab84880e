#pragma once
// What the FP8 and FP4 tests share: where an entry's bytes lie, found by the arithmetic a host
// does with a pool or a view (entry j: page table slot j / page_size, slot j % page_size); a
// pool's round trip held to a format's oracle; and what the library says of a block format as a
// storage type, the row functions' refusal included.

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "support/common.hpp"
#include "support/message_of.hpp"
#include "phasekv/cache/page_pool.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/sequence_view.hpp"
#include "phasekv/format/storage.hpp"

namespace phasekv_test {

// Entry j of a sequence's stream view with pages of page_size entries.
inline const std::byte* entry_at(const phasekv::stream_view& v, std::int64_t page_size, std::int64_t j) {
  return v.base + v.pages[sz(j / page_size)] * v.layout.page_stride_bytes + (j % page_size) * v.layout.entry_stride_bytes;
}

// Entry j of the first sequence of a CSR view.
inline const std::byte* entry_at(const phasekv::paged_view& v, std::int64_t page_size, std::int64_t j) {
  return v.base + v.indices[sz(v.indptr[0] + j / page_size)] * v.layout.page_stride_bytes +
         (j % page_size) * v.layout.entry_stride_bytes;
}

// Head h of the entry in slot `slot` of page p.
inline const std::byte* head_at(const phasekv::page_pool& pool, phasekv::page_id p, std::int64_t slot, std::int64_t h) {
  const phasekv::page_layout& l = pool.layout();
  return pool.base() + p * l.page_stride_bytes + slot * l.entry_stride_bytes + h * l.head_stride_bytes;
}

// Writes every slot of two pages of `pool` (pages of s.page_size entries of s.kv_heads heads of
// s.channels) with make_entry(), reads each back, and copies page 0's first page_size − 1
// entries over page 1's. "" when every head's bytes, where the layout puts them, are
// encode(the head's values) (a byte vector), every channel read back is decode(those bytes)
// (doubles), and the copy moved the bytes as they are; else the first thing that differs.
template <class Shape, class MakeEntry, class Encode, class Decode>
std::string block_pool_mismatch(phasekv::page_pool& pool, const Shape& s, MakeEntry&& make_entry, Encode&& encode,
                                Decode&& decode) {
  const phasekv::page_layout& l = pool.layout();
  phasekv::page_id pages[2];
  pool.allocate(2, pages);
  std::vector<std::vector<float>> entries;
  for (phasekv::page_id p : pages)
    for (std::int64_t slot = 0; slot < s.page_size; ++slot) {
      entries.push_back(make_entry());
      pool.write_entry(p, slot, entries.back().data());
    }
  std::size_t e = 0;
  for (phasekv::page_id p : pages)
    for (std::int64_t slot = 0; slot < s.page_size; ++slot, ++e) {
      std::vector<float> back(sz(s.kv_heads * s.channels));
      pool.read_entry(p, slot, back.data());
      for (std::int64_t h = 0; h < s.kv_heads; ++h) {
        const std::string where =
            "page " + std::to_string(p) + ", slot " + std::to_string(slot) + ", head " + std::to_string(h) + ": ";
        const std::vector<std::uint8_t> want = encode(entries[e].data() + h * s.channels);
        if (std::memcmp(head_at(pool, p, slot, h), want.data(), want.size()) != 0) return where + "bytes differ";
        const std::vector<double> values = decode(want);
        for (std::int64_t c = 0; c < s.channels; ++c)
          if (static_cast<double>(back[sz(h * s.channels + c)]) != values[sz(c)])
            return where + "channel " + std::to_string(c) + " reads back as " + std::to_string(back[sz(h * s.channels + c)]);
      }
    }
  pool.copy_entries(pages[0], pages[1], s.page_size - 1);
  if (std::memcmp(pool.data(pages[1]), pool.data(pages[0]), sz((s.page_size - 1) * l.entry_stride_bytes)) != 0)
    return "copy_entries changed the bytes";
  return "";
}

// The messages of store_row and load_row asked to convert a row of a block format.
inline std::string store_row_error(phasekv::storage_type block_format) {
  const float values[4] = {1, 2, 3, 4};
  unsigned char bytes[16] = {};
  return message_of<phasekv::input_error>([&] { phasekv::store_row(values, bytes, 4, block_format); });
}
inline std::string load_row_error(phasekv::storage_type block_format) {
  float values[4] = {1, 2, 3, 4};
  const unsigned char bytes[16] = {};
  return message_of<phasekv::input_error>([&] { phasekv::load_row(bytes, values, 4, block_format); });
}

// A block format as a storage type: named `name`, one byte an element, valid, stored in blocks and
// not in rows, so the row functions refuse it naming it.
inline void check_block_storage_type(phasekv::storage_type block_format, const std::string& name) {
  using Catch::Matchers::Contains;
  CHECK_THAT(store_row_error(block_format), Contains("storage_type = " + name + ": is stored in blocks"));
  CHECK_THAT(load_row_error(block_format), Contains("storage_type = " + name));
  CHECK(std::string(phasekv::to_string(block_format)) == name);
  CHECK(phasekv::bytes_per_element(block_format) == 1);
  CHECK(phasekv::is_valid(block_format));
  CHECK(phasekv::is_block_storage(block_format));
  CHECK(!phasekv::is_row_storage(block_format));
}

}  // namespace phasekv_test
