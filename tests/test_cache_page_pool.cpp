// The page pool (include/phasekv/cache/page_pool.hpp): configuration, layout, allocation and
// reference counts, entry access, copy-on-write, a model-based random test against a std::map,
// and a multi-threaded test meant to be run under ThreadSanitizer as well.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "support/common.hpp"
#include "support/configs.hpp"
#include "phasekv/cache/page_pool.hpp"

namespace test_cache_page_pool {

namespace {

using phasekv::page_id;
using phasekv::page_pool;
using phasekv::page_pool_config;
using phasekv::storage_type;
using Catch::Matchers::Contains;

page_pool_config pool_config(storage_type storage = storage_type::f32, std::int64_t capacity = 8) {
  return phasekv_test::pool_of("kv", 4, 2, 3, capacity, storage);
}

// What a value looks like after a trip through the storage type, via the scalar conversions.
float stored_value(float value, storage_type storage) {
  switch (storage) {
    case storage_type::f32: return value;
    case storage_type::bf16: return phasekv::bf16_to_float(phasekv::float_to_bf16(value));
    case storage_type::f16: return phasekv::f16_to_float(phasekv::float_to_f16(value));
    case storage_type::fp8_e4m3_block: break;     // not a type of element: test_cache_fp8.cpp
    case storage_type::fp4_e2m1_hadamard: break;  // nor this: test_cache_fp4.cpp
  }
  return value;
}

using phasekv_test::bits_of;

// An entry whose every element is a pseudo-random function of where it belongs — page, slot,
// head, channel — so a wrong stride or overlapping pages show up as wrong values even after
// rounding to 16 bits.
std::vector<float> tagged_entry(const page_pool& pool, page_id page, std::int64_t slot) {
  const auto& layout = pool.layout();
  std::vector<float> values(static_cast<std::size_t>(layout.entry_stride));
  for (std::int64_t head = 0; head < layout.kv_heads; ++head) {
    for (std::int64_t channel = 0; channel < layout.channels; ++channel) {
      // splitmix64 of the position, scaled to [-8, 8)
      std::uint64_t hash = static_cast<std::uint64_t>(((page * 1000 + slot) * 1000 + head) * 1000 + channel);
      hash += 0x9E3779B97F4A7C15ull;
      hash = (hash ^ (hash >> 30)) * 0xBF58476D1CE4E5B9ull;
      hash = (hash ^ (hash >> 27)) * 0x94D049BB133111EBull;
      hash ^= hash >> 31;
      values[static_cast<std::size_t>(head * layout.head_stride + channel)] =
          static_cast<float>(hash >> 40) / static_cast<float>(1 << 20) - 8.0f;
    }
  }
  return values;
}

// tagged_entry as it reads back from the pool.
std::vector<float> expected_entry(const page_pool& pool, page_id page, std::int64_t slot) {
  auto values = tagged_entry(pool, page, slot);
  for (float& value : values) value = stored_value(value, pool.layout().storage);
  return values;
}

std::vector<float> read(const page_pool& pool, page_id page, std::int64_t slot) {
  std::vector<float> values(static_cast<std::size_t>(pool.layout().entry_stride));
  pool.read_entry(page, slot, values.data());
  return values;
}

// Decodes the element at byte address `at` by plain pointer arithmetic on the pool's memory.
float element_at(const std::byte* at, storage_type storage) {
  if (storage == storage_type::f32) {
    float value;
    std::memcpy(&value, at, sizeof value);
    return value;
  }
  std::uint16_t bits;
  std::memcpy(&bits, at, sizeof bits);
  return storage == storage_type::bf16 ? phasekv::bf16_to_float(bits) : phasekv::f16_to_float(bits);
}

std::vector<std::byte> snapshot(const page_pool& pool) {
  const std::byte* begin = pool.base();
  return std::vector<std::byte>(begin, begin + pool.capacity() * pool.bytes_per_page());
}

}  // namespace

TEST_CASE("page_pool: configuration errors name the field and the value", "[cache][page_pool]") {
  CHECK_NOTHROW(pool_config().validate());
  auto expect_error = [](page_pool_config config, const std::string& message) {
    CHECK_THROWS_AS(config.validate(), phasekv::config_error);
    CHECK_THROWS_WITH(config.validate(), Contains(message));
    CHECK_THROWS_AS(page_pool(config), phasekv::config_error);
  };
  auto config = pool_config();
  config.page_size = 0;
  expect_error(config, "kv.page_size = 0: must be at least 1");
  config = pool_config();
  config.kv_heads = -2;
  expect_error(config, "kv.kv_heads = -2: must be at least 1");
  config = pool_config();
  config.channels = 0;
  expect_error(config, "kv.channels = 0: must be at least 1");
  config = pool_config();
  config.capacity = 0;
  expect_error(config, "kv.capacity = 0: must be at least 1");
  config = pool_config();
  config.capacity = std::int64_t{1} << 31;
  expect_error(config, "kv.capacity = 2147483648: must be at most 2^31 - 1");
  config = pool_config();
  config.storage = static_cast<storage_type>(9);
  expect_error(config, "kv.storage = 9: is not a storage_type");
  config = pool_config();
  config.channels = std::int64_t{1} << 40;
  config.kv_heads = std::int64_t{1} << 30;  // the product would overflow std::int64_t
  expect_error(config, "kv.kv_heads = 1073741824: makes the pool larger than 2^48 bytes");
  config = pool_config();
  config.name = "pool";
  config.page_size = 0;
  expect_error(config, "pool.page_size = 0: must be at least 1");
}

TEST_CASE("page_pool: is move-only", "[cache][page_pool]") {
  STATIC_REQUIRE_FALSE(std::is_copy_constructible<page_pool>::value);
  STATIC_REQUIRE_FALSE(std::is_copy_assignable<page_pool>::value);
  STATIC_REQUIRE(std::is_nothrow_move_constructible<page_pool>::value);
  STATIC_REQUIRE(std::is_nothrow_move_assignable<page_pool>::value);

  page_pool pool(pool_config());
  const page_id page = pool.allocate();
  pool.write_entry(page, 1, tagged_entry(pool, page, 1).data());
  page_pool moved(std::move(pool));
  CHECK(moved.used_pages() == 1);
  CHECK(moved.refcount(page) == 1);
  CHECK(read(moved, page, 1) == expected_entry(moved, page, 1));
  page_pool assigned(pool_config(storage_type::f16, 2));
  assigned = std::move(moved);
  CHECK(assigned.capacity() == 8);
  CHECK(read(assigned, page, 1) == expected_entry(assigned, page, 1));
}

TEST_CASE("page_pool: layout strides match the documented entry-major layout", "[cache][page_pool]") {
  struct shape {
    std::int64_t page_size, kv_heads, channels;
    storage_type storage;
  };
  const shape shapes[] = {
      {4, 2, 3, storage_type::f32},    // 96-byte pages, padded to 128
      {3, 1, 5, storage_type::f16},    // 30-byte pages, padded to 64
      {16, 2, 64, storage_type::bf16}, // 4096 bytes, no padding
      {1, 3, 7, storage_type::bf16},
  };
  for (const shape& s : shapes) {
    auto config = pool_config(s.storage, 3);
    config.page_size = s.page_size;
    config.kv_heads = s.kv_heads;
    config.channels = s.channels;
    page_pool pool(config);
    const auto& layout = pool.layout();
    const std::int64_t element_bytes = phasekv::bytes_per_element(s.storage);
    INFO("page_size " << s.page_size << " kv_heads " << s.kv_heads << " channels " << s.channels << " "
                      << phasekv::to_string(s.storage));

    CHECK(layout.element_bytes == element_bytes);
    CHECK(layout.head_stride == s.channels);
    CHECK(layout.entry_stride == s.kv_heads * s.channels);
    CHECK(layout.head_stride_bytes == layout.head_stride * element_bytes);
    CHECK(layout.entry_stride_bytes == layout.entry_stride * element_bytes);
    CHECK(layout.page_stride_bytes == layout.page_stride * element_bytes);
    const std::int64_t payload = s.page_size * s.kv_heads * s.channels * element_bytes;
    CHECK(layout.page_stride_bytes >= payload);
    CHECK(layout.page_stride_bytes < payload + 64);
    CHECK(layout.page_stride_bytes % 64 == 0);
    CHECK(pool.bytes_per_page() == layout.page_stride_bytes);
    CHECK(reinterpret_cast<std::uintptr_t>(pool.base()) % 64 == 0);

    page_id pages[3];
    pool.allocate(3, pages);
    for (page_id page : pages) {
      CHECK(pool.data(page) == pool.base() + page * layout.page_stride_bytes);
      for (std::int64_t slot = 0; slot < s.page_size; ++slot) {
        pool.write_entry(page, slot, tagged_entry(pool, page, slot).data());
      }
    }
    // Read every element back by the documented formula, after all pages were written, so an
    // overlap between pages or slots would have overwritten something.
    std::size_t wrong = 0;
    for (page_id page : pages) {
      for (std::int64_t slot = 0; slot < s.page_size; ++slot) {
        const auto expected = expected_entry(pool, page, slot);
        for (std::int64_t head = 0; head < s.kv_heads; ++head) {
          for (std::int64_t channel = 0; channel < s.channels; ++channel) {
            const std::byte* at = pool.data(page) + slot * layout.entry_stride_bytes +
                                  head * layout.head_stride_bytes + channel * element_bytes;
            const std::byte* same = pool.base() + ((page * layout.page_stride + slot * layout.entry_stride +
                                                    head * layout.head_stride + channel) * element_bytes);
            wrong += at != same;
            wrong += element_at(at, s.storage) != expected[static_cast<std::size_t>(head * s.channels + channel)];
          }
        }
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("page_pool: allocating past capacity throws and leaves the pool untouched", "[cache][page_pool]") {
  page_pool pool(pool_config(storage_type::bf16, 5));
  CHECK(pool.capacity() == 5);
  CHECK(pool.free_pages() == 5);
  CHECK(pool.used_pages() == 0);
  CHECK(pool.bytes_used() == 0);
  for (page_id expected = 0; expected < 5; ++expected) {
    const page_id page = pool.allocate();
    CHECK(page == expected);  // a fresh pool hands out pages in order
    CHECK(pool.refcount(page) == 1);
    for (std::int64_t slot = 0; slot < 4; ++slot) pool.write_entry(page, slot, tagged_entry(pool, page, slot).data());
  }
  CHECK(pool.used_pages() == 5);
  CHECK(pool.free_pages() == 0);
  CHECK(pool.bytes_used() == 5 * pool.bytes_per_page());
  const auto before = snapshot(pool);

  CHECK_THROWS_AS(pool.allocate(), phasekv::capacity_error);
  CHECK_THROWS_WITH(pool.allocate(), Contains("kv.capacity = 5"));
  page_id out[2] = {-7, -7};
  CHECK_THROWS_AS(pool.allocate(1, out), phasekv::capacity_error);
  CHECK(out[0] == -7);

  CHECK(pool.used_pages() == 5);
  CHECK(pool.free_pages() == 0);
  CHECK(snapshot(pool) == before);
  for (page_id page = 0; page < 5; ++page) CHECK(pool.refcount(page) == 1);

  pool.release(3);
  CHECK(pool.allocate() == 3);  // the pool still works after the failures
}

TEST_CASE("page_pool: multi-page allocation is all or nothing", "[cache][page_pool]") {
  page_pool pool(pool_config(storage_type::f32, 8));
  page_id first[3];
  pool.allocate(3, first);
  CHECK(std::vector<page_id>(first, first + 3) == std::vector<page_id>{0, 1, 2});
  CHECK(pool.used_pages() == 3);

  std::vector<page_id> out(6, -7);
  CHECK_THROWS_AS(pool.allocate(6, out.data()), phasekv::capacity_error);
  CHECK_THROWS_WITH(pool.allocate(6, out.data()),
                    Contains("kv.capacity = 8") && Contains("cannot allocate 6 pages, only 5 free"));
  CHECK(out == std::vector<page_id>(6, -7));
  CHECK(pool.used_pages() == 3);
  for (page_id page = 3; page < 8; ++page) CHECK(pool.refcount(page) == 0);

  pool.allocate(5, out.data());  // exactly what is left, in the order the free list had them
  CHECK(std::vector<page_id>(out.begin(), out.begin() + 5) == std::vector<page_id>{3, 4, 5, 6, 7});
  CHECK(pool.free_pages() == 0);
  CHECK_THROWS_WITH(pool.allocate(1, out.data()), Contains("cannot allocate 1 page, only 0 free"));

  CHECK_NOTHROW(pool.allocate(0, nullptr));
  CHECK_THROWS_AS(pool.allocate(-1, out.data()), phasekv::input_error);
  CHECK_THROWS_WITH(pool.allocate(-1, out.data()), Contains("kv.allocate(count) = -1"));
  CHECK_THROWS_AS(pool.allocate(1, nullptr), phasekv::input_error);
  CHECK(pool.used_pages() == 8);
}

TEST_CASE("page_pool: reference counts and LIFO reuse", "[cache][page_pool]") {
  page_pool pool(pool_config(storage_type::f16, 8));
  const page_id a = pool.allocate();
  const page_id b = pool.allocate();
  const page_id c = pool.allocate();

  SECTION("a page is freed only when its last holder releases it") {
    pool.retain(b);
    pool.retain(b);
    CHECK(pool.refcount(b) == 3);
    pool.release(b);
    pool.release(b);
    CHECK(pool.refcount(b) == 1);
    CHECK(pool.used_pages() == 3);
    pool.release(b);
    CHECK(pool.refcount(b) == 0);
    CHECK(pool.used_pages() == 2);
    CHECK(pool.free_pages() == 6);
    CHECK(pool.bytes_used() == 2 * pool.bytes_per_page());
  }
  SECTION("released pages are reused last-in, first-out") {
    pool.release(b);
    pool.release(a);
    CHECK(pool.allocate() == a);
    CHECK(pool.allocate() == b);
    CHECK(pool.allocate() == 3);  // then the never-used pages, in order
    pool.release(c);
    page_id two[2];
    pool.allocate(2, two);
    CHECK(two[0] == c);
    CHECK(two[1] == 4);
    CHECK(pool.refcount(c) == 1);
  }
  SECTION("releasing or retaining a free page is an error that names it") {
    pool.release(c);
    CHECK_THROWS_AS(pool.release(c), phasekv::input_error);
    CHECK_THROWS_WITH(pool.release(c), Contains("kv.release(page) = 2") && Contains("not allocated"));
    CHECK_THROWS_WITH(pool.retain(5), Contains("kv.retain(page) = 5") && Contains("not allocated"));
    CHECK(pool.refcount(c) == 0);
    CHECK(pool.used_pages() == 2);
    CHECK(pool.allocate() == c);  // the failed release did not push c twice
    CHECK(pool.allocate() == 3);
  }
}

TEST_CASE("page_pool: bad page ids and slots are errors that name them", "[cache][page_pool]") {
  page_pool pool(pool_config(storage_type::f32, 8));
  const page_id page = pool.allocate();
  const page_id other = pool.allocate();
  const page_id free_page = 6;
  std::vector<float> values(6, 1.0f);
  const auto& const_pool = pool;

  for (page_id bad : {page_id{-1}, page_id{8}, page_id{1000}}) {
    const std::string id = std::to_string(bad);
    CHECK_THROWS_WITH(pool.retain(bad), Contains("kv.retain(page) = " + id) && Contains("[0, capacity = 8)"));
    CHECK_THROWS_WITH(pool.release(bad), Contains("kv.release(page) = " + id));
    CHECK_THROWS_WITH(pool.refcount(bad), Contains("kv.refcount(page) = " + id));
    CHECK_THROWS_WITH(pool.data(bad), Contains("kv.data(page) = " + id));
    CHECK_THROWS_WITH(const_pool.data(bad), Contains("kv.data(page) = " + id));
    CHECK_THROWS_WITH(pool.write_entry(bad, 0, values.data()), Contains("kv.write_entry(page) = " + id));
    CHECK_THROWS_WITH(pool.read_entry(bad, 0, values.data()), Contains("kv.read_entry(page) = " + id));
    CHECK_THROWS_WITH(pool.copy_entries(bad, page, 1), Contains("kv.copy_entries(page) = " + id));
    CHECK_THROWS_WITH(pool.copy_entries(page, bad, 1), Contains("kv.copy_entries(page) = " + id));
    CHECK_THROWS_AS(pool.release(bad), phasekv::input_error);
  }
  // Free pages have no contents to touch.
  CHECK_THROWS_WITH(pool.data(free_page), Contains("kv.data(page) = 6") && Contains("not allocated"));
  CHECK_THROWS_AS(pool.write_entry(free_page, 0, values.data()), phasekv::input_error);
  CHECK_THROWS_AS(pool.read_entry(free_page, 0, values.data()), phasekv::input_error);
  CHECK_THROWS_AS(pool.copy_entries(page, free_page, 1), phasekv::input_error);
  CHECK(pool.refcount(free_page) == 0);

  CHECK_THROWS_WITH(pool.write_entry(page, 4, values.data()),
                    Contains("kv.write_entry(slot) = 4") && Contains("[0, page_size = 4)"));
  CHECK_THROWS_WITH(pool.read_entry(page, -1, values.data()), Contains("kv.read_entry(slot) = -1"));
  CHECK_THROWS_WITH(pool.write_entry(page, 0, nullptr), Contains("kv.write_entry(values)"));
  CHECK_THROWS_WITH(pool.read_entry(page, 0, nullptr), Contains("kv.read_entry(out)"));
  CHECK_THROWS_WITH(pool.copy_entries(page, other, 5), Contains("kv.copy_entries(count) = 5") && Contains("[0, page_size = 4]"));
  CHECK_THROWS_AS(pool.copy_entries(page, other, -1), phasekv::input_error);

  CHECK(pool.used_pages() == 2);  // none of that changed anything
  CHECK(pool.refcount(page) == 1);
  CHECK(pool.refcount(other) == 1);
}

TEST_CASE("page_pool: entries round-trip through every storage type", "[cache][page_pool]") {
  const storage_type storage = GENERATE(storage_type::f32, storage_type::bf16, storage_type::f16);
  INFO(phasekv::to_string(storage));
  auto config = pool_config(storage, 4);
  config.kv_heads = 3;
  config.channels = 37;  // exercises SIMD bodies and scalar tails of the row conversions
  page_pool pool(config);
  const std::int64_t entry = pool.layout().entry_stride;

  std::mt19937_64 random(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const float specials[] = {0.0f, -0.0f, 1e-6f, -7e-8f, 65504.0f, 70000.0f, -1e30f,
                            std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            1.0f + std::ldexp(1.0f, -9), 1.0f + std::ldexp(1.0f, -12)};
  page_id pages[2];
  pool.allocate(2, pages);
  std::map<std::pair<page_id, std::int64_t>, std::vector<float>> written;
  for (page_id page : pages) {
    for (std::int64_t slot = 0; slot < config.page_size; ++slot) {
      std::vector<float> values(static_cast<std::size_t>(entry));
      for (float& v : values) v = normal(random);
      for (std::size_t i = 0; i < std::size(specials); ++i) values[(i * 7 + static_cast<std::size_t>(slot)) % values.size()] = specials[i];
      pool.write_entry(page, slot, values.data());
      written[{page, slot}] = values;
    }
  }
  std::size_t wrong = 0;
  for (const auto& [where, values] : written) {
    const auto loaded = read(pool, where.first, where.second);
    for (std::size_t i = 0; i < values.size(); ++i) wrong += bits_of(loaded[i]) != bits_of(stored_value(values[i], storage));
  }
  CHECK(wrong == 0);
  if (storage != storage_type::f32) {
    // Sanity: conversion really happened (1 + 2^-12 is not representable in 16 bits).
    CHECK(stored_value(1.0f + std::ldexp(1.0f, -12), storage) == 1.0f);
  }
}

TEST_CASE("page_pool: copy_entries copies a prefix of a page (copy-on-write)", "[cache][page_pool]") {
  const storage_type storage = GENERATE(storage_type::f32, storage_type::bf16, storage_type::f16);
  page_pool pool(pool_config(storage, 4));
  const page_id source = pool.allocate();
  const page_id destination = pool.allocate();
  for (std::int64_t slot = 0; slot < 4; ++slot) {
    pool.write_entry(source, slot, tagged_entry(pool, source, slot).data());
    pool.write_entry(destination, slot, tagged_entry(pool, destination, slot).data());
  }
  const auto source_before = std::vector<std::byte>(pool.data(source), pool.data(source) + pool.bytes_per_page());

  pool.copy_entries(source, destination, 3);
  for (std::int64_t slot = 0; slot < 3; ++slot) CHECK(read(pool, destination, slot) == expected_entry(pool, source, slot));
  CHECK(read(pool, destination, 3) == expected_entry(pool, destination, 3));  // past the prefix: untouched
  CHECK(std::equal(source_before.begin(), source_before.end(), pool.data(source)));

  pool.copy_entries(source, destination, 0);  // nothing to copy
  pool.copy_entries(source, source, 4);       // onto itself: a no-op
  CHECK(read(pool, destination, 3) == expected_entry(pool, destination, 3));
  CHECK(std::equal(source_before.begin(), source_before.end(), pool.data(source)));
  pool.copy_entries(source, destination, 4);
  CHECK(read(pool, destination, 3) == expected_entry(pool, source, 3));
}

TEST_CASE("page_pool: random operations agree with a reference model", "[cache][page_pool]") {
  const std::uint64_t seed = GENERATE(1u, 2u, 3u, 4u, 5u);
  INFO("seed " << seed);
  constexpr std::int64_t capacity = 6;
  auto config = pool_config(storage_type::f16, capacity);
  config.page_size = 2;
  config.kv_heads = 1;
  config.channels = 2;
  page_pool pool(config);

  // The model: reference counts of allocated pages, the free list as a stack (top = back), and
  // the stamp written into each allocated page so we can tell pages never overlap or get lost.
  std::map<page_id, std::int32_t> model;
  std::vector<page_id> free_stack;
  for (page_id page = capacity - 1; page >= 0; --page) free_stack.push_back(page);
  std::map<page_id, float> stamps;

  std::mt19937_64 random(seed);
  auto pick = [&](std::int64_t n) { return std::uniform_int_distribution<std::int64_t>(0, n - 1)(random); };
  auto random_held = [&] {
    auto it = model.begin();
    std::advance(it, pick(static_cast<std::int64_t>(model.size())));
    return it->first;
  };
  auto random_free = [&] { return free_stack[static_cast<std::size_t>(pick(static_cast<std::int64_t>(free_stack.size())))]; };
  auto take_from_model = [&](std::int64_t step) {
    const page_id page = free_stack.back();
    free_stack.pop_back();
    model[page] = 1;
    stamps[page] = static_cast<float>(step % 2048);
    return page;
  };
  auto stamp_page = [&](page_id page) {
    const float entry[2] = {stamps[page], -stamps[page]};
    pool.write_entry(page, 0, entry);
  };

  std::int64_t allocations = 0, capacity_failures = 0, bad_releases = 0;
  for (std::int64_t step = 0; step < 3000; ++step) {
    const auto op = pick(6);
    if (op == 0) {
      if (free_stack.empty()) {
        REQUIRE_THROWS_AS(pool.allocate(), phasekv::capacity_error);
        ++capacity_failures;
      } else {
        const page_id expected = free_stack.back();
        REQUIRE(pool.allocate() == expected);
        take_from_model(step);
        stamp_page(expected);
        ++allocations;
      }
    } else if (op == 1) {
      const std::int64_t count = pick(4);
      std::vector<page_id> out(static_cast<std::size_t>(count) + 1, -7);
      if (count > static_cast<std::int64_t>(free_stack.size())) {
        REQUIRE_THROWS_AS(pool.allocate(count, out.data()), phasekv::capacity_error);
        REQUIRE(out == std::vector<page_id>(out.size(), -7));
        ++capacity_failures;
      } else {
        pool.allocate(count, out.data());
        for (std::int64_t i = 0; i < count; ++i) {
          REQUIRE(out[static_cast<std::size_t>(i)] == take_from_model(step));
          stamp_page(out[static_cast<std::size_t>(i)]);
        }
        REQUIRE(out.back() == -7);
        allocations += count;
      }
    } else if (op == 2 && !model.empty()) {
      const page_id page = random_held();
      pool.retain(page);
      ++model[page];
    } else if ((op == 3 || op == 4) && !model.empty()) {
      const page_id page = random_held();
      pool.release(page);
      if (--model[page] == 0) {
        model.erase(page);
        stamps.erase(page);
        free_stack.push_back(page);
      }
    } else if (op == 5 && !free_stack.empty()) {
      const page_id page = random_free();
      REQUIRE_THROWS_AS(pick(2) == 0 ? pool.release(page) : pool.retain(page), phasekv::input_error);
      ++bad_releases;
    }

    // The whole observable state, every step.
    REQUIRE(pool.used_pages() == static_cast<std::int64_t>(model.size()));
    REQUIRE(pool.free_pages() == static_cast<std::int64_t>(free_stack.size()));
    for (page_id page = 0; page < capacity; ++page) {
      const auto it = model.find(page);
      REQUIRE(pool.refcount(page) == (it == model.end() ? 0 : it->second));
    }
    for (const auto& [page, stamp] : stamps) {
      float entry[2];
      pool.read_entry(page, 0, entry);
      REQUIRE(entry[0] == stamp);
      REQUIRE(entry[1] == -stamp);
    }
  }
  // The random walk must have visited the interesting states.
  CHECK(allocations > 100);
  CHECK(capacity_failures > 10);
  CHECK(bad_releases > 10);

  for (const auto& [page, count] : model) {
    for (std::int32_t i = 0; i < count; ++i) pool.release(page);
  }
  CHECK(pool.used_pages() == 0);
  CHECK(pool.free_pages() == pool.capacity());
  // The free list holds every page exactly once.
  std::vector<page_id> all(static_cast<std::size_t>(capacity));
  pool.allocate(capacity, all.data());
  CHECK(std::set<page_id>(all.begin(), all.end()).size() == static_cast<std::size_t>(capacity));
}

TEST_CASE("page_pool: concurrent allocate, retain and release keep the accounting consistent",
          "[cache][page_pool][threads]") {
  // Each thread allocates pages, writes its own tag into them, shares some with itself via
  // retain, reads a common full page that every thread retains, and releases everything it
  // took. If the pool ever handed one page to two holders at once, the tags would collide (and
  // ThreadSanitizer would report the concurrent writes); if a count were lost, the final
  // accounting would be off.
  constexpr int thread_count = 4;
  constexpr int iterations = 20000;
  constexpr std::int64_t capacity = 10;  // small, so threads run into capacity_error too
  auto config = pool_config(storage_type::bf16, capacity);
  page_pool pool(config);
  const std::int64_t entry = pool.layout().entry_stride;

  const page_id shared = pool.allocate();
  std::vector<float> shared_values(static_cast<std::size_t>(entry));
  for (std::int64_t slot = 0; slot < config.page_size; ++slot) {
    for (std::int64_t i = 0; i < entry; ++i) shared_values[static_cast<std::size_t>(i)] = static_cast<float>(slot * 10 + i);
    pool.write_entry(shared, slot, shared_values.data());
  }

  std::vector<std::int64_t> capacity_failures(thread_count, 0), corrupt(thread_count, 0);
  auto work = [&](int thread) {
    std::mt19937 random(static_cast<unsigned>(thread) + 1);
    std::vector<std::pair<page_id, float>> held;  // one entry per reference this thread holds
    std::vector<float> values(static_cast<std::size_t>(entry)), loaded(static_cast<std::size_t>(entry));
    for (int iteration = 0; iteration < iterations; ++iteration) {
      const unsigned op = random() % 4;
      if (op == 0 || held.empty()) {
        try {
          const page_id page = pool.allocate();
          const float tag = static_cast<float>(thread * 16 + iteration % 16);  // exact in bf16, distinct per thread
          std::fill(values.begin(), values.end(), tag);
          pool.write_entry(page, 0, values.data());
          held.emplace_back(page, tag);
        } catch (const phasekv::capacity_error&) {
          ++capacity_failures[static_cast<std::size_t>(thread)];
        }
      } else if (op == 1 && held.size() < 6) {
        const auto copy = held[random() % held.size()];
        pool.retain(copy.first);
        held.push_back(copy);
      } else if (op == 2) {
        pool.retain(shared);
        for (std::int64_t slot = 0; slot < config.page_size; ++slot) {
          pool.read_entry(shared, slot, loaded.data());
          corrupt[static_cast<std::size_t>(thread)] += loaded[1] != static_cast<float>(slot * 10 + 1);
        }
        pool.release(shared);
      } else if (!held.empty()) {
        const std::size_t index = random() % held.size();
        const auto [page, tag] = held[index];
        pool.read_entry(page, 0, loaded.data());
        corrupt[static_cast<std::size_t>(thread)] += loaded[0] != tag || loaded.back() != tag;
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(index));
        pool.release(page);
      }
      const std::int64_t used = pool.used_pages();
      corrupt[static_cast<std::size_t>(thread)] += used < 1 || used > capacity;
    }
    for (const auto& [page, tag] : held) pool.release(page);
  };

  std::vector<std::thread> threads;
  for (int thread = 0; thread < thread_count; ++thread) threads.emplace_back(work, thread);
  for (auto& thread : threads) thread.join();

  std::int64_t total_failures = 0;
  for (int thread = 0; thread < thread_count; ++thread) {
    CHECK(corrupt[static_cast<std::size_t>(thread)] == 0);
    total_failures += capacity_failures[static_cast<std::size_t>(thread)];
  }
  CHECK(total_failures > 0);  // the pool really ran full (robust: one thread alone also fills it)
  CHECK(pool.used_pages() == 1);
  CHECK(pool.refcount(shared) == 1);
  for (page_id page = 0; page < capacity; ++page) {
    if (page != shared) CHECK(pool.refcount(page) == 0);
  }
  pool.release(shared);
  CHECK(pool.free_pages() == capacity);
  std::vector<page_id> all(static_cast<std::size_t>(capacity));
  pool.allocate(capacity, all.data());
  CHECK(std::set<page_id>(all.begin(), all.end()).size() == static_cast<std::size_t>(capacity));
}

}  // namespace test_cache_page_pool
