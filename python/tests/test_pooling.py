"""Poolings chosen at run time from Python: Pooling names any built-in pooling with its RoPE placement
and norm, a Policy is one of them, and a PagedCache holds one, two or three streams each of its own
pooling — computing what a ModelCache of the same layer kind computes, bit for bit."""

import numpy as np
import pytest

import phasekv as pk

R, N = pk.RopePlacement, pk.EntryNorm


def test_a_policy_is_a_pooling_and_an_unknown_id_is_a_config_error():
    assert pk.Pooling.of(pk.Policy.mean) == pk.Pooling("mean")
    assert pk.Pooling.of(pk.Policy.deepseek_v4) == pk.Pooling("vector_gates", R.after_pool, N.rms)
    assert hash(pk.Pooling("mean")) == hash(pk.Pooling.of(pk.Policy.mean))
    p = pk.Pooling("scalar_gates", rope=R.before_pool, norm=N.rms)
    assert (p.id, p.rope, p.norm) == ("scalar_gates", R.before_pool, N.rms)
    assert repr(p) == "Pooling('scalar_gates', RopePlacement.before_pool, EntryNorm.rms)"
    with pytest.raises(pk.ConfigError, match=r"^Pooling.id = 'median': is not a built-in pooling \(fixed_weights, "):
        pk.Pooling("median")
    with pytest.raises(TypeError, match=r"^policy: must be a Policy, a Pooling or a pooling id \(str\), not int$"):
        pk.Compressor(3, pk.Geometry(), pk.StreamConfig(channels=4))
    with pytest.raises(pk.ConfigError, match=r"^kv.pooling = 'median': is not a registered pooling"):
        pk.Compressor("median", pk.Geometry(), pk.StreamConfig(name="kv", channels=4))


def test_a_compressor_of_a_policy_equals_one_of_its_pooling(rng):
    g = pk.Geometry(stride=4, window=8)
    c = pk.StreamConfig(name="kv", channels=64, rope=pk.RopeConfig(channels=16))
    by_policy = pk.Compressor(pk.Policy.deepseek_v4, g, c)
    by_pooling = pk.Compressor(pk.Pooling("vector_gates", R.after_pool, N.rms), g, c)
    assert by_policy.policy == pk.Policy.deepseek_v4 and by_pooling.pooling == by_policy.pooling
    payload = rng.standard_normal((37, 1, 2, 64), dtype=np.float32)
    logits = rng.standard_normal((37, 1, 2, 64), dtype=np.float32)
    a = by_policy.append(by_policy.make_state(), payload, logits)
    b = by_pooling.append(by_pooling.make_state(), payload, logits)
    assert len(a) == 9 and a.values.tobytes() == b.values.tobytes()


def test_a_paged_cache_of_scalar_gates_stores_what_its_compressor_emits(rng):
    """scalar_gates with RoPE before pooling and RMSNorm: no Policy named it before."""
    g = pk.Geometry(stride=2, window=4)
    c = pk.StreamConfig(name="kv", channels=32, kv_heads=2, inputs=pk.InputLayout.per_slot,
                        rope=pk.RopeConfig(channels=8))
    pooling = pk.Pooling("scalar_gates", R.before_pool, N.rms)
    params = pk.StreamParams(slot_bias=rng.standard_normal(2 * 4 * 1), norm_weight=rng.random(32) + 0.5)
    config = pk.CacheConfig(name="scalar", page_size=4, pages=16, history=3)
    config.window = pk.RawWindowConfig(tokens=8, kv_heads=2, key_channels=32)
    cache = pk.PagedCache(pooling, g, [c], config, [params])
    assert cache.poolings == [pooling] and cache.policy == pooling and cache.shape().streams[0].applies_rope
    compressor = pk.Compressor(pooling, g, c, params)
    assert compressor.gate_channels == 1 and compressor.views == 4
    state = compressor.make_state()
    seq = cache.create()
    emitted = []
    for tokens in (3, 1, 9, 2, 6):
        payload = rng.standard_normal((tokens, 2, 4, 32), dtype=np.float32)
        logits = rng.standard_normal((tokens, 2, 4, 1), dtype=np.float32)
        keys = rng.standard_normal((tokens, 2, 32), dtype=np.float32)
        assert cache.append(seq, [(payload, logits)], keys) == compressor.entries_after(state, tokens)
        emitted.append(compressor.append(state, payload, logits).values)
    assert cache.read_entries(seq).tobytes() == np.concatenate(emitted).tobytes()
    cache.remove_suffix(seq, 19)
    assert cache.entries(seq) == 9


