"""The paging layers: a page pool and a page table (sequences as integer ids).

Arrays cross the boundary without copies: token ids are passed by pointer
from NumPy arrays (or converted once from lists), and the batch export fills
NumPy arrays the caller keeps, which the kernels can read directly.
"""

from __future__ import annotations

import ctypes
import enum
import weakref
from dataclasses import dataclass
from typing import Optional, cast

import numpy as np
import numpy.typing as npt

from . import _lib
from ._arrays import IntArray
from ._handle import Handle
from .errors import check, errbuf, error_for
from .plan import Plan

L = _lib.lib

_i32p = ctypes.POINTER(ctypes.c_int32)
_i64p = ctypes.POINTER(ctypes.c_int64)


class OpKind(enum.IntEnum):
    """What a page operation asks the storage to do (``kvp_page_op_kind``)."""

    COPY = 0
    SEAL = 1
    UNSEAL = 2
    SWAP_OUT = 3  # host tier: device page -> host slot (see kvpage.tier)
    SWAP_IN = 4   # host tier: host slot -> device page


@dataclass(frozen=True)
class PageOp:
    """A data movement the table (or the host tier) asks the storage to perform
    (``kvp_page_op_t``). For SWAP_OUT ``dst`` is a host slot, for SWAP_IN
    ``src`` is; ``row`` is then the chunk of the page."""

    kind: OpKind
    src: int
    dst: int
    count: int
    row: int


class EventKind(enum.IntEnum):
    """Pool events: a page stored in the prefix cache, evicted from it, or
    freed; and the events a cache adds (:meth:`kvpage.Cache.set_event_callback`):
    a page's blob stored in or removed from a tier, the prefix cache cleared."""

    STORED = 0
    EVICTED = 1
    FREED = 2
    TIER_STORED = 16   #: a cache wrote the page's blob to a tier
    TIER_REMOVED = 17  #: a cache removed a rejected blob from a tier
    CLEARED = 18       #: the prefix cache was emptied (:meth:`kvpage.Cache.clear_prefix`)


@dataclass(frozen=True)
class PoolEvent:
    kind: EventKind
    page: int
    parent: int
    priority: int
    hash: int


def as_i32(values: IntArray, what: str) -> npt.NDArray[np.int32]:
    """A C-contiguous int32 array: an int32 NumPy array is used as is (no copy);
    other NumPy arrays must be integer and are refused if they would lose bits;
    lists are converted once."""
    if isinstance(values, np.ndarray):
        if values.dtype == np.int32 and values.flags.c_contiguous and values.ndim == 1:
            return cast("npt.NDArray[np.int32]", values)
        if values.ndim != 1:
            raise ValueError(f"{what} must be one-dimensional, got shape {values.shape}")
        if values.dtype.kind not in "iu":
            raise ValueError(f"{what} must hold integers, got dtype {values.dtype}")
        out = values.astype(np.int32)
        if not np.array_equal(out, values):
            raise ValueError(f"{what} holds values outside int32")
        return np.ascontiguousarray(out)
    out = np.asarray(list(values), dtype=np.int64)
    if out.ndim != 1:
        raise ValueError(f"{what} must be a flat sequence of integers")
    if out.size and (out.min() < -(2**31) or out.max() >= 2**31):
        raise ValueError(f"{what} holds values outside int32")
    return out.astype(np.int32)


def _ptr(a: np.ndarray, ctype):
    return a.ctypes.data_as(ctypes.POINTER(ctype)) if a.size else None


