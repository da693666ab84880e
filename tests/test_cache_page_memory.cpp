// Memory the host controls (cache/page_memory.hpp): pools take their block from a host's
// page_memory and give it back; a failing or misaligned host allocation is an error with nothing
// leaked; and the default memory is committed lazily — a cache sized for a million entries that
// holds one 4K-token sequence has only that sequence's pages resident (measured with mincore).

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <new>
#include <random>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "support/prelude.hpp"
#include "support/configs.hpp"
#include "phasekv/cache/page_memory.hpp"
#include "phasekv/cache/page_pool.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/models/deepseek_v4.hpp"

namespace test_cache_page_memory {

namespace {

using namespace phasekv_test::prelude;

// A bump arena over one buffer, recording what it handed out and got back.
class arena final : public page_memory {
 public:
  explicit arena(std::size_t bytes) : buffer_(bytes + 4096) {}
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    auto address = reinterpret_cast<std::uintptr_t>(buffer_.data()) + used_;
    address = (address + alignment - 1) / alignment * alignment;
    const std::size_t end = address - reinterpret_cast<std::uintptr_t>(buffer_.data()) + bytes;
    if (end > buffer_.size()) throw std::bad_alloc();
    used_ = end;
    ++allocations;
    live_bytes += bytes;
    return reinterpret_cast<void*>(address);
  }
  void deallocate(void*, std::size_t bytes, std::size_t) noexcept override {
    ++deallocations;
    live_bytes -= bytes;
  }
  bool owns(const void* p) const {
    return p >= static_cast<const void*>(buffer_.data()) && p < static_cast<const void*>(buffer_.data() + buffer_.size());
  }
  int allocations = 0, deallocations = 0;
  std::size_t live_bytes = 0;

 private:
  std::vector<std::byte> buffer_;
  std::size_t used_ = 0;
};

// Memory that refuses (by throwing, or by returning null) or hands out a misaligned block.
class refusing final : public page_memory {
 public:
  enum mode { throws, null, misaligned };
  explicit refusing(mode m) : mode_(m) {}
  void* allocate(std::size_t bytes, std::size_t) override {
    if (mode_ == throws) throw std::bad_alloc();
    if (mode_ == null) return nullptr;
    storage_.resize(bytes + 128);
    auto address = (reinterpret_cast<std::uintptr_t>(storage_.data()) + 63) / 64 * 64 + 8;
    return reinterpret_cast<void*>(address);
  }
  void deallocate(void*, std::size_t, std::size_t) noexcept override { ++deallocations; }
  int deallocations = 0;

