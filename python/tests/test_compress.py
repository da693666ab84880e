"""The write path: stream configs and parameters, the compressor and the entries it emits."""

import numpy as np
import pytest

import phasekv as pk
from conftest import csa_layer, random_chunk

P = pk.presets


def test_presets_hold_the_published_numbers():
    g = P.deepseek_geometry(4)
    assert (g.stride, g.window, g.origin, g.anchor) == (4, 8, 0, pk.AnchorMode.block_start)
    kv, ix = P.deepseek_kv_stream(4), P.deepseek_indexer_stream(4)
    assert (kv.name, kv.role, kv.channels, kv.kv_heads, kv.inputs) == (
        "csa.kv", pk.StreamRole.key_value, 512, 1, pk.InputLayout.per_branch)
    assert (ix.name, ix.role, ix.channels) == ("csa.indexer", pk.StreamRole.indexer, 128)
    assert kv.rope.channels == 64 and kv.rope.base == 160000.0
    assert P.deepseek_geometry(128) == pk.Geometry(stride=128, window=128)
    assert P.deepseek_kv_stream(128).name == "hca.kv"
    assert P.deepseek_geometry(2) == pk.Geometry(stride=2, window=4)
    assert P.nsa_compressed_geometry() == pk.Geometry(stride=16, window=32)
    c = P.deepseek_cache(4, 10, history=5)
    assert (c.page_size, c.pages, c.history, c.window.tokens, c.window.key_channels) == (64, 10, 5, 128, 512)
    r = P.deepseek_reader(4)
    assert (r.query_heads, r.indexer_stream, r.top_k, r.indexer_heads, r.sink, r.derotate_output) == (
        64, 1, 512, 64, True, True)
    assert P.deepseek_reader(128).indexer_stream is None


def test_presets_by_compress_ratio():
    """Each checkpoint compress ratio gives its layer's geometry, streams, cache and reader, the
    same configs deepseek_kind builds for it; a ratio of no compressed layer raises, naming it."""
    layers = {4: ("csa", "dsv4.csa", 8, True), 128: ("hca", "dsv4.hca", 128, False),
              2: ("v4.1.csa", "dsv4.1.csa", 4, True)}
    for ratio, (prefix, cache_name, window, indexer) in layers.items():
        kind = P.deepseek_kind(ratio)
        g = P.deepseek_geometry(ratio)
        assert g == pk.Geometry(stride=ratio, window=window) == kind.geometry
        kv = P.deepseek_kv_stream(ratio)
        assert (kv.name, kv.role, kv.channels, kv.kv_heads, kv.inputs, kv.rope.channels) == (
            prefix + ".kv", pk.StreamRole.key_value, 512, 1, pk.InputLayout.per_branch, 64)
        assert kind.streams[0].config.name == kv.name
        ix = P.deepseek_indexer_stream(ratio)
        assert (ix is not None) == indexer and len(kind.streams) == 1 + indexer
        if indexer:
            assert (ix.name, ix.role, ix.channels) == (prefix + ".indexer", pk.StreamRole.indexer, 128)
            assert kind.streams[1].config.name == ix.name
        for precision in (False, True):
            c = P.deepseek_cache(ratio, 5, 2, precision)
            assert c.name == cache_name + (".precision" if precision else "")
            assert (c.page_size, c.pages, c.history, c.window.tokens, c.window.key_channels) == (64, 5, 2, 128, 512)
            storage = [pk.StorageType.fp8_e4m3_block] + [P.deepseek_v4_indexer_storage()] * indexer
            assert c.stream_storage == (storage if precision else [])
            w = P.deepseek_window(precision)
            assert (w.precision, w.rope_channels) == (c.window.precision, c.window.rope_channels)
            r = P.deepseek_reader(ratio, precision=precision)
            assert r.name == P.deepseek_kind(ratio, precision).reader.name
            assert (r.query_heads, r.sink, r.derotate_output) == (64, True, True)
            assert (r.indexer_stream, r.top_k) == ((1, 512) if indexer else (None, 0))
            fp4 = precision and indexer
            assert r.precision == (pk.IndexerPrecision.fp4 if fp4 else pk.IndexerPrecision.f32)
    assert P.deepseek_window().precision == pk.StorageType.f32
    assert P.deepseek_window(precision=True).precision == pk.StorageType.fp8_e4m3_block
    for ratio in (0, 3, 64):
        for name, call in (("deepseek_geometry", lambda: P.deepseek_geometry(ratio)),
                           ("deepseek_kv_stream", lambda: P.deepseek_kv_stream(ratio)),
                           ("deepseek_indexer_stream", lambda: P.deepseek_indexer_stream(ratio)),
                           ("deepseek_cache", lambda: P.deepseek_cache(ratio, 4)),
                           ("deepseek_reader", lambda: P.deepseek_reader(ratio))):
            with pytest.raises(pk.ConfigError, match=rf"^{name}\(compress_ratio\) = {ratio}: is not a compressed "):
                call()


