"""Pool and table through Python: pages, sequences, prefix cache, export, errors, lifetime."""

import gc

import numpy as np
import pytest

import kvpage
from kvpage import OpKind, Pool, Table


def test_pool_alloc_release_all_or_nothing():
    with Pool(num_pages=8, page_size=16) as pool:
        pages = pool.alloc(5)
        assert pages.dtype == np.int32 and len(set(pages.tolist())) == 5
        assert all(pool.refcount(int(p)) == 1 for p in pages)
        with pytest.raises(kvpage.NoSpace):
            pool.alloc(4)
        assert pool.stats()["free_pages"] == 3  # unchanged by the failure
        pool.release(pages)
        assert pool.stats()["free_pages"] == 8
        with pytest.raises(kvpage.InvalidArgument):
            pool.release([999])


def test_pool_from_plan_has_the_planned_pages():
    plan = kvpage.plan(layers=32, kv_heads=8, head_dim=128, kv_budget="1GiB", context=2048,
                       format="int8")
    with Pool.from_plan(plan) as pool:
        st = pool.stats()
        assert st["total_pages"] == plan.num_pages
        assert st["total_staging"] == plan.num_staging == plan.max_seqs


def test_sequence_lifecycle_slots_and_export():
    pool = Pool(num_pages=64, page_size=4)
    t = Table(pool)
    a = t.create()
    t.reserve(a, 10)
    slots, ops = t.append(a, np.arange(10, dtype=np.int32))
    assert ops == []
    pages = t.pages(a)
    assert len(pages) == 3
    expect = [int(pages[i // 4]) * 4 + i % 4 for i in range(10)]
    assert slots.tolist() == expect
    b, ops = t.fork(a)
    assert ops == []  # pool pages are shared, nothing to copy yet
    # appending to the fork copies the shared, partly filled last page first
    s2, ops = t.append(b, [99])
    assert [o.kind for o in ops] == [OpKind.COPY]
    assert ops[0].src == pages[2]
    e = t.export([a, b], num_new=[0, 1])
    assert e.indptr.tolist() == [0, 3, 6]
    assert e.last_page_len.tolist() == [2, 3]
    assert e.indices[:3].tolist() == pages.tolist()
    assert e.slot_mapping.tolist() == s2.tolist()
    assert e.qo_indptr.tolist() == [0, 0, 1]
    assert e.view.batch == 2 and e.view.page_size == 4
    assert e.view.indices[4] == e.indices[4]  # the view points at the NumPy buffers
    assert t.truncate(a, 5) == []
    assert t.length(a) == 5
    t.release(a)
    t.release(b)
    with pytest.raises(kvpage.NotFound):
        t.release(a)
    t.close()
    pool.close()


def test_prefix_cache_reuse_and_events():
    with Pool(num_pages=32, page_size=4) as pool:
        pool.record_events()
        t = Table(pool)
        prompt = np.arange(100, 112, dtype=np.int32)  # 3 full pages
        a = t.create()
        t.reserve(a, 12)
        t.append(a, prompt)
        t.release(a)
        stored = [e for e in pool.events() if e.kind == kvpage.EventKind.STORED]
        assert len(stored) == 3
        b = t.create()
        assert t.lookup_prefix(prompt) == 12
        matched = t.attach_prefix(b, prompt)
        assert matched in (8, 12)  # the last token may be left for recompute
        assert pool.stats()["prefix_hit_tokens"] == matched
        assert t.length(b) == matched


def test_bad_arrays_are_value_errors():
    with Pool(num_pages=8, page_size=4) as pool:
        t = Table(pool)
        s = t.create()
        t.reserve(s, 8)
        with pytest.raises(ValueError, match="integers"):
            t.append(s, np.zeros(3, dtype=np.float32))
        with pytest.raises(ValueError, match="one-dimensional"):
            t.append(s, np.zeros((2, 2), dtype=np.int32))
        with pytest.raises(ValueError, match="outside int32"):
            t.append(s, np.array([2**40], dtype=np.int64))
        with pytest.raises(ValueError, match="outside int32"):
            t.append(s, [2**33])
        # a non-contiguous int32 view is accepted by making it contiguous once
        v = np.arange(8, dtype=np.int32)[::2]
        t.append(s, v)
        assert t.length(s) == 4
        with pytest.raises(ValueError, match="entries"):
            t.export([s], num_new=[1, 2])


def test_table_keeps_pool_alive_and_closing_pool_closes_tables():
    pool = Pool(num_pages=8, page_size=4)
    t = Table(pool)
    del pool
    gc.collect()
    s = t.create()  # the pool is still alive through the table
    t.reserve(s, 4)
    pool = t.pool
    pool.close()
    assert t.closed
    with pytest.raises(kvpage.Closed):
        t.create()
    with pytest.raises(kvpage.Closed):
        pool.alloc(1)


def test_errors_carry_detail():
    with pytest.raises(kvpage.InvalidArgument) as e:
        Pool(num_pages=0)
    assert "num_pages" in e.value.detail
    with Pool(num_pages=4, page_size=4) as pool:
        t = Table(pool)
        with pytest.raises(kvpage.NotFound):
            t.reserve(12345, 1)
        s = t.create()
        with pytest.raises(kvpage.NoSpace):
            t.reserve(s, 100)
        with pytest.raises(kvpage.InvalidArgument):
            t.truncate(s, 5)
