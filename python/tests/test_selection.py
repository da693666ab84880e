"""The selection stage alone (EntrySelector), host indices into a read, and FlashMLA's LSE convention,
against a float64 oracle and the reader's own selection."""

import numpy as np
import pytest

import phasekv as pk
from conftest import csa_inputs, csa_layer
from test_read import oracle

P = pk.presets


def oracle_scores(layer, seq, t, rc, iq, iw):
    """I_j = sum_h w_h ReLU(q_h . k_j) over the candidates, float64."""
    candidates = layer.geometry.visible_entries(t)
    ix = layer.cache.read_entries(seq, rc.indexer_stream)[:candidates, 0, :].astype(np.float64)
    return (np.maximum(iq.astype(np.float64) @ ix.T, 0.0) * iw.astype(np.float64)[:, None]).sum(0)


@pytest.mark.parametrize("precision", [False, True])
def test_selector_selects_what_the_reader_selects(rng, precision):
    layer = csa_layer(rng, precision=precision)
    seq = layer.cache.create()
    layer.append(seq, 1201)  # 300 entries
    rc = P.deepseek_reader(4, precision=True) if precision else P.deepseek_reader(4)
    rc.top_k = 64
    reader = pk.SparseReader(layer.cache, rc)
    selector = pk.EntrySelector(layer.cache, pk.selection_of(rc))
    assert selector.config.top_k == 64 and selector.config.physical_stream == rc.key_stream
    t = 1200
    q, iq, iw, sinks = csa_inputs(rng, rc)
    scores = selector.score(layer.cache, seq, t, iq, iw)
    assert scores.shape == (selector.candidates(t),) == (300,) and scores.dtype == np.float32
    if not precision:  # fp32 indexer: the oracle's scores, its sort
        np.testing.assert_allclose(scores, oracle_scores(layer, seq, t, rc, iq, iw), rtol=1e-5, atol=1e-6)
    logical, physical, top = selector.select(layer.cache, seq, t, iq, iw)
    assert logical.dtype == physical.dtype == np.int32 and logical.shape == (64,)
    assert list(logical) == sorted(range(300), key=lambda j: (-scores[j], j))[:64]
    assert np.array_equal(top, scores[logical])
    _, _, read_logical, read_physical = reader.read_batch(
        layer.cache, [seq], [t], q[None], iq[None], iw[None], sinks[None], selected_logical=True,
        selected_physical=True)
    assert np.array_equal(read_logical[0], logical) and np.array_equal(read_physical[0], physical)
    # The reader's selection handed back as host indices: the same bits.
    out = reader.read(layer.cache, seq, t, q, iq, iw, sinks)
    again = reader.read(layer.cache, seq, t, q, sinks=sinks, indices=logical)
    assert np.array_equal(out, again)
    # A smaller top_k: the ranking's prefix; more than the config's is an error.
    assert np.array_equal(selector.select(layer.cache, seq, t, iq, iw, top_k=5)[0], logical[:5])
    with pytest.raises(pk.InputError, match=r"request.top_k = 65: must lie in \[0, top_k = 64\]"):
        selector.select(layer.cache, seq, t, iq, iw, top_k=65)


