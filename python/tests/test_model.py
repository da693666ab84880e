"""The model front door from Python (ModelCache, ModelStep) against the per-layer path: a small
DeepSeek-V4-shaped model's reads equal, bit for bit, a PagedCache and SparseReader per layer fed
the same chunks; sequences, snapshots, shape errors, closed steps and the GIL."""

import threading
import time

import numpy as np
import pytest

import phasekv as pk

P = pk.presets
WINDOW, PAGE, TOP_K = 16, 4, 8


def small_spec(page_size=PAGE):
    """presets.deepseek_v4_shaped(5) — window-only, window-only, CSA, HCA, CSA — shrunk: a 16-token
    window, small pages and a top-8 selection, so that pages fill and the indexer drops entries."""
    spec = P.deepseek_v4_shaped(5)
    kinds = spec.kinds
    for k in kinds:
        k.window.tokens = WINDOW
        k.page_size = page_size
        if k.reader.top_k > 0:
            k.reader.top_k = TOP_K
    spec.kinds = kinds
    return spec


CSA, HCA, SWA = 2, 3, 0  # layers of each kind in small_spec()


def layer_inputs(model, layer, tokens, rng):
    """One row of a layer's append: per stream (payload, logits) as (tokens, floats), window keys."""
    chunks = []
    for k in range(len(model.shape(layer).streams)):
        payload, logits = model.stream_floats(layer, k)
        chunks.append((rng.standard_normal((tokens, payload), dtype=np.float32),
                       rng.standard_normal((tokens, logits), dtype=np.float32)))
    w = model.shape(layer).window
    return (chunks, rng.standard_normal((tokens, w.kv_heads, w.key_channels), dtype=np.float32))


def step_inputs(model, tokens, rng):
    """Per layer, per row: the inputs of one step of len(tokens) rows."""
    return [[layer_inputs(model, l, n, rng) for n in tokens] for l in range(model.layers)]


def run_step(model, seqs, tokens, inputs):
    with model.begin(seqs, tokens) as step:
        for l, rows in enumerate(inputs):
            step.append(l, rows)
        step.commit()


def read_inputs(rng, rows, indexer=True):
    q = rng.standard_normal((rows, 64, 512), dtype=np.float32)
    iq = rng.standard_normal((rows, 64, 128), dtype=np.float32) if indexer else None
    iw = rng.random((rows, 64), dtype=np.float32) / 64 if indexer else None
    sinks = rng.standard_normal((rows, 64), dtype=np.float32)
    return q, iq, iw, sinks


def reference_layer(model, layer, pages=256):
    """The per-layer path for a compressed layer of the model: a PagedCache with the DeepSeek-V4
    policy, the same geometry, streams, page size and window, and a SparseReader with its config."""
    kind = model.kind_of(layer)
    config = P.deepseek_cache(kind.geometry.stride, pages)  # the stride is the compress ratio
    config.window = kind.window
    config.page_size = kind.page_size
    streams = [s.config for s in kind.streams]
    cache = pk.PagedCache(pk.Policy.deepseek_v4, kind.geometry, streams, config)
    return cache, pk.SparseReader(cache, model.reader(layer))


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


