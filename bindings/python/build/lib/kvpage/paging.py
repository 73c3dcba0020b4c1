"""Pages: the pool of page ids and the page table that maps sequences onto them.

A thin layer over ``kvp_pool_t`` and ``kvp_table_t`` (see docs/paging.md), enough
to drive the host tier (:mod:`kvpage.tier`) from Python: sequences, appends with
their slots and page operations, forks, reservations and statistics.
"""

from __future__ import annotations

import ctypes
import enum
import weakref
from dataclasses import dataclass
from typing import Optional, Sequence

from . import _lib
from ._handle import Handle
from .errors import check, errbuf, error_for

L = _lib.lib


class OpKind(enum.IntEnum):
    """What a page operation asks the storage to do (``kvp_page_op_kind``)."""

    COPY = 0
    SEAL = 1
    UNSEAL = 2
    SWAP_OUT = 3
    SWAP_IN = 4


@dataclass(frozen=True)
class PageOp:
    """One page operation (``kvp_page_op_t``). For SWAP_OUT ``dst`` is a host
    slot, for SWAP_IN ``src`` is; ``row`` is then the chunk of the page."""

    kind: OpKind
    src: int
    dst: int
    count: int
    row: int


def _ops(arr, n: int) -> list[PageOp]:
    return [PageOp(OpKind(arr[i].kind), arr[i].src, arr[i].dst, arr[i].count, arr[i].row)
            for i in range(n)]


class _Owner(Handle):
    """A handle in a chain pool -> table -> tier: each is destroyed only after
    the objects built on it, whatever order they are closed or collected in.

    A child holds its parent (so the parent outlives it); the parent knows its
    children weakly and counts them. Closing the parent closes the children
    it can see first. When the garbage collector finalizes a parent before a
    child (in a reference cycle its weak references are already cleared), the
    parent's destruction is deferred until its last child is destroyed.
    """

    def __init__(self, ptr, destroy, parent: "Optional[_Owner]" = None):
        super().__init__(ptr, destroy)
        self._dependents: "weakref.WeakSet[_Owner]" = weakref.WeakSet()
        self._live_children = 0
        self._deferred = False
        self._parent = parent
        if parent is not None:
            parent._dependents.add(self)
            parent._live_children += 1

    def close(self) -> None:
        if getattr(self, "_ptr", None) is None:
            return
        for d in list(self._dependents):
            d.close()
        if self._live_children > 0:  # children being collected: destroy after them
            self._deferred = True
            return
        super().close()
        parent = self._parent
        if parent is not None:
            parent._live_children -= 1
            if parent._deferred and parent._live_children == 0:
                parent._deferred = False
                parent.close()


class Pool(_Owner):
    """``kvp_pool_t``: page ids, reference counts and the prefix cache.

    ``num_staging`` staging pages are needed when keys are int8 or int4
    (:attr:`kvpage.Layout.needs_staging`). Closing the pool closes its tables.
    """

    def __init__(self, num_pages: int, page_size: int = 16, num_staging: int = 0,
                 prefix_cache: bool = True):
        p = _lib.new_struct(_lib.PoolParamsC)
        L.kvp_pool_params_init(ctypes.byref(p))
        p.num_pages, p.page_size, p.num_staging = num_pages, page_size, num_staging
        p.prefix_cache = 1 if prefix_cache else 0
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(L.kvp_pool_create(ctypes.byref(p), ctypes.byref(ptr), err, len(err)), err)
        super().__init__(ptr, L.kvp_pool_destroy)
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_staging = num_staging

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise error_for(rc, L.kvp_pool_last_error(self._p()).decode())

    def stats(self) -> dict:
        """Counters (``kvp_pool_stats_t``) as a dict."""
        s = _lib.new_struct(_lib.PoolStatsC)
        self._check(L.kvp_pool_stats(self._p(), ctypes.byref(s)))
        return {n: getattr(s, n) for n, _ in s._fields_ if n != "struct_size"}

    def refcount(self, page: int) -> int:
        """References held on a page (0 when free or only cached)."""
        out = ctypes.c_int32()
        self._check(L.kvp_pool_refcount(self._p(), page, ctypes.byref(out)))
        return out.value

    def evict(self, max_pages: int = 2**31 - 1) -> int:
        """Evict up to ``max_pages`` cached pages now; returns how many."""
        out = ctypes.c_int32()
        self._check(L.kvp_pool_evict(self._p(), max_pages, ctypes.byref(out)))
        return out.value