def test_hca_and_v4_1_presets_and_the_precision_caches():
    hca = P.deepseek_kv_stream(128)
    assert (hca.channels, hca.kv_heads, hca.rope.channels, hca.inputs) == (512, 1, 64, pk.InputLayout.per_branch)
    kv, ix = P.deepseek_kv_stream(2), P.deepseek_indexer_stream(2)
    assert (kv.name, kv.channels, ix.name, ix.channels) == ("v4.1.csa.kv", 512, "v4.1.csa.indexer", 128)
    r = P.deepseek_reader(2)
    assert (r.query_heads, r.indexer_stream, r.top_k) == (64, 1, 512)
    for plain, precise in ((P.deepseek_reader(4), P.deepseek_reader(4, precision=True)),
                           (r, P.deepseek_reader(2, precision=True)),
                           (P.deepseek_reader(128), P.deepseek_reader(128, precision=True))):
        assert precise.name != plain.name
        assert plain.precision == pk.IndexerPrecision.f32
        assert precise.precision == (pk.IndexerPrecision.f32 if plain.indexer_stream is None else pk.IndexerPrecision.fp4)
        assert (precise.query_heads, precise.indexer_stream, precise.top_k) == (plain.query_heads, plain.indexer_stream, plain.top_k)
    for ratio in (4, 128, 2):
        c = P.deepseek_cache(ratio, 6, history=2)
        assert (c.page_size, c.pages, c.history, c.storage, c.stream_storage) == (64, 6, 2, pk.StorageType.f32, [])
    fp8, ixs = pk.StorageType.fp8_e4m3_block, P.deepseek_v4_indexer_storage()
    assert ixs == pk.StorageType.fp4_e2m1_hadamard  # DeepSeek-V4 indexer keys
    assert P.deepseek_cache(4, 6, precision=True).stream_storage == [fp8, ixs]
    assert P.deepseek_cache(2, 6, precision=True).stream_storage == [fp8, ixs]
    assert P.deepseek_cache(128, 6, precision=True).stream_storage == [fp8]
    # An HCA layer from its presets: one 584-byte FP8 stream.
    cache = pk.PagedCache(pk.Policy.deepseek_v4, P.deepseek_geometry(128), [hca],
                          P.deepseek_cache(128, 4, precision=True))
    assert cache.shape().streams[0].storage == fp8
    seq = cache.create()
    rng = np.random.default_rng(3)
    payload = rng.standard_normal((130, 1, 1, 512), dtype=np.float32)
    logits = rng.standard_normal((130, 1, 1, 512), dtype=np.float32)
    cache.append(seq, [(payload, logits)], rng.standard_normal((130, 1, 512), dtype=np.float32))
    assert cache.read_entries(seq).shape == (1, 1, 512)


def test_stream_params_take_array_likes_and_validate():
    p = pk.StreamParams(slot_bias=[0.5] * 8, norm_weight=np.ones(4))
    assert p.slot_bias.dtype == np.float32 and p.slot_bias.shape == (8,)
    assert p.slot_profile.size == 0
    g = pk.Geometry(stride=2, window=4)
    config = pk.StreamConfig(name="s", channels=4)
    config.rope.channels = 2
    with pytest.raises(pk.ConfigError) as e:
        pk.validate_stream(pk.Policy.deepseek_v4, g, config, p)
    assert str(e.value) == "s.slot_bias.size() = 8: must be 16 (kv_heads × window × gate channels)"
    with pytest.raises(pk.ConfigError, match=r"^s.norm_weight.size\(\) = 4: must be 0: this policy has no RMSNorm$"):
        pk.validate_stream(pk.Policy.mean, g, config, pk.StreamParams(norm_weight=np.ones(4)))
    pk.validate_stream(pk.Policy.mean, g, config)


