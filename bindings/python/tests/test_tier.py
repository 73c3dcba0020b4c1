"""The host tier through Python: bit-exact round trips through page I/O and
through operations, shared pages, a full tier, errors and lifetime."""

import gc
import random

import pytest

import kvpage
from kvpage import HostFull, OpKind, Pool, Table, Tier


class FakeStorage:
    """Every page's bytes, as a storage keeps them; implements page I/O."""

    def __init__(self, layout, num_pages, num_staging, seed=1):
        rnd = random.Random(seed)
        self.num_pages = num_pages
        self.pages = [bytearray(rnd.randbytes(layout.page_bytes)) for _ in range(num_pages)]
        self.pages += [bytearray(rnd.randbytes(layout.staging_page_bytes))
                       for _ in range(num_staging)]
        self.copies = 0
        self.fail = None

    def copy_to_host(self, page, offset, dst):
        if self.fail:
            raise self.fail
        dst[:] = self.pages[page][offset:offset + len(dst)]
        self.copies += 1

    def copy_from_host(self, page, offset, src):
        if self.fail:
            raise self.fail
        self.pages[page][offset:offset + len(src)] = src
        self.copies += 1

    def run(self, ops, host, slot_bytes):
        for op in ops:
            size = len(self.pages[op.src if op.kind == OpKind.SWAP_OUT else op.dst])
            off = op.row * slot_bytes
            n = min(slot_bytes, size - off)
            if op.kind == OpKind.SWAP_OUT:
                host[op.dst * slot_bytes:op.dst * slot_bytes + n] = self.pages[op.src][off:off + n]
            elif op.kind == OpKind.SWAP_IN:
                self.pages[op.dst][off:off + n] = host[op.src * slot_bytes:op.src * slot_bytes + n]
            else:
                raise AssertionError(op)

    def scribble(self, pages):
        for p in pages:
            self.pages[p][:] = bytes(len(self.pages[p]))

    def content(self, table, seq):
        return [bytes(self.pages[p]) for p in list(table.pages(seq))]


def make(k="int8", v="int4", pages=32, staging=4, slots=32, io=True):
    layout = kvpage.layout(2, 2, 64, page_size=4, k_format=k, v_format=v)
    staging = staging if layout.needs_staging else 0
    pool = Pool(pages, page_size=4, num_staging=staging)
    table = Table(pool, max_seqs=8)
    store = FakeStorage(layout, pages, staging)
    slot = -(-layout.page_bytes // 256) * 256
    tier = Tier(table, slots * slot, layout, page_io=store if io else None)
    return layout, pool, table, store, tier


@pytest.mark.parametrize("io", [True, False])
@pytest.mark.parametrize("k,v", [("fp16", "fp16"), ("int8", "int8"), ("int4", "int4"),
                                 ("int8", "int4")])
def test_round_trip_is_bit_exact(io, k, v):
    layout, pool, table, store, tier = make(k, v, io=io)
    s = table.create()
    table.append(s, list(range(100, 110)))  # 2 full pages + 2 tokens
    child, _ = table.fork(s)
    before = store.content(table, s)
    pages = list(table.pages(s))
    ops = tier.swap_out(s)
    st = tier.stats()
    if io:
        assert ops == []
    else:
        assert all(op.kind == OpKind.SWAP_OUT for op in ops)
        store.run(ops, tier.host_memory(), st["slot_bytes"])
    assert table.info(s)["swapped"]
    assert tier.seq_info(s)["swapped"]
    with pytest.raises(kvpage.BadState, match="swapped out"):
        table.append(s, [1])
    with pytest.raises(kvpage.BadState):
        table.reserve(s, 1)
    with pytest.raises(kvpage.BadState):
        table.fork(s)
    # the fork's pages were never copied nor freed
    assert pool.refcount(pages[0]) == 2
    table.release(child)
    store.scribble(p for p in range(pool.num_pages + pool.num_staging)
                   if p >= pool.num_pages or pool.refcount(p) == 0)
    ops = tier.swap_in(s)
    if not io:
        store.run(ops, tier.host_memory(), st["slot_bytes"])
    assert store.content(table, s) == before
    assert tier.stats()["free_slots"] == st["total_slots"]
    table.append(s, list(range(3)))  # usable again


def test_host_full_changes_nothing():
    layout, pool, table, store, tier = make(slots=2)
    s = table.create()
    table.append(s, list(range(13)))
    info, stats, pstats = table.info(s), tier.stats(), pool.stats()
    with pytest.raises(HostFull, match="host slots") as e:
        tier.swap_out(s)
    assert e.value.status == -10 and e.value.name == "KVP_EHOSTFULL"
    assert table.info(s) == info
    assert tier.stats() == stats
    assert pool.stats() == pstats
    tier.drop(s)
    with pytest.raises(kvpage.NotFound):
        table.info(s)


def test_page_io_errors_become_exceptions():
    layout, pool, table, store, tier = make()
    s = table.create()
    table.append(s, list(range(9)))
    before = store.content(table, s)
    store.fail = kvpage.CudaError(-7, "device lost")
    with pytest.raises(kvpage.CudaError, match="page I/O failed"):
        tier.swap_out(s)
    store.fail = ZeroDivisionError("a bug in the storage")
    with pytest.raises(ZeroDivisionError):
        tier.swap_out(s)
    assert not table.info(s)["swapped"]
    store.fail = None
    tier.swap_out(s)
    store.fail = kvpage.CudaError(-7, "device lost")
    with pytest.raises(kvpage.CudaError):
        tier.swap_in(s)
    assert table.info(s)["swapped"]  # still safe on the host
    store.fail = None
    tier.swap_in(s)
    assert store.content(table, s) == before


def test_bad_input_and_lifetime():
    layout, pool, table, store, tier = make()
    s = table.create()
    with pytest.raises(kvpage.BadState, match="resident"):
        tier.swap_in(s)
    with pytest.raises(kvpage.NotFound):
        tier.swap_out(12345)
    tier.swap_out(s)
    with pytest.raises(kvpage.BadState, match="already swapped out"):
        tier.swap_out(s)
    with pytest.raises(kvpage.BadState, match="already has"):
        Tier(table, 1 << 20, layout)
    other = kvpage.layout(2, 2, 64, page_size=8, k_format="int8", v_format="int4")
    with pytest.raises(kvpage.InvalidArgument, match="page size"):
        Tier(Table(Pool(8, page_size=4, num_staging=2)), 1 << 20, other)
    # closing the pool closes the table and its tier, each exactly once
    pool.close()
    assert table.closed and tier.closed
    with pytest.raises(kvpage.Closed):
        tier.stats()
    t2 = make()[4]
    del t2
    gc.collect()


def test_collected_in_any_order():
    """Reference cycles hand the whole chain to the garbage collector at once,
    in no particular order: each object is still destroyed after its children."""
    for _ in range(20):
        layout, pool, table, store, tier = make()
        s = table.create()
        table.append(s, list(range(9)))
        tier.swap_out(s)
        pool.cycle = (pool, table, tier)  # a cycle through all three
        store.tier = tier
        del layout, pool, table, store, tier, s
        gc.collect()
