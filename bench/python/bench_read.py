"""A 128K-context DeepSeek-V4 CSA layer read from Python against the same read from C++.

The target: a read through the Python package costs within 5% of the same read from C++.
Both sides read the same PagedCache, sequence, inputs and output array with the same
SparseReader, in one process and through the same machine code, so the difference is exactly the
binding's: argument checks, the GIL release, the locks, the call itself. The C++ side is
time_reads (bench/python/bench_module.cpp), which calls reader.read(cache, seq, request, out) the
way a C++ host does, from a build of the binding that has it (_phasekv_bench).

The workload is bench/decode_workload.hpp's shape: 64 query heads over one tied 512-channel K/V
head, a 64-head indexer over 128-channel keys choosing the top 512 entries, a 128-token window,
an attention sink, S = 4, W = 8, pages of 64 entries, the query at position 131071. Inputs are
uniform in [-1, 1) from a seeded generator (the numbers do not change the timing).

Timing: rounds of `--reads` Python reads then `--reads` C++ reads (the order alternating by
round, so drift cancels), each read timed alone, in wall time and in the thread's CPU time (the
machine is shared; CPU time is what the other core's load disturbs least). Reported: the median
read of each side, python / C++ for both clocks, the spread of the per-round ratios, and the
Python overhead per read in microseconds.

On a loaded machine the 128K medians move by a few percent from run to run, more than the
binding costs. So the same comparison also runs on a short context (`--small-tokens`, 1000 reads
a side), where a read takes a fraction of a millisecond and the per-call overhead stands out;
that overhead over the 128K C++ read is the binding's cost with the noise taken out. Build, then
run:

    cmake --build build/python --target _phasekv_bench
    PYTHONPATH=build/python/python /usr/bin/python3 bench/python/bench_read.py
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np

# The binding built once more with a C++ timing hook (bench_module.cpp). It is used in place of
# the phasekv package: both register the same C++ types, so only one may be imported.
import _phasekv_bench as pk

P = pk.presets


def build(tokens, seed):
    """The cache, filled with `tokens` tokens, and its reader; setup is not timed."""
    g = P.deepseek_geometry(4)
    config = P.deepseek_cache(4, pages=(tokens // 4 + 63) // 64 + 1)
    streams = [P.deepseek_kv_stream(4), P.deepseek_indexer_stream(4)]
    cache = pk.PagedCache(pk.Policy.deepseek_v4, g, streams, config)
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
    reader = pk.SparseReader(cache, P.deepseek_reader(4))
    inputs = (uniform(64, 512), uniform(64, 128), rng.uniform(0, 1 / 64, size=64).astype(np.float32), uniform(64))
    return cache, seq, reader, inputs


def compare(cache, seq, reader, inputs, position, rounds, reads):
    """Alternating rounds of Python and C++ reads: (python times, C++ times, per-round ratios)."""
    q, iq, iw, sinks = inputs
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
        return pk.time_reads(reader, cache, seq, position, q, iq, iw, sinks, out_cpp, n)

    python_reads(3), cpp_reads(3)  # warm up: scratch sized, pages touched
    if not np.array_equal(out_py, out_cpp):
        sys.exit("bench_read: the Python and C++ reads differ")
    py_all, cpp_all, ratios = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            py, cpp = python_reads(reads), cpp_reads(reads)
        else:
            cpp, py = cpp_reads(reads), python_reads(reads)
        py_all += py
        cpp_all += cpp
        ratios.append(tuple(statistics.median(t[k] for t in py) / statistics.median(t[k] for t in cpp) for k in (0, 1)))
    return py_all, cpp_all, ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=131072)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reads", type=int, default=10, help="reads per side and round")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--small-tokens", type=int, default=512, help="context of the overhead measurement")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()

    start = time.perf_counter()
    layer = build(args.tokens, args.seed)
    setup = time.perf_counter() - start
    py_all, cpp_all, ratios = compare(*layer, args.tokens - 1, args.rounds, args.reads)
    small_py, small_cpp, _ = compare(*build(args.small_tokens, args.seed), args.small_tokens - 1, 20, 50)

    def median(times, k):
        return statistics.median(t[k] for t in times)

    clocks = {"wall": 0, "cpu": 1}
    figures = {
        "tokens": args.tokens,
        "reads_per_side": len(py_all),
        "setup_s": round(setup, 1),
        "python_ms": {c: median(py_all, k) * 1e3 for c, k in clocks.items()},
        "cpp_ms": {c: median(cpp_all, k) * 1e3 for c, k in clocks.items()},
        "python_over_cpp": {c: median(py_all, k) / median(cpp_all, k) for c, k in clocks.items()},
        "round_ratio_range": {c: [min(r[k] for r in ratios), max(r[k] for r in ratios)] for c, k in clocks.items()},
        "small_tokens": args.small_tokens,
        "overhead_us": {c: (median(small_py, k) - median(small_cpp, k)) * 1e6 for c, k in clocks.items()},
    }
    figures["overhead_of_read"] = {
        c: figures["overhead_us"][c] / (figures["cpp_ms"][c] * 1e3) for c in clocks
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"DeepSeek-V4 CSA read at {args.tokens} tokens, {len(py_all)} reads a side in {args.rounds} "
          f"alternating rounds (setup {setup:.1f} s)")
    for clock in clocks:
        low, high = figures["round_ratio_range"][clock]
        print(f"  {clock:4}: python {figures['python_ms'][clock]:.3f} ms, C++ {figures['cpp_ms'][clock]:.3f} ms, "
              f"python / C++ {figures['python_over_cpp'][clock]:.4f} (rounds {low:.3f}-{high:.3f})")
    for clock in clocks:
        print(f"  binding overhead ({clock}, {args.small_tokens}-token reads): {figures['overhead_us'][clock]:+.1f} us "
              f"per read = {100 * figures['overhead_of_read'][clock]:+.2f}% of the {args.tokens}-token C++ read")
    print("  target: python / C++ <= 1.05")


if __name__ == "__main__":
    main()