def test_a_decode_step_reads_what_the_per_layer_path_reads(rng):
    model = pk.ModelCache(small_spec(), pk.ModelOptions(pages=256))
    seqs = [model.create(), model.create()]
    prefill, decode = step_inputs(model, [300, 137], rng), step_inputs(model, [1, 1], rng)
    refs = {l: reference_layer(model, l) for l in (CSA, HCA)}
    ref_seqs = {l: [refs[l][0].create() for _ in seqs] for l in refs}
    for l, (cache, _) in refs.items():
        for inputs in (prefill, decode):
            for row, seq in enumerate(ref_seqs[l]):
                chunks, keys = inputs[l][row]
                cache.append(seq, chunks, keys)
    run_step(model, seqs, [300, 137], prefill)
    assert [model.tokens(s) for s in seqs] == [300, 137]

    with model.begin(seqs, 1) as step:
        for l, rows in enumerate(decode):
            step.append(l, rows)
        q, iq, iw, sinks = read_inputs(rng, 2)
        out, lse, sel, phys = step.read(CSA, [0, 1], q, iq, iw, sinks, selected_logical=True)
        cache, reader = refs[CSA]
        want = reader.read_batch(cache, ref_seqs[CSA], [300, 137], q, iq, iw, sinks, selected_logical=True)
        assert out.shape == (2, 64, 512) and out.dtype == np.float32 and phys is None
        assert np.array_equal(out, want[0]) and np.array_equal(lse, want[1]) and np.array_equal(sel, want[2])
        assert (sel >= 0).all()  # 75 and 34 entries: the indexer picked 8 of each

        q, _, _, sinks = read_inputs(rng, 2, indexer=False)
        out, lse, _, _ = step.read(HCA, [1, 0], q, sinks=sinks)
        cache, reader = refs[HCA]
        want = reader.read_batch(cache, ref_seqs[HCA][::-1], [137, 300], q, sinks=sinks)
        assert np.array_equal(out, want[0]) and np.array_equal(lse, want[1])
        step.commit()
    # The committed cache reads the same, and holds the same entries and window rows.
    out_after, _, _, _ = model.read(HCA, [seqs[1], seqs[0]], q, sinks=sinks)
    assert np.array_equal(out_after, out)
    assert np.array_equal(model.read_entry(CSA, 1, seqs[0], 70), refs[CSA][0].read_entry(ref_seqs[CSA][0], 1, 70))
    assert np.array_equal(model.copy_window_key(HCA, seqs[1], 137), refs[HCA][0].window_key(ref_seqs[HCA][1], 137))


def test_sequences_fork_share_pages_and_unknown_ids_raise(rng):
    model = pk.ModelCache(small_spec(), pk.ModelOptions(pages=64, history=8))
    a = model.create()
    run_step(model, [a], [41], step_inputs(model, [41], rng))
    used = model.pool_usage()
    b = model.fork(a)
    assert model.pool_usage().total.pages_used == used.total.pages_used  # shared, not copied
    assert model.sequences == 2 and sorted(model.live_sequences()) == sorted([a, b]) and b in model
    mem = model.memory(b)
    assert len(mem.layers) == model.layers and mem.total.tokens == 41
    assert mem.layers[CSA].shared_pages == mem.layers[CSA].pages > 0

    assert model.can_remove_suffix(b, 40) and not model.can_remove_suffix(b, 10)
    with pytest.raises(pk.Error):
        model.remove_suffix(b, 10)
    assert model.tokens(b) == 41
    model.remove_suffix(b, 40)
    assert model.tokens(b) == 40 and model.tokens(a) == 41
    model.free(b)
    assert model.sequences == 1 and not model.contains(b)
    assert model.pool_usage().total.pages_used == used.total.pages_used
    for call in (lambda: model.tokens(b), lambda: model.fork(b), lambda: model.free(b), lambda: model.begin([b], 1),
                 lambda: model.snapshot(b), lambda: model.memory(b)):
        with pytest.raises(pk.InputError, match=r"\(sequence\) = "):
            call()
    with pytest.raises(pk.InputError, match=r"\(layer\) = 9"):
        model.shape(9)
    assert model.sequences == 1 and model.tokens(a) == 41


def test_an_invalid_spec_raises_config_error_naming_the_field():
    spec = small_spec()
    layers = spec.layers
    layers[1].kind = 7
    with pytest.raises(pk.ConfigError, match=r"dsv4\.layers\[1\]\.kind = 7"):
        pk.ModelCache(spec)
    with pytest.raises(pk.ConfigError, match=r"layers\[1\]\.kind = 7"):
        pk.ModelSpec(name=spec.name, kinds=spec.kinds, layers=layers)
    with pytest.raises(pk.ConfigError, match=r"options\.pages = 0"):
        pk.ModelCache(small_spec(), pk.ModelOptions(pages=0))
    with pytest.raises(pk.ConfigError, match=r"compress_ratio\) = 3"):
        P.deepseek_kind(3)
    assert P.deepseek_kind(0).window_only() and not P.deepseek_kind(4).window_only()
    assert P.deepseek_kind(128).name == P.deepseek_v4_model([0, 128]).kinds[1].name
    assert "vector_gates" in pk.pooling_ids() and "mean" in pk.pooling_ids()
    assert P.deepseek_indexer_weight_scale() == pytest.approx(1 / (128**0.5 * 64**0.5))