@dataclass(frozen=True)
class Appended:
    """What an append returns: each row's slot and the operations to run first."""

    slots: list[int]
    ops: list[PageOp]


class Table(_Owner):
    """``kvp_table_t``: sequences mapped onto a pool's pages.

    The table keeps its pool alive; closing the table closes its host tier.
    """

    def __init__(self, pool: Pool, max_seqs: int = 0):
        p = _lib.new_struct(_lib.TableParamsC)
        L.kvp_table_params_init(ctypes.byref(p))
        p.max_seqs = max_seqs
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(L.kvp_table_create(pool._p(), ctypes.byref(p), ctypes.byref(ptr), err, len(err)),
              err)
        super().__init__(ptr, L.kvp_table_destroy, parent=pool)
        self.pool = pool

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise error_for(rc, L.kvp_table_last_error(self._p()).decode())

    def create_seq(self, priority: int = 0, salt: int = 0) -> int:
        """A new empty sequence; returns its id."""
        p = _lib.new_struct(_lib.SeqParamsC)
        L.kvp_seq_params_init(ctypes.byref(p))
        p.priority, p.salt = priority, salt
        out = ctypes.c_int32()
        self._check(L.kvp_table_seq_create(self._p(), ctypes.byref(p), ctypes.byref(out)))
        return out.value

    def release(self, seq: int) -> None:
        """Release a resident sequence (its id becomes invalid)."""
        self._check(L.kvp_table_seq_release(self._p(), seq))

    def reserve(self, seq: int, n: int) -> None:
        """Guarantee room for ``n`` more tokens (sets the reservation)."""
        self._check(L.kvp_table_reserve(self._p(), seq, n))

    def append(self, seq: int, n: Optional[int] = None,
               tokens: Optional[Sequence[int]] = None) -> Appended:
        """Append ``n`` tokens (or ``tokens``, whose ids feed the prefix cache)."""
        if tokens is not None:
            if n is not None and n != len(tokens):
                raise ValueError("n and len(tokens) differ")
            n = len(tokens)
        if n is None:
            raise TypeError("append needs n or tokens")
        tok = (ctypes.c_int32 * n)(*tokens) if tokens is not None else None
        slots = (ctypes.c_int64 * max(n, 1))()
        cap = n // self.pool.page_size + 2
        ops = (_lib.PageOpC * cap)()
        nops = ctypes.c_int32()
        self._check(L.kvp_table_append(self._p(), seq, n, tok, slots, ops, cap,
                                       ctypes.byref(nops)))
        return Appended([slots[i] for i in range(n)], _ops(ops, nops.value))

    def fork(self, seq: int) -> tuple[int, list[PageOp]]:
        """A child sharing every page of ``seq``; returns (child, ops)."""
        child = ctypes.c_int32()
        ops = (_lib.PageOpC * 1)()
        nops = ctypes.c_int32()
        self._check(L.kvp_table_fork(self._p(), seq, ctypes.byref(child), ops, 1,
                                     ctypes.byref(nops)))
        return child.value, _ops(ops, nops.value)

    def seq_info(self, seq: int) -> dict:
        """``kvp_seq_info_t`` as a dict (``swapped`` is a bool)."""
        s = _lib.new_struct(_lib.SeqInfoC)
        self._check(L.kvp_table_seq_info(self._p(), seq, ctypes.byref(s)))
        d = {n: getattr(s, n) for n, _ in s._fields_ if n not in ("struct_size", "reserved_")}
        d["swapped"] = bool(d["swapped"])
        return d

    def seq_pages(self, seq: int) -> list[int]:
        """The sequence's page ids in token order (a partly filled staging page last)."""
        n = self.seq_info(seq)["num_pages"]
        arr = (ctypes.c_int32 * max(n, 1))()
        self._check(L.kvp_table_seq_pages(self._p(), seq, arr, n))
        return list(arr[:n])