def _ops(buf, n) -> list[PageOp]:
    return [PageOp(OpKind(buf[i].kind), buf[i].src, buf[i].dst, buf[i].count, buf[i].row)
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
    """``kvp_pool_t``: page ids with reference counts and a prefix cache.

    Create it from a page count (``Pool(num_pages=4096)``) or from a plan
    (``Pool.from_plan(kvpage.plan(...))``) so it holds exactly the pages the
    planner promised.

    Args:
        num_pages: pool pages (required, >= 1; ids 0 .. num_pages-1).
        page_size: tokens per page; default 16.
        num_staging: fp16 staging pages (layouts with int8/int4 keys; ids from
            num_pages on); default 0.
        prefix_cache: keep full pages for prefix reuse after their sequences
            end; default True.
        hash_seed: prefix hash seed; default 0 (set it from a secret when
            prompts come from untrusted users).
    """

    def __init__(self, num_pages: int = 0, page_size: int = 16, num_staging: int = 0,
                 prefix_cache: bool = True, hash_seed: int = 0, *, _plan: Optional[Plan] = None):
        p = _lib.new_struct(_lib.PoolParamsC)
        L.kvp_pool_params_init(ctypes.byref(p))
        p.page_size = page_size
        p.num_pages = num_pages
        p.num_staging = num_staging
        p.prefix_cache = 1 if prefix_cache else 0
        p.hash_seed = hash_seed
        ptr = ctypes.c_void_p()
        err = errbuf()
        if _plan is None:
            check(L.kvp_pool_create(ctypes.byref(p), ctypes.byref(ptr), err, len(err)), err)
        else:
            c = _plan_to_c(_plan)
            check(L.kvp_pool_create_from_plan(ctypes.byref(c), ctypes.byref(p), ctypes.byref(ptr),
                                              err, len(err)), err)
        super().__init__(ptr, L.kvp_pool_destroy)
        self.page_size = page_size if _plan is None else _plan.page_size
        self.num_pages = num_pages if _plan is None else _plan.num_pages
        self.num_staging = num_staging if _plan is None else (
            _plan.num_staging if _plan.needs_staging else 0)
        self._events: list[PoolEvent] = []
        self._event_fn = None

    @classmethod
    def _borrow(cls, ptr: int, owner) -> "Pool":
        """A pool owned by ``owner`` (a cache): never destroyed from here."""
        p = cls.__new__(cls)
        _Owner.__init__(p, ctypes.c_void_p(ptr), lambda _p: None)
        p._owner = owner
        p._events, p._event_fn = [], None
        st = p.stats()
        p.page_size, p.num_pages = st["page_size"], st["total_pages"]
        p.num_staging = st["total_staging"]
        return p

    @classmethod
    def from_plan(cls, plan: Plan, prefix_cache: bool = True, hash_seed: int = 0) -> "Pool":
        """A pool with exactly the plan's pool and staging pages."""
        return cls(page_size=plan.page_size, prefix_cache=prefix_cache, hash_seed=hash_seed,
                   _plan=plan)

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise error_for(rc, L.kvp_pool_last_error(self._p()).decode())

    def alloc(self, n: int) -> npt.NDArray[np.int32]:
        """Allocate n pages, all or none (NoSpace, pool unchanged)."""
        out = np.empty(n, dtype=np.int32)
        self._check(L.kvp_pool_alloc(self._p(), n, _ptr(out, ctypes.c_int32)))
        return out

    def alloc_staging(self, n: int) -> npt.NDArray[np.int32]:
        """Allocate n staging pages (engines with their own page table)."""
        out = np.empty(n, dtype=np.int32)
        self._check(L.kvp_pool_alloc_staging(self._p(), n, _ptr(out, ctypes.c_int32)))
        return out

    def retain(self, pages: IntArray) -> None:
        """Add one engine reference to each page."""
        a = as_i32(pages, "pages")
        self._check(L.kvp_pool_retain(self._p(), a.size, _ptr(a, ctypes.c_int32)))

    def release(self, pages: IntArray) -> None:
        """Drop one engine reference from each page."""
        a = as_i32(pages, "pages")
        self._check(L.kvp_pool_release(self._p(), a.size, _ptr(a, ctypes.c_int32)))

    def refcount(self, page: int) -> int:
        out = ctypes.c_int32()
        self._check(L.kvp_pool_refcount(self._p(), page, ctypes.byref(out)))
        return out.value

    def evict(self, max_pages: int) -> int:
        """Evict up to max_pages cached pages now; returns how many."""
        out = ctypes.c_int32()
        self._check(L.kvp_pool_evict(self._p(), max_pages, ctypes.byref(out)))
        return out.value

    def stats(self) -> dict:
        """Pages, tokens, utilization and prefix-cache counters, as a dict."""
        s = _lib.new_struct(_lib.PoolStatsC)
        self._check(L.kvp_pool_stats(self._p(), ctypes.byref(s)))
        return {name: getattr(s, name) for name, _ in s._fields_
                if name not in ("struct_size",)}

    def record_events(self, on: bool = True) -> None:
        """Collect page stored / evicted / freed events (read them with events())."""
        if on:
            def fn(_opaque, ev):
                e = ev.contents
                self._events.append(PoolEvent(EventKind(e.kind), e.page, e.parent, e.priority,
                                              e.hash))
            self._event_fn = _lib.PoolEventFn(fn)
            self._check(L.kvp_pool_set_event_callback(self._p(), self._event_fn, None))
        else:
            self._check(L.kvp_pool_set_event_callback(self._p(), _lib.PoolEventFn(), None))
            self._event_fn = None

    def events(self) -> list[PoolEvent]:
        """Events collected since the last call."""
        out, self._events = self._events, []
        return out


def _plan_to_c(plan: Plan) -> _lib.PlanC:
    c = _lib.new_struct(_lib.PlanC)
    for name, _ in _lib.PlanC._fields_:
        if name in ("struct_size", "reserved_"):
            continue
        v = getattr(plan, name)
        setattr(c, name, int(v) if not isinstance(v, float) else v)
    return c


@dataclass
class Export:
    """A batch exported for kernels: NumPy arrays the library filled in place,
    and ``view`` (a ``kvp_kv_view_t``) pointing at them."""

    indptr: npt.NDArray[np.int32]         #: ``[batch+1]`` CSR offsets
    indices: npt.NDArray[np.int32]        #: page ids
    last_page_len: npt.NDArray[np.int32]  #: ``[batch]``
    slot_mapping: npt.NDArray[np.int64]   #: slots of each sequence's last ``num_new`` rows
    qo_indptr: npt.NDArray[np.int32]      #: ``[batch+1]`` offsets into slot_mapping
    view: _lib.KvViewC


class Table(_Owner):
    """``kvp_table_t``: sequences (integer ids) mapped onto a pool's pages.

    ``max_seqs`` is the number of sequence slots; 0 (the default) means the
    pool's staging page count in layouts with staging, else 4096.

    The table keeps its pool alive; closing the pool closes its tables, and
    closing a table closes its host tier (:class:`kvpage.Tier`) first.
    """

    def __init__(self, pool: Pool, max_seqs: int = 0):
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(L.kvp_table_create(pool._p(), max_seqs, ctypes.byref(ptr), err, len(err)), err)
        super().__init__(ptr, L.kvp_table_destroy, parent=pool)
        self.pool = pool  # keeps the pool alive while the table is
        self.page_size = pool.page_size

    @classmethod
    def _borrow(cls, ptr: int, pool: Pool, owner) -> "Table":
        """A table owned by ``owner`` (a cache): never destroyed from here."""
        t = cls.__new__(cls)
        _Owner.__init__(t, ctypes.c_void_p(ptr), lambda _p: None)
        t._owner = owner
        t.pool = pool
        t.page_size = pool.page_size
        return t

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise error_for(rc, L.kvp_table_last_error(self._p()).decode())

    def create(self, priority: int = 0, salt: int = 0) -> int:
        """A new, empty sequence; returns its id.

        Args:
            priority: eviction priority of the pages it fills (higher is kept
                longer once they are only cached); default 0.
            salt: prefix-cache namespace: sequences with different salts never
                share cached pages; default 0.
        """
        out = ctypes.c_int32()
        self._check(L.kvp_table_seq_create(self._p(), priority, salt, ctypes.byref(out)))
        return out.value

    def release(self, seq: int) -> None:
        """End a sequence; its full pages stay in the prefix cache."""
        self._check(L.kvp_table_seq_release(self._p(), seq))

    def reserve(self, seq: int, n: int) -> None:
        """Guarantee room for n more tokens (NoSpace: all or nothing)."""
        self._check(L.kvp_table_reserve(self._p(), seq, n))

    def _ops_buffer(self, n: int):
        cap = int(n) // max(self.page_size, 1) + 4
        return (_lib.PageOpC * cap)(), cap

    def append(self, seq: int, tokens: IntArray) -> tuple[npt.NDArray[np.int64], list[PageOp]]:
        """Append tokens (their ids feed the prefix cache); returns the new rows'
        slots (int64, page * page_size + offset) and the page ops to execute."""
        t = as_i32(tokens, "tokens")
        slots = np.empty(t.size, dtype=np.int64)
        ops, cap = self._ops_buffer(t.size)
        n_ops = ctypes.c_int32()
        self._check(L.kvp_table_append(self._p(), seq, t.size, _ptr(t, ctypes.c_int32),
                                       _ptr(slots, ctypes.c_int64), ops, cap,
                                       ctypes.byref(n_ops)))
        return slots, _ops(ops, n_ops.value)

    def truncate(self, seq: int, length: int) -> list[PageOp]:
        """Shorten a sequence (e.g. rejected speculative tokens)."""
        ops, cap = self._ops_buffer(0)
        n_ops = ctypes.c_int32()
        self._check(L.kvp_table_truncate(self._p(), seq, length, ops, cap, ctypes.byref(n_ops)))
        return _ops(ops, n_ops.value)

    def fork(self, seq: int) -> tuple[int, list[PageOp]]:
        """A child sharing every page of `seq`; returns (child id, page ops)."""
        ops, cap = self._ops_buffer(0)
        n_ops = ctypes.c_int32()
        child = ctypes.c_int32()
        self._check(L.kvp_table_fork(self._p(), seq, ctypes.byref(child), ops, cap,
                                     ctypes.byref(n_ops)))
        return child.value, _ops(ops, n_ops.value)

    def attach_prefix(self, seq: int, tokens: IntArray) -> int:
        """Attach the longest cached prefix of `tokens`; returns the tokens matched."""
        t = as_i32(tokens, "tokens")
        out = ctypes.c_int64()
        self._check(L.kvp_table_attach_prefix(self._p(), seq, _ptr(t, ctypes.c_int32), t.size,
                                              ctypes.byref(out)))
        return out.value

    def lookup_prefix(self, tokens: IntArray, salt: int = 0) -> int:
        """How many leading tokens are cached (read-only)."""
        t = as_i32(tokens, "tokens")
        out = ctypes.c_int64()
        self._check(L.kvp_table_lookup_prefix(self._p(), salt, _ptr(t, ctypes.c_int32), t.size,
                                              ctypes.byref(out)))
        return out.value

    def set_priority(self, seq: int, priority: int) -> None:
        self._check(L.kvp_table_set_priority(self._p(), seq, priority))

    def set_range_priority(self, seq: int, begin: int, end: int, priority: int) -> None:
        """Eviction priority of tokens [begin, end), e.g. to pin a system prompt."""
        self._check(L.kvp_table_set_range_priority(self._p(), seq, begin, end, priority))

    def info(self, seq: int) -> dict:
        """``kvp_seq_info_t`` as a dict; ``swapped`` is True while the sequence
        is in a host tier."""
        s = _lib.new_struct(_lib.SeqInfoC)
        self._check(L.kvp_table_seq_info(self._p(), seq, ctypes.byref(s)))
        d = {name: getattr(s, name) for name, _ in s._fields_
             if name not in ("struct_size", "reserved_")}
        d["swapped"] = bool(d["swapped"])
        return d

    def length(self, seq: int) -> int:
        return self.info(seq)["length"]

    def pages(self, seq: int) -> npt.NDArray[np.int32]:
        """The sequence's page ids in token order (a staging page last)."""
        n = self.info(seq)["num_pages"]
        out = np.empty(n, dtype=np.int32)
        self._check(L.kvp_table_seq_pages(self._p(), seq, _ptr(out, ctypes.c_int32), n))
        return out

    def export(self, seqs: IntArray, num_new: Optional[IntArray] = None) -> Export:
        """Export a batch: CSR page table plus the slot mapping of each sequence's
        last `num_new` rows, into fresh NumPy arrays the library fills in place."""
        s = as_i32(seqs, "seqs")
        nn = None if num_new is None else as_i32(num_new, "num_new")
        if nn is not None and nn.size != s.size:
            raise ValueError(f"num_new has {nn.size} entries for {s.size} sequences")
        n_idx, n_slots = ctypes.c_int64(), ctypes.c_int64()
        self._check(L.kvp_table_export_size(self._p(), _ptr(s, ctypes.c_int32), s.size,
                                            None if nn is None else _ptr(nn, ctypes.c_int32),
                                            ctypes.byref(n_idx), ctypes.byref(n_slots)))
        e = Export(np.empty(s.size + 1, np.int32), np.empty(n_idx.value, np.int32),
                   np.empty(s.size, np.int32), np.empty(n_slots.value, np.int64),
                   np.empty(s.size + 1, np.int32), _lib.new_struct(_lib.KvViewC))
        b = _lib.new_struct(_lib.BatchBuffersC)
        b.indptr, b.indices = e.indptr.ctypes.data, e.indices.ctypes.data
        b.last_page_len = e.last_page_len.ctypes.data
        b.slot_mapping, b.qo_indptr = e.slot_mapping.ctypes.data, e.qo_indptr.ctypes.data
        b.indices_capacity, b.slots_capacity = e.indices.size, e.slot_mapping.size
        self._check(L.kvp_table_export(self._p(), _ptr(s, ctypes.c_int32), s.size,
                                       None if nn is None else _ptr(nn, ctypes.c_int32),
                                       ctypes.byref(b), ctypes.byref(e.view)))
        return e
