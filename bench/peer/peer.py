#!/usr/bin/python3
"""The PyTorch peer of phasekv's benchmarked maths, run by bench/peer/run.

Reads what peer_dump wrote (manifest.json + raw .bin arrays), recomputes every case in PyTorch the
way a PyTorch user would write it (whole-tensor ops, BLAS GEMMs, torch.topk, a sink-aware
logsumexp; no Python loop over tokens or entries — the write path loops over the W = 8 window
slots, each op covering every entry at once; at DeepSeek-V4's precision it dequantizes the
cache's stored FP8/FP4 bytes by table lookups and simulates the FP4 queries with torch ops, as
DeepSeek's reference code simulates quantization), checks the results against phasekv's, and
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
  V4 precision  (FP8 entries, FP4 indexer) outputs and every candidate's indexer score within
              1e-5 * max|phasekv|: the dequantized values are exact in fp32 and each head's
              dot product is exact in the GEMM (integers times powers of two), so only the fp32
              order of the head sum and of the attention differ.

Timing: only the step phasekv's benchmark times, on tensors already loaded (the prefill of 32768
tokens for the write cases; the decode step given the cache contents for the read cases — at V4
precision the stored bytes, so the step includes dequantizing every indexer key and the selected
entries, and transforming and quantizing the indexer queries, as phasekv's step does). Median
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
V4_REL_TOL = 1e-5     # V4 precision: scores (every candidate's) and output, relative to max |phasekv|

DTYPES = {"float32": "<f4", "float64": "<f8", "int64": "<i8", "uint8": "u1"}


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
        # [n, C] and [n, Ci]: the compressed cache, contiguous (absent at V4 precision, whose
        # subclass reads the stored bytes instead)
        self.kv = case.arrays.get("kv_entries")
        self.index_keys = case.arrays.get("indexer_entries")
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
        n, channels = p["candidates"], p["kv_heads"] * p["channels"]
        self.k = min(p["top_k"], n)
        self.scale = p["scale"]
        self.inv_freq = rope_inv_freq(p)
        self.position = torch.tensor([p["position"]])
        hi = self.index_w.shape[0]
        self.head_scores = torch.empty((n, hi))
        self.scores_buf = torch.empty(n)
        self.top = (torch.empty(self.k), torch.empty(self.k, dtype=torch.int64))
        self.keys = torch.empty((self.k + self.window.shape[0], channels))
        self.logits = torch.empty((self.q.shape[0], self.keys.shape[0]))
        self.out = torch.empty((self.q.shape[0], channels))

    def scores(self):
        # I_j = sum_h w_h relu(q_h . k_j): one [n, Ci] x [Ci, Hi] GEMM, ReLU in place, a GEMV.
        torch.mm(self.index_keys, self.index_q_t, out=self.head_scores).relu_()
        return torch.mv(self.head_scores, self.index_w, out=self.scores_buf)

    def select(self):
        return torch.topk(self.scores(), self.k, sorted=False, out=self.top)[1]

    def exact_scores(self):
        """The indexer scores in float64, for the near-tie allowance of the selection check."""
        return torch.relu(self.index_keys.double() @ self.index_q_t.double()) @ self.index_w.double()

    def gather(self, selected, rows):
        """rows <- the selected entries as fp32 rows."""
        torch.index_select(self.kv, 0, selected, out=rows)

    def attend(self, selected):
        keys = self.keys  # [selected entries; window rows]: tied K/V, so also the values
        self.gather(selected, keys[: len(selected)])
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


# ---- DeepSeek-V4 precision: the stored formats, as torch ops ---------------------------------------

def e4m3fn_values():
    """[256] fp32: the value of each e4m3fn byte (OCP FP8 E4M3, "fn": finite, no infinities):
    sign, 4 exponent bits e with bias 7, 3 mantissa bits m; (8 + m)·2^(e − 10) for e ≥ 1,
    m·2^−9 for e = 0, NaN for S.1111.111. This torch has no torch.float8_e4m3fn (1.13; later
    ones do), so a table indexed by the code plays the part of .view(float8_e4m3fn).float()."""
    code = torch.arange(256, dtype=torch.int64)
    e, m = ((code >> 3) & 0xF).double(), (code & 0x7).double()
    value = torch.where(e == 0, m * 2.0 ** -9, (8.0 + m) * torch.pow(2.0, e - 10.0))  # exact in float64
    value = torch.where(code >= 0x80, -value, value)
    value[(code & 0x7F) == 0x7F] = math.nan
    return value.float()  # every value is exact in fp32


def ue8m0_values():
    """[256] fp32: 2^(b − 127) for each UE8M0 scale byte b (b = 0 gives the fp32 subnormal
    2^−127), NaN for 0xFF."""
    value = torch.pow(2.0, torch.arange(256, dtype=torch.float64) - 127.0)
    value[0xFF] = math.nan
    return value.float()


def e2m1_byte_values():
    """[256] complex64: the two e2m1 values of one byte of FP4 codes as (real, imaginary) —
    channel 2i in the low nibble, channel 2i + 1 in the high one (format/fp4.hpp, the order of
    torch.float4_e2m1fn_x2 in later torches). Codes 0–7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes
    8–15 their negatives. A complex element holds the pair so that one lookup per byte writes both
    channels, and view_as_real of the result is the channels in order: a row lookup in a [256, 2]
    fp32 table (index_select, embedding) took 4.3 ms for the 128K step's 2M bytes, this 0.9 ms."""
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    nibble = torch.tensor(grid + [-v for v in grid])
    byte = torch.arange(256)
    return torch.view_as_complex(torch.stack([nibble[byte & 0xF], nibble[byte >> 4]], dim=1).contiguous())