def test_mean_pooling_is_the_mean_of_each_window():
    # W = 2S, per-branch inputs: slot i of entry j reads view branch_of_slot(i) of token slot_token(j, i).
    rng = np.random.default_rng(1)
    g = pk.Geometry(stride=3, window=6)
    c = pk.Compressor(pk.Policy.mean, g, pk.StreamConfig(name="m", channels=5, kv_heads=2))
    assert (c.views, c.gate_channels, c.payload_floats_per_token, c.floats_per_entry) == (2, 0, 20, 10)
    state = c.make_state()
    payload = rng.standard_normal((20, 2, 2, 5), dtype=np.float32)
    e = c.append(state, payload, slot_weights=True)
    assert (state.tokens, state.entries, len(e)) == (20, 6, 6)
    assert np.array_equal(e.index, np.arange(6)) and np.array_equal(e.anchor, [g.anchor_position(j) for j in range(6)])
    for k, j in enumerate(e.index):
        slots = [i for i in range(6) if not g.is_padding(j, i)]
        rows = np.array([payload[g.slot_token(j, i), :, g.branch_of_slot(i), :] for i in slots], dtype=np.float64)
        assert np.allclose(e.values[k], rows.mean(axis=0), rtol=1e-6, atol=1e-6)
        expected = np.zeros(6)
        expected[slots] = 1.0 / len(slots)
        assert np.allclose(e.slot_weights[k], expected[None, :], atol=1e-7)


def test_any_chunking_emits_identical_entries():
    rng = np.random.default_rng(2)
    g = P.deepseek_geometry(4)
    c = pk.Compressor(pk.Policy.deepseek_v4, g, P.deepseek_kv_stream(4))
    payload, logits = random_chunk(rng, P.deepseek_kv_stream(4), 37, g, pk.Policy.deepseek_v4)
    whole = c.append(c.make_state(), payload, logits)
    state, parts = c.make_state(), []
    for a, b in [(0, 1), (1, 6), (6, 7), (7, 30), (30, 37)]:
        parts.append(c.append(state, payload[a:b], logits[a:b]))
    assert np.array_equal(np.concatenate([p.values for p in parts]), whole.values)
    assert np.array_equal(np.concatenate([p.index for p in parts]), whole.index)
    assert c.entries_after(state, 3) == g.completed_entries(40) - 9


def test_compressor_entries_are_the_caches_entries(rng):
    layer = csa_layer(rng)
    seq = layer.cache.create()
    g = layer.geometry
    kv = pk.Compressor(pk.Policy.deepseek_v4, g, P.deepseek_kv_stream(4))
    ix = pk.Compressor(pk.Policy.deepseek_v4, g, P.deepseek_indexer_stream(4))
    states = [kv.make_state(), ix.make_state()]
    emitted = [[], []]
    for tokens in (5, 64, 131):
        chunks = [random_chunk(rng, s, tokens, g, layer.policy) for s in layer.streams]
        layer.cache.append(seq, chunks, rng.standard_normal((tokens, 1, 512), dtype=np.float32))
        for k, c in enumerate((kv, ix)):
            emitted[k].append(c.append(states[k], *chunks[k]).values)
    for k in range(2):
        assert np.array_equal(np.concatenate(emitted[k]), layer.cache.read_entries(seq, k))


def test_entries_arrays_are_owned_without_a_copy():
    c = pk.Compressor(pk.Policy.mean, pk.Geometry(stride=2, window=2), pk.StreamConfig(channels=3))
    e = c.append(c.make_state(), np.ones((4, 1, 1, 3), dtype=np.float32), slot_weights=False)
    # The arrays wrap the vectors the C++ sink filled (a capsule owns them): no copy on the way out.
    assert type(e.values.base).__name__ == "PyCapsule" and e.values.flags.c_contiguous
    assert e.slot_weights is None and e.values.shape == (2, 1, 3)


def test_state_truncate_and_history():
    c = pk.Compressor(pk.Policy.mean, pk.Geometry(stride=2, window=4), pk.StreamConfig(name="m", channels=2))
    s = c.make_state(history=4)
    assert s.ring_rows == 8 and s.bytes > 0
    x = np.arange(40, dtype=np.float32).reshape(10, 1, 2, 2)
    first = c.append(s, x)
    assert c.can_truncate(s, 6) and not c.can_truncate(s, 11)
    c.truncate(s, 6)
    assert (s.tokens, s.entries) == (6, 3)
    again = c.append(s, x[6:])
    assert np.array_equal(again.values, first.values[3:])
    short = c.make_state()
    c.append(short, x)
    with pytest.raises(pk.InputError, match=r"^m: truncate to tokens = 2: needs the inputs of tokens from 0"):
        c.truncate(short, 2)


