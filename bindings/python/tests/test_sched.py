"""The scheduler through Python: plans, invariants on a tiny engine model, errors, lifetime."""

import gc

import pytest

import kvpage
from kvpage import Action, Reason, Scheduler


def pages(n, page=16):
    return (n + page - 1) // page


def test_plan_prefill_then_decode():
    with Scheduler(page_size=16, total_pages=100, watermark_pages=0) as s:
        s.submit(1, prompt_tokens=40, max_new_tokens=3, priority=1)
        p = s.step(free_pages=100)
        assert [(i.id, i.start, i.tokens) for i in p.prefill] == [(1, 0, 40)]
        assert p.decode == []
        p = s.step(free_pages=100 - pages(40))
        assert p.decode == [1]
        p = s.step(free_pages=100 - pages(41))
        assert p.decode == [1]
        p = s.step(free_pages=100 - pages(42))
        assert p.finished == [1]
        st = s.stats()
        assert st["finished"] == 1 and st["running"] == 0 and st["steps"] == 4


def test_engine_model_never_overcommits():
    free = 60
    lens = {}
    with Scheduler(page_size=16, total_pages=60, hysteresis=2, page_bytes=100,
                   actions=Action.RECOMPUTE) as s:
        for i in range(20):
            s.submit(i, prompt_tokens=50 + i * 7, max_new_tokens=60, priority=i % 3)
        for _ in range(2000):
            p = s.step(free_pages=free)
            for rid in p.finished:
                free += pages(lens.pop(rid))
            for it in p.preempt:
                free += pages(lens.pop(it.id))
            for it in p.prefill:
                old = lens.get(it.id, 0)
                assert it.start == old
                free -= pages(old + it.tokens) - pages(old)
                lens[it.id] = old + it.tokens
                assert free >= 0
            for rid in p.decode:
                free -= pages(lens[rid] + 1) - pages(lens[rid])
                lens[rid] += 1
                assert free >= 0
            if not lens and s.stats()["waiting"] == 0:
                break
        assert s.stats()["finished"] == 20
        assert free == 60


def test_too_long_is_rejected_with_reason():
    with Scheduler(page_size=16, total_pages=4, watermark_pages=0) as s:
        s.submit(9, prompt_tokens=100, max_new_tokens=10)
        p = s.step(free_pages=4)
        assert p.reject == [kvpage.sched.Item(9, 0, 0, Reason.TOO_LONG)]


def test_errors_and_lifetime():
    with pytest.raises(kvpage.InvalidArgument, match="page_size"):
        Scheduler(page_size=0, total_pages=10)
    with pytest.raises(TypeError, match="bogus"):
        Scheduler(page_size=16, total_pages=10, bogus=1)
    s = Scheduler(page_size=16, total_pages=10, max_requests=1)
    s.submit(1, 10, 10)
    with pytest.raises(kvpage.InvalidArgument, match="already live"):
        s.submit(1, 10, 10)
    with pytest.raises(kvpage.NoSpace, match="table full"):
        s.submit(2, 10, 10)
    with pytest.raises(kvpage.NotFound):
        s.finish(77)
    with pytest.raises(kvpage.InvalidArgument):
        s.step(free_pages=-1)
    s.close()
    assert s.closed
    s.close()  # idempotent
    with pytest.raises(kvpage.Closed):
        s.step(free_pages=1)
    with pytest.raises(kvpage.Closed):
        with s:
            pass
    # destroyed by the garbage collector when dropped
    t = Scheduler(page_size=16, total_pages=10)
    del t
    gc.collect()
