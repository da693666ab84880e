"""A 128K-context DeepSeek-V4 CSA layer read from Python against the same read from C++.

Issue 14 wants a read through the Python package to cost within 5% of the same read from C++.
Both sides read the same PagedCache, sequence, inputs and output array with the same
SparseReader, in one process, so the difference is exactly the binding's: argument checks, the
GIL release, the locks, the call itself. The C++ side is _phasekv_bench.time_reads (bench/python/
bench_module.cpp), which calls reader.read(cache, seq, request, out) the way a C++ host does.

The workload is bench/decode_workload.hpp's shape: 64 query heads over one tied 512-channel K/V
head, a 64-head indexer over 128-channel keys choosing the top 512 entries, a 128-token window,
an attention sink, S = 4, W = 8, pages of 64 entries, the query at position 131071. Inputs are
uniform in [-1, 1) from a seeded generator (the numbers do not change the timing).

Timing: rounds of `--reads` Python reads then `--reads` C++ reads (the order alternating by
round, so drift cancels), each read timed alone, in wall time and in the thread's CPU time (the
machine is shared; CPU time is what the other core's load disturbs least). Reported: the median
read of each side, python / C++ for both clocks, the spread of the per-round ratios, and the
Python overhead per read in microseconds. Build, then run:

    cmake --build build/python --target _phasekv _phasekv_bench
    PYTHONPATH=build/python/python:python /usr/bin/python3 bench/python/bench_read.py
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np

import _phasekv_bench
import phasekv as pk

P = pk.presets


def build(tokens, seed):
    """The cache, filled with `tokens` tokens, and its reader; setup is not timed."""
    g = P.deepseek_v4_csa_geometry()
    config = P.deepseek_v4_cache(pages=(tokens // 4 + 63) // 64 + 1)
    streams = [P.deepseek_v4_csa_kv(), P.deepseek_v4_csa_indexer()]
    cache = pk.PagedCache(P.deepseek_v4_csa_policy, g, streams, config)
    seq = cache.create()
    rng = np.random.default_rng(seed)
    block = 4096

    def uniform(*shape):
        return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)

    # As decode_workload.hpp: one K/V block appended cyclically, fresh indexer inputs per block
    # (periodic scores would give top-k an unrealistically tie-heavy input).
    kv, kv_gates, window = uniform(block, 1, 2, 512), uniform(block, 1, 2, 512), uniform(block, 1, 512)
    for done in range(0, tokens, block):
        n = min(block, tokens - done)
        chunks = [(kv[:n], kv_gates[:n]), (uniform(n, 1, 2, 128), uniform(n, 1, 2, 128))]
        cache.append(seq, chunks, window[:n])
    reader = pk.SparseReader(cache, P.deepseek_v4_csa_reader())
    inputs = (uniform(64, 512), uniform(64, 128), rng.uniform(0, 1 / 64, size=64).astype(np.float32), uniform(64))
    return cache, seq, reader, inputs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=131072)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reads", type=int, default=10, help="reads per side and round")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()

    start = time.perf_counter()
    cache, seq, reader, (q, iq, iw, sinks) = build(args.tokens, args.seed)
    position = args.tokens - 1
    setup = time.perf_counter() - start
    out_py = np.empty((64, 512), dtype=np.float32)
    out_cpp = np.empty_like(out_py)

    def python_reads(n):
        times = []
        for _ in range(n):
            wall, cpu = time.perf_counter(), time.thread_time()
            reader.read(cache, seq, position, q, iq, iw, sinks, out=out_py)
            times.append((time.perf_counter() - wall, time.thread_time() - cpu))
        return times

    def cpp_reads(n):
        return _phasekv_bench.time_reads(reader, cache, seq, position, q, iq, iw, sinks, out_cpp, n)

    python_reads(3), cpp_reads(3)  # warm up: scratch sized, pages touched
    if not np.array_equal(out_py, out_cpp):
        sys.exit("bench_read: the Python and C++ reads differ")

    py_all, cpp_all, ratios_wall, ratios_cpu = [], [], [], []
    for r in range(args.rounds):
        first, second = (python_reads, cpp_reads) if r % 2 == 0 else (cpp_reads, python_reads)
        a, b = first(args.reads), second(args.reads)
        py, cpp = (a, b) if r % 2 == 0 else (b, a)
        py_all += py
        cpp_all += cpp
        ratios_wall.append(statistics.median(t[0] for t in py) / statistics.median(t[0] for t in cpp))
        ratios_cpu.append(statistics.median(t[1] for t in py) / statistics.median(t[1] for t in cpp))

    def median(times, k):
        return statistics.median(t[k] for t in times)

    figures = {
        "tokens": args.tokens,
        "reads_per_side": len(py_all),
        "setup_s": round(setup, 1),
        "python_ms": {"wall": median(py_all, 0) * 1e3, "cpu": median(py_all, 1) * 1e3},
        "cpp_ms": {"wall": median(cpp_all, 0) * 1e3, "cpu": median(cpp_all, 1) * 1e3},
        "python_over_cpp": {"wall": median(py_all, 0) / median(cpp_all, 0), "cpu": median(py_all, 1) / median(cpp_all, 1)},
        "round_ratio_range": {"wall": [min(ratios_wall), max(ratios_wall)], "cpu": [min(ratios_cpu), max(ratios_cpu)]},
        "overhead_us": {"wall": (median(py_all, 0) - median(cpp_all, 0)) * 1e6,
                        "cpu": (median(py_all, 1) - median(cpp_all, 1)) * 1e6},
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"DeepSeek-V4 CSA read at {args.tokens} tokens, {len(py_all)} reads a side in {args.rounds} "
          f"alternating rounds (setup {setup:.1f} s)")
    for clock in ("wall", "cpu"):
        print(f"  {clock:4}: python {figures['python_ms'][clock]:.3f} ms, C++ {figures['cpp_ms'][clock]:.3f} ms, "
              f"python / C++ {figures['python_over_cpp'][clock]:.4f} (rounds {min(figures['round_ratio_range'][clock]):.3f}"
              f"-{max(figures['round_ratio_range'][clock]):.3f}), overhead {figures['overhead_us'][clock]:+.1f} us")
    print("  target: python / C++ <= 1.05")


if __name__ == "__main__":
    main()