def test_appends_reject_bad_chunks_with_the_libraries_message():
    c = pk.Compressor(pk.Policy.deepseek_v4, P.deepseek_geometry(4), P.deepseek_kv_stream(4))
    s = c.make_state()
    payload = np.zeros((3, 1, 2, 512), dtype=np.float32)
    with pytest.raises(pk.InputError) as e:
        c.append(s, payload)  # gated: the logits are missing
    assert str(e.value) == (
        "csa.kv: chunk.logits.size() = 0: must be 3072 (tokens × kv_heads × views × gate channels)")
    with pytest.raises(ValueError, match="needs a leading token axis"):
        c.append(s, payload.reshape(-1), payload.reshape(-1))
    bad = payload.copy()
    bad[1, 0, 0, 7] = np.nan
    with pytest.raises(pk.InputError, match=r"payload\[.*\] = nan: must be finite"):
        c.append(s, bad, payload, check_finite=True)
    other = pk.Compressor(pk.Policy.mean, pk.Geometry(stride=2, window=2), pk.StreamConfig(channels=4))
    with pytest.raises(pk.InputError, match="was not made for this compressor"):
        c.append(other.make_state(), payload, payload)
    assert s.tokens == 0


def test_compressor_accessors():
    g = P.deepseek_geometry(4)
    bias = np.zeros((1, 8, 512), dtype=np.float32)
    c = pk.Compressor(pk.Policy.deepseek_v4, g, P.deepseek_kv_stream(4), pk.StreamParams(slot_bias=bias))
    assert c.policy == pk.Policy.deepseek_v4 and c.geometry == g and c.config.name == "csa.kv"
    assert c.params.slot_bias.shape == (4096,) and c.params.norm_weight.size == 0
    assert (c.views, c.gate_channels, c.logit_floats_per_token, c.floats_per_entry) == (2, 512, 1024, 512)
    assert [c.view_of_slot(i) for i in range(8)] == [1, 1, 1, 1, 0, 0, 0, 0]
    assert pk.views_per_token(pk.InputLayout.per_slot, g) == 8


def _bf16_bits(x):
    """float32 → bf16 bits (round to nearest even, as torch does) as uint16, and their exact
    float32 widening (bits << 16)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    widened = (rounded.astype(np.uint32) << 16).view(np.float32)
    return rounded, widened


def test_bf16_chunks_equal_the_float32_chunks_of_their_widening(rng):
    g = P.deepseek_geometry(4)
    c = pk.Compressor(pk.Policy.deepseek_v4, g, P.deepseek_kv_stream(4))
    payload, logits = random_chunk(rng, P.deepseek_kv_stream(4), 37, g, pk.Policy.deepseek_v4)
    (p16, p32), (l16, l32) = _bf16_bits(payload), _bf16_bits(logits)
    wide = c.append(c.make_state(), p32, l32, slot_weights=True)
    assert len(wide.index) == 9
    # Both bf16, one of each, int16 bits (torch's bf16 .view(torch.int16)), split across appends.
    for pay, log in ((p16, l16), (p16, l32), (p32, l16), (p16.view(np.int16), l16.view(np.int16))):
        e = c.append(c.make_state(), pay, log, slot_weights=True)
        assert e.values.tobytes() == wide.values.tobytes()
        assert e.slot_weights.tobytes() == wide.slot_weights.tobytes()
    state, parts = c.make_state(), []
    for k, (a, b) in enumerate([(0, 1), (1, 6), (6, 7), (7, 30), (30, 37)]):
        pay = (p16 if k % 2 == 0 else p32)[a:b]
        parts.append(c.append(state, pay, l16[a:b]).values)
    assert np.concatenate(parts).tobytes() == wide.values.tobytes()

    # Through the cache, and the errors: NaN bits with check_finite, other dtypes.
    layer = csa_layer(rng)
    a, b = layer.cache.create(), layer.cache.create()
    ix = P.deepseek_indexer_stream(4)
    ip, il = random_chunk(rng, ix, 37, g, pk.Policy.deepseek_v4)
    (ip16, ip32), (il16, il32) = _bf16_bits(ip), _bf16_bits(il)
    keys = rng.standard_normal((37, 1, 512), dtype=np.float32)
    layer.cache.append(a, [(p32, l32), (ip32, il32)], keys)
    layer.cache.append(b, [(p16, l16), (ip16, il16)], keys)
    for k in range(2):
        assert layer.cache.read_entries(a, k).tobytes() == layer.cache.read_entries(b, k).tobytes()
    nan = p16.copy()
    nan[3, 0, 1, 7] = 0x7FC0
    with pytest.raises(pk.InputError, match=r"chunk.payload_bf16\[token 3, element 519\]"):
        c.append(c.make_state(), nan, l16, check_finite=True)
    with pytest.raises(TypeError, match="uint16/int16 holding bf16 bits"):
        c.append(c.make_state(), payload.astype(np.float64), logits)