 private:
  mode mode_;
  std::vector<std::byte> storage_;
};

page_pool_config small_pool(page_memory* memory) {
  page_pool_config c = phasekv_test::pool_of("pool", 4, 2, 8, 10);
  c.memory = memory;
  return c;
}

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

TEST_CASE("page_memory: a pool lives in the host's memory and gives it back", "[cache][memory]") {
  arena host(1 << 16);
  {
    page_pool pool(small_pool(&host));
    REQUIRE(host.allocations == 1);
    REQUIRE(host.owns(pool.base()));
    REQUIRE(host.live_bytes == static_cast<std::size_t>(pool.bytes_reserved()));
    REQUIRE(reinterpret_cast<std::uintptr_t>(pool.base()) % 64 == 0);
    const page_id p = pool.allocate();
    std::vector<float> entry(16), back(16);
    for (std::size_t i = 0; i < entry.size(); ++i) entry[i] = static_cast<float>(i) * 0.5f - 3.0f;
    pool.write_entry(p, 2, entry.data());
    pool.read_entry(p, 2, back.data());
    REQUIRE(back == entry);
    // The bytes are where the layout says, inside the host's buffer.
    const auto* at = reinterpret_cast<const float*>(pool.base() + p * pool.layout().page_stride_bytes +
                                                    2 * pool.layout().entry_stride_bytes);
    REQUIRE(host.owns(at));
    REQUIRE(std::vector<float>(at, at + 16) == entry);
    page_pool moved(std::move(pool));  // moving keeps the one block
    REQUIRE(host.allocations == 1);
    REQUIRE(host.deallocations == 0);
  }
  REQUIRE(host.deallocations == 1);
  REQUIRE(host.live_bytes == 0);
}

TEST_CASE("page_memory: a refused or misaligned block is an error and nothing leaks", "[cache][memory]") {
  refusing throws(refusing::throws), null(refusing::null), misaligned(refusing::misaligned);
  REQUIRE_THAT(message_of([&] { page_pool p(small_pool(&throws)); }),
               Contains("pool.capacity = 10") && Contains("could not be allocated"));
  REQUIRE_THAT(message_of([&] { page_pool p(small_pool(&null)); }), Contains("pool.capacity = 10"));
  REQUIRE_THAT(message_of([&] { page_pool p(small_pool(&misaligned)); }),
               Contains("pool.memory = a block at") && Contains("must be aligned to 64 bytes"));
  REQUIRE(misaligned.deallocations == 1);  // given back before the error left the constructor
}

TEST_CASE("page_memory: memory of a known size is never overrun; arena_page_memory carries its size",
          "[cache][memory]") {
  // A host arena too small for the pool: refused before any allocation, naming both sizes.
  std::vector<std::byte> small(1000);
  arena_page_memory tight(small.data(), small.size());
  const std::string message = message_of([&] { page_pool p(small_pool(&tight)); });
  CHECK_THAT(message, Contains("pool.capacity = 10") && Contains("its memory holds") && Contains("needs"));
  CHECK(tight.used() == 0);

  // A host's own page_memory that reports its size is checked the same way: allocate() never runs.
  class sized final : public page_memory {
   public:
    void* allocate(std::size_t, std::size_t) override {
      ++allocations;
      throw std::bad_alloc();
    }
    void deallocate(void*, std::size_t, std::size_t) noexcept override {}
    std::size_t capacity(std::size_t) const noexcept override { return 64; }
    int allocations = 0;
  } host;
  CHECK_THROWS_AS(page_pool(small_pool(&host)), capacity_error);
  CHECK(host.allocations == 0);

  // Two pools fit one after the other, aligned, inside the buffer; a third does not; all given
  // back, the buffer is whole again.
  const std::size_t one = static_cast<std::size_t>(page_pool(small_pool(nullptr)).bytes_reserved());
  std::vector<std::byte> buffer(2 * one + 200);
  arena_page_memory arena_memory(buffer.data() + 3, buffer.size() - 3);  // a misaligned start
  {
    page_pool a(small_pool(&arena_memory)), b(small_pool(&arena_memory));
    for (const page_pool* p : {&a, &b}) {
      CHECK(reinterpret_cast<std::uintptr_t>(p->base()) % 64 == 0);
      CHECK(p->base() >= buffer.data());
      CHECK(p->base() + p->bytes_reserved() <= buffer.data() + buffer.size());
    }
    CHECK(b.base() >= a.base() + a.bytes_reserved());
    CHECK(arena_memory.capacity(64) < one);
    CHECK_THROWS_AS(page_pool(small_pool(&arena_memory)), capacity_error);
    const page_id p = b.allocate();
    std::vector<float> entry(16, 2.5f), back(16);
    b.write_entry(p, 1, entry.data());
    b.read_entry(p, 1, back.data());
    CHECK(back == entry);
  }
  CHECK(arena_memory.used() == 0);
  CHECK(arena_memory.capacity(64) >= 2 * one);
  CHECK_THROWS_AS(arena_page_memory(nullptr, 16), input_error);
}

TEST_CASE("page_memory: a paged_cache with host memory reads and writes the host's block", "[cache][memory]") {
  using csa = stream_compressor<presets::deepseek_v4_csa_policy>;
  arena host(8 << 20);
  cache_config cc;
  cc.page_size = 16;
  cc.pages = 16;
  cc.memory = &host;
  {
    paged_cache<csa> cache(layer_compressor<csa>(csa(presets::deepseek_v4_csa_layer.geom,
                                                     presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer))),
                           cc);
    REQUIRE(host.allocations == 1);
    REQUIRE(host.owns(cache.pool(0).base()));
    const sequence_id s = cache.create();
    const auto& kv = cache.compressors().stream<0>();
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> payload(static_cast<std::size_t>(40 * kv.payload_floats_per_token())),
        logits(static_cast<std::size_t>(40 * kv.logit_floats_per_token()));
    for (float& x : payload) x = u(rng);
    for (float& x : logits) x = u(rng);
    cache.append(s, {token_chunk{40, payload, logits}});
    REQUIRE(cache.entries(s, 0) == 10);
    std::vector<float> entry(512);
    cache.read_entry(s, 0, 7, entry.data());
    const auto& layout = cache.pool(0).layout();
    const auto* at = reinterpret_cast<const float*>(cache.pool(0).base() +
                                                    cache.page_table(s, 0)[0] * layout.page_stride_bytes +
                                                    7 * layout.entry_stride_bytes);
    REQUIRE(host.owns(at));
    REQUIRE(std::vector<float>(at, at + 512) == entry);
  }
  REQUIRE(host.deallocations == 1);
}

