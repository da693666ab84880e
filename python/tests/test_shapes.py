"""Array arguments are checked by shape, not only by size: a transposed, flattened or extra-axis
array is an InputError in shape terms, before anything is read or written."""

import re

import numpy as np
import pytest

import phasekv as pk
from conftest import csa_layer

P = pk.presets


@pytest.fixture
def world(rng):
    layer = csa_layer(rng)
    seq = layer.cache.create()
    layer.append(seq, 40)
    reader = pk.SparseReader(layer.cache, P.deepseek_reader(4))
    rc = reader.config
    inputs = dict(queries=rng.standard_normal((rc.query_heads, 512), dtype=np.float32),
                  indexer_queries=rng.standard_normal((rc.indexer_heads, 128), dtype=np.float32),
                  indexer_weights=np.full(rc.indexer_heads, 1 / 64, np.float32),
                  sinks=rng.standard_normal(rc.query_heads, dtype=np.float32))
    return layer.cache, seq, reader, inputs


def shape_error(expected):
    return pytest.raises(pk.InputError, match="^" + re.escape(expected) + "$")


def test_a_read_takes_its_arrays_in_their_documented_shapes_only(world):
    cache, seq, reader, good = world
    out = reader.read(cache, seq, 39, **good)
    assert out.shape == (64, 512)
    q = good["queries"]
    for bad, text in [(q.T.copy(), "(512, 64)"), (q.reshape(-1), "(32768,)"), (q[None], "(1, 64, 512)")]:
        with shape_error(f"queries: shape {text}, expected (query_heads=64, channels=512)"):
            reader.read(cache, seq, 39, **dict(good, queries=bad))
    with shape_error("indexer_queries: shape (128, 64), expected (indexer_heads=64, indexer_channels=128)"):
        reader.read(cache, seq, 39, **dict(good, indexer_queries=good["indexer_queries"].T.copy()))
    with shape_error("indexer_weights: shape (64, 1), expected (indexer_heads=64,)"):
        reader.read(cache, seq, 39, **dict(good, indexer_weights=good["indexer_weights"][:, None].copy()))
    with shape_error("sinks: shape (1, 64), expected (query_heads=64,)"):
        reader.read(cache, seq, 39, **dict(good, sinks=good["sinks"][None].copy()))
    # The output too: an array of the right size but the wrong shape is refused, left unwritten.
    wrong = np.full((512, 64), 7.0, np.float32)
    with shape_error("out: shape (512, 64), expected (query_heads=64, channels=512)"):
        reader.read(cache, seq, 39, **good, out=wrong)
    assert (wrong == 7.0).all()
    mine = np.empty((64, 512), np.float32)
    assert reader.read(cache, seq, 39, **good, out=mine) is mine
    np.testing.assert_array_equal(mine, out)


def test_a_batched_read_takes_stacked_arrays_of_the_documented_shape(world):
    cache, seq, reader, good = world
    stacked = {k: np.stack([v, v]) for k, v in good.items()}
    out, lse, _, _ = reader.read_batch(cache, [seq, seq], [39, 38], **stacked)
    assert out.shape == (2, 64, 512) and lse.shape == (2, 64)
    with shape_error("queries: shape (2, 512, 64), expected (len(seqs)=2, query_heads=64, channels=512)"):
        reader.read_batch(cache, [seq, seq], [39, 38], **dict(stacked, queries=stacked["queries"].transpose(0, 2, 1).copy()))
    with shape_error("queries: shape (64, 512), expected (len(seqs)=2, query_heads=64, channels=512)"):
        reader.read_batch(cache, [seq, seq], [39, 38], **dict(stacked, queries=good["queries"]))
    with shape_error("lse: shape (64, 2), expected (len(seqs)=2, query_heads=64)"):
        reader.read_batch(cache, [seq, seq], [39, 38], **stacked, lse=np.empty((64, 2), np.float32))


