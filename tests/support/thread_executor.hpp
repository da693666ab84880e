#pragma once
// A host's thread pool for the reader tests: `threads` std::threads per run(), tasks taken from a
// shared counter — optionally last task first — so pieces really run concurrently and out of
// order. Counts its runs.

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "phasekv/core/executor.hpp"

namespace phasekv_test {

class thread_executor final : public phasekv::executor {
 public:
  explicit thread_executor(int threads, bool reverse = false) : threads_(threads), reverse_(reverse) {}
  std::int64_t concurrency() const noexcept override { return threads_; }
  void run(std::int64_t tasks, task_function task, void* context) noexcept override {
    std::atomic<std::int64_t> next{0};
    auto work = [&] {
      for (std::int64_t i; (i = next.fetch_add(1)) < tasks;) task(context, reverse_ ? tasks - 1 - i : i);
    };
    std::vector<std::thread> pool;
    for (int k = 1; k < threads_; ++k) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    ++runs;
  }
  std::int64_t runs = 0;

 private:
  int threads_;
  bool reverse_;
};

}  // namespace phasekv_test