E4M3FN, UE8M0, E2M1_BYTE = e4m3fn_values(), ue8m0_values(), e2m1_byte_values()


def hadamard_scale(n):
    """The float64 nearest n^−1/2 for n = 2^m: 2^−m/2, or sqrt(0.5)·2^−(m−1)/2 for odd m (sqrt is
    correctly rounded; 1 / math.sqrt(128) is one ulp below the nearest)."""
    m = n.bit_length() - 1
    return math.ldexp(math.sqrt(0.5) if m % 2 else 1.0, -(m // 2))


def sylvester_hadamard(n):
    """Sylvester's Hadamard matrix H_n in float64: H_1 = [1], H_2m = [[H_m, H_m], [H_m, −H_m]]."""
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


def fp4_simulate(y, block):
    """DeepSeek-V4's FP4 quantization of y [..., C] in blocks of `block` channels, returned
    dequantized (q·s, exact in fp32), as a quantize-dequantize simulation computes it:

      amax = max(max |y|, 6·2^−126),  s = 2^k,  k = ceil(log2(amax / 6)),
      q = e2m1(clamp(y / s, −6, 6)), round to nearest, ties to even."""
    b = y.reshape(*y.shape[:-1], y.shape[-1] // block, block)
    amax = b.abs().amax(dim=-1, keepdim=True).clamp_(min=6.0 * 2.0 ** -126)
    # k from frexp: amax / 6 (in fp32, as format/fp4.hpp says DeepSeek evaluates it) = f·2^e with f in [0.5, 1), so
    # ceil(log2) is e, or e − 1 when f = 0.5 (a power of two). torch.log2 would round a quotient a
    # few ulps above 2^k down to k; frexp reads k off exactly. s comes from the UE8M0 table,
    # the stored byte k + 127, exactly.
    fraction, exponent = torch.frexp(amax / 6.0)
    s = UE8M0[(exponent - (fraction == 0.5).int() + 127).long()]
    v = b / s  # exact: s is a power of two (and |v| ≤ 6 since amax ≤ 6·s)
    a = v.abs().clamp_(max=6.0)
    # The e2m1 grid is spaced 0.5 below 2, 1 in [2, 4) and 2 in [4, 6]; in each range the points
    # with an even mantissa bit are the even multiples of the spacing. So torch.round (half to
    # even) of a / spacing rounds to nearest with ties to the even code: 0.25 → 0, 0.75 → 1,
    # 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4; a value that rounds up into the next range
    # lands on that range's first point, which it shares.
    spacing = torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))
    q = torch.round(a / spacing).mul_(spacing).copysign_(v)
    return (q * s).reshape(y.shape)


class SparseDecodeV4(SparseDecode):
    """The decode step at DeepSeek-V4's precision, from the cache's stored bytes.

    K/V entries (fp8_e4m3_block, 584 bytes): e4m3fn codes of the first N = 448 channels with a
    UE8M0 scale per 64, the 64 RoPE channels in bf16; the selected entries are dequantized per
    step (code value · scale, bf16 widened), exact in fp32. Indexer keys (fp4_e2m1_hadamard, 68
    bytes): e2m1 codes of the Hadamard-transformed key with a UE8M0 scale per 32, dequantized per
    step. Indexer queries: y = 128^−1/2 · H_128 · q (a GEMM by ±1 in float64 — its sums of these
    fp32 inputs are exact — times the float64 nearest 128^−1/2, rounded to fp32: the value
    phasekv's float64 butterflies give, format/fp4.hpp), then fp4_simulate. Then the scores as in fp32:
    I_j = Σ_h w_h ReLU(q̂_h · k̂_j), one fp32 GEMM of the dequantized values, in which every
    product and partial sum is exact (integers times powers of two), so each q̂_h · k̂_j is
    exact and only the head sum's fp32 order differs from phasekv's."""

    def __init__(self, case):
        super().__init__(case)  # the fp32 case's buffers, window, queries, sinks, RoPE
        p = self.p
        if p.get("kv_storage") != "fp8_e4m3_block" or p.get("indexer_storage") != "fp4_e2m1_hadamard":
            raise SystemExit(f"peer: {case.name}: expects fp8_e4m3_block entries and fp4_e2m1_hadamard keys")
        self.kv_bytes = case["kv_entry_bytes"]         # [n, 584] uint8, the stored entries
        self.ix_bytes = case["indexer_entry_bytes"]    # [n, 68] uint8, the stored indexer keys
        self.n_q, self.rope_at = p["fp8_quantized_channels"], p["fp8_rope_offset"]
        self.fp8_scale_at, self.fp8_blocks = p["fp8_scale_offset"], p["fp8_blocks"]
        self.fp8_block = p["fp8_block_channels"]
        if self.n_q != self.fp8_blocks * self.fp8_block:
            raise SystemExit("peer: the FP8 case is written for whole blocks of codes")
        self.fp4_scale_at, self.fp4_block = p["fp4_scale_offset"], p["fp4_block_channels"]
        n, ci = self.kv_bytes.shape[0], p["indexer_channels"]
        self.index_q = case["indexer_queries"]         # [Hi, Ci] fp32, as the host hands them over
        # The transform's ±1 matrix as a buffer, made once; its scale is applied after the sums.
        self.hadamard, self.hadamard_scale = sylvester_hadamard(ci), hadamard_scale(ci)
        # Per-step buffers (see the module docstring): code indices, dequantized keys, scales.
        self.ix_codes = torch.empty((n, self.fp4_scale_at), dtype=torch.int64)
        self.ix_scale_codes = torch.empty((n, ci // self.fp4_block), dtype=torch.int64)
        self.ix_keys = torch.empty((n, ci))
        self.ix_scales = torch.empty((n, ci // self.fp4_block))
        self.sel_bytes = torch.empty((self.k, self.kv_bytes.shape[1]), dtype=torch.uint8)
        self.kv_codes = torch.empty((self.k, self.n_q), dtype=torch.int64)
        self.kv_scale_codes = torch.empty((self.k, self.fp8_blocks), dtype=torch.int64)
        self.kv_values = torch.empty((self.k, self.n_q))
        self.kv_scales = torch.empty((self.k, self.fp8_blocks))
        self.index_q_hat_t = None

    def quantized_queries(self):
        """q̂ [Ci, Hi]: the indexer queries transformed and FP4-simulated, transposed for the GEMM."""
        # H is symmetric: the rows of q times H are the (H q_h)ᵀ.
        y = (self.index_q.double() @ self.hadamard).mul_(self.hadamard_scale).float()
        return fp4_simulate(y, self.fp4_block).t()

    def dequantized_keys(self):
        """k̂ [n, Ci]: every indexer key's stored codes times its block scales."""
        n, ci = self.ix_keys.shape
        self.ix_codes.copy_(self.ix_bytes[:, : self.fp4_scale_at])   # uint8 -> int64 indices
        torch.gather(E2M1_BYTE, 0, self.ix_codes.view(-1), out=torch.view_as_complex(self.ix_keys.view(-1, 2)))
        self.ix_scale_codes.copy_(self.ix_bytes[:, self.fp4_scale_at:])
        torch.index_select(UE8M0, 0, self.ix_scale_codes.view(-1), out=self.ix_scales.view(-1))
        self.ix_keys.view(n, -1, self.fp4_block).mul_(self.ix_scales[:, :, None])
        return self.ix_keys

    def scores(self):
        self.index_q_hat_t = self.quantized_queries()
        torch.mm(self.dequantized_keys(), self.index_q_hat_t, out=self.head_scores).relu_()
        return torch.mv(self.head_scores, self.index_w, out=self.scores_buf)

    def exact_scores(self):
        # The same dequantized values in float64: each dot product exact, the head sum nearly so.
        self.scores()
        return torch.relu(self.ix_keys.double() @ self.index_q_hat_t.double()) @ self.index_w.double()

    def gather(self, selected, rows):
        """rows <- the selected entries dequantized: codes · block scale, then the bf16 RoPE channels."""
        k, nq, block = len(selected), self.n_q, self.fp8_block
        raw = torch.index_select(self.kv_bytes, 0, selected, out=self.sel_bytes[:k])
        self.kv_codes[:k].copy_(raw[:, :nq])
        torch.index_select(E4M3FN, 0, self.kv_codes[:k].view(-1), out=self.kv_values[:k].view(-1))
        self.kv_scale_codes[:k].copy_(raw[:, self.fp8_scale_at: self.fp8_scale_at + self.fp8_blocks])
        torch.index_select(UE8M0, 0, self.kv_scale_codes[:k].view(-1), out=self.kv_scales[:k].view(-1))
        torch.mul(self.kv_values[:k].view(k, -1, block), self.kv_scales[:k, :, None],
                  out=rows[:, :nq].view(k, -1, block))
        rope = rows.shape[1] - nq
        rows[:, nq:].copy_(raw[:, self.rope_at: self.rope_at + 2 * rope].view(torch.bfloat16))


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
    exact = step.exact_scores()
    kth = torch.topk(exact, step.k).values[-1].item()
    allowance = TIE_TOL * max(1.0, abs(kth))
    differing = sorted(mine ^ theirs)
    far = [j for j in differing if abs(exact[j].item() - kth) > allowance]
    note = f"{len(differing) // 2} swapped near-tie(s) at the k-th score"
    if far:
        return False, f"ids {far[:8]} differ and are not near-ties of the k-th score {kth:.9g}"
    return True, note


def in_phasekv_order(head_scores, weights):
    """I_j from relu'd head scores [n, H] (H a multiple of 64) summed in the FP4 kernel's order
    (kernels/indexer_fp4.hpp): lane l of 16 accumulates fma(r_h, w_h, a_l) over heads
    h = 16g + l, then halves at distance 8, 4, 2, 1, then head blocks in order. A diagnostic, not
    the peer's maths: if the torch head scores are phasekv's bit for bit, this gives phasekv's
    scores bit for bit. Each fma is a float64 product (exact: 24 × 24 bits) and sum, then fp32 —
    the sum is exact too unless the two terms lie more than 29 binades apart."""
    r, w = head_scores.double(), weights.double()
    total = torch.zeros(r.shape[0], dtype=torch.float64)
    for block in range(0, r.shape[1], 64):
        a = torch.zeros(r.shape[0], 16, dtype=torch.float64)
        for g in range(block, block + 64, 16):
            a = (r[:, g: g + 16] * w[g: g + 16] + a).float().double()
        for width in (8, 4, 2, 1):
            a = (a[:, :width] + a[:, width: 2 * width]).float().double()
        total = (total + a[:, 0]).float().double()
    return total.float()


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
            scores = step.scores()
            result["score_rel_error"] = relative_error(scores[case["selected"]], case["selected_scores"])
            if "indexer_scores" in case.arrays:
                # V4 precision: every candidate's score, and the tighter tolerance on scores and
                # output (the dequantized values are exact, so only fp32 summation orders differ).
                result["score_rel_error"] = relative_error(scores, case["indexer_scores"])
                same_bits = (in_phasekv_order(step.head_scores, step.index_w) == case["indexer_scores"])
                result["scores_bit_equal_in_phasekv_order"] = same_bits.double().mean().item()
                errors = [result["score_rel_error"], result.get("max_rel_error_on_phasekv_selection", err)]
                result["ok"] = sel_ok and max(errors) <= V4_REL_TOL
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
    suffix = {"bf16": "_bf16_indexer", "fp4": "_v4_precision"}.get(case.p.get("indexer_precision"), "")
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
        step = {"compress": Compressor, "sparse": SparseDecode, "dense": DenseDecode}[case.kind]
        if case.kind == "sparse" and case.p.get("indexer_precision") == "fp4":
            step = SparseDecodeV4
        step = step(case)
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
              + (f", {result['selection']}" if "selection" in result else "")
              + (f", scores {result['score_rel_error']:.2e}" if "score_rel_error" in result else "")
              + (f", {result['scores_bit_equal_in_phasekv_order']:.1%} of the scores bit-equal in phasekv's sum order"
                 if "scores_bit_equal_in_phasekv_order" in result else "") + "), torch "
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
