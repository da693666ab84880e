#pragma once
// An executor (executor.hpp) over OpenMP, for hosts that compile with -fopenmp (CMake:
// find_package(OpenMP) and link OpenMP::OpenMP_CXX). Each run() is one parallel loop with a
// dynamic schedule (tasks can differ in size: pages of different fill, heads of different work).
// Without OpenMP the executor runs tasks serially, so this header compiles everywhere.
//
// The engine does no work on threads of its own: only the tasks a host's executor runs. (A host
// that also uses Eigen with OpenMP on may define EIGEN_DONT_PARALLELIZE so Eigen's own products
// stay off the executor's threads; our benchmarks and examples do.)

#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "phasekv/core/executor.hpp"

namespace phasekv {

class openmp_executor final : public executor {
 public:
  // threads = 0: OpenMP's default team size (OMP_NUM_THREADS, else the number of cores).
  explicit openmp_executor(int threads = 0) noexcept : threads_(threads) {}

  // The team size asked for (0 = OpenMP's default). Kept with or without OpenMP, so the class
  // has one layout whatever the flags of the file that includes it.
  int requested_threads() const noexcept { return threads_; }

  std::int64_t concurrency() const noexcept override {
#ifdef _OPENMP
    return requested_threads() > 0 ? requested_threads() : omp_get_max_threads();
#else
    return 1;
#endif
  }

  void run(std::int64_t tasks, task_function task, void* context) noexcept override {
#ifdef _OPENMP
    const int threads = static_cast<int>(concurrency());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
#endif
    for (std::int64_t i = 0; i < tasks; ++i) task(context, i);
  }

 private:
  int threads_;
};

}  // namespace phasekv
