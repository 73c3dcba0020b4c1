"""The Cache façade through Python: the decode loop against a NumPy float64
reference, the step's view, the parts, array checking, errors and lifetime."""

import gc

import numpy as np
import pytest

import kvpage
from kvpage import Cache, Isa, Pool, Store, Table, Tier

from _reference import D, H, QH, reference, rel


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


def _expected_csr(cache, seqs):
    """indptr, indices, last_page_len of the sequences, from the table."""
    indptr, indices, last = [0], [], []
    for s in seqs:
        pages = cache.table.pages(s)
        indices += pages.tolist()
        indptr.append(len(indices))
        info = cache.info(s)
        last.append(info["last_page_len"])
    return indptr, indices, last


@pytest.mark.parametrize("fmt", ["fp16", "int8"])
def test_step_view_is_the_steps_batch(fmt):
    rng = np.random.default_rng(7)
    with Cache(layers=1, kv_heads=H, head_dim=D, num_pages=32, page_size=16, k_format=fmt,
               v_format=fmt, max_seqs=4, isa=Isa.PORTABLE) as c:
        with pytest.raises(kvpage.BadState, match="no step"):
            c.step_view()
        a, b = c.create(), c.create()
        rows = c.begin_step([a, b], [37, 5])
        view = c.step_view()
        assert (view.batch, view.page_size, view.rows) == (2, 16, rows) == (2, 16, 42)
        assert view.num_pages == 32 and view.num_staging == (4 if fmt == "int8" else 0)
        indptr, indices, last = _expected_csr(c, [a, b])
        assert view.indptr.tolist() == indptr
        assert view.indices.tolist() == indices
        assert view.last_page_len.tolist() == last == [37 - 32, 5]
        assert view.qo_indptr.tolist() == [0, 37, 42]
        assert view.indptr.dtype == np.int32 and view.slots.dtype == np.int64
        # the slots are the rows' places: page * page_size + offset, in token order
        pages_a = c.table.pages(a)
        assert view.slots[:37].tolist() == [int(pages_a[i // 16]) * 16 + i % 16
                                           for i in range(37)]
        assert not view.indices.flags.writeable  # the cache's own buffers
        # the view drives the cache's context directly, as an engine's kernels would
        k = rng.normal(size=(rows, H, D)).astype(np.float32)
        v = rng.normal(size=(rows, H, D)).astype(np.float32)
        q = rng.normal(size=(rows, QH, D)).astype(np.float32)
        c.write(0, k, v)
        want = c.attend(0, q)
        got = c.context.attention(c.store, view, 0, q)
        assert np.array_equal(got, want)
        c.begin_step([b], [1])
        view2 = c.step_view()
        assert view2.batch == 1 and view2.rows == 1 and view2.qo_indptr.tolist() == [0, 1]
        assert view2.last_page_len.tolist() == [6]


def test_parts_are_the_caches_own():
    c = Cache(layers=2, kv_heads=H, head_dim=D, num_pages=16, page_size=8, max_seqs=3,
              threads=2, isa=Isa.PORTABLE)
    assert isinstance(c.store, Store) and isinstance(c.pool, Pool)
    assert isinstance(c.table, Table) and c.tier is None
    assert c.store is c.store  # made once
    assert c.store.info().num_pages == 16 and c.store.page_size == 8
    assert (c.store.layers, c.store.kv_heads, c.store.head_dim) == (2, H, D)
    assert c.context.info().threads == 2 and c.context.isa == Isa.PORTABLE
    assert c.pool.num_pages == 16 and c.pool.page_size == 8
    s = c.create(priority=3, salt=9)
    c.begin_step([s], [11])
    info = c.info(s)
    assert info["length"] == 11 == c.length(s) == c.table.length(s)
    assert info["priority"] == 3 and info["salt"] == 9
    assert c.pool.stats() == c.stats()
    assert c.stats()["live_tokens"] == 11
    parts = [c.store, c.pool, c.table, c.context]
    c.close()
    assert all(p.closed for p in parts)
    with pytest.raises(kvpage.Closed):
        c.store
    with pytest.raises(kvpage.Closed):
        c.length(s)


def test_a_part_keeps_its_cache_alive():
    store = Cache(layers=1, kv_heads=H, head_dim=D, num_pages=4, max_seqs=1).store
    gc.collect()
    assert store.info().num_pages == 4
    table = Cache(layers=1, kv_heads=H, head_dim=D, num_pages=4, max_seqs=1).table
    gc.collect()
    s = table.pool.stats()
    assert s["total_pages"] == 4


def test_host_tier_part():
    with Cache(layers=1, kv_heads=H, head_dim=D, num_pages=8, page_size=16, max_seqs=2,
               host_bytes="1MiB") as c:
        assert isinstance(c.tier, Tier)
        s = c.create()
        c.begin_step([s], [20])
        z = np.zeros((20, H, D), np.float32)
        c.write(0, z, z)
        c.swap_out(s)
        assert c.tier.seq_info(s)["swapped"] and c.info(s)["swapped"]
        assert c.tier.stats()["swapped_tokens"] == 20
        c.swap_in(s)
        assert not c.info(s)["swapped"] and c.length(s) == 20


def test_default_softmax_scale():
    rng = np.random.default_rng(8)
    with Cache(layers=1, kv_heads=H, head_dim=D, num_pages=8, k_format="fp32",
               v_format="fp32", max_seqs=1) as c:
        s = c.create()
        c.begin_step([s], [9])
        k = rng.normal(size=(9, H, D)).astype(np.float32)
        v = rng.normal(size=(9, H, D)).astype(np.float32)
        q = rng.normal(size=(9, QH, D)).astype(np.float32)
        c.write(0, k, v)
        assert np.array_equal(c.attend(0, q), c.attend(0, q, sm_scale=D ** -0.5))
        assert rel(c.attend(0, q), reference(q, k, v, D ** -0.5)) < 1e-5
