"""The host tier: swap a page table's sequences out to host memory and back.

Data moves either through a *page I/O* object the storage provides (two
methods, called with a writable or read-only :class:`memoryview` of host
memory), or as :class:`~kvpage.paging.PageOp` operations the engine executes
itself against :meth:`Tier.host_memory`. See ``kvp_tier_t`` for the rules.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Protocol, Union

from . import _lib
from .errors import Error, check, errbuf, error_for
from .store import Store
from .paging import PageOp, Table, _ops, _Owner
from .plan import Layout

L = _lib.lib


class PageIO(Protocol):
    """What a storage implements so the tier can move page bytes.

    ``copy_to_host`` fills ``dst`` with bytes ``[offset, offset + len(dst))``
    of device page ``page``; ``copy_from_host`` writes ``src`` there. Raise a
    :class:`kvpage.Error` (e.g. ``CudaError``) to fail the swap with its
    status; any other exception fails it too and is re-raised by the call.
    """

    def copy_to_host(self, page: int, offset: int, dst: memoryview) -> None: ...

    def copy_from_host(self, page: int, offset: int, src: memoryview) -> None: ...


def _view(address: int, n: int, readonly: bool) -> memoryview:
    mv = memoryview((ctypes.c_char * n).from_address(address)).cast("B")
    return mv.toreadonly() if readonly else mv


def _trampolines(io: PageIO, box: list):
    """C callbacks over ``io``. They capture the storage and an error box, not
    the tier, so no reference cycle delays the tier's destruction."""

    def call(fn, page, offset, address, n, readonly) -> int:
        try:
            fn(page, offset, _view(address, n, readonly))
            return 0
        except Error as e:
            box[0] = e
            return e.status
        except BaseException as e:  # noqa: BLE001 - re-raised after the C call returns
            box[0] = e
            return -1

    def to_host(_opaque, page, offset, dst, n):
        return call(io.copy_to_host, page, offset, dst, n, False)

    def from_host(_opaque, page, offset, src, n):
        return call(io.copy_from_host, page, offset, src, n, True)

    return _lib.COPY_TO_HOST(to_host), _lib.COPY_FROM_HOST(from_host)


class Tier(_Owner):
    """``kvp_tier_t``: a host memory area of ``host_bytes`` for ``table``'s sequences.

    ``layout`` (from :func:`kvpage.layout`) gives the page sizes; it must match
    the pool. ``page_io`` is a :class:`kvpage.Store` (CPU or CUDA: its own
    page copies, ``kvp_store_page_io``, which it keeps alive), or any object
    with the :class:`PageIO` methods. Without it the swaps return operations
    to execute.
    The tier keeps its table alive; closing the table closes the tier.
    """

    def __init__(self, table: Table, host_bytes: int, layout: Layout,
                 page_io: "Optional[Union[PageIO, Store]]" = None):
        self._io_error: list = [None]
        self._layout_c = layout._c()
        p = _lib.new_struct(_lib.TierParamsC)
        L.kvp_tier_params_init(ctypes.byref(p))
        p.host_bytes = host_bytes
        p.layout = ctypes.pointer(self._layout_c)
        if isinstance(page_io, Store):  # the store's own C functions: no Python per page
            io = _lib.new_struct(_lib.PageIoC)
            rc = L.kvp_store_page_io(page_io._p(), ctypes.byref(io))
            if rc != 0:
                raise error_for(rc, "kvp_store_page_io")
            self._io_c = io
            self._store = page_io  # the store must outlive the tier
            p.page_io = ctypes.pointer(io)
        elif page_io is not None:
            io = _lib.new_struct(_lib.PageIoC)
            self._callbacks = _trampolines(page_io, self._io_error)  # must outlive the tier
            io.copy_to_host, io.copy_from_host = self._callbacks
            self._io_c = io
            p.page_io = ctypes.pointer(io)
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(L.kvp_tier_create(table._p(), ctypes.byref(p), ctypes.byref(ptr), err, len(err)),
              err)
        super().__init__(ptr, L.kvp_tier_destroy, parent=table)
        self.table = table
        self.has_page_io = page_io is not None

    @classmethod
    def _borrow(cls, ptr: int, table: Table, owner) -> "Tier":
        """A tier owned by ``owner`` (a cache, whose tier moves pages with its
        store's page I/O): never destroyed from here."""
        t = cls.__new__(cls)
        _Owner.__init__(t, ctypes.c_void_p(ptr), lambda _p: None)
        t._owner = owner
        t._io_error = [None]
        t.table = table
        t.has_page_io = True
        return t

    def _check(self, rc: int) -> None:
        io_error, self._io_error[0] = self._io_error[0], None
        if rc == 0:
            return
        err = error_for(rc, L.kvp_tier_last_error(self._p()).decode())
        if io_error is not None and not isinstance(io_error, Error):
            raise io_error from err
        raise err

    def _swap(self, fn, seq: int) -> list[PageOp]:
        cap = 0 if self.has_page_io else self.seq_info(seq)["ops"]
        ops = (_lib.PageOpC * max(cap, 1))()
        n = ctypes.c_int32()
        self._check(fn(self._p(), seq, ops, cap, ctypes.byref(n)))
        return _ops(ops, n.value)

    def swap_out(self, seq: int) -> list[PageOp]:
        """Move a resident sequence to the host tier; the SWAP_OUT operations to
        run (none with page I/O). Raises :class:`kvpage.HostFull` when it does
        not fit (nothing changes)."""
        return self._swap(L.kvp_tier_swap_out, seq)

    def swap_in(self, seq: int) -> list[PageOp]:
        """Bring a sequence back; the SWAP_IN operations to run (none with page
        I/O). Raises :class:`kvpage.NoSpace` without free pages."""
        return self._swap(L.kvp_tier_swap_in, seq)

    def drop(self, seq: int) -> None:
        """Free a sequence, resident or swapped out (its id becomes invalid)."""
        self._check(L.kvp_tier_drop(self._p(), seq))

    def seq_info(self, seq: int) -> dict:
        """What swapping ``seq`` moves (``kvp_tier_seq_info_t``) as a dict."""
        s = _lib.new_struct(_lib.TierSeqInfoC)
        self._check(L.kvp_tier_seq_info(self._p(), seq, ctypes.byref(s)))
        d = {n: getattr(s, n) for n, _ in s._fields_ if n not in ("struct_size", "reserved_")}
        d["swapped"], d["staging"] = bool(d["swapped"]), bool(d["staging"])
        return d

    def stats(self) -> dict:
        """Sizes and counters (``kvp_tier_stats_t``) as a dict."""
        s = _lib.new_struct(_lib.TierStatsC)
        self._check(L.kvp_tier_stats(self._p(), ctypes.byref(s)))
        return {n: getattr(s, n) for n, _ in s._fields_ if n != "struct_size"}

    def host_memory(self) -> memoryview:
        """The tier's host memory, writable; slot ``s`` starts at ``s * slot_bytes``.
        Valid while the tier is open."""
        base = ctypes.c_void_p()
        n = ctypes.c_uint64()
        self._check(L.kvp_tier_host_memory(self._p(), ctypes.byref(base), ctypes.byref(n)))
        return _view(base.value, n.value, False)
