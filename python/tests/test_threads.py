"""Appends and reads release the GIL: Python threads may share caches and readers safely."""

import threading

import numpy as np

import phasekv as pk
from conftest import csa_layer, random_chunk

P = pk.presets


def test_threads_share_a_cache_and_a_reader(rng):
    layer = csa_layer(rng, pages=256)
    cache = layer.cache
    seqs = [cache.create() for _ in range(3)]
    for seq in seqs:
        layer.append(seq, 700)
    rc = P.deepseek_reader(4)
    shared_reader = pk.SparseReader(cache, rc)
    q = rng.standard_normal((64, 512), dtype=np.float32)
    iq = rng.standard_normal((64, 128), dtype=np.float32)
    iw = rng.random(64, dtype=np.float32) / 64
    sinks = rng.standard_normal(64, dtype=np.float32)
    want = [shared_reader.read(cache, s, 699, q, iq, iw, sinks) for s in seqs]
    # Inputs for the writer, drawn up front (the generator is not thread-safe).
    writes = [[random_chunk(rng, s, 16, layer.geometry, layer.policy) for s in layer.streams] for _ in range(20)]
    keys = rng.standard_normal((16, 1, 512), dtype=np.float32)
    errors = []

    def reads(reader, seq, expected):
        try:
            for _ in range(10):
                assert np.array_equal(reader.read(cache, seq, 699, q, iq, iw, sinks), expected)
        except BaseException as e:  # reported below: a thread's exception is otherwise lost
            errors.append(e)

    def appends(seq):
        try:
            for chunks in writes:
                cache.append(seq, chunks, keys)
        except BaseException as e:
            errors.append(e)

    writer_seq = cache.create()
    threads = [threading.Thread(target=reads, args=(shared_reader, seqs[0], want[0])),
               threading.Thread(target=reads, args=(shared_reader, seqs[1], want[1])),
               threading.Thread(target=reads, args=(pk.SparseReader(cache, rc), seqs[2], want[2])),
               threading.Thread(target=appends, args=(writer_seq,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cache.tokens(writer_seq) == 320