def three_stream_kind():
    """Separate K (vector gates, RoPE after pooling, RMSNorm), V (mean) and indexer keys (scalar
    gates, RMSNorm), an untied raw window, a reader selecting 4 entries through the indexer."""
    g = pk.Geometry(stride=2, window=4)
    rope = pk.RopeConfig(channels=8)
    specs = [
        pk.StreamSpec(config=pk.StreamConfig(name="k", role=pk.StreamRole.key, channels=32, rope=rope),
                      pooling="vector_gates", rope=R.after_pool, norm=N.rms),
        pk.StreamSpec(config=pk.StreamConfig(name="v", role=pk.StreamRole.value, channels=24), pooling="mean"),
        pk.StreamSpec(config=pk.StreamConfig(name="ix", role=pk.StreamRole.indexer, channels=16),
                      pooling="scalar_gates", norm=N.rms),
    ]
    reader = pk.ReaderConfig(name="kvi", query_heads=2, key_stream=0, value_stream=1, indexer_stream=2, top_k=4,
                             indexer_heads=2)
    window = pk.RawWindowConfig(tokens=6, kv_heads=1, key_channels=32, value_channels=24)
    return pk.LayerKind(name="kvi", geometry=g, streams=specs, window=window, page_size=4, reader=reader)


def test_a_three_stream_paged_cache_reads_what_a_model_cache_reads(rng):
    kind = three_stream_kind()
    params = [pk.StreamParams(slot_bias=rng.standard_normal(4 * 32), norm_weight=rng.random(32) + 0.5),
              pk.StreamParams(),
              pk.StreamParams(slot_bias=rng.standard_normal(4), norm_weight=rng.random(16) + 0.5)]
    model = pk.ModelCache(pk.ModelSpec(name="m", kinds=[kind], layers=[pk.ModelLayer(kind=0, params=params)]),
                          pk.ModelOptions(pages=64, history=4))
    config = pk.CacheConfig(name="kvi", page_size=kind.page_size, pages=64, history=4)
    config.window = kind.window
    poolings = [pk.Pooling(s.pooling, s.rope, s.norm) for s in kind.streams]
    cache = pk.PagedCache(poolings, kind.geometry, [s.config for s in kind.streams], config, params)
    assert cache.stream_count == 3 and cache.poolings == poolings
    reader = pk.SparseReader(cache, model.reader(0))
    seq, mseq = cache.create(), model.create()
    position = 0
    for tokens in (5, 1, 12, 3, 1, 8):
        chunks = []
        for k in range(3):
            payload, logits = model.stream_floats(0, k)
            chunks.append((rng.standard_normal((tokens, payload), dtype=np.float32),
                           rng.standard_normal((tokens, logits), dtype=np.float32)))
        keys = rng.standard_normal((tokens, 1, 32), dtype=np.float32)
        values = rng.standard_normal((tokens, 1, 24), dtype=np.float32)
        cache.append(seq, chunks, keys, values)
        with model.begin([mseq], tokens) as step:
            step.append(0, [(chunks, keys, values)])
            step.commit()
        position += tokens
        q = rng.standard_normal((1, 2, 32), dtype=np.float32)
        iq = rng.standard_normal((1, 2, 16), dtype=np.float32)
        iw = rng.random((1, 2), dtype=np.float32)
        want = reader.read_batch(cache, [seq], [position - 1], q, iq, iw, selected_logical=True)
        got = model.read(0, [mseq], q, iq, iw, selected_logical=True)
        assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()
        assert np.array_equal(got[2], want[2])
    assert (want[2] >= 0).all() and cache.entries(seq) == 15  # the indexer chose 4 of 15 entries
    for k in range(3):
        for j in range(cache.entries(seq)):
            assert model.read_entry(0, k, mseq, j).tobytes() == cache.read_entry(seq, k, j).tobytes()
    # The same holds after a rollback both sides take.
    cache.remove_suffix(seq, 27)
    model.remove_suffix(mseq, 27)
    q = rng.standard_normal((1, 2, 32), dtype=np.float32)
    iq = rng.standard_normal((1, 2, 16), dtype=np.float32)
    iw = rng.random((1, 2), dtype=np.float32)
    want = reader.read_batch(cache, [seq], [26], q, iq, iw)
    got = model.read(0, [mseq], q, iq, iw)
    assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()


def test_a_paged_cache_takes_one_pooling_per_stream_and_refuses_a_fourth_stream():
    g = pk.Geometry(stride=2, window=4)
    streams = [pk.StreamConfig(name="k", role=pk.StreamRole.key, channels=8),
               pk.StreamConfig(name="v", role=pk.StreamRole.value, channels=8)]
    cache = pk.PagedCache(["mean", pk.Policy.mean], g, streams, pk.CacheConfig())
    assert cache.poolings == [pk.Pooling("mean")] * 2 and cache.policy == ["mean", pk.Policy.mean]
    with pytest.raises(pk.ConfigError, match=r"^len\(policy\) = 1: must be streams.size\(\) = 2"):
        pk.PagedCache([pk.Policy.mean], g, streams, pk.CacheConfig())
    with pytest.raises(pk.ConfigError, match=r"^streams.size\(\) = 4: must be 1 \(a K/V layer\), 2 .* or 3"):
        pk.PagedCache(pk.Policy.mean, g, streams * 2, pk.CacheConfig())
