#!/usr/bin/python3
"""The PyTorch peer of phasekv's benchmarked maths, run by bench/peer/run.

Reads what peer_dump wrote (manifest.json + raw .bin arrays), recomputes every case in PyTorch the
way a PyTorch user would write it (whole-tensor ops, BLAS GEMMs, torch.topk, a sink-aware
logsumexp; no Python loop over tokens or entries — the write path loops over the W = 8 window
slots, each op covering every entry at once), checks the results against phasekv's, and
times each case at the requested thread counts. With --phasekv-json it also reads the Google
Benchmark JSON of the matching phasekv benchmarks and prints a side-by-side table and one
`name: value` line per ratio.

Checks (exit status 1 when one fails):
  outputs     max|torch - phasekv| <= 1e-4 * max|phasekv| over the whole output.
  selection   the same set of top-k entry ids; an id in one set only is accepted when its
              indexer score (recomputed in float64) lies within 1e-5 * max(1, |s_k|) of the k-th
              best score s_k: fp32 scores summed in different orders may swap entries whose
              scores tie or nearly tie at the boundary, and either choice is a correct top-k.
              The output is then also compared on phasekv's own selection.

Timing: only the step phasekv's benchmark times, on tensors already loaded (the prefill of 32768
tokens for the write cases; the decode step given the cache contents for the read cases). Median
of repeated runs after warm-up, wall clock (time.perf_counter), under torch.inference_mode().
Thread count n means torch.set_num_threads(n) and, because Debian's torch calls the system BLAS
without telling it how many threads to use, openblas_set_num_threads(n) as well.

Buffers: each step writes its large intermediates (indexer scores, logits, pooling windows) into
tensors allocated once, with out= and in-place ops, as a decode loop that runs every token
should. phasekv reuses its scratch the same way. With fresh tensors per step, glibc serves every
allocation of 32 MiB or more with a new mmap, and first-touch page faults, very slow on this VM,
would dominate the torch times (a 128K dense step several times slower) — timing the allocator,
not the maths.
"""

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

REL_TOL = 1e-4        # output agreement, relative to max |phasekv|
TIE_TOL = 1e-5        # near-tie allowance at the k-th indexer score

DTYPES = {"float32": "<f4", "float64": "<f8", "int64": "<i8"}


# ---- environment -------------------------------------------------------------------------------

def openblas():
    """The OpenBLAS library torch's GEMMs landed in (via libblas.so.3), or None."""
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))  # make sure the BLAS is loaded and mapped
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "openblas" in line and "/" in line})
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_set_num_threads  # noqa: B018 — raises AttributeError when absent
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib
        except (OSError, AttributeError):
            continue
    return None


BLAS = None


def set_threads(n):
    torch.set_num_threads(n)
    if BLAS is not None:
        BLAS.openblas_set_num_threads(n)


def cpu_capability():
    """The instruction set torch's own kernels dispatch to (ATEN_CPU_CAPABILITY overrides it)."""
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip()
    return "unknown"


