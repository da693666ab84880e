#pragma once
// How phasekv runs independent pieces of work in parallel: through an executor the host supplies.
// The library never creates a thread of its own. Without an executor, work runs in order on the
// calling thread (serial_executor), so embedding phasekv in an engine that already owns its
// threads costs nothing and surprises nobody.
//
// A host adapts its own thread pool by implementing `run`: call `task(context, i)` exactly once
// for every i in [0, tasks), on any threads, in any order, and return only when all calls have
// returned. `concurrency()` says how many tasks may run at once; callers use it only to decide
// whether splitting is worth it, never to choose results — every parallel path in phasekv splits
// work into pieces of a fixed size, so a read gives bit-identical results on any executor.
//
// `task` never throws: for_each() catches what a piece of work throws (an allocation failure,
// say) and rethrows the first such exception on the calling thread once every task has returned.
// openmp_executor.hpp adapts OpenMP.

#include <atomic>
#include <cstdint>
#include <exception>

namespace phasekv {

class executor {
 public:
  using task_function = void (*)(void* context, std::int64_t index) noexcept;

  virtual ~executor() = default;
  virtual std::int64_t concurrency() const noexcept = 0;
  virtual void run(std::int64_t tasks, task_function task, void* context) noexcept = 0;

  // f(i) for every i in [0, tasks) through run(); the first exception thrown by f is rethrown
  // here after all tasks have finished.
  template <class F>
  void for_each(std::int64_t tasks, F& f) {
    if (tasks <= 0) return;
    if (tasks == 1) {
      f(std::int64_t{0});
      return;
    }
    struct context {
      F* f = nullptr;
      std::atomic<bool> failed{false};
      std::exception_ptr error;
    } c;
    c.f = &f;
    run(
        tasks,
        [](void* p, std::int64_t i) noexcept {
          auto& shared = *static_cast<context*>(p);
          try {
            (*shared.f)(i);
          } catch (...) {
            if (!shared.failed.exchange(true)) shared.error = std::current_exception();
          }
        },
        &c);
    if (c.error) std::rethrow_exception(c.error);
  }
};

// The default: every task on the calling thread, in index order.
class serial_executor final : public executor {
 public:
  std::int64_t concurrency() const noexcept override { return 1; }
  void run(std::int64_t tasks, task_function task, void* context) noexcept override {
    for (std::int64_t i = 0; i < tasks; ++i) task(context, i);
  }
};

// One shared serial executor: stateless, so sharing it across threads is safe.
inline executor& default_executor() noexcept {
  static serial_executor serial;
  return serial;
}

}  // namespace phasekv
