"""Entries the host pooled itself (PagedCache.append_entries) stored as the write path stores its
own, byte for byte (FP8 entries, FP4 indexer keys, FP8 window), and read alike."""

import numpy as np
import pytest

import phasekv as pk
from conftest import csa_inputs, random_chunk

P = pk.presets


def csa_cache(config):
    streams = [P.deepseek_kv_stream(4), P.deepseek_indexer_stream(4)]
    return pk.PagedCache(pk.Policy.deepseek_v4, P.deepseek_geometry(4), streams, config), streams


def test_host_entries_are_stored_as_the_write_path_stores_them(rng):
    fed, streams = csa_cache(P.deepseek_cache(4, 16, precision=True))
    host, _ = csa_cache(P.deepseek_cache(4, 16, precision=True))
    twin, _ = csa_cache(P.deepseek_cache(4, 16))  # f32 entries: what the write path pools, before storage
    a, b, t = fed.create(), host.create(), twin.create()
    g = P.deepseek_geometry(4)
    for tokens in (201, 3, 96):
        chunks = [random_chunk(rng, s, tokens, g, pk.Policy.deepseek_v4) for s in streams]
        window = rng.standard_normal((tokens, 1, 512), dtype=np.float32)
        first = twin.entries(t, 0)
        fed.append(a, chunks, window)
        twin.append(t, chunks, window)
        n = host.entries_after(b, tokens)
        assert n == twin.entries(t, 0) - first
        pooled = [twin.read_entries(t, k)[first:first + n] for k in range(2)]
        assert host.append_entries(b, tokens, pooled, window) == n
    assert fed.entries(a, 0) == host.entries(b, 0) == 75
    for k, size in ((0, 584), (1, 68)):
        for j in range(75):
            got = host.entry_bytes(b, k, j)
            assert got.dtype == np.uint8 and got.shape == (size,)
            assert np.array_equal(got, fed.entry_bytes(a, k, j))
    rc = P.deepseek_reader(4, precision=True)
    rc.top_k = 16
    q, iq, iw, sinks = csa_inputs(rng, rc)
    out_a = pk.SparseReader(fed, rc).read(fed, a, 299, q, iq, iw, sinks)
    out_b = pk.SparseReader(host, rc).read(host, b, 299, q, iq, iw, sinks)
    assert np.array_equal(out_a, out_b)
    # The compressor cannot continue it: W = 8 > S = 4 pools tokens it never saw.
    chunks = [random_chunk(rng, s, 4, g, pk.Policy.deepseek_v4) for s in streams]
    with pytest.raises(pk.InputError, match="continue with host-computed entries"):
        host.append(b, chunks, rng.standard_normal((4, 1, 512), dtype=np.float32))
    assert host.tokens(b) == 300
    # Shapes are checked by axis.
    entries = [np.zeros((1, 1, 512), np.float32), np.zeros((1, 1, 128), np.float32)]
    with pytest.raises(pk.InputError, match=r"entries\[1\]: shape \(1, 128, 1\), expected \(entries=1, kv_heads=1, channels=128\)"):
        host.append_entries(b, 4, [entries[0], np.zeros((1, 128, 1), np.float32)], np.zeros((4, 1, 512), np.float32))
    with pytest.raises(pk.InputError, match=r"len\(entries\)"):
        host.append_entries(b, 4, entries[:1], np.zeros((4, 1, 512), np.float32))
    with pytest.raises(pk.InputError, match="entry_bytes"):
        host.entry_bytes(b, 0, 75)


def test_append_batch_equals_single_appends_and_is_all_or_nothing(rng):
    batched, streams = csa_cache(P.deepseek_cache(4, 8))
    single, _ = csa_cache(P.deepseek_cache(4, 8))
    g = P.deepseek_geometry(4)
    a = [batched.create() for _ in range(3)]
    b = [single.create() for _ in range(3)]
    for step, tokens in enumerate((5, 1, 3, 1)):
        chunks = [[random_chunk(rng, s, tokens, g, pk.Policy.deepseek_v4) for s in streams] for _ in a]
        windows = [rng.standard_normal((tokens, 1, 512), dtype=np.float32) for _ in a]
        batched.append_batch(a, chunks, windows)
        for i in range(3):
            single.append(b[i], chunks[i], windows[i])
    for i in range(3):
        assert batched.tokens(a[i]) == single.tokens(b[i]) == 10
        for k in range(2):
            assert np.array_equal(batched.read_entries(a[i], k), single.read_entries(b[i], k))
    chunks = [[random_chunk(rng, s, 4, g, pk.Policy.deepseek_v4) for s in streams] for _ in a]
    windows = [rng.standard_normal((4, 1, 512), dtype=np.float32) for _ in a]
    windows[2] = windows[2][:3]
    with pytest.raises(pk.InputError, match=r"items\[2\]"):
        batched.append_batch(a, chunks, windows)
    assert [batched.tokens(s) for s in a] == [10, 10, 10]
    with pytest.raises(pk.InputError, match=r"repeats items\[0\]"):
        batched.append_batch([a[0], a[0]], chunks[:2], windows[:2])