def test_an_append_takes_payloads_and_logits_in_the_stream_shape(rng):
    layer = csa_layer(rng)
    cache, seq = layer.cache, layer.cache.create()
    x = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
    n = 8
    kv, ix, keys = (x(n, 1, 2, 512), x(n, 1, 2, 512)), (x(n, 1, 2, 128), x(n, 1, 2, 128)), x(n, 1, 512)
    swapped = (kv[0].transpose(0, 2, 1, 3).copy(), kv[1])  # (tokens, views, kv_heads, channels)
    with shape_error("chunks[0] payload: shape (8, 2, 1, 512), expected (tokens=8, kv_heads=1, views=2, channels=512)"):
        cache.append(seq, [swapped, ix], keys)
    with shape_error("chunks[1] logits: shape (8, 2, 128), expected (tokens=8, kv_heads=1, views=2, gate_channels=128)"):
        cache.append(seq, [kv, (ix[0], ix[1][:, 0].copy())], keys)
    assert cache.tokens(seq) == 0  # nothing appended by the refused calls
    # The documented flat form (tokens, kv_heads·views·channels) is the same bytes.
    flat = [(kv[0].reshape(n, -1), kv[1].reshape(n, -1)), (ix[0].reshape(n, -1), ix[1].reshape(n, -1))]
    cache.append(seq, flat, keys)
    assert cache.tokens(seq) == n
    with shape_error("chunks[0] payload: shape (8, 512), expected (tokens=8, kv_heads·views·channels=1024)"):
        cache.append(seq, [(kv[0][:, 0, 0].copy(), kv[1].reshape(n, -1)), flat[1]], keys)
    # A compressor alone checks the same.
    comp = pk.Compressor(pk.Policy.deepseek_v4, P.deepseek_geometry(4), P.deepseek_kv_stream(4))
    state = comp.make_state()
    with shape_error("chunk payload: shape (8, 2, 1, 512), expected (tokens=8, kv_heads=1, views=2, channels=512)"):
        comp.append(state, swapped[0], kv[1])


def test_an_entry_read_into_the_callers_array_checks_its_shape(world):
    cache, seq, _, _ = world
    want = cache.read_entry(seq, 0, 3)
    assert want.shape == (1, 512)
    wrong = np.full((512, 1), 7.0, np.float32)
    with shape_error("out: shape (512, 1), expected (kv_heads=1, channels=512)"):
        cache.read_entry(seq, 0, 3, out=wrong)
    assert (wrong == 7.0).all()
    mine = np.empty((1, 512), np.float32)
    assert cache.read_entry(seq, 0, 3, out=mine) is mine
    np.testing.assert_array_equal(mine, want)


def test_host_entries_are_checked_by_shape_and_fed_all_or_nothing():
    n, window = 4, 4
    index = np.arange(n, dtype=np.int64)
    weights = np.full((n, 1, window), 0.25, np.float32)
    with shape_error("anchor: shape (3,), expected (len(index)=4,)"):
        pk.Entries(index, slot_weights=weights, anchor=np.zeros(3, np.int64))
    # values and slot_weights must agree on kv_heads: each entry is a view striding through both.
    with shape_error("slot_weights: shape (4, 2, 4), expected (len(index)=4, kv_heads (of values)=1, window=4)"):
        pk.Entries(index, slot_weights=np.full((n, 2, window), 0.25, np.float32),
                   values=np.zeros((n, 1, 64), np.float32))
    # A bad entry late in the batch leaves the profile and the log as they were.
    profile, log = pk.WriteProfile(pk.Geometry(stride=4, window=window), 1), pk.SlotWeightLog(window=window)
    profile.add(pk.Entries(index[:2].copy(), slot_weights=weights[:2].copy()))
    log.add(pk.Entries(index[:2].copy(), slot_weights=weights[:2].copy()))
    before = (profile.concentration_windows(0), profile.slot_profile(0).tobytes(), log.recorded)
    bad = weights.copy()
    bad[3, 0, 1] = np.nan
    for sink in (profile, log):
        with pytest.raises(pk.InputError, match=r"entry 5 slot_weights\[head 0\]\[slot 1\] = nan"):
            sink.add(pk.Entries(index + 2, slot_weights=bad))
    assert (profile.concentration_windows(0), profile.slot_profile(0).tobytes(), log.recorded) == before
    assert not log.has(2)
    profile.add(pk.Entries(index + 2, slot_weights=weights))
    assert profile.concentration_windows(0) == before[0] + n
