"""Hostile inputs from Python: every one is a Python exception naming what is wrong — never a
crash, never a partial change. After each refused call the cache's state (tokens, entries, pool
use) is byte-for-byte what it was."""

import gc
import threading

import numpy as np
import pytest

import phasekv as pk
from conftest import csa_layer, random_chunk

P = pk.presets


@pytest.fixture
def world(rng):
    layer = csa_layer(rng, pages=8)
    cache = layer.cache
    seq = cache.create()
    layer.append(seq, 40)
    reader = pk.SparseReader(cache, P.deepseek_reader(4))
    inputs = dict(queries=rng.standard_normal((64, 512), dtype=np.float32),
                  indexer_queries=rng.standard_normal((64, 128), dtype=np.float32),
                  indexer_weights=np.full(64, 1 / 64, np.float32),
                  sinks=rng.standard_normal(64, dtype=np.float32))
    return layer, seq, reader, inputs


def state_of(cache):
    """Everything a refused call must leave as it was."""
    seqs = cache.live_sequences()
    return (seqs, [cache.tokens(s) for s in seqs],
            [cache.read_entries(s, k).tobytes() for s in seqs for k in range(cache.stream_count)],
            [cache.pool_usage(k) for k in range(cache.stream_count)])


def read_cases(inputs):
    q, iq, iw, sinks = (inputs[k] for k in ("queries", "indexer_queries", "indexer_weights", "sinks"))
    read_only = np.empty((64, 512), np.float32)
    read_only.flags.writeable = False
    misaligned = np.frombuffer(bytearray(q.nbytes + 1), np.float32, count=q.size, offset=1).reshape(q.shape)
    return [
        ("float64 queries", dict(queries=q.astype(np.float64)), TypeError, r"^queries\.dtype = float64: must be float32"),
        ("int queries", dict(queries=q.astype(np.int32)), TypeError, r"^queries\.dtype = int32"),
        ("strided queries", dict(queries=np.repeat(q, 2, axis=1)[:, ::2]), ValueError, r"^queries = .*C-contiguous"),
        ("misaligned queries", dict(queries=misaligned), ValueError, r"^queries = .*aligned"),
        ("0-d queries", dict(queries=np.array(1.0, np.float32)), pk.InputError, r"^queries: shape \(\), expected"),
        ("a scalar", dict(queries=np.float32(1.0)), pk.InputError, r"^queries: shape \(\), expected"),
        ("a list", dict(queries=q.tolist()), TypeError, r"^queries: list is not an array"),
        ("None queries", dict(queries=None), pk.InputError, r"queries"),
        ("empty queries", dict(queries=np.empty((0, 512), np.float32)), pk.InputError, r"^queries: shape \(0, 512\)"),
        ("NaN queries", dict(queries=np.full_like(q, np.nan)), pk.InputError, r"request\.queries\[0\] = nan"),
        ("Inf sinks", dict(sinks=np.full_like(sinks, np.inf)), pk.InputError, r"sinks\[0\] = inf"),
        ("transposed indexer", dict(indexer_queries=iq.T.copy()), pk.InputError, r"^indexer_queries: shape \(128, 64\)"),
        ("read-only out", dict(out=read_only), ValueError, r"^out: is read-only"),
        ("small out", dict(out=np.empty((64, 100), np.float32)), pk.InputError, r"^out: shape \(64, 100\)"),
        ("float64 out", dict(out=np.empty((64, 512))), TypeError, r"^out\.dtype = float64"),
        ("huge top_k", dict(top_k=2**62), pk.InputError, r"request\.top_k = 4611686018427387904"),
        ("negative top_k", dict(top_k=-2), pk.InputError, r"request\.top_k = -2"),
    ]


def test_reads_refuse_bad_arrays_and_leave_everything_as_it_was(world):
    layer, seq, reader, inputs = world
    cache = layer.cache
    before, want = state_of(cache), reader.read(cache, seq, 39, **inputs)
    for name, change, error, message in read_cases(inputs):
        with pytest.raises(error, match=message):
            reader.read(cache, seq, 39, **dict(inputs, **change))
        assert state_of(cache) == before, name
    for position in (-1, 40, 2**62):
        with pytest.raises(pk.InputError, match=rf"request\.position = {position}: must lie in \[0, tokens = 40\)"):
            reader.read(cache, seq, position, **inputs)
    for bad_seq in (-1, 2**63 - 1, seq + 1):
        with pytest.raises(pk.InputError, match=r"is not a live sequence of this cache"):
            reader.read(cache, bad_seq, 39, **inputs)
    # An id of another cache, and an id freed since, are refused too.
    other = csa_layer(np.random.default_rng(5), pages=8)
    foreign = other.cache.create()
    with pytest.raises(pk.InputError, match=r"is not a live sequence of this cache"):
        reader.read(cache, foreign, 39, **inputs)
    gone = cache.create()
    cache.free(gone)
    with pytest.raises(pk.InputError, match=r"is not a live sequence of this cache"):
        cache.append(gone, [random_chunk(np.random.default_rng(2), s, 1, layer.geometry, layer.policy)
                            for s in layer.streams])
    assert state_of(cache) == before
    assert reader.read(cache, seq, 39, **inputs).tobytes() == want.tobytes()


