#pragma once
// What the fuzz targets fuzz_snapshot, fuzz_view and fuzz_diag share: the failure report (the
// harness's message and what the input decoded to, then abort, so libFuzzer keeps the input) and
// a reader of the input's bytes that reads zeros past the end, so every input decodes.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <string>

namespace phasekv_fuzz {

// What the current input decoded to, for a failure's message; each target fills it.
inline std::string& setup() {
  static std::string text;
  return text;
}

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "\nphasekv fuzz: FAILED: %s\n  input: %s\n", what.c_str(), setup().c_str());
  std::fflush(stderr);
  std::abort();
}

// What an input's first bytes alone determine (a source snapshot, a populated world and what it
// reads), made once and kept: a pure function of its key, so every input still runs the same
// whatever ran before it, and a finding replays from its file alone. At most `limit` values are
// kept; a new one evicts the oldest, so no single input pays for dropping many (clearing a full
// memo of 2,048 caches under ASan once took a view-target input past libFuzzer's timeout).
template <class Key, class Value>
class memo {
 public:
  explicit memo(std::size_t limit) : limit_(limit) {}
  // The value of `key`, made by make() (returning std::unique_ptr<Value>) the first time.
  template <class Make>
  Value& get(const Key& key, Make&& make) {
    auto it = values_.find(key);
    if (it != values_.end()) return *it->second;
    if (values_.size() >= limit_) {
      values_.erase(order_.front());
      order_.pop_front();
    }
    auto made = values_.emplace(key, make()).first;
    order_.push_back(key);
    return *made->second;
  }

 private:
  std::size_t limit_;
  std::map<Key, std::unique_ptr<Value>> values_;
  std::deque<Key> order_;  // keys in the order they were made
};

struct input_bytes {
  const std::uint8_t* data;
  std::size_t size, at = 0;
  std::uint8_t byte() { return at < size ? data[at++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(byte() | (byte() << 8)); }
};

}  // namespace phasekv_fuzz