def test_host_indices_read_exactly_those_entries(rng):
    layer = csa_layer(rng)
    seq = layer.cache.create()
    layer.append(seq, 800)  # 200 entries
    rc = P.deepseek_reader(4)
    rc.top_k, rc.indexer_stream, rc.indexer_heads = 16, None, 0  # every selection is the host's
    reader = pk.SparseReader(layer.cache, rc)
    t = 799
    q, _, _, sinks = csa_inputs(rng, P.deepseek_reader(4))
    chosen = rng.choice(200, size=10, replace=False).astype(np.int32)
    indices = np.full(16, -1, dtype=np.int32)
    indices[rng.choice(16, size=10, replace=False)] = chosen  # scattered among the padding
    out = reader.read(layer.cache, seq, t, q, sinks=sinks, indices=indices)
    want, *_ = oracle(layer, seq, t, rc, q, sinks=sinks, selected=list(indices[indices >= 0]))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=2e-6)
    # Batched, with a per-sequence length (FlashMLA's topk_length): the first 4 slots only.
    outs, _, logical, _ = reader.read_batch(layer.cache, [seq, seq], [t, t], np.stack([q, q]),
                                            sinks=np.stack([sinks, sinks]), top_k=[16, 4],
                                            indices=np.stack([indices, indices]), selected_logical=True)
    assert np.array_equal(outs[0], out)
    first = [j for j in indices[:4] if j >= 0]
    want4, *_ = oracle(layer, seq, t, rc, q, sinks=sinks, selected=first)
    np.testing.assert_allclose(outs[1], want4, rtol=1e-4, atol=2e-6)
    assert list(logical[1][: len(first)]) == first
    with pytest.raises(pk.InputError, match=r"request.indices\[0\] = 200: must be −1 \(padding\) or an entry id"):
        reader.read(layer.cache, seq, t, q, sinks=sinks, indices=np.array([200], dtype=np.int32))
    with pytest.raises(pk.InputError, match=r"request.indices = entry 3 twice"):
        reader.read(layer.cache, seq, t, q, sinks=sinks, indices=np.array([3, 3], dtype=np.int32))
    with pytest.raises(pk.InputError, match=r"must name the entries to read"):
        reader.read(layer.cache, seq, t, q, sinks=sinks)
    with pytest.raises(pk.InputError, match=r"indices.shape"):
        reader.read(layer.cache, seq, t, q, sinks=sinks, indices=np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(TypeError, match=r"indices"):
        reader.read(layer.cache, seq, t, q, sinks=sinks, indices=np.zeros(2, dtype=np.int64))


def test_flashmla_lse_excludes_the_sink(rng):
    layer = csa_layer(rng)
    seq = layer.cache.create()
    layer.append(seq, 400)
    rc = P.deepseek_reader(4)
    ours = pk.SparseReader(layer.cache, rc)
    rc.lse = pk.LseConvention.flashmla
    theirs = pk.SparseReader(layer.cache, rc)
    q, iq, iw, sinks = csa_inputs(rng, rc)
    a = ours.read_batch(layer.cache, [seq], [399], q[None], iq[None], iw[None], sinks[None])
    b = theirs.read_batch(layer.cache, [seq], [399], q[None], iq[None], iw[None], sinks[None])
    assert np.array_equal(a[0], b[0])  # the same output
    _, lse, *_ = oracle(layer, seq, 399, P.deepseek_reader(4), q, iq, iw, sinks)
    np.testing.assert_allclose(a[1][0], lse, rtol=1e-5)
    # FlashMLA's: ln of the keys' sum alone; ours = logaddexp(theirs, sink).
    np.testing.assert_allclose(np.logaddexp(b[1][0].astype(np.float64), sinks), lse, rtol=1e-5)


def test_physical_indices_read_what_their_logical_ids_read(rng):
    """selected_physical fed back with indices_kind=physical reads bit-identically to the logical ids;
    the same numbers taken as logical ids read other entries (the confusion the kind prevents)."""
    layer = csa_layer(rng)
    cache = layer.cache
    other = cache.create()
    layer.append(other, 300)  # another sequence first, so this one's pages do not start at 0
    parent = cache.create()
    layer.append(parent, 500)
    seq = cache.fork(parent)  # shares the parent's pages, then copies its last one on write
    layer.append(seq, 301)
    rc = P.deepseek_reader(4)
    rc.top_k = 32
    reader = pk.SparseReader(cache, rc)
    t = cache.tokens(seq) - 1
    q, iq, iw, sinks = csa_inputs(rng, rc)
    _, _, logical, physical = reader.read_batch(cache, [seq], [t], q[None], iq[None], iw[None], sinks[None],
                                                selected_logical=True, selected_physical=True)
    logical, physical = logical[0], physical[0]
    assert not np.array_equal(logical, physical)
    want = reader.read(cache, seq, t, q, sinks=sinks, indices=logical)
    got = reader.read(cache, seq, t, q, sinks=sinks, indices=physical, indices_kind=pk.IndexKind.physical)
    assert np.array_equal(got, want)
    outs, _, again, _ = reader.read_batch(cache, [seq], [t], q[None], sinks=sinks[None], indices=physical[None],
                                          indices_kind=pk.IndexKind.physical, selected_logical=True)
    assert np.array_equal(outs[0], want) and np.array_equal(again[0], logical)
    # A physical id of a page the sequence does not hold (the other sequence's first page) is refused.
    stranger = np.array([cache.page_table(other, rc.key_stream)[0] * cache.config.page_size], dtype=np.int32)
    with pytest.raises(pk.InputError, match=r"request.indices\[0\] = \d+: is a physical id of page \d+ .* not in the "
                                             r"sequence's page table"):
        reader.read(cache, seq, t, q, sinks=sinks, indices=stranger, indices_kind=pk.IndexKind.physical)
