"""Torch tensors as first-class arrays: read in place through DLPack (bf16 as bf16 where the
library takes bf16), returned as given through out=, and refused with the fix named when they
require grad, are not contiguous, live off the CPU or have the wrong element type."""

import gc

import numpy as np
import pytest

import phasekv as pk
from conftest import csa_inputs, csa_layer, random_chunk
from phasekv import presets as P

torch = pytest.importorskip("torch")


class DLPackOnly:
    """A producer that speaks only DLPack (no __array__, no buffer), as JAX or CuPy arrays do."""

    def __init__(self, tensor, device=(1, 0)):
        self.tensor, self.device = tensor, device

    def __dlpack__(self, stream=None):
        return self.tensor.__dlpack__()

    def __dlpack_device__(self):
        return self.device


@pytest.fixture
def csa_read(rng, csa):
    seq = csa.cache.create()
    csa.append(seq, 300)
    rc = P.deepseek_reader(4)
    reader = pk.SparseReader(csa.cache, rc)
    inputs = csa_inputs(rng, rc)
    return csa.cache, seq, reader, inputs, reader.read(csa.cache, seq, 299, *inputs)


def test_out_returns_the_tensor_it_was_given(csa_read):
    cache, seq, reader, inputs, want = csa_read
    out = torch.full((64, 512), float("nan"))
    got = reader.read(cache, seq, 299, *[torch.from_numpy(x) for x in inputs], out=out)
    assert got is out
    again = reader.read(cache, seq, 299, *inputs, out=out.numpy())  # a NumPy view of it, returned as given
    assert np.shares_memory(again, out.numpy())
    assert torch.equal(out, torch.from_numpy(want))
    lse = torch.empty(2, 64)
    outs = torch.empty(2, 64, 512)
    o, l, _, _ = reader.read_batch(cache, [seq, seq], [299, 299], *[np.stack([x, x]) for x in inputs], out=outs, lse=lse)
    assert o is outs and l is lse
    assert torch.equal(outs[1], torch.from_numpy(want))


def test_dlpack_in_and_out(csa_read):
    cache, seq, reader, inputs, want = csa_read
    # A DLPack-only producer is read in place, and stays valid for the call after its capsule is gone.
    got = reader.read(cache, seq, 299, *[DLPackOnly(torch.from_numpy(x)) for x in inputs])
    gc.collect()
    assert got.tobytes() == want.tobytes()
    # A result is a NumPy array: torch views it through DLPack without a copy.
    t = torch.from_dlpack(got)
    assert t.data_ptr() == got.ctypes.data and torch.equal(t, torch.from_numpy(want))
    with pytest.raises(ValueError, match=r"^queries: on DLPack device \(2, 0\), not the CPU .*x\.cpu\(\)"):
        reader.read(cache, seq, 299, DLPackOnly(torch.from_numpy(inputs[0]), (2, 0)), *inputs[1:])


def test_tensors_are_refused_with_the_fix(csa_read):
    cache, seq, reader, inputs, _ = csa_read
    q = torch.from_numpy(inputs[0])
    rest = inputs[1:]
    with pytest.raises(TypeError, match=r"^queries: a tensor that requires grad .*pass x\.detach\(\)"):
        reader.read(cache, seq, 299, q.clone().requires_grad_(), *rest)
    transposed = torch.from_numpy(np.ascontiguousarray(inputs[0].T)).t()  # shape (64, 512), strided
    assert transposed.shape == (64, 512) and not transposed.is_contiguous()
    with pytest.raises(ValueError, match=r"^queries: a non-contiguous tensor of shape \(64, 512\) .*x\.contiguous\(\)"):
        reader.read(cache, seq, 299, transposed, *rest)
    assert reader.read(cache, seq, 299, transposed.contiguous(), *rest).tobytes() == \
        reader.read(cache, seq, 299, *inputs).tobytes()
    with pytest.raises(TypeError, match=r"^queries\.dtype = bfloat16: must be float32 here \(pass x\.float\(\)\)"):
        reader.read(cache, seq, 299, q.to(torch.bfloat16), *rest)
    with pytest.raises(TypeError, match=r"^queries\.dtype = float64: must be float32"):
        reader.read(cache, seq, 299, q.double(), *rest)
    with pytest.raises(TypeError, match=r"^queries: str is not an array"):
        reader.read(cache, seq, 299, "q", *rest)
    with pytest.raises(TypeError, match=r"^queries: list is not an array"):
        reader.read(cache, seq, 299, inputs[0].tolist(), *rest)
    with pytest.raises(pk.InputError, match=r"^out: shape \(512, 64\), expected \(query_heads=64, channels=512\)$"):
        reader.read(cache, seq, 299, *inputs, out=torch.empty(512, 64))
    with pytest.raises(TypeError, match=r"^out: a tensor that requires grad"):
        reader.read(cache, seq, 299, *inputs, out=torch.empty(64, 512, requires_grad=True))


def test_bf16_tensors_are_read_as_bf16(rng):
    g = P.deepseek_geometry(4)
    c = pk.Compressor(pk.Policy.deepseek_v4, g, P.deepseek_kv_stream(4))
    payload, logits = random_chunk(rng, P.deepseek_kv_stream(4), 37, g, pk.Policy.deepseek_v4)
    p16, l16 = torch.from_numpy(payload).to(torch.bfloat16), torch.from_numpy(logits).to(torch.bfloat16)
    # The oracle: the float32 widening of the same bf16 values, and the int16 bits of the same memory.
    wide = c.append(c.make_state(), p16.float().numpy(), l16.float().numpy(), slot_weights=True)
    bits = c.append(c.make_state(), p16.view(torch.int16).numpy(), l16.view(torch.int16).numpy(), slot_weights=True)
    got = c.append(c.make_state(), p16, l16, slot_weights=True)
    assert got.values.tobytes() == wide.values.tobytes() == bits.values.tobytes()
    assert got.slot_weights.tobytes() == wide.slot_weights.tobytes()
    # Not a copy of float32 values that happen to round the same: a bf16 tensor whose float32
    # values differ from their bf16 rounding still gives the bf16 result.
    assert not np.array_equal(p16.float().numpy(), payload)
    # The layer cache takes tensor chunks too, mixed with NumPy arrays.
    layer = csa_layer(rng)
    a, b = layer.cache.create(), layer.cache.create()
    ip, il = random_chunk(rng, P.deepseek_indexer_stream(4), 37, g, pk.Policy.deepseek_v4)
    keys = rng.standard_normal((37, 1, 512), dtype=np.float32)
    layer.cache.append(a, [(p16.float().numpy(), l16.float().numpy()), (ip, il)], keys)
    layer.cache.append(b, [(p16, l16), (torch.from_numpy(ip), il)], torch.from_numpy(keys))
    for k in range(2):
        assert layer.cache.read_entries(a, k).tobytes() == layer.cache.read_entries(b, k).tobytes()
