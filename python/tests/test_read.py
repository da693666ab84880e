"""The sparse reader against a NumPy double-precision oracle; batches against single reads."""

import numpy as np
import pytest

import phasekv as pk
from conftest import csa_inputs, csa_layer, mean_layer

P = pk.presets


def rotate_back(x, position, rope):
    """Interleaved RoPE on the last rope.channels channels, rotated by -position (float64)."""
    r = rope.channels
    theta = rope.inverse_frequencies(x.shape[-1])
    angle = position * theta
    c, s = np.cos(angle), np.sin(angle)
    out = x.copy()
    a, b = x[..., -r::2], x[..., -r + 1 :: 2]
    out[..., -r::2] = a * c + b * s
    out[..., -r + 1 :: 2] = -a * s + b * c
    return out


def oracle(layer, seq, t, rc, q, iq=None, iw=None, sinks=None, selected=None):
    """Plain attention in float64 over the selected entries and the window tokens [t - N + 1, t],
    with the sink in the denominator and the output de-rotated: DESIGN of sparse_reader.hpp."""
    cache, g = layer.cache, layer.geometry
    candidates = g.visible_entries(t)
    if selected is None:
        if rc.top_k > 0:
            ix = cache.read_entries(seq, rc.indexer_stream)[:candidates, 0, :].astype(np.float64)
            scores = (np.maximum(iq.astype(np.float64) @ ix.T, 0.0) * iw.astype(np.float64)[:, None]).sum(0)
            selected = sorted(range(candidates), key=lambda j: (-scores[j], j))[: rc.top_k]
        else:
            selected = list(range(candidates))
    entries = cache.read_entries(seq, rc.key_stream)[:, 0, :].astype(np.float64)
    n_win = cache.config.window.tokens
    first = max(0, t - n_win + 1)
    keys = np.concatenate([entries[list(selected)], layer.window_key_rows(seq)[first : t + 1].astype(np.float64)])
    scale = rc.scale if rc.scale > 0 else 1.0 / np.sqrt(keys.shape[1])
    logits = scale * (q.astype(np.float64) @ keys.T)  # [heads][keys]
    top = logits.max(axis=1, keepdims=True)
    if rc.sink:
        top = np.maximum(top, sinks.astype(np.float64)[:, None])
    p = np.exp(logits - top)
    denominator = p.sum(axis=1, keepdims=True)
    if rc.sink:
        denominator += np.exp(sinks.astype(np.float64)[:, None] - top)
    out = (p @ keys) / denominator
    if rc.derotate_output:
        out = rotate_back(out, t, cache.stream_config(rc.key_stream).rope)
    lse = (top + np.log(denominator))[:, 0]
    mass = (p / denominator)
    return out, lse, list(selected), mass.mean(axis=0), first