def blas_description():
    if BLAS is None:
        return "not OpenBLAS (libblas.so.3 is another implementation)"
    return (f"OpenBLAS, core {BLAS.openblas_get_corename().decode()}, "
            f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")


# ---- loading -----------------------------------------------------------------------------------

class Case:
    def __init__(self, directory, entry):
        self.name = entry["name"]
        self.kind = entry["kind"]
        self.p = entry["params"]
        self.arrays = {}
        for key, spec in entry["arrays"].items():
            data = np.fromfile(os.path.join(directory, spec["file"]), dtype=DTYPES[spec["dtype"]])
            expected = math.prod(spec["shape"])
            if data.size != expected:
                raise SystemExit(f"peer: {spec['file']}: {data.size} elements, manifest says {expected}")
            self.arrays[key] = torch.from_numpy(data.reshape(spec["shape"]))

    def __getitem__(self, key):
        return self.arrays[key]


def load(directory):
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest.get("format") != "phasekv-peer-dump/1" or manifest.get("byte_order") != "little":
        raise SystemExit("peer: unknown dump format")
    return [Case(directory, entry) for entry in manifest["cases"]]


# ---- the maths ---------------------------------------------------------------------------------

def rope_inv_freq(p):
    """theta_k = base^(-2k/R), k < R/2, YaRN-scaled as docs/DESIGN.md §3 and core/rope.hpp
    define it."""
    r = p["rope_channels"]
    k = torch.arange(r // 2, dtype=torch.float64)
    theta = p["rope_base"] ** (-2.0 * k / r)
    if p["yarn"]:
        context = p["yarn_original_context"]

        def correction_dim(rotations):
            return r * math.log(context / (2 * math.pi * rotations)) / (2 * math.log(p["rope_base"]))

        low = max(math.floor(correction_dim(p["yarn_beta_fast"])), 0.0)
        high = min(math.ceil(correction_dim(p["yarn_beta_slow"])), r - 1.0)
        high = max(high, low)  # phasekv keeps every pair when low > high (see rope.hpp)
        if high == low:
            high += 0.001
        ramp = ((k - low) / (high - low)).clamp(0.0, 1.0)
        theta = theta / p["yarn_factor"] * ramp + theta * (1.0 - ramp)
    return theta


def rope_pairs(x, rotated, layout):
    """The (a, b) halves of the rotated pairs in the last `rotated` channels of x, as views."""
    tail = x[..., x.shape[-1] - rotated:]
    if layout == "interleaved":
        return tail[..., 0::2], tail[..., 1::2]
    return tail[..., : rotated // 2], tail[..., rotated // 2:]


def rotate_(x, cos, sin, rotated, layout):
    """In place: a' = a cos - b sin, b' = a sin + b cos on each pair (sin < 0 rotates back)."""
    a, b = rope_pairs(x, rotated, layout)
    a0 = a.clone()
    a.mul_(cos).addcmul_(b, sin, value=-1.0)
    b.mul_(cos).addcmul_(a0, sin)


def rope_table(positions, inv_freq):
    """cos/sin of position * theta_k in float32, the angles formed in float64 (as phasekv does)."""
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(angles).float(), torch.sin(angles).float()


class Compressor:
    """One stream's prefill: gated pooling over windows of W tokens every S, RMSNorm, RoPE after
    pooling at the block start (the DeepSeek-V4 CSA preset), for origin 0.

    The large intermediates live in buffers made once (see the module docstring)."""

    def __init__(self, case):
        p = case.p
        if p["origin"] != 0 or p["anchor"] != "block_start":
            raise SystemExit(f"peer: {case.name}: only origin 0 and block-start anchors are implemented")
        self.S, self.W = p["stride"], p["window"]
        self.eps = p["norm_eps"]
        self.rotated, self.layout = p["rope_channels"], p["rope_layout"]
        self.bias = case["slot_bias"].permute(1, 0, 2).contiguous()  # [W, heads, C]: per slot, added to logits
        self.norm_weight = case["norm_weight"]
        tokens, H, _, C = case["payload"].shape
        self.entries = J = tokens // self.S  # complete entries after `tokens` tokens (origin 0)
        # The RoPE table for the entries' anchors, made once as a model's freqs_cis buffer would be.
        anchors = torch.arange(J, dtype=torch.int64) * self.S
        cos, sin = rope_table(anchors, rope_inv_freq(p))
        self.cos, self.sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
        per_branch = p["inputs"] == "per_branch"
        self.view_of_slot = [(self.W - 1 - i) // self.S if per_branch else i for i in range(self.W)]
        # Per-channel softmax state over the slots, [entries, heads, C] each.
        self.m = torch.empty((J, H, C))
        self.d = torch.empty((J, H, C))
        self.e = torch.empty((J, H, C))
        self.pooled = torch.empty((J, H, C))

    def slots(self, payload, logits):
        """Per slot i: (first entry whose slot i is a real token, its payload and logit rows).

        Slot i of entry j holds token j*S - (W - S) + i (negative = padding), read in the slot's
        view, so over all entries slot i is a strided view (stride S) of the token axis: the
        windows are never copied out."""
        J, S, W = self.entries, self.S, self.W
        lead = W - S
        for i in range(W):
            first = max(0, -((i - lead) // S))
            t0 = first * S - lead + i
            rows = slice(t0, t0 + (J - first - 1) * S + 1, S)
            v = self.view_of_slot[i]
            yield i, first, payload[rows, :, v], logits[rows, :, v]

    def __call__(self, payload, logits):
        """payload/logits [tokens, heads, views, C] -> entries [entries, heads, C]."""
        m, d, e, pooled = self.m, self.d, self.e, self.pooled
        # Gate softmax over the real slots, per channel, max-subtracted, in two passes over the
        # slots: the max of s_i = logit_i + bias_i, then sum_i exp(s_i - m) and sum_i exp(s_i - m) x_i.
        # Padding slots are simply left out (entry j < first of that slot).
        m.fill_(-math.inf)
        for i, first, _, logit in self.slots(payload, logits):
            torch.maximum(m[first:], torch.add(logit, self.bias[i], out=e[first:]), out=m[first:])
        d.zero_()
        pooled.zero_()
        for i, first, x, logit in self.slots(payload, logits):
            w = torch.add(logit, self.bias[i], out=e[first:]).sub_(m[first:]).exp_()
            d[first:].add_(w)
            pooled[first:].addcmul_(w, x)
        pooled.div_(d)
        # RMSNorm over each head's channels, then RoPE on the last R channels at the anchors.
        C = pooled.shape[-1]
        rms = torch.linalg.vector_norm(pooled, dim=-1, keepdim=True).square_().div_(C).add_(self.eps).rsqrt_()
        pooled.mul_(rms).mul_(self.norm_weight)
        rotate_(pooled, self.cos, self.sin, self.rotated, self.layout)
        return pooled


class SparseDecode:
    """One decode step: lightning indexer, top-k, joint softmax over the selected entries, the raw
    window and the sink, de-rotation of the output's RoPE channels (tied K/V)."""

    def __init__(self, case):
        p = case.p
        if p["kv_heads"] != 1:
            raise SystemExit("peer: the sparse case is written for one KV head (MQA)")
        self.p = p
        self.kv = case["kv_entries"]                 # [n, C]: the compressed cache, contiguous
        self.index_keys = case["indexer_entries"]    # [n, Ci]
        self.window = case["window_rows"]            # [N_win, C], RoPE'd at their own positions
        self.q = case["queries"]                     # [Hq, C]
        index_q = case["indexer_queries"]
        if p.get("indexer_precision", "f32") == "bf16":
            # The reader's bf16 indexer: queries rounded to bf16 (to nearest even, as phasekv), keys
            # stored in bf16 (dumped as their exact fp32 values); products exact, sums in fp32.
            # torch's own bf16 GEMM would round the head scores to bf16 as well, another selection.
            index_q = index_q.to(torch.bfloat16).to(torch.float32)
        self.index_q_t = index_q.t().contiguous()  # [Ci, Hi]: one GEMM per step
        self.index_w = case["indexer_weights"]       # [Hi]
        self.sinks = case["sinks"]                   # [Hq]
        self.k = min(p["top_k"], self.kv.shape[0])
        self.scale = p["scale"]
        self.inv_freq = rope_inv_freq(p)
        self.position = torch.tensor([p["position"]])
        n, hi = self.index_keys.shape[0], self.index_w.shape[0]
        self.head_scores = torch.empty((n, hi))
        self.scores_buf = torch.empty(n)
        self.top = (torch.empty(self.k), torch.empty(self.k, dtype=torch.int64))
        self.keys = torch.empty((self.k + self.window.shape[0], self.kv.shape[1]))
        self.logits = torch.empty((self.q.shape[0], self.keys.shape[0]))
        self.out = torch.empty((self.q.shape[0], self.kv.shape[1]))

    def scores(self):
        # I_j = sum_h w_h relu(q_h . k_j): one [n, Ci] x [Ci, Hi] GEMM, ReLU in place, a GEMV.
        torch.mm(self.index_keys, self.index_q_t, out=self.head_scores).relu_()
        return torch.mv(self.head_scores, self.index_w, out=self.scores_buf)

    def select(self):
        return torch.topk(self.scores(), self.k, sorted=False, out=self.top)[1]

    def attend(self, selected):
        keys = self.keys  # [selected entries; window rows]: tied K/V, so also the values
        torch.index_select(self.kv, 0, selected, out=keys[: len(selected)])
        keys[len(selected):].copy_(self.window)
        logits = torch.mm(self.q, keys.t(), out=self.logits).mul_(self.scale)
        # Joint softmax with the sink in the denominator only, the logsumexp formed in place:
        # m = max(max_i l_i, sink), d = sum_i exp(l_i - m) + exp(sink - m), p_i = exp(l_i - m) / d.
        m = torch.maximum(logits.amax(dim=1), self.sinks)
        p = logits.sub_(m[:, None]).exp_()
        d = p.sum(dim=1).add_((self.sinks - m).exp_())
        out = torch.mm(p, keys, out=self.out).div_(d[:, None])
        if self.p["derotate_output"]:
            cos, sin = rope_table(self.position, self.inv_freq)
            rotate_(out, cos, -sin, self.p["rope_channels"], self.p["rope_layout"])
        return out

    def __call__(self):
        selected = self.select()
        return self.attend(selected), selected


class DenseDecode:
    """The dense baseline: every query head over all raw tokens (tied K/V), with the sink."""

    def __init__(self, case):
        self.kv = case["kv"][: case.p["context"]]  # a view: the shared file holds the largest context
        self.q = case["queries"] * case.p["scale"]  # the scale folded into Q once, as bench_read does
        self.sinks = case["sinks"]
        self.logits = torch.empty((self.q.shape[0], self.kv.shape[0]))
        self.out = torch.empty_like(self.q)

    def __call__(self):
        logits = torch.mm(self.q, self.kv.t(), out=self.logits)
        m = torch.maximum(logits.amax(dim=1), self.sinks)
        p = logits.sub_(m[:, None]).exp_()
        d = p.sum(dim=1).add_((self.sinks - m).exp_())
        return torch.mm(p, self.kv, out=self.out).div_(d[:, None])


# ---- checks ------------------------------------------------------------------------------------

def relative_error(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def check_selection(step, selected, reference):
    """(ok, note): the two top-k sets agree up to near-ties at the k-th score."""
    mine, theirs = set(selected.tolist()), set(reference.tolist())
    if len(mine) != len(reference) or len(theirs) != len(reference):
        return False, f"{len(mine)} torch ids, {len(theirs)} phasekv ids, expected {len(reference)}"
    if mine == theirs:
        return True, "same set"
    exact = torch.relu(step.index_keys.double() @ step.index_q_t.double()) @ step.index_w.double()
    kth = torch.topk(exact, step.k).values[-1].item()
    allowance = TIE_TOL * max(1.0, abs(kth))
    differing = sorted(mine ^ theirs)
    far = [j for j in differing if abs(exact[j].item() - kth) > allowance]
    note = f"{len(differing) // 2} swapped near-tie(s) at the k-th score"
    if far:
        return False, f"ids {far[:8]} differ and are not near-ties of the k-th score {kth:.9g}"
    return True, note


def run_checks(case, step):
    """Returns a dict with the check results for one case."""
    with torch.inference_mode():
        if case.kind == "compress":
            got = step(case["payload"], case["logits"])
            want = case["entries"]
            inv_freq_err = relative_error(rope_inv_freq(case.p), case["rope_inv_freq"])
            return {"max_rel_error": relative_error(got, want), "ok": relative_error(got, want) <= REL_TOL
                    and inv_freq_err <= 1e-12, "note": f"rope inv_freq rel err {inv_freq_err:.1e}"}
        if case.kind == "sparse":
            out, selected = step()
            want = case["output"]
            err = relative_error(out, want)
            sel_ok, note = check_selection(step, selected, case["selected"])
            result = {"max_rel_error": err, "ok": sel_ok and err <= REL_TOL, "selection": note}
            if note != "same set":
                # The maths on phasekv's selection, so a legitimate swap cannot hide a real error.
                err_same = relative_error(step.attend(case["selected"]), want)
                result["max_rel_error_on_phasekv_selection"] = err_same
                result["ok"] = sel_ok and err_same <= REL_TOL
            scores = step.scores()[case["selected"]]
            result["score_rel_error"] = relative_error(scores, case["selected_scores"])
            return result
        got = step()
        err = relative_error(got, case["output"])
        return {"max_rel_error": err, "ok": err <= REL_TOL}


# ---- timing ------------------------------------------------------------------------------------

def time_step(fn, min_time, min_runs=5, warmup=2, max_runs=2000):
    """(median wall seconds, median CPU seconds of this thread, runs) of fn(), after `warmup`
    untimed runs. The CPU time is the whole step's only at 1 thread (then torch and OpenBLAS
    compute on the calling thread); it is what bench_read's CPU-time columns measure, and drifts
    less than wall time when other processes share the cores."""
    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        wall, cpu = [], []
        while len(wall) < min_runs or (sum(wall) < min_time and len(wall) < max_runs):
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            cpu.append(time.thread_time() - c0)
            wall.append(time.perf_counter() - t0)
    return statistics.median(wall), statistics.median(cpu), len(wall)


# ---- the report --------------------------------------------------------------------------------

LABELS = {"compress": "prefill", "sparse": "decode", "dense": "dense"}


def label(case):
    if case.kind == "compress":
        tokens = case.p["tokens"]
        size = f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)
        return f"prefill_{size}_" + case.name.replace("write_csa_", "csa_")
    context = case.p["context"]
    size = f"{context // 1024}k" if context % 1024 == 0 else str(context)
    suffix = "_bf16_indexer" if case.p.get("indexer_precision") == "bf16" else ""
    return f"{LABELS[case.kind]}_{size}{suffix}"


def phasekv_times(paths, column="real_time"):
    """{benchmark name: ms} from Google Benchmark JSON files (iteration runs only); `column` is
    real_time (wall) or cpu_time (the benchmark thread's CPU time)."""
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
    times = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for b in data.get("benchmarks", []):
            if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
                continue
            times[b["name"]] = b[column] * scale[b.get("time_unit", "ns")]
    return times


def lookup(times, name):
    """A benchmark by name, also when the JSON name carries a suffix (e.g. /real_time)."""
    if not name:
        return None
    for key, value in times.items():
        if key == name or key.startswith(name + "/"):
            return value
    return None


def fmt(value, digits=3):
    return "—" if value is None else f"{value:.{digits}g}" if value < 1000 else f"{value:.0f}"


def report(results, times, cpu_times, threads):
    rows, ratios = [], []
    for r in results:
        pk1 = lookup(times, r["benchmark"])
        pk2 = lookup(times, r.get("benchmark_threads"))
        t = r["torch_ms"]
        row = [r["label"], fmt(pk1), fmt(pk2)] + [fmt(t.get(n)) for n in threads]
        for n in threads:
            # Against phasekv at the same thread count when that benchmark exists, else 1 thread.
            base = pk2 if n == 2 and pk2 is not None else pk1
            ratio = t[n] / base if base else None
            row.append(fmt(ratio, 2))
            if ratio is not None:
                suffix = "phasekv2t" if n == 2 and pk2 is not None else "phasekv"
                ratios.append((f"{r['label']}_torch{n}t_over_{suffix}", ratio))
        # The same 1-thread ratio on CPU time, which the machine's other load disturbs less.
        pk1_cpu = lookup(cpu_times, r["benchmark"])
        cpu_ratio = r["torch_cpu_ms_1t"] / pk1_cpu if pk1_cpu and "torch_cpu_ms_1t" in r else None
        row.append(fmt(cpu_ratio, 2))
        if cpu_ratio is not None:
            ratios.append((f"{r['label']}_torch1t_over_phasekv_cpu", cpu_ratio))
        if pk1 is not None and pk2 is not None:
            ratios.append((f"{r['label']}_phasekv1t_over_phasekv2t", pk1 / pk2))
        row.append(f"{r['max_rel_error']:.1e}")
        row.append(r.get("selection", ""))
        rows.append(row)
    header = (["case", "phasekv 1t ms", "phasekv 2t ms"] + [f"torch {n}t ms" for n in threads]
              + [f"torch {n}t / phasekv" for n in threads] + ["1t ratio, CPU time", "max rel err", "top-k"])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = "  ".join
    print(line(h.ljust(w) for h, w in zip(header, widths)))
    print(line("-" * w for w in widths))
    for row in rows:
        print(line(str(x).ljust(w) for x, w in zip(row, widths)))
    print("Times are medians of wall time; torch 2t / phasekv compares with phasekv at 2 threads where")
    print("bench_read has that benchmark, else at 1; the CPU-time ratio compares the benchmark thread's")
    print("CPU time with torch's at 1 thread.")
    print()
    for name, value in ratios:
        print(f"{name}: {value:.3g}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", help="the directory peer_dump wrote")
    parser.add_argument("--threads", default="1,2", help="thread counts to time (default 1,2)")
    parser.add_argument("--min-time", type=float, default=float(os.environ.get("PEER_MIN_TIME", "0.5")),
                        help="seconds of timed runs per case and thread count, at least 5 runs (PEER_MIN_TIME)")
    parser.add_argument("--phasekv-json", nargs="*", default=[], help="Google Benchmark JSON of the phasekv side")
    parser.add_argument("--json-out", help="write the peer's results here as JSON")
    args = parser.parse_args()
    threads = [int(n) for n in args.threads.split(",")]

    global BLAS
    BLAS = openblas()
    print(f"peer: torch {torch.__version__}, BLAS: {blas_description()}, ATen kernels: {cpu_capability()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}", file=sys.stderr)

    results, failed = [], False
    for case in load(args.dump):
        step = {"compress": Compressor, "sparse": SparseDecode, "dense": DenseDecode}[case.kind](case)
        set_threads(1)
        result = {"case": case.name, "label": label(case), "benchmark": case.p.get("benchmark") or None,
                  "benchmark_threads": case.p.get("benchmark_threads")}
        result.update(run_checks(case, step))
        fn = (lambda: step(case["payload"], case["logits"])) if case.kind == "compress" else step
        result["torch_ms"], result["runs"] = {}, {}
        for n in threads:
            set_threads(n)
            seconds, cpu_seconds, runs = time_step(fn, args.min_time)
            result["torch_ms"][n] = seconds * 1e3
            result["runs"][n] = runs
            if n == 1:
                result["torch_cpu_ms_1t"] = cpu_seconds * 1e3
        status = "ok" if result["ok"] else "FAILED"
        print(f"peer: {case.name}: check {status} (max rel error {result['max_rel_error']:.2e}"
              + (f", {result['selection']}" if "selection" in result else "") + "), torch "
              + ", ".join(f"{n}t {result['torch_ms'][n]:.3f} ms" for n in threads), file=sys.stderr)
        failed |= not result["ok"]
        results.append(result)
        del step

    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"torch": torch.__version__, "blas": blas_description(), "aten_kernels": cpu_capability(),
                       "results": results}, f, indent=1)
    if args.phasekv_json:
        report(results, phasekv_times(args.phasekv_json), phasekv_times(args.phasekv_json, "cpu_time"), threads)
    if failed:
        print("peer: a correctness check FAILED (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
