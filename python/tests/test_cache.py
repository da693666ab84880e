"""The paged cache in both forms: sequence operations, queries and accounting."""

import numpy as np
import pytest

import phasekv as pk
from conftest import bf16_oracle, csa_layer, fp8_round_oracle, mean_layer, random_chunk

P = pk.presets


@pytest.mark.parametrize("make", [csa_layer, mean_layer], ids=["csa-two-streams", "mean-one-stream"])
def test_sequence_operations(make, rng):
    layer = make(rng, history=64)
    cache, g = layer.cache, layer.geometry
    assert cache.stream_count == len(layer.streams) and cache.policy == layer.policy
    a = cache.create()
    assert cache.tokens(a) == 0 and a in cache and cache.contains(a) and cache.sequences == 1
    emitted = layer.append(a, 50)
    assert emitted == g.completed_entries(50) and cache.tokens(a) == 50
    for k in range(cache.stream_count):
        assert cache.entries(a, k) == emitted
    before = [cache.read_entries(a, k) for k in range(cache.stream_count)]

    b = cache.fork(a)  # shares every page
    assert cache.live_sequences() == [a, b] and cache.memory(b).shared_pages == cache.memory(b).pages
    assert np.array_equal(cache.page_table(a, 0), cache.page_table(b, 0))
    layer.append(b, 30)  # copy on write: a is unchanged
    for k in range(cache.stream_count):
        assert np.array_equal(cache.read_entries(a, k), before[k])
        assert np.array_equal(cache.read_entries(b, k)[: before[k].shape[0]], before[k])

    cache.remove_suffix(b, 50)
    assert cache.tokens(b) == 50 and cache.can_remove_suffix(b, 20) and not cache.can_remove_suffix(b, 51)
    for k in range(cache.stream_count):
        assert np.array_equal(cache.read_entries(b, k), before[k])

    c = cache.create()
    layer.append(c, 9)
    cache.copy(a, c)  # seq_cp: c becomes a fork of a
    assert cache.tokens(c) == 50 and np.array_equal(cache.read_entries(c, 0), before[0])
    entry = cache.read_entry(c, 0, 3)
    assert entry.shape == (layer.streams[0].kv_heads, layer.streams[0].channels)
    assert np.array_equal(entry, before[0][3])

    cache.keep(c)
    assert cache.live_sequences() == [c]
    cache.free(c)
    assert cache.sequences == 0 and cache.pool_usage(0)["used_pages"] == 0
    d = cache.create()
    cache.clear()
    assert d not in cache


def test_window_rows_and_memory(rng):
    layer = mean_layer(rng, raw_window=16, history=0)
    cache = layer.cache
    seq = cache.create()
    layer.append(seq, 40)
    keys = layer.window_key_rows(seq)
    assert cache.window_first(seq) == 24 and cache.window_rows == 16 and cache.tied_window
    for t in (24, 31, 39):
        assert np.array_equal(cache.window_key(seq, t)[0], keys[t])
        assert np.array_equal(cache.window_value(seq, t)[0], keys[t])
    with pytest.raises(pk.InputError, match=r"^mean: window token = 23: must lie in the raw window \[24, 40\)$"):
        cache.window_key(seq, 23)
    m = cache.memory(seq)
    assert (m.tokens, m.entries, m.pages) == (40, 10, 2)
    assert m.entry_bytes == 10 * 64 * 4 and m.uncompressed_bytes == 40 * 64 * 4
    assert m.compression_ratio() == 4.0 and m.state_bytes > 0
    usage = cache.pool_usage(0)
    assert usage["used_pages"] == 2 and usage["capacity"] == 32 and cache.pages_held(0) == 2


def test_read_entry_into_a_preallocated_array(csa):
    seq = csa.cache.create()
    csa.append(seq, 40)
    out = np.empty((1, 128), dtype=np.float32)
    got = csa.cache.read_entry(seq, 1, 5, out=out)
    assert got is out and np.array_equal(out, csa.cache.read_entries(seq, 1)[5])
    with pytest.raises(pk.InputError, match=r"^out: shape \(64,\), expected \(kv_heads=1, channels=128\)$"):
        csa.cache.read_entry(seq, 1, 5, out=np.empty(64, dtype=np.float32))