def test_csa_read_equals_the_oracle(rng):
    layer = csa_layer(rng, history=64)
    seq = layer.cache.create()
    for tokens in (1000, 1, 1999):  # 3000 tokens: 750 entries, of which the top 512 are read
        layer.append(seq, tokens)
    rc = P.deepseek_reader(4)
    reader = pk.SparseReader(layer.cache, rc)
    for t in (2999, 2950):
        q, iq, iw, sinks = csa_inputs(rng, rc)
        trace = pk.ReadTrace()
        out = reader.read(layer.cache, seq, t, q, iq, iw, sinks, trace=trace)
        assert out.shape == (64, 512) and out.dtype == np.float32
        want, lse, selected, mass, first = oracle(layer, seq, t, rc, q, iq, iw, sinks)
        # The indexer's top 512 (rank order, ties to the lower entry) is the oracle's.
        assert trace.candidates == layer.geometry.visible_entries(t)
        assert list(trace.selected) == selected
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=2e-6)
        np.testing.assert_allclose(trace.entry_mass, mass[:512], rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(trace.window_token_mass, mass[512:], rtol=1e-4, atol=1e-7)
        assert trace.window_first == first
        assert trace.window_mass + trace.sink_mass + trace.entry_mass.sum() == pytest.approx(1.0, abs=1e-5)
        _, batch_lse, _, _ = reader.read_batch(layer.cache, [seq], [t], q[None], iq[None], iw[None], sinks[None])
        np.testing.assert_allclose(batch_lse[0], lse, rtol=1e-5)


def test_csa_precision_preset_reads_fp8_entries_with_the_fp4_indexer(rng):
    layer = csa_layer(rng, precision=True)
    seq = layer.cache.create()
    layer.append(seq, 2100)  # 525 entries, of which the FP4 indexer picks 512
    rc = P.deepseek_reader(4, precision=True)
    assert rc.precision == pk.IndexerPrecision.fp4
    with pytest.raises(pk.ConfigError, match="precision"):  # FP4 keys need the FP4 indexer
        pk.SparseReader(layer.cache, P.deepseek_reader(4))
    reader = pk.SparseReader(layer.cache, rc)
    q, iq, iw, sinks = csa_inputs(rng, rc)
    trace = pk.ReadTrace()
    out = reader.read(layer.cache, seq, 2099, q, iq, iw, sinks, trace=trace)
    assert trace.candidates == 525 and len(trace.selected) == 512
    # Attention over the FP8 entries (read back dequantized) and the window, on the FP4
    # indexer's selection, is the float64 oracle's.
    want, *_ = oracle(layer, seq, 2099, rc, q, sinks=sinks, selected=list(trace.selected))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=2e-6)
    memory = layer.cache.memory(seq)
    assert memory.entry_bytes == 525 * (584 + 68)  # 146 + 17 bytes per token at S = 4
    # The window holds the FP8 values of the rows handed over (the oracle read above used them).
    window = P.deepseek_window(precision=True)
    assert (window.precision, window.rope_channels) == (pk.StorageType.fp8_e4m3_block, 64)
    given = np.concatenate(layer.window_keys[seq])[2099, 0]
    held = layer.cache.window_key(seq, 2099)
    assert np.array_equal(held.reshape(-1), layer.window_key_rows(seq)[2099])
    assert not np.array_equal(held.reshape(-1), given)
    # ... stored as one 584-byte FP8 head: 448 e4m3fn codes times their block's UE8M0 scale, the 64
    # RoPE channels in bf16, seven scale bytes, one zero byte (decoded here from the format).
    raw = layer.cache.window_key_bytes(seq, 2099)
    assert raw.shape == (1, 584) and raw.dtype == np.uint8 and raw[0, 583] == 0
    code = np.arange(256)
    exponent, mantissa = (code >> 3) & 15, code & 7
    e4m3 = np.where(exponent == 0, mantissa * 2.0**-9, (1 + mantissa / 8) * 2.0 ** (exponent - 7.0))
    e4m3 = np.where(code & 0x80, -e4m3, e4m3)
    scales = 2.0 ** (raw[0, 576:583].astype(np.float64) - 127)
    codes = e4m3[raw[0, :448]] * np.repeat(scales, 64)
    rope = (raw[0, 448:576].copy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(np.concatenate([codes.astype(np.float32), rope]), held.reshape(-1))


def test_mean_layer_reads_every_entry_and_the_window(rng):
    layer = mean_layer(rng, raw_window=16)
    seq = layer.cache.create()
    layer.append(seq, 203)
    rc = pk.ReaderConfig(name="m.reader", query_heads=4)  # GQA: 4 query heads on 1 KV head
    assert rc.indexer_stream == pk.FROM_ROLES and rc.top_k == 0  # no selection: no indexer
    reader = pk.SparseReader(layer.cache.shape(), rc)
    q = rng.standard_normal((4, 64), dtype=np.float32)
    trace = pk.ReadTrace()
    out = reader.read(layer.cache, seq, 202, q, trace=trace)
    want, _, selected, mass, _ = oracle(layer, seq, 202, reader.config, q)  # its streams resolved from the roles
    assert list(trace.selected) == selected == list(range(50)) and trace.scores.size == 0
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=2e-6)
    np.testing.assert_allclose(trace.entry_mass, mass[:50], rtol=1e-4, atol=1e-7)


