"""Shared fixtures: small layers in both cache forms, filled with seeded random inputs.

Run with PYTHONPATH=<build>/python:<repo>/python (scripts/test-python sets it).
"""

import numpy as np
import pytest

import phasekv as pk

P = pk.presets


def random_chunk(rng, compressor_or_config, tokens, geometry, policy):
    """Inputs of one stream for `tokens` tokens: (payload, logits) with the layout the policy reads."""
    c = compressor_or_config
    views = pk.views_per_token(c.inputs, geometry)
    payload = rng.standard_normal((tokens, c.kv_heads, views, c.channels), dtype=np.float32)
    if policy == pk.Policy.mean:
        return payload
    logits = rng.standard_normal((tokens, c.kv_heads, views, c.channels), dtype=np.float32)
    return (payload, logits)


class Layer:
    """A cache, its inputs so far (to build oracles from) and a reader config for it."""

    def __init__(self, cache, streams, policy, window_channels, rng):
        self.cache, self.streams, self.policy, self.rng = cache, streams, policy, rng
        self.geometry = cache.geometry
        self.window_channels = window_channels
        self.window_keys = {}  # seq -> list of [tokens][kv_heads][channels] arrays

    def append(self, seq, tokens):
        chunks = [random_chunk(self.rng, s, tokens, self.geometry, self.policy) for s in self.streams]
        keys = self.rng.standard_normal((tokens, 1, self.window_channels), dtype=np.float32)
        self.window_keys.setdefault(seq, []).append(keys)
        return self.cache.append(seq, chunks, keys)

    def window_key_rows(self, seq):
        """The window rows the cache should hold: the inputs, FP8-rounded for an FP8 window."""
        rows = np.concatenate(self.window_keys[seq])[:, 0, :]
        w = self.cache.config.window
        return fp8_round_oracle(rows, w.rope_channels) if w.precision == pk.StorageType.fp8_e4m3_block else rows


def e4m3fn_oracle(v):
    """Round float32 values in [-448, 448] to the nearest e4m3fn value, ties to even (from the format:
    exponent bias 7, 3 mantissa bits, normals from 2^-6, subnormal step 2^-9)."""
    v = v.astype(np.float64)
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0**-6)))
    step = 2.0 ** (e - 3)
    return (np.round(v / step) * step).astype(np.float32)


def bf16_oracle(x):
    """float32 to the nearest bf16 (ties to even), as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)


def fp8_round_oracle(x, rope_channels=0):
    """DeepSeek-V4's FP8 values of rows x[..., C] (finite): per block of 64 of the first C - rope
    channels s = 2^ceil(log2(max(amax, 1e-4) / 448)), value e4m3fn(x / s) * s; the last rope
    channels rounded to bf16."""
    x = np.asarray(x, dtype=np.float32)
    quantized = x.shape[-1] - rope_channels
    out = x.copy()
    for first in range(0, quantized, 64):
        block = x[..., first : min(quantized, first + 64)]
        amax = np.maximum(np.abs(block).max(axis=-1, keepdims=True), np.float32(1e-4))
        mantissa, exponent = np.frexp(amax * np.float32(1.0 / 448.0))
        scale = np.ldexp(np.float32(1.0), np.where(mantissa == 0.5, exponent - 1, exponent)).astype(np.float32)
        out[..., first : first + block.shape[-1]] = e4m3fn_oracle(np.clip(block / scale, -448, 448)) * scale
    if rope_channels:
        out[..., quantized:] = bf16_oracle(x[..., quantized:])
    return out


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def csa_inputs(rng, rc):
    """A CSA read's inputs for reader config rc: queries, indexer queries and weights, sinks."""
    q = rng.standard_normal((rc.query_heads, 512), dtype=np.float32)
    iq = rng.standard_normal((rc.indexer_heads, 128), dtype=np.float32)
    iw = rng.random(rc.indexer_heads, dtype=np.float32) / rc.indexer_heads
    sinks = rng.standard_normal(rc.query_heads, dtype=np.float32)
    return q, iq, iw, sinks


def csa_layer(rng, pages=64, history=0, window=128, precision=False):
    """DeepSeek-V4 CSA: tied 512-channel K/V and 128-channel indexer keys, S=4, W=8; with
    precision, stored as DeepSeek-V4 does (FP8 entries, FP4 indexer keys)."""
    config = P.deepseek_cache(4, pages, history, precision=precision)
    if not precision:
        config.name = "dsv4"  # the name the error messages in test_cache.py expect
    config.window.tokens = window
    streams = [P.deepseek_kv_stream(4), P.deepseek_indexer_stream(4)]
    cache = pk.PagedCache(pk.Policy.deepseek_v4, P.deepseek_geometry(4), streams, config)
    return Layer(cache, streams, pk.Policy.deepseek_v4, 512, rng)


def mean_layer(rng, stride=4, window=4, channels=64, pages=32, history=0, raw_window=16):
    """One tied K/V stream of mean pooling, no RoPE."""
    stream = pk.StreamConfig(name="kv", channels=channels)
    config = pk.CacheConfig(name="mean", page_size=8, pages=pages, history=history)
    config.window = pk.RawWindowConfig(tokens=raw_window, kv_heads=1, key_channels=channels)
    cache = pk.PagedCache(pk.Policy.mean, pk.Geometry(stride=stride, window=window), [stream], config)
    return Layer(cache, [stream], pk.Policy.mean, channels, rng)


@pytest.fixture
def csa(rng):
    return csa_layer(rng)


@pytest.fixture
def mean(rng):
    return mean_layer(rng)
