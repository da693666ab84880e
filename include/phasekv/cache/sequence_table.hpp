#pragma once
// The table of an owner's sequences — a layer's paged_cache, a model's model_cache: ids to
// records under one mutex.
//
// Ids: every owner takes a tag for the top bits of its ids from one process-wide counter, and an
// id is that tag with the sequence's slot number below it. Another owner's id is then rejected as
// unknown instead of naming one of this owner's sequences, and the message can say whose it was.
// Tags repeat after 2^22 owners; slots count to 2^40.
//
// Locking: the mutex is held only to look up, add or drop records, never while a record is
// written. Each sequence has one writer at a time (the owners' contract), so a record found under
// the lock stays valid until its writer frees it. An owner whose operations span several records
// (a model step holding its sequences) takes mutex() and uses the *_locked lookups.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/core/types.hpp"

namespace phasekv {
namespace detail {

inline sequence_id next_sequence_tag() noexcept {
  static std::atomic<std::int64_t> owners{0};
  return ((owners.fetch_add(1, std::memory_order_relaxed) % (std::int64_t{1} << 22)) + 1) << 40;
}

// Why `id` names no live sequence of the owner tagged `tag`, for the error message (2199023255553
// is sequence #1 of the owner tagged 2).
inline std::string unknown_sequence(sequence_id id, sequence_id tag, const char* owner) {
  constexpr sequence_id slot_mask = (std::int64_t{1} << 40) - 1;
  if (id >= 0 && (id & ~slot_mask) == tag)
    return std::string("is not a live sequence of this ") + owner + ": its sequence #" + std::to_string(id & slot_mask) +
           ", freed (or dropped by keep/clear) since";
  return std::string("is not a live sequence of this ") + owner +
         ": an id of another cache or model, or not one the library made";
}

// How many times a sequence was written in a way that moves or changes memory a view points into
// (append, remove_suffix, copy onto it): what a view's stamp records. Atomic so that checking a
// misused view — one read while its sequence is written — is not itself a data race.
struct write_count {
  std::atomic<std::uint64_t> n{0};
  write_count() = default;
  write_count(const write_count& o) noexcept : n(o.get()) {}
  write_count& operator=(const write_count& o) noexcept {
    n.store(o.get(), std::memory_order_relaxed);
    return *this;
  }
  std::uint64_t get() const noexcept { return n.load(std::memory_order_relaxed); }
  void bump() noexcept { n.fetch_add(1, std::memory_order_relaxed); }
};

// A lookup's check of a found record, run under the lock: check(record, id, operation) throws to
// refuse it (a model cache refuses a sequence an open step holds). The default accepts all.
struct accept_any {
  template <class Record>
  void operator()(const Record&, sequence_id, const char*) const noexcept {}
};

template <class Record>
class sequence_table {
 public:
  using records = std::unordered_map<sequence_id, std::unique_ptr<Record>>;

  // `owner` names the kind of owner in messages: "cache", "model cache".
  explicit sequence_table(const char* owner) noexcept : owner_(owner) {}
  sequence_table(const sequence_table&) = delete;
  sequence_table& operator=(const sequence_table&) = delete;

  std::mutex& mutex() const noexcept { return mutex_; }

  // The record of `id`, or input_error "<name>.<operation>(sequence)" naming whose id it was. A
  // lookup leaves the table as it is, hence const; the record itself is its writer's (the owners'
  // const queries hand it out as const).
  template <class Check = accept_any>
  Record& find(sequence_id id, const std::string& name, const char* operation, Check&& check = {}) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return find_locked(id, name, operation, check);
  }
  // The same, the caller holding mutex().
  template <class Check = accept_any>
  Record& find_locked(sequence_id id, const std::string& name, const char* operation, Check&& check = {}) const {
    Record* r = lookup_locked(id);
    if (r == nullptr) fail_unknown(id, name, operation);
    check(*r, id, operation);
    return *r;
  }
  // The record of `id` or null, the caller holding mutex().
  Record* lookup_locked(sequence_id id) const noexcept {
    const auto it = records_.find(id);
    return it == records_.end() ? nullptr : it->second.get();
  }

  // Adds a record under a fresh id. If the table cannot grow (std::bad_alloc) the record stays
  // with the caller: the slot is made empty first, and the record moves in only once it exists.
  sequence_id insert(std::unique_ptr<Record>&& record) {
    std::lock_guard<std::mutex> lock(mutex_);
    const sequence_id id = tag_ | next_;
    auto slot = records_.emplace(id, nullptr).first;
    slot->second = std::move(record);
    ++next_;
    return id;
  }

  // Takes `id`'s record out of the table (free).
  template <class Check = accept_any>
  std::unique_ptr<Record> erase(sequence_id id, const std::string& name, const char* operation, Check&& check = {}) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = records_.find(id);
    if (it == records_.end()) fail_unknown(id, name, operation);
    check(*it->second, id, operation);
    std::unique_ptr<Record> record = std::move(it->second);
    records_.erase(it);
    return record;
  }
  // Takes every record but `kept`'s out of the table (keep). All or nothing: `kept` must be live
  // and every record pass `check` before any is taken, and the one allocation comes first.
  template <class Check = accept_any>
  std::vector<std::unique_ptr<Record>> erase_all_but(sequence_id kept, const std::string& name, const char* operation,
                                                     Check&& check = {}) {
    std::vector<std::unique_ptr<Record>> taken;
    std::lock_guard<std::mutex> lock(mutex_);
    find_locked(kept, name, operation);
    for (const auto& entry : records_) check(*entry.second, entry.first, operation);
    taken.reserve(records_.size());
    for (auto it = records_.begin(); it != records_.end();) {
      if (it->first == kept) {
        ++it;
        continue;
      }
      taken.push_back(std::move(it->second));
      it = records_.erase(it);
    }
    return taken;
  }
  // Takes every record out of the table (clear), once every one passes `check`.
  template <class Check = accept_any>
  records erase_all(const char* operation, Check&& check = {}) {
    records taken;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& entry : records_) check(*entry.second, entry.first, operation);
    taken.swap(records_);
    return taken;
  }

  bool contains(sequence_id id) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return records_.count(id) != 0;
  }
  std::int64_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<std::int64_t>(records_.size());
  }
  // The live ids in increasing order (creation order).
  std::vector<sequence_id> ids() const {
    std::vector<sequence_id> out;
    std::lock_guard<std::mutex> lock(mutex_);
    out.reserve(records_.size());
    for (const auto& entry : records_) out.push_back(entry.first);
    std::sort(out.begin(), out.end());
    return out;
  }
  // f(id, const Record&) for every record, under the lock.
  template <class F>
  void for_each(F&& f) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& entry : records_) f(entry.first, static_cast<const Record&>(*entry.second));
  }

  [[noreturn]] void fail_unknown(sequence_id id, const std::string& name, const char* operation) const {
    detail::fail<input_error>(name + "." + operation + "(sequence)", id, unknown_sequence(id, tag_, owner_));
  }

 private:
  const char* owner_;
  mutable std::mutex mutex_;
  records records_;
  sequence_id tag_ = next_sequence_tag();
  sequence_id next_ = 0;
};

}  // namespace detail
}  // namespace phasekv