def test_read_batch_is_bit_identical_to_single_reads(rng):
    layer = csa_layer(rng, history=64)
    cache = layer.cache
    a = cache.create()
    layer.append(a, 2500)
    b = cache.fork(a)
    layer.append(b, 301)
    c = cache.create()
    layer.append(c, 97)
    rc = P.deepseek_reader(4)
    reader = pk.SparseReader(cache, rc)
    seqs, positions, top_k = [a, b, c, a], [2499, 2800, 96, 2450], [-1, 100, 0, 512]
    inputs = [csa_inputs(rng, rc) for _ in seqs]
    q, iq, iw, sinks = (np.stack(x) for x in zip(*inputs))
    traces = [pk.ReadTrace() for _ in seqs]
    out, lse, logical, physical = reader.read_batch(
        cache, seqs, positions, q, iq, iw, sinks, top_k=top_k, selected_logical=True, selected_physical=True,
        traces=traces)
    assert out.shape == (4, 64, 512) and lse.shape == (4, 64) and logical.dtype == np.int32
    for i, seq in enumerate(seqs):
        single = pk.ReadTrace()
        one = reader.read(cache, seq, positions[i], *inputs[i], top_k=top_k[i], trace=single)
        assert np.array_equal(one, out[i])  # bit for bit
        assert np.array_equal(single.selected, traces[i].selected)
        assert np.array_equal(single.entry_mass, traces[i].entry_mass)
        k = len(single.selected) if top_k[i] != 0 else 0
        assert np.array_equal(logical[i, :k], single.selected) and np.all(logical[i, k:] == -1)
        table = cache.page_table(seq, 0)
        page_size = cache.config.page_size
        expected = [table[j // page_size] * page_size + j % page_size for j in single.selected[:k]]
        assert np.array_equal(physical[i, :k], expected) and np.all(physical[i, k:] == -1)
    # A batch of one gives the same log-sum-exp as the same item inside the batch.
    _, lse1, _, _ = reader.read_batch(cache, [b], [2800], q[1:2], iq[1:2], iw[1:2], sinks[1:2], top_k=[100])
    assert np.array_equal(lse1[0], lse[1])


def test_outputs_are_written_in_place(rng, csa):
    seq = csa.cache.create()
    csa.append(seq, 600)
    rc = P.deepseek_reader(4)
    reader = pk.SparseReader(csa.cache, rc)
    q, iq, iw, sinks = csa_inputs(rng, rc)
    out = np.full((64, 512), np.nan, dtype=np.float32)
    address = out.__array_interface__["data"][0]
    got = reader.read(csa.cache, seq, 599, q, iq, iw, sinks, out=out)
    assert got is out and out.__array_interface__["data"][0] == address and np.isfinite(out).all()
    again = reader.read(csa.cache, seq, 599, q, iq, iw, sinks, out=out)  # reused, same result
    assert again is out and np.array_equal(again, reader.read(csa.cache, seq, 599, q, iq, iw, sinks))
    # Batch outputs may be views into one larger tensor.
    big = np.zeros((3, 64, 512), dtype=np.float32)
    lse = np.zeros((3, 64), dtype=np.float32)
    o, l, _, _ = reader.read_batch(csa.cache, [seq, seq], [599, 599], np.stack([q, q]), np.stack([iq, iq]),
                                   np.stack([iw, iw]), np.stack([sinks, sinks]), out=big[1:], lse=lse[:2])
    assert np.shares_memory(o, big) and np.shares_memory(l, lse)
    assert np.array_equal(big[1], out) and np.array_equal(big[2], out) and not big[0].any()
    selected = np.full((2, 512), 7, dtype=np.int32)
    _, _, s, _ = reader.read_batch(csa.cache, [seq, seq], [599, 599], np.stack([q, q]), np.stack([iq, iq]),
                                   np.stack([iw, iw]), np.stack([sinks, sinks]), top_k=[10, 512],
                                   selected_logical=selected)
    assert s is selected and np.all(selected[0, 10:] == 7)  # slots past an item's top_k are left alone


def test_arrays_that_would_need_a_copy_are_rejected(rng, csa):
    seq = csa.cache.create()
    csa.append(seq, 100)
    rc = P.deepseek_reader(4)
    reader = pk.SparseReader(csa.cache, rc)
    q, iq, iw, sinks = csa_inputs(rng, rc)
    with pytest.raises(TypeError, match=r"^queries.dtype = float64: must be float32"):
        reader.read(csa.cache, seq, 99, q.astype(np.float64), iq, iw, sinks)
    with pytest.raises(TypeError, match=r"^indexer_weights.dtype = int64: must be float32"):
        reader.read(csa.cache, seq, 99, q, iq, np.arange(3), sinks)
    with pytest.raises(TypeError, match=r"^indexer_weights: list is not an array"):  # never a silent copy
        reader.read(csa.cache, seq, 99, q, iq, [1.0, 2.0, 3.0], sinks)
    with pytest.raises(ValueError, match=r"^sinks = array of dtype float32, shape \(64,\): must be C-contiguous"):
        reader.read(csa.cache, seq, 99, q, iq, iw, np.repeat(sinks, 2)[::2])
    misaligned = np.frombuffer(bytearray(q.nbytes + 1), dtype=np.float32, count=q.size, offset=1).reshape(q.shape)
    with pytest.raises(ValueError, match="must be aligned"):
        reader.read(csa.cache, seq, 99, misaligned, iq, iw, sinks)
    with pytest.raises(TypeError, match=r"^out.dtype = float64"):
        reader.read(csa.cache, seq, 99, q, iq, iw, sinks, out=np.empty((64, 512)))
    with pytest.raises(ValueError, match="read-only"):
        frozen = np.empty((64, 512), dtype=np.float32)
        frozen.flags.writeable = False
        reader.read(csa.cache, seq, 99, q, iq, iw, sinks, out=frozen)
    with pytest.raises(pk.InputError, match=r"^out: shape \(10,\), expected \(query_heads=64, channels=512\)$"):
        reader.read(csa.cache, seq, 99, q, iq, iw, sinks, out=np.empty(10, dtype=np.float32))
    with pytest.raises(pk.InputError, match=r"^queries: shape \(1, 512\), expected \(query_heads=64, channels=512\)$"):
        reader.read(csa.cache, seq, 99, q[:1], iq, iw, sinks)
    message = r"^csa.reader: items\[1\].request.position = 100: must lie in \[0, tokens = 100\)"
    with pytest.raises(pk.InputError, match=message):
        reader.read_batch(csa.cache, [seq, seq], [99, 100], np.stack([q, q]), np.stack([iq, iq]), np.stack([iw, iw]),
                          np.stack([sinks, sinks]))
    with pytest.raises(pk.InputError,
                       match=r"^queries: shape \(1, 64, 512\), expected \(len\(seqs\)=2, query_heads=64, channels=512\)$"):
        reader.read_batch(csa.cache, [seq, seq], [99, 99], q[None], iq[None], iw[None], sinks[None])


def test_reader_accessors_and_config_errors(csa):
    rc = P.deepseek_reader(4)
    reader = pk.SparseReader(csa.cache.shape(), rc)
    assert reader.output_floats == 64 * 512 and reader.config.top_k == 512
    assert reader.shape.geometry == csa.geometry and len(reader.shape.streams) == 2
    rc.indexer_stream = None
    message = (r"^csa.reader.indexer_heads = 64: must be 0 without an indexer stream "
               r"\(the host supplies the indices\)$")
    with pytest.raises(pk.ConfigError, match=message):
        pk.SparseReader(csa.cache, rc)
    rc.indexer_stream = 7
    message = r"^csa.reader.indexer_stream = 7: must name a stream of the cache when top_k > 0, or be no_stream"
    with pytest.raises(pk.ConfigError, match=message):
        pk.SparseReader(csa.cache, rc)
    rc.indexer_stream, rc.key_stream = 1, 5
    message = r"^csa.reader.key_stream = 5: must name a stream of the cache \(it has 2\)$"
    with pytest.raises(pk.ConfigError, match=message):
        pk.SparseReader(csa.cache, rc)