def test_appends_refuse_bad_chunks_all_or_nothing(world, rng):
    layer, seq, _, _ = world
    cache = layer.cache
    before = state_of(cache)
    good = [random_chunk(rng, s, 8, layer.geometry, layer.policy) for s in layer.streams]
    keys = rng.standard_normal((8, 1, 512), dtype=np.float32)
    nan = [(good[0][0].copy(), good[0][1]), good[1]]
    nan[0][0][5, 0, 1, 3] = np.nan
    cases = [
        ("too few streams", [good[0]], keys, pk.InputError, r"len\(chunks\) = 1: must be the layer's stream count, 2"),
        ("a str chunk", ["x", good[1]], keys, TypeError, r"^chunks\[0\] payload: str is not an array"),
        ("a 1-D payload", [(good[0][0].reshape(-1), good[0][1]), good[1]], keys, ValueError, r"needs a leading token axis"),
        ("float64 logits", [(good[0][0], good[0][1].astype(np.float64)), good[1]], keys, TypeError,
         r"^chunks\[0\] logits\.dtype = float64"),
        ("token counts differ", [good[0], (good[1][0][:7].copy(), good[1][1][:7].copy())], keys, pk.InputError, r"token"),
        ("keys of other tokens", good, keys[:3].copy(), pk.InputError, r"window_keys"),
        ("NaN with check_finite", nan, keys, pk.InputError, r"chunk.payload\[token 5, element 515\] = nan"),
    ]
    for name, chunks, k, error, message in cases:
        with pytest.raises(error, match=message):
            cache.append(seq, chunks, k, check_finite=True)
        assert state_of(cache) == before, name
    # A full pool: the append that needs one more page than there is is refused whole.
    big = [random_chunk(rng, s, 2100, layer.geometry, layer.policy) for s in layer.streams]  # > 8 pages of entries
    with pytest.raises(pk.CapacityError, match=r"cannot allocate"):
        cache.append(seq, big, rng.standard_normal((2100, 1, 512), dtype=np.float32))
    assert state_of(cache) == before


def test_configs_and_diagnostics_refuse_what_would_overflow(rng):
    with pytest.raises(pk.ConfigError, match=r"geometry\.window = 1099511627776: must be at most 2\^20"):
        pk.Compressor(pk.Policy.mean, pk.Geometry(stride=2**40, window=2**40), pk.StreamConfig(name="kv", channels=64))
    with pytest.raises(pk.ConfigError, match=r"kv\.channels = 1099511627776"):
        pk.Compressor(pk.Policy.mean, pk.Geometry(stride=4, window=4), pk.StreamConfig(name="kv", channels=2**40))
    with pytest.raises(pk.ConfigError, match=r"capacity = 1099511627776: must be at most 2\^31 - 1"):
        pk.PagedCache(pk.Policy.mean, pk.Geometry(stride=4, window=4), [pk.StreamConfig(name="kv", channels=64)],
                      pk.CacheConfig(pages=2**40))
    layer = csa_layer(rng)
    rc = P.deepseek_reader(4)
    rc.precision = pk.IndexerPrecision(9)  # an enum value no member has
    with pytest.raises(pk.ConfigError, match=r"precision = 9: is not an indexer_precision"):
        pk.SparseReader(layer.cache, rc)
    # Host-built entries with absurd indices: refused before any table is sized.
    w = np.full((1, 1, 4), 0.25, np.float32)
    for sink, who in ((pk.SlotWeightLog(window=4), "slot_weight_log"),
                      (pk.WriteProfile(pk.Geometry(stride=4, window=4), 1), "write_profile")):
        for index, why in ((2**62, "must be below 2\\^48"), (-5, "must be non-negative")):
            with pytest.raises(pk.InputError, match=rf"^{who}: entry\.index = {index}: {why}"):
                sink.add(pk.Entries(np.array([index], np.int64), slot_weights=w))
    # Finite values a storage cannot hold, under check_finite: f16 tops out at 65504.
    cache = pk.PagedCache(pk.Policy.mean, pk.Geometry(stride=4, window=4), [pk.StreamConfig(name="kv", channels=64)],
                          pk.CacheConfig(pages=8, storage=pk.StorageType.f16))
    seq = cache.create()
    with pytest.raises(pk.InputError, match=r"value\[0\] = 100000: is not representable in f16 storage"):
        cache.append(seq, [np.full((4, 1, 1, 64), 1e5, np.float32)], check_finite=True)
    assert cache.tokens(seq) == 0