#if defined(__linux__)
// Bytes of [block, block + bytes) the kernel holds in memory.
std::int64_t resident_bytes(const std::byte* block, std::int64_t bytes) {
  const std::int64_t os_page = ::sysconf(_SC_PAGESIZE);
  const auto start = reinterpret_cast<std::uintptr_t>(block) / os_page * os_page;
  const std::int64_t length = reinterpret_cast<std::uintptr_t>(block) + bytes - start;
  std::vector<unsigned char> resident(static_cast<std::size_t>((length + os_page - 1) / os_page));
  REQUIRE(::mincore(reinterpret_cast<void*>(start), static_cast<std::size_t>(length), resident.data()) == 0);
  std::int64_t count = 0;
  for (unsigned char r : resident) count += r & 1;
  return count * os_page;
}

TEST_CASE("page_memory: a 1M-entry cache holding one 4K-token sequence keeps only its pages resident",
          "[cache][memory]") {
  using csa = stream_compressor<presets::deepseek_v4_csa_policy>;
  cache_config cc;
  cc.page_size = 64;
  cc.pages = (1 << 20) / 64;  // a million entries per stream: 2 GiB of K/V, 512 MiB of indexer keys
  cc.window.tokens = 128;
  cc.window.key_channels = 512;
  paged_cache<csa, csa> cache(
      layer_compressor<csa, csa>(
          csa(presets::deepseek_v4_csa_layer.geom, presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer)),
          csa(presets::deepseek_v4_csa_layer.geom, *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer))),
      cc);
  const sequence_id s = cache.create();
  const i64 tokens = 4096, chunk = 512;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto values = [&](i64 n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = u(rng);
    return v;
  };
  const auto& kv = cache.compressors().stream<0>();
  const auto& ix = cache.compressors().stream<1>();
  for (i64 t = 0; t < tokens; t += chunk) {
    const auto kv_payload = values(chunk * kv.payload_floats_per_token());
    const auto kv_logits = values(chunk * kv.logit_floats_per_token());
    const auto ix_payload = values(chunk * ix.payload_floats_per_token());
    const auto ix_logits = values(chunk * ix.logit_floats_per_token());
    cache.append(s, {token_chunk{chunk, kv_payload, kv_logits}, token_chunk{chunk, ix_payload, ix_logits}},
                 values(chunk * 512));
  }
  for (std::size_t k = 0; k < 2; ++k) {
    const page_pool& pool = cache.pool(k);
    const std::int64_t used = pool.used_pages() * pool.bytes_per_page();
    const std::int64_t resident = resident_bytes(pool.base(), pool.bytes_reserved());
    INFO("stream " << k << ": " << pool.used_pages() << " pages in use (" << used << " bytes), " << resident
                   << " bytes resident of " << pool.bytes_reserved() << " reserved");
    REQUIRE(pool.used_pages() == 16);  // 1024 entries / 64
    REQUIRE(pool.pages_touched() == 16);
    REQUIRE(resident >= used);
    REQUIRE(resident < 2 * used);
  }
}
#endif

}  // namespace

}  // namespace test_cache_page_memory