def test_cache_errors_name_the_field(csa):
    cache = csa.cache
    seq = cache.create()
    with pytest.raises(pk.InputError, match=r"^dsv4.tokens\(sequence\) = 12345: is not a live sequence of this cache: an id "
                                             r"of another cache or model, or not one the library made$"):
        cache.tokens(12345)
    # A freed id says whose it was: the cache's tag in the top bits, its sequence number below.
    gone = cache.create()
    cache.free(gone)
    with pytest.raises(pk.InputError, match=rf"^dsv4.tokens\(sequence\) = {gone}: is not a live sequence of this cache: its "
                                             rf"sequence #{gone % 2**40}, freed \(or dropped by keep/clear\) since$"):
        cache.tokens(gone)
    with pytest.raises(pk.InputError, match=r"^append: len\(chunks\) = 1: must be the layer's stream count, 2"):
        cache.append(seq, [np.zeros((1, 1, 2, 512), dtype=np.float32)])
    with pytest.raises(pk.InputError, match=r"^dsv4.append: window_keys.size\(\) = 0: must be 512"):
        chunks = [random_chunk(csa.rng, s, 1, csa.geometry, csa.policy) for s in csa.streams]
        cache.append(seq, chunks)
    assert cache.tokens(seq) == 0  # nothing half-applied
    with pytest.raises(pk.InputError, match=r"^dsv4.remove_suffix\(p0\) = 5: must lie in \[0, tokens = 0\]$"):
        cache.remove_suffix(seq, 5)
    with pytest.raises(pk.InputError, match=r"^dsv4.copy\(destination\) = \d+: must differ from source$"):
        cache.copy(seq, seq)
    with pytest.raises(pk.InputError, match=r"^dsv4.read_entry\(entry\) = 0: must lie in \[0, entries = 0\)$"):
        cache.read_entry(seq, 0, 0)
    with pytest.raises(pk.ConfigError, match=r"^streams.size\(\) = 4: must be 1 \(a K/V layer\), 2 .* or 3"):
        pk.PagedCache(pk.Policy.mean, pk.Geometry(), [pk.StreamConfig(channels=1)] * 4, pk.CacheConfig())


def test_a_full_pool_is_a_capacity_error_and_changes_nothing(rng):
    layer = mean_layer(rng, pages=2)  # 8 entries a page: 16 entries, 64 tokens
    seq = layer.cache.create()
    layer.append(seq, 60)
    with pytest.raises(pk.CapacityError) as e:
        layer.append(seq, 8)
    assert isinstance(e.value, pk.Error) and not isinstance(e.value, ValueError)
    assert str(e.value).startswith("mean.pool[0]")
    assert layer.cache.tokens(seq) == 60 and layer.cache.entries(seq, 0) == 15


def test_bf16_stream_storage_is_read_back_rounded(rng):
    stream = pk.StreamConfig(name="kv", channels=16)
    config = pk.CacheConfig(name="b", page_size=4, pages=8, storage=pk.StorageType.bf16)
    assert config.stream_storage == []
    cache = pk.PagedCache(pk.Policy.mean, pk.Geometry(stride=1, window=1), [stream], config)
    seq = cache.create()
    x = rng.standard_normal((5, 1, 1, 16), dtype=np.float32)
    cache.append(seq, [x])
    assert np.array_equal(cache.read_entries(seq), bf16_oracle(x.reshape(5, 1, 16)))
    assert cache.shape().streams[0].storage == pk.StorageType.bf16


def test_fp8_stream_storage_is_read_back_block_quantized(rng):
    # DeepSeek-V4's FP8 entries: per block of 64 channels s = 2^ceil(log2(amax / 448)), values
    # e4m3fn(x / s) * s. No RoPE policy here, so no channel stays bf16.
    stream = pk.StreamConfig(name="kv", channels=128)
    config = pk.CacheConfig(name="q", page_size=4, pages=8, storage=pk.StorageType.fp8_e4m3_block)
    cache = pk.PagedCache(pk.Policy.mean, pk.Geometry(stride=1, window=1), [stream], config)
    assert cache.shape().streams[0].storage == pk.StorageType.fp8_e4m3_block
    seq = cache.create()
    x = rng.standard_normal((6, 1, 1, 128), dtype=np.float32) * np.float32(3.0)
    x[1, 0, 0, :64] *= np.float32(1e-7)  # a block below the 1e-4 amax floor
    cache.append(seq, [x])
    expected = fp8_round_oracle(x.reshape(6, 1, 128))
    assert np.array_equal(cache.read_entries(seq), expected)


def test_every_class_shows_what_it_holds(csa):
    seq = csa.cache.create()
    csa.append(seq, 40)
    text = repr(csa.cache)
    assert text.startswith("PagedCache(policy=Policy.deepseek_v4, streams=2, geometry=Geometry(stride=4, window=8,")
    assert "sequences=1, tokens=40, pages used per stream=[1/64, 1/64], page_size=64)" in text
    memory = repr(csa.cache.memory(seq))
    assert memory.startswith("SequenceMemory(tokens=40, entries=20, pages=2, ")  # both streams
    assert repr(pk.stats.wilson_interval(3, 10)) == "ProportionInterval(estimate=0.3, low=0.107791, high=0.603222)"
    bare = [f"{m.__name__}.{n}" for m in (pk, pk.stats, pk.plot, pk.probe, pk.presets) for n, v in vars(m).items()
            if isinstance(v, type) and v.__repr__ is object.__repr__]
    assert bare == []