def test_objects_outlive_what_they_were_made_from(rng):
    layer = csa_layer(rng)
    cache, seq = layer.cache, layer.cache.create()
    layer.append(seq, 40)
    entries, window = cache.read_entries(seq, 0), cache.window_key(seq, 39)
    want = entries.copy(), window.copy()
    reader = pk.SparseReader(cache.shape(), P.deepseek_reader(4))
    del cache, layer
    gc.collect()
    # Returned arrays own their memory.
    assert entries.tobytes() == want[0].tobytes() and window.tobytes() == want[1].tobytes()
    # Host entries keep the arrays they view; the caller's names may go.
    index, weights = np.arange(3, dtype=np.int64), np.full((3, 1, 4), 0.25, np.float32)
    e = pk.Entries(index, slot_weights=weights)
    del index, weights
    gc.collect()
    profile = pk.WriteProfile(pk.Geometry(stride=4, window=4), 1)
    profile.add(e)
    assert profile.concentration_windows(0) == 3
    # A reader needs only a cache of its shape: another one reads as well.
    other = csa_layer(rng)
    s = other.cache.create()
    other.append(s, 20)
    inputs = (rng.standard_normal((64, 512), dtype=np.float32), rng.standard_normal((64, 128), dtype=np.float32),
              np.full(64, 1 / 64, np.float32), np.zeros(64, np.float32))
    assert np.isfinite(reader.read(other.cache, s, 19, *inputs)).all()
    # A freed sequence's id stays refused, and a reused id is a different sequence.
    other.cache.free(s)
    with pytest.raises(pk.InputError, match=r"is not a live sequence"):
        reader.read(other.cache, s, 19, *inputs)
    assert other.cache.create() != s


def test_hostile_calls_from_threads_leave_good_reads_intact(world):
    layer, seq, reader, inputs = world
    cache = layer.cache
    want = reader.read(cache, seq, 39, **inputs).tobytes()
    before = state_of(cache)
    bad = read_cases(inputs)
    refused, errors = [], []

    def hostile():
        try:
            for _ in range(5):
                for _, change, error, _ in bad:
                    try:
                        reader.read(cache, seq, 39, **dict(inputs, **change))
                    except error:
                        refused.append(1)
        except BaseException as e:  # reported below
            errors.append(e)

    def good():
        try:
            for _ in range(20):
                assert reader.read(cache, seq, 39, **inputs).tobytes() == want
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=f) for f in (hostile, hostile, good, good)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(refused) == 2 * 5 * len(bad)
    assert state_of(cache) == before


# ---- the third adversarial probe: calls that killed the interpreter (SIGFPE) -------------------


def test_config_objects_built_invalid_are_refused_when_built():
    cases = [
        (lambda: pk.StreamConfig(name="kv", channels=0), r"kv\.channels = 0"),
        (lambda: pk.StreamConfig(name="kv", channels=8, kv_heads=0), r"kv\.kv_heads = 0"),
        (lambda: pk.RawWindowConfig(tokens=8), r"window\.key_channels = 0"),
        (lambda: pk.RawWindowConfig(tokens=8, key_channels=4, rope_channels=2), r"window\.rope_channels = 2"),
        (lambda: pk.CacheConfig(name="c", page_size=0), r"c\.page_size = 0"),
        (lambda: pk.CacheConfig(name="c", history=-1), r"c\.history = -1"),
        (lambda: pk.RecordShape(key_tokens=0), r"record_shape\.key_tokens = 0"),
        (lambda: pk.SweepConfig(stride=0), r"stride = 0"),
        (lambda: pk.probe.NeedleConfig(channels=6), r"channels"),
        (lambda: pk.testing.Options(cases=-1), r"options\.cases = -1"),
        (lambda: pk.plot.PlotAxes(x_min=1.0, x_max=0.0), r"x_max"),
    ]
    for build, message in cases:
        with pytest.raises(pk.ConfigError, match=message):
            build()
    # Built with no fields, a config is a blank to fill in (StreamConfig's 0 channels are not yet
    # valid), checked where it is used; built with valid fields it is accepted.
    blank = pk.StreamConfig()
    blank.channels = 8
    assert pk.StreamConfig(name="kv", channels=8).channels == 8
    assert pk.CacheConfig(name="c", page_size=4, window=pk.RawWindowConfig(tokens=8, key_channels=4)).page_size == 4
    assert pk.SweepConfig(stride=4, trials_per_residue=20, query_position=10_000, span=4096).stride == 4


