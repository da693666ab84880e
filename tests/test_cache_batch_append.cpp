// The batched append of a decode step (paged_cache::append_batch):
//
//   - bit-identical to B single appends in item order — the same page ids, entry bytes, window
//     rows and states — on the serial executor and on threads running the items in either order,
//     with forked sequences (a shared last page copied on write), one or several tokens per item;
//   - all or nothing: a bad item, a repeated sequence, a full pool and an entry that fails while
//     being stored leave every sequence and the pool's free list as they were.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/prelude.hpp"
#include "support/message_of.hpp"
#include "support/thread_executor.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "support/read_world.hpp"

namespace test_cache_batch_append {

namespace {

using namespace phasekv_test::prelude;
using namespace phasekv_test::read_support;
using W = selection_world;
using item = selection_cache::append_item;

// Everything a sequence holds: tokens, page tables, entry bytes, window rows.
struct holdings {
  std::vector<i64> counts;
  std::vector<std::vector<page_id>> tables;
  std::vector<std::byte> bytes;
  std::vector<float> window;
  bool operator==(const holdings& o) const {
    return counts == o.counts && tables == o.tables && bytes == o.bytes && window == o.window;
  }
};

// with_pages: the page ids too (they differ from single appends only where two sequences of a
// batch share a partly filled last page: each copies it, where singles copy it once).
holdings holdings_of(const selection_cache& c, sequence_id s, bool with_pages = true) {
  holdings h;
  h.counts = {c.tokens(s), c.window_first(s)};
  for (std::size_t k = 0; k < selection_cache::stream_count; ++k) {
    h.counts.push_back(c.entries(s, k));
    h.counts.push_back(c.pool(k).used_pages());
    h.tables.push_back(with_pages ? c.page_table(s, k) : std::vector<page_id>(c.page_table(s, k).size()));
    for (i64 j = 0; j < c.entries(s, k); ++j) {
      const span<const std::byte> b = c.entry_bytes(s, k, j);
      h.bytes.insert(h.bytes.end(), b.begin(), b.end());
    }
  }
  for (i64 t = c.window_first(s); t < c.tokens(s); ++t) {
    const float* k = c.window_key(s, t);
    h.window.insert(h.window.end(), k, k + W::kv_heads * W::key_channels);
  }
  return h;
}

// Inputs of `tokens` tokens for each of B items, kept alive for the items' spans.
struct step_inputs {
  std::vector<W::inputs> in;
  std::vector<i64> tokens;
  std::vector<item> items(const W& world, const std::vector<sequence_id>& seqs) const {
    std::vector<item> out;
    const i64 views = world.geom.branches();
    for (std::size_t b = 0; b < seqs.size(); ++b) {
      const W::inputs& x = in[b];
      const i64 n = tokens[b];
      item it;
      it.seq = seqs[b];
      it.in = {token_chunk{n, span<const float>(x.keys.data(), sz(n * W::kv_heads * views * W::key_channels)), {}},
               token_chunk{n, span<const float>(x.values.data(), sz(n * W::kv_heads * views * W::value_channels)),
                           span<const float>(x.value_logits.data(), sz(n * W::kv_heads * views * W::value_channels))},
               token_chunk{n, span<const float>(x.indexer.data(), sz(n * views * W::indexer_channels)), {}}};
      it.window_keys = span<const float>(x.window_keys.data(), sz(n * W::kv_heads * W::key_channels));
      it.window_values = span<const float>(x.window_values.data(), sz(n * W::kv_heads * W::value_channels));
      out.push_back(it);
    }
    return out;
  }
};

step_inputs random_step(const W& world, std::mt19937& rng, std::size_t batch, bool several) {
  step_inputs s;
  for (std::size_t b = 0; b < batch; ++b) {
    s.tokens.push_back(several ? 1 + static_cast<i64>(rng() % 3) : 1);
    s.in.push_back(world.make_inputs(rng, s.tokens.back(), 3));
  }
  return s;
}

// Two identical caches with B sequences of different lengths (and two forks of them).
struct twins {
  W world;
  selection_cache batched, single;
  std::vector<sequence_id> seqs, single_seqs;  // the same sequences in each (ids are per cache)
  bool forks;
  explicit twins(i64 pages = 128, bool with_forks = false)
      : batched(world.make(storage_type::f16, 9, 0, pages)), single(world.make(storage_type::f16, 9, 0, pages)),
        forks(with_forks) {
    std::mt19937 rng(90);
    for (selection_cache* c : {&batched, &single}) {
      std::mt19937 same(91);
      std::vector<sequence_id> made;
      for (int b = 0; b < 5; ++b) {
        made.push_back(c->create());
        const i64 n = 3 + 2 * b;
        world.append(*c, made.back(), world.make_inputs(same, n, 3), 0, n);
      }
      if (forks) {
        made.push_back(c->fork(made[1]));  // shares a partial last page with sequence 1
        made.push_back(c->fork(made[4]));
      }
      (c == &batched ? seqs : single_seqs) = made;
    }
  }
  bool same() const {
    for (std::size_t b = 0; b < seqs.size(); ++b)
      if (!(holdings_of(batched, seqs[b], !forks) == holdings_of(single, single_seqs[b], !forks))) return false;
    return true;
  }
  // The single appends of `order` (indices into seqs), in that order.
  void append_singly(const step_inputs& in, const std::vector<std::size_t>& order) {
    std::vector<sequence_id> ids;
    for (std::size_t b : order) ids.push_back(single_seqs[b]);
    for (const item& it : in.items(world, ids)) single.append(it.seq, it.in, it.window_keys, it.window_values);
  }
  std::vector<sequence_id> batched_ids(const std::vector<std::size_t>& order) const {
    std::vector<sequence_id> ids;
    for (std::size_t b : order) ids.push_back(seqs[b]);
    return ids;
  }
};

TEST_CASE("append_batch: bit-identical to single appends in item order, on any executor", "[cache][batch_append]") {
  phasekv_test::thread_executor threads(3), reversed(3, true);
  executor* executors[] = {&default_executor(), &threads, &reversed};
  for (executor* ex : executors)
  for (const bool forks : {false, true}) {
    INFO((forks ? "with forks" : "without forks"));
    twins t(128, forks);
    std::mt19937 rng(100);
    for (int step = 0; step < 12; ++step) {
      INFO("step " << step);
      const step_inputs in = random_step(t.world, rng, t.seqs.size(), step % 3 == 2);
      std::vector<std::size_t> order(t.seqs.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::shuffle(order.begin(), order.end(), rng);  // any item order
      const std::vector<item> items = in.items(t.world, t.batched_ids(order));
      t.batched.append_batch(span<const item>(items.data(), items.size()), *ex);
      t.append_singly(in, order);
      REQUIRE(t.same());
    }
  }
}

TEST_CASE("append_batch: a bad item, a repeat, a full pool or a failing entry changes nothing", "[cache][batch_append][errors]") {
  twins t(40);
  std::mt19937 rng(200);
  const std::vector<holdings> before = [&] {
    std::vector<holdings> h;
    for (sequence_id s : t.seqs) h.push_back(holdings_of(t.batched, s));
    return h;
  }();
  auto unchanged = [&] {
    for (std::size_t b = 0; b < t.seqs.size(); ++b) REQUIRE(holdings_of(t.batched, t.seqs[b]) == before[b]);
  };
  step_inputs in = random_step(t.world, rng, t.seqs.size(), true);
  std::vector<item> items = in.items(t.world, t.seqs);
  std::vector<item> bad = items;
  bad[2].in[1].logits = {};
  CHECK_THROWS_WITH(t.batched.append_batch(span<const item>(bad.data(), bad.size())),
                    Contains("cache.append_batch: items[2] = ") && Contains("logits"));
  unchanged();
  bad = items;
  bad[4].seq = bad[1].seq;
  CHECK_THROWS_WITH(t.batched.append_batch(span<const item>(bad.data(), bad.size())),
                    Contains("items[4].seq") && Contains("repeats items[1].seq"));
  unchanged();
  bad = items;
  bad[1].window_keys = {};
  CHECK_THROWS_WITH(t.batched.append_batch(span<const item>(bad.data(), bad.size())), Contains("items[1]") && Contains("window_keys"));
  unchanged();
  bad = items;
  bad[3].seq = 12345;
  CHECK_THROWS_WITH(t.batched.append_batch(span<const item>(bad.data(), bad.size())), Contains("items[3] = 12345"));
  unchanged();
  // An entry that cannot be stored (f16 infinity under check_finite): thrown by a task after
  // every page was reserved.
  step_inputs huge = in;
  std::fill(huge.in[3].keys.begin(), huge.in[3].keys.end(), 4e5f);  // half of an entry's window: > 65520
  bad = huge.items(t.world, t.seqs);
  append_options checked;
  checked.check_finite = true;
  phasekv_test::thread_executor threads(2);
  REQUIRE(t.batched.entries_after(t.seqs[3], huge.tokens[3]) > 0);
  CHECK_THROWS_WITH(t.batched.append_batch(span<const item>(bad.data(), bad.size()), threads, checked),
                    Contains("is not representable in f16"));
  unchanged();
  // A pool too small for the whole batch: fill it until the next batch cannot fit.
  for (int step = 0;; ++step) {
    REQUIRE(step < 200);
    const step_inputs next = random_step(t.world, rng, t.seqs.size(), true);
    const std::vector<item> more = next.items(t.world, t.seqs);
    std::vector<holdings> prior;
    for (sequence_id s : t.seqs) prior.push_back(holdings_of(t.batched, s));
    bool full = false;
    try {
      t.batched.append_batch(span<const item>(more.data(), more.size()), threads);
    } catch (const capacity_error&) {
      full = true;
    }
    std::vector<std::size_t> all(t.seqs.size());
    std::iota(all.begin(), all.end(), std::size_t{0});
    if (!full) {
      t.append_singly(next, all);
      REQUIRE(t.same());
      continue;
    }
    for (std::size_t b = 0; b < t.seqs.size(); ++b) REQUIRE(holdings_of(t.batched, t.seqs[b]) == prior[b]);
    // The free list is as it was: the first item alone gets the pages a single append gets.
    const std::vector<item> few(more.begin(), more.begin() + 1);
    t.batched.append_batch(span<const item>(few.data(), few.size()));
    t.append_singly(next, {0});
    CHECK(t.same());
    break;
  }
}

}  // namespace

}  // namespace test_cache_batch_append
