"""Store, quantize, attention and the Cache through Python, against a NumPy float64 reference."""

import numpy as np
import pytest

import kvpage
from kvpage import Cache, Context, Format, Isa, Pool, Store, Table

H, QH, D = 2, 8, 64


def reference(q, k, v, scale, causal=True):
    """float64 attention: q [rows][QH][D] are the last rows of a sequence of len(k) tokens."""
    rows, n = q.shape[0], k.shape[0]
    out = np.zeros(q.shape)
    g = QH // H
    for i in range(rows):
        pos = n - rows + i
        hi = pos + 1 if causal else n
        for h in range(QH):
            s = (k[:hi, h // g].astype(np.float64) @ q[i, h].astype(np.float64)) * scale
            w = np.exp(s - s.max())
            w /= w.sum()
            out[i, h] = w @ v[:hi, h // g].astype(np.float64)
    return out


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("fmt,tol", [("fp32", 1e-5), ("fp16", 2e-3), ("int8", 3e-2)])
def test_cache_decode_loop_matches_reference(fmt, tol):
    rng = np.random.default_rng(0)
    with Cache(layers=2, kv_heads=H, head_dim=D, num_pages=64, page_size=16, k_format=fmt,
               v_format=fmt, max_seqs=4, threads=2) as c:
        s = c.create()
        hist_k = {0: [], 1: []}
        hist_v = {0: [], 1: []}
        for new in (37, 1, 1, 1, 5, 1):
            rows = c.begin_step([s], [new], rng.integers(0, 1000, new))
            assert rows == new
            for layer in (0, 1):
                k = rng.normal(size=(new, H, D)).astype(np.float32)
                v = rng.normal(size=(new, H, D)).astype(np.float32)
                c.write(layer, k, v)
                hist_k[layer].append(k)
                hist_v[layer].append(v)
                q = rng.normal(size=(new, QH, D)).astype(np.float32)
                out = c.attend(layer, q, sm_scale=0.125)
                ref = reference(q, np.concatenate(hist_k[layer]), np.concatenate(hist_v[layer]), 0.125)
                assert rel(out, ref) < tol
        assert c.length(s) == 46
        assert c.stats()["live_tokens"] == 46


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


def test_wrong_arrays_are_value_errors():
    with Cache(layers=1, kv_heads=H, head_dim=D, num_pages=8, page_size=16, max_seqs=2) as c:
        s = c.create()
        c.begin_step([s], [2])
        good = np.zeros((2, H, D), np.float32)
        with pytest.raises(ValueError, match="float32 or float16"):
            c.write(0, good.astype(np.float64), good)
        with pytest.raises(ValueError, match="shape"):
            c.write(0, np.zeros((2, H, D + 1), np.float32), good)
        with pytest.raises(ValueError, match="rows"):
            c.write(0, np.zeros((3, H, D), np.float32), good)
        with pytest.raises(ValueError, match="contiguous"):
            c.write(0, np.zeros((2, D, H), np.float32).transpose(0, 2, 1), good)
        with pytest.raises(ValueError, match="same dtype"):
            c.write(0, good, good.astype(np.float16))
        with pytest.raises(ValueError, match="NumPy"):
            c.write(0, [[0.0]], good)
        c.write(0, good, good)
        ro = np.zeros((2, QH, D), np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            c.attend(0, np.zeros((2, QH, D), np.float32), out=ro)
        # strided rows with contiguous elements are fine (no copy)
        big = np.zeros((2, 2 * H, D), np.float32)
        c.write(0, big[:, :H], big[:, H:])


def test_cache_errors_and_lifetime():
    with pytest.raises(kvpage.InvalidArgument, match="num_pages or kv_budget"):
        Cache(layers=1, kv_heads=H, head_dim=D)
    c = Cache(layers=1, kv_heads=H, head_dim=D, kv_budget="1MiB", k_format="int8", max_seqs=2)
    s = c.create()
    with pytest.raises(kvpage.BadState):
        c.write(0, np.zeros((0, H, D), np.float32), np.zeros((0, H, D), np.float32))
    with pytest.raises(kvpage.NoSpace, match="batch index 0"):
        c.begin_step([s], [1 << 20])
    store = c.store
    c.close()
    assert store.closed
    with pytest.raises(kvpage.Closed):
        c.create()


def test_example_script_runs():
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=str(repo / "bindings" / "python"))
    r = subprocess.run([sys.executable, str(repo / "examples" / "python" / "decode_loop.py")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "step 5" in r.stdout and "utilization" in r.stdout


def test_cache_swap_round_trip():
    rng = np.random.default_rng(5)
    with Cache(layers=1, kv_heads=H, head_dim=D, num_pages=8, page_size=16, max_seqs=2,
               host_bytes="1MiB") as c:
        s = c.create()
        c.begin_step([s], [40])
        k = rng.normal(size=(40, H, D)).astype(np.float32)
        v = rng.normal(size=(40, H, D)).astype(np.float32)
        c.write(0, k, v)
        q = rng.normal(size=(40, QH, D)).astype(np.float32)
        before = c.attend(0, q, sm_scale=0.125)
        c.swap_out(s)
        assert c.stats()["used_pages"] == 0
        with pytest.raises(kvpage.BadState):
            c.swap_out(s)
        c.swap_in(s)
        c.begin_step([s], [1])
        c.write(0, k[:1], v[:1])
        after = c.attend(0, q[-1:], sm_scale=0.125)
        ref = reference(q[-1:], np.concatenate([k, k[:1]]), np.concatenate([v, v[:1]]), 0.125)
        assert rel(after, ref) < 2e-3
        assert before.shape == (40, QH, D)
