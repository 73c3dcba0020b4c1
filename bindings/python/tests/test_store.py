"""Store, quantize and the attention Context through Python, against a NumPy
float64 reference."""

import numpy as np
import pytest

import kvpage
from kvpage import Backend, Context, Isa, Pool, Store, Table

from _reference import D, H, QH, reference, rel


def test_quantize_round_trip_and_block_bytes():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, H, D)).astype(np.float32)
    for fmt in ("fp16", "int8", "int4"):
        blocks = kvpage.quantize(x, fmt, is_value=True, page_size=32)
        lay = kvpage.layout(1, H, D, 32, "fp16", fmt)
        assert blocks.shape == (2, H, lay.v_block_bytes)
        y = kvpage.dequantize(blocks, fmt, D, is_value=True, page_size=32)
        assert y.shape == x.shape
        bound = {"fp16": 1e-3, "int8": 1e-2, "int4": 0.1}[fmt]
        assert rel(y, x) < bound
    with pytest.raises(ValueError, match="multiple of page_size"):
        kvpage.quantize(x[:10], "int8", page_size=32)
    with pytest.raises(ValueError, match="bytes"):
        kvpage.dequantize(blocks[:, :, :10].copy(), "int4", D, is_value=True, page_size=32)


def test_store_table_context_by_hand():
    rng = np.random.default_rng(2)
    pool = Pool(num_pages=16, page_size=8)
    t = Table(pool)
    store = Store(layers=1, kv_heads=H, head_dim=D, num_pages=16, page_size=8)
    ctx = Context(threads=1, isa=Isa.PORTABLE)
    assert ctx.isa == Isa.PORTABLE
    s = t.create()
    t.reserve(s, 20)
    slots, ops = t.append(s, np.arange(20))
    k = rng.normal(size=(20, H, D)).astype(np.float16)
    v = rng.normal(size=(20, H, D)).astype(np.float16)
    store.append(0, k, v, slots, ops)
    kk, vv = store.read(0, int(t.pages(s)[0]), 0, 8)
    assert np.array_equal(kk, k[:8].astype(np.float32))
    batch = t.export([s], num_new=[3])
    q = rng.normal(size=(3, QH, D)).astype(np.float16)
    out = ctx.attention(store, batch, 0, q, sm_scale=0.125)
    assert out.dtype == np.float16 and out.shape == (3, QH, D)
    assert rel(out.astype(np.float64), reference(q, k, v, 0.125)) < 3e-3
    base, nbytes = store.arena()
    assert base != 0 and nbytes == kvpage.layout(1, H, D, 8).arena_bytes(16)

def test_store_info_layout_and_nonfinite_count():
    store = Store(layers=2, kv_heads=H, head_dim=D, num_pages=8, page_size=16,
                  k_format="int8", v_format="int4", num_staging=2)
    info = store.info()
    lay = kvpage.layout(2, H, D, 16, "int8", "int4")
    assert info.backend == Backend.CPU and info.device == -1 and store.device == -1
    assert (info.num_pages, info.num_staging) == (8, 2)
    assert info.arena != 0 and info.arena_bytes == lay.arena_bytes(8, 2)
    assert store.arena() == (info.arena, info.arena_bytes)
    assert store.layout() == lay
    assert (store.layers, store.kv_heads, store.head_dim, store.page_size) == (2, H, D, 16)
    assert store.nonfinite_count == 0
    pool = Pool(num_pages=8, page_size=16, num_staging=2)
    t = Table(pool)
    s = t.create()
    slots, ops = t.append(s, np.arange(3))
    k = np.ones((3, H, D), np.float32)
    k[1, 0, 5] = np.nan
    k[2, 1, 7] = np.inf
    store.append(0, k, np.ones_like(k), slots, ops)
    assert store.nonfinite_count == 2


def test_context_info():
    ctx = Context(threads=2, isa=Isa.PORTABLE)
    info = ctx.info()
    assert info.backend == Backend.CPU and info.device == -1
    assert info.isa == Isa.PORTABLE == ctx.isa and str(ctx.isa) == "portable"
    assert info.threads == 2 == ctx.threads
    assert info.workspace_bytes == 16 << 20  # the default
    auto = Context()
    assert auto.isa != Isa.AUTO and kvpage.isa_supported(auto.isa)
    with pytest.raises(kvpage.InvalidArgument):
        Context(threads=0)


def test_default_softmax_scale_and_lse():
    """sm_scale None is the library's default, 1/sqrt(head_dim); lse is the
    log-sum-exp of the scaled logits."""
    rng = np.random.default_rng(4)
    pool = Pool(num_pages=8, page_size=16)
    t = Table(pool)
    store = Store(layers=1, kv_heads=H, head_dim=D, num_pages=8, page_size=16, k_format="fp32",
                  v_format="fp32")
    ctx = Context(isa=Isa.PORTABLE)
    s = t.create()
    slots, ops = t.append(s, np.arange(21))
    k = rng.normal(size=(21, H, D)).astype(np.float32)
    v = rng.normal(size=(21, H, D)).astype(np.float32)
    store.append(0, k, v, slots, ops)
    batch = t.export([s], num_new=[4])
    q = rng.normal(size=(4, QH, D)).astype(np.float32)
    lse = np.empty((4, QH), np.float32)
    default = ctx.attention(store, batch, 0, q, lse=lse)
    explicit = ctx.attention(store, batch, 0, q, sm_scale=1 / np.sqrt(D))
    assert np.array_equal(default, explicit)
    want, want_lse = reference(q, k, v, 1 / np.sqrt(D), with_lse=True)
    assert rel(default, want) < 1e-5
    assert np.abs(lse - want_lse).max() < 1e-4
    with pytest.raises(ValueError, match="lse"):
        ctx.attention(store, batch, 0, q, lse=np.empty((4, QH), np.float64))