def test_a_snapshot_restores_into_another_layout_and_reads_the_same(rng):
    a = pk.ModelCache(small_spec(), pk.ModelOptions(pages=64))
    b = pk.ModelCache(small_spec(page_size=8), pk.ModelOptions(pages=40))
    s = a.create()
    run_step(a, [s], [97], step_inputs(a, [97], rng))
    snap = a.snapshot(s)
    assert isinstance(snap, bytes)
    t = b.restore(memoryview(snap))
    assert b.tokens(t) == 97 and b.memory(t).total.entries == a.memory(s).total.entries

    damaged = bytearray(snap)
    damaged[len(damaged) // 2] ^= 0x40
    with pytest.raises(pk.InputError):
        b.restore(damaged)
    with pytest.raises(pk.InputError):
        b.restore(np.frombuffer(snap[: len(snap) // 3], dtype=np.uint8))
    assert b.sequences == 1 and b.live_sequences() == [t]

    inputs = step_inputs(a, [1], rng)
    q, iq, iw, sinks = read_inputs(rng, 1)
    outs = []
    for model, seq in ((a, s), (b, t)):
        with model.begin([seq], 1) as step:
            for l, rows in enumerate(inputs):
                step.append(l, rows)
            outs.append([step.read(CSA, [0], q, iq, iw, sinks, selected_logical=True),
                         step.read(HCA, [0], q, sinks=sinks), step.read(SWA, [0], q, sinks=sinks)])
            step.commit()
    for x, y in zip(*outs):
        assert np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1])
    assert np.array_equal(outs[0][0][2], outs[1][0][2])
    assert b.restore(np.frombuffer(a.snapshot(s), dtype=np.uint8)) != t


def test_bad_shapes_raise_naming_the_argument_and_change_nothing(rng):
    model = pk.ModelCache(small_spec(), pk.ModelOptions(pages=64))
    s = model.create()
    inputs = step_inputs(model, [5], rng)
    step = model.begin([s], 5)
    chunks, keys = inputs[CSA][0]
    bad = [(chunks[0][0][:, :-1].copy(), chunks[0][1]), chunks[1]]
    with pytest.raises(pk.InputError, match=r"rows\[0\]\.chunks\[0\] payload: shape \(5, 1023\), expected \(tokens=5, kv_heads·views·channels=1024\)"):
        step.append(CSA, [(bad, keys)])
    with pytest.raises(pk.InputError, match=r"rows\[0\]\.window_keys: shape \(5, 512\), expected \(tokens=5, kv_heads=1, channels=512\)"):
        step.append(CSA, [(chunks, keys[:, 0, :].copy())])
    with pytest.raises(pk.InputError, match=r"rows\[0\]\.chunks\.size\(\) = 1"):
        step.append(CSA, [(chunks[:1], keys)])
    with pytest.raises(pk.InputError, match=r"len\(rows\) = 2"):
        step.append(CSA, [(chunks, keys)] * 2)
    with pytest.raises(TypeError, match=r"float32"):
        step.append(CSA, [([(chunks[0][0].astype(np.float64), chunks[0][1]), chunks[1]], keys)])
    for l, rows in enumerate(inputs):
        step.append(l, rows)  # every layer, the failed ones included, still takes its rows
    q, iq, iw, sinks = read_inputs(rng, 1)
    with pytest.raises(pk.InputError, match=r"queries: shape \(1, 64, 511\), expected \(len\(rows\)=1, query_heads=64, channels=512\)"):
        step.read(CSA, [0], q[:, :, :511].copy(), iq, iw, sinks)
    with pytest.raises(pk.InputError, match=r"indexer_weights: shape \(2, 64\)"):
        step.read(CSA, [0], q, iq, np.zeros((2, 64), np.float32), sinks)
    with pytest.raises(pk.InputError, match=r"rows\[0\] = 3"):
        step.read(CSA, [3], q, iq, iw, sinks)
    out = step.read(CSA, [0], q, iq, iw, sinks)[0]
    assert np.isfinite(out).all()
    step.commit()
    assert model.tokens(s) == 5


def test_closed_steps_raise_and_abort_puts_everything_back(rng):
    model = pk.ModelCache(small_spec(), pk.ModelOptions(pages=64))
    s = model.create()
    run_step(model, [s], [30], step_inputs(model, [30], rng))
    before, table = model.pool_usage().total.pages_used, model.page_table(s, 1)
    snap = model.snapshot(s)

    inputs = step_inputs(model, [40], rng)
    step = model.begin([s], [40])
    assert step.open and step.rows == 1 and step.sequence(0) == s and step.tokens(0) == 40
    assert model.pool_usage().total.pages_used > before  # begin reserves the pages
    with pytest.raises(pk.InputError, match="in an open step"):
        model.tokens(s)
    with pytest.raises(pk.InputError, match=r"layer = 0.*not appended"):
        step.commit()
    for l, rows in enumerate(inputs):
        step.append(l, rows)
    step.abort()
    assert not step.open and model.tokens(s) == 30 and model.pool_usage().total.pages_used == before
    assert np.array_equal(model.page_table(s, 1), table) and model.snapshot(s) == snap
    for call in (step.commit, lambda: step.append(0, [inputs[0][0]]),
                 lambda: step.read(SWA, [0], np.zeros((1, 64, 512), np.float32))):
        with pytest.raises(pk.InputError, match="closed"):
            call()
    step.abort()  # a no-op

    with pytest.raises(RuntimeError, match="boom"):
        with model.begin([s], 40) as step:
            step.append(0, inputs[0])
            raise RuntimeError("boom")
    with model.begin([s], 40) as step:  # left without commit(): aborted too
        pass
    assert model.tokens(s) == 30 and model.snapshot(s) == snap and not step.open

    run_step(model, [s], [40], inputs)
    assert model.tokens(s) == 70
    step = model.begin([s], 1)
    step.append(0, [layer_inputs(model, 0, 1, rng)])
    del step  # dropped uncommitted: aborted
    assert model.tokens(s) == 70 and model.snapshot(s) != snap


def test_appends_and_reads_release_the_gil(rng):
    model = pk.ModelCache(small_spec(), pk.ModelOptions(pages=512))
    s = model.create()
    inputs = step_inputs(model, [1500], rng)
    step = model.begin([s], 1500)
    for l in range(model.layers):
        if l != CSA:
            step.append(l, inputs[l])
    window = []  # (start, end) of the call, measured in the appending thread
    errors = []

    def append():
        try:
            t0 = time.perf_counter()
            step.append(CSA, inputs[CSA])  # a long prefill chunk: tens of milliseconds or more
            window.extend((t0, time.perf_counter()))
        except BaseException as e:  # reported below: a thread's exception is otherwise lost
            errors.append(e)

    thread = threading.Thread(target=append)
    stamps = []
    thread.start()
    while thread.is_alive():  # this loop runs only while the appending thread does not hold the GIL
        stamps.append(time.perf_counter())
    thread.join()
    assert errors == []
    t0, t1 = window
    inside = [t for t in stamps if t0 <= t <= t1]
    # With the GIL held for the call, no stamp would fall inside it but at its edges.
    gaps = np.diff([t0] + inside + [t1])
    assert len(inside) > 100 and gaps.max() < 0.5 * (t1 - t0), (t1 - t0, len(inside), gaps.max())
    step.commit()
    assert model.tokens(s) == 1500


def test_bf16_chunks_are_their_float32_widening(rng):
    """Payload and logits as bf16 bits (uint16) append exactly what their float32 widening does."""
    models = [pk.ModelCache(small_spec(), pk.ModelOptions(pages=64)) for _ in range(2)]
    seqs = [m.create() for m in models]
    inputs = step_inputs(models[0], [23], rng)
    as_bits = lambda x: (x.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bf16
    widened = lambda bits: (bits.astype(np.uint32) << 16).view(np.float32)
    wide, bf16 = [], []
    for rows in inputs:
        (chunks, keys), = rows
        bits = [tuple(as_bits(a) for a in chunk) for chunk in chunks]
        bf16.append([(bits, keys)])
        wide.append([([tuple(widened(b) for b in chunk) for chunk in bits], keys)])
    run_step(models[0], [seqs[0]], [23], wide)
    run_step(models[1], [seqs[1]], [23], bf16)
    for stream in (0, 1):
        for j in range(5):  # 23 tokens: CSA's entries 0..4
            assert np.array_equal(models[0].read_entry(CSA, stream, seqs[0], j),
                                  models[1].read_entry(CSA, stream, seqs[1], j))
    assert models[0].snapshot(seqs[0]) == models[1].snapshot(seqs[1])


def test_threads_step_disjoint_sequences_of_one_model(rng):
    """Steps over different sequences from two threads read what the same steps read one by one."""
    sizes = pk.ModelCache(small_spec(), pk.ModelOptions(pages=1))  # what step_inputs sizes the inputs by
    steps = [[(step_inputs(sizes, [n], rng), read_inputs(rng, 1)) for n in (9, 1, 1, 3, 1)] for _ in range(2)]

    def drive(model, seq, plan, outs):
        for inputs, (q, iq, iw, sinks) in plan:
            with model.begin([seq], inputs[0][0][1].shape[0]) as step:
                for l, rows in enumerate(inputs):
                    step.append(l, rows)
                outs.append(step.read(CSA, [0], q, iq, iw, sinks)[0])
                step.commit()

    alone = pk.ModelCache(small_spec(), pk.ModelOptions(pages=64))
    want = [[], []]
    for plan, outs in zip(steps, want):
        drive(alone, alone.create(), plan, outs)
    shared = pk.ModelCache(small_spec(), pk.ModelOptions(pages=64))
    seqs, got, errors = [shared.create(), shared.create()], [[], []], []

    def run(k):
        try:
            drive(shared, seqs[k], steps[k], got[k])
        except BaseException as e:  # reported below: a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and [shared.tokens(s) for s in seqs] == [15, 15]
    for a, b in zip(want, got):
        assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b) == 5


def test_step_reads_take_host_indices_and_fill_traces(rng):
    """A read of the entries the reader itself selected (host indices, indexer inputs None) equals
    the reader's read bit for bit, in a step and committed; traces name what each read looked at."""
    model = pk.ModelCache(small_spec(), pk.ModelOptions(pages=256))
    seqs = [model.create(), model.create()]
    run_step(model, seqs, [300, 137], step_inputs(model, [300, 137], rng))
    q, iq, iw, sinks = read_inputs(rng, 2)
    with model.begin(seqs, 1) as step:
        for l, rows in enumerate(step_inputs(model, [1, 1], rng)):
            step.append(l, rows)
        traces = [pk.ReadTrace(), None]
        out, lse, sel, _ = step.read(CSA, [0, 1], q, iq, iw, sinks, selected_logical=True, traces=traces)
        assert traces[0].candidates == 75 and sorted(traces[0].selected) == sorted(sel[0])
        host, host_lse, _, _ = step.read(CSA, [0, 1], q, sinks=sinks, indices=sel)
        assert np.array_equal(host, out) and np.array_equal(host_lse, lse)
        with pytest.raises(pk.InputError, match="len\\(traces\\)"):
            step.read(CSA, [0, 1], q, iq, iw, sinks, traces=[pk.ReadTrace()])
        with pytest.raises(pk.InputError, match="indices.shape"):
            step.read(CSA, [0, 1], q, sinks=sinks, indices=sel[0])
        step.commit()
    committed, _, _, _ = model.read(CSA, seqs, q, sinks=sinks, indices=sel)
    assert np.array_equal(committed, out)
