#pragma once
// The pages one append adds to one page table, reserved before anything is written: fresh pages
// for the entries past the table's end, and a private copy of the last page when it is partial,
// about to be written and held by another sequence too (copy on write). An append reserves a plan
// per stream first, so a full pool fails with nothing changed; the entries then go to
// page_for(...), and the plan is adopted (the table takes its pages) or dropped (the pool takes
// them back, last allocated first, so its LIFO free list is exactly as before).

#include <cstdint>
#include <utility>
#include <vector>

#include "phasekv/cache/page_pool.hpp"
#include "phasekv/core/types.hpp"

namespace phasekv::detail {

struct page_plan {
  std::vector<page_id> fresh;
  page_id copy = -1;  // replaces the table's last page, or -1

  // The plan for a table holding `before` entries that will hold `after`: every page allocated
  // (one all-or-nothing allocation, so nothing leaks if it throws), the copy filled.
  static page_plan reserve(page_pool& pool, const std::vector<page_id>& table, std::int64_t before, std::int64_t after,
                           std::int64_t page_size) {
    page_plan plan;
    if (after == before) return plan;
    const std::int64_t pages_after = (after + page_size - 1) / page_size;
    const bool copy = before % page_size != 0 && pool.refcount(table.back()) > 1;  // a shared partial last page
    std::vector<page_id> pages(static_cast<std::size_t>(pages_after - static_cast<std::int64_t>(table.size())) +
                               (copy ? 1 : 0));
    pool.allocate(static_cast<std::int64_t>(pages.size()), pages.data());
    if (copy) {
      plan.copy = pages.back();
      pages.pop_back();
      pool.copy_entries(table.back(), plan.copy, before % page_size);
    }
    plan.fresh = std::move(pages);
    return plan;
  }

  // The page entry `entry` goes to.
  page_id page_for(const std::vector<page_id>& table, std::int64_t entry, std::int64_t page_size) const {
    const auto index = static_cast<std::size_t>(entry / page_size);
    if (index < table.size()) return index + 1 == table.size() && copy >= 0 ? copy : table[index];
    return fresh[index - table.size()];
  }

  // The table takes the plan's pages (the caller reserved its capacity, so nothing allocates); a
  // copy replaces the shared last page, whose holders drop by one (another still holds it).
  void adopt(page_pool& pool, std::vector<page_id>& table) {
    if (copy >= 0) {
      pool.release(table.back());
      table.back() = copy;
    }
    table.insert(table.end(), fresh.begin(), fresh.end());
  }

  // The pool takes the plan's pages back, in the reverse of the order they were allocated (the
  // copy came last): after a failed append the next call receives the very pages it would have
  // received had the failure never happened.
  void drop(page_pool& pool) noexcept {
    // Pages of a plan are held by nobody else: releasing them cannot throw in practice.
    try {
      if (copy >= 0) pool.release(copy);
      for (auto p = fresh.rbegin(); p != fresh.rend(); ++p) pool.release(*p);
    } catch (...) {
    }
    *this = page_plan{};
  }
};

}  // namespace phasekv::detail