def test_an_invalid_geometry_is_refused_when_built_and_when_used():
    with pytest.raises(pk.ConfigError, match=r"geometry\.window = 4: must be at least geometry\.stride \(6\)"):
        pk.Geometry(stride=6, window=4)
    with pytest.raises(pk.ConfigError, match=r"geometry\.stride = 0: must be at least 1"):
        pk.Geometry(stride=0, window=4)
    g = pk.Geometry(stride=4, window=8)
    g.stride = 0  # fields stay writable one at a time; every method checks the whole first
    for call in (lambda: g.phase_of(5), lambda: g.phase_of(np.arange(8)), lambda: g.block_of(5),
                 lambda: g.coverage(5), lambda: g.entries_covering(5), lambda: g.completed_entries(9),
                 lambda: g.visible_entries(9), lambda: g.block_start(1), lambda: g.branches, lambda: g.lead,
                 lambda: g.branch_of_slot(1), lambda: g.anchor_position(2)):
        with pytest.raises(pk.ConfigError, match=r"geometry\.stride = 0"):
            call()
    g.stride = 4
    assert list(g.phase_of(np.arange(6))) == [0, 1, 2, 3, 0, 1]


def test_integer_helpers_refuse_what_would_trap_or_overflow():
    with pytest.raises(pk.InputError, match=r"b = 0: must not be 0"):
        pk.floor_div(1, 0)
    with pytest.raises(pk.InputError, match=r"b = 0: must not be 0"):
        pk.floor_mod(1, 0)
    with pytest.raises(pk.InputError, match=r"divided by b = -1 overflows"):
        pk.floor_div(-2**63, -1)
    with pytest.raises(pk.InputError, match=r"b = 0"):
        pk.floor_div(np.array([1, 2]), np.array([1, 0]))
    with pytest.raises(pk.InputError, match=r"modulus = 0: must lie in \[1, 2\^48\]"):
        pk.Geometry.residue_of(5, 0)
    g = pk.Geometry(stride=4, window=8)
    with pytest.raises(pk.InputError, match=r"tokens = 9223372036854775807: must lie in \[-2\^48, 2\^48\]"):
        g.completed_entries(2**63 - 1)
    with pytest.raises(pk.InputError, match=r"entry = "):
        g.block_start(2**62)
    # What stays in range is the same arithmetic as before.
    assert pk.floor_div(-7, 2) == -4 and pk.floor_mod(-7, 2) == 1 and pk.floor_div(-2**63, 1) == -2**63
    assert g.completed_entries(2**48) == 2**46 and pk.Geometry.residue_of(-1, 8) == 7


class _NullDLPack:
    """A DLPack producer whose header says 4 floats at address 0 (a malformed producer)."""

    def __init__(self, null=True, shape=(4,)):
        import ctypes

        class Device(ctypes.Structure):
            _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]

        class DType(ctypes.Structure):
            _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

        class Tensor(ctypes.Structure):
            _fields_ = [("data", ctypes.c_void_p), ("device", Device), ("ndim", ctypes.c_int), ("dtype", DType),
                        ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                        ("byte_offset", ctypes.c_uint64)]

        class Managed(ctypes.Structure):
            _fields_ = [("tensor", Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]

        self.backing = (ctypes.c_float * 4)(1, 2, 3, 4)
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.managed = Managed()
        t = self.managed.tensor
        t.data = None if null else ctypes.addressof(self.backing)
        t.device = Device(1, 0)
        t.ndim = len(shape)
        t.dtype = DType(2, 32, 1)  # float32
        t.shape = self.shape
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self._new = lambda: new(ctypes.addressof(self.managed), b"dltensor", None)

    def __dlpack__(self, stream=None):
        return self._new()

    def __dlpack_device__(self):
        return (1, 0)


def test_a_dlpack_producer_with_a_null_data_pointer_is_refused(world):
    layer, seq, reader, inputs = world
    before = state_of(layer.cache)
    sinks = inputs["sinks"]
    with pytest.raises(ValueError, match=r"sinks: a DLPack tensor with a null data pointer"):
        reader.read(layer.cache, seq, 39, inputs["queries"], inputs["indexer_queries"], inputs["indexer_weights"],
                    _NullDLPack(shape=(64,)))
    with pytest.raises(ValueError, match=r"shape\[0\] = -64: must be non-negative"):
        reader.read(layer.cache, seq, 39, inputs["queries"], inputs["indexer_queries"], inputs["indexer_weights"],
                    _NullDLPack(null=False, shape=(-64,)))
    assert state_of(layer.cache) == before
    # An empty tensor may have a null pointer (there is nothing to read): it reaches the shape check.
    with pytest.raises(ValueError, match=r"sinks"):
        reader.read(layer.cache, seq, 39, inputs["queries"], inputs["indexer_queries"], inputs["indexer_weights"],
                    _NullDLPack(shape=(0,)))
    reader.read(layer.cache, seq, 39, inputs["queries"], inputs["indexer_queries"], inputs["indexer_weights"], sinks)
