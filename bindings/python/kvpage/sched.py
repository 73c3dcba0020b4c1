"""The scheduler layer: a policy the engine consults once per step."""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass, field

from . import _lib
from ._handle import Handle
from .errors import check, errbuf, error_for

L = _lib.lib


class Reason(enum.IntEnum):
    """Why a request was rejected or a sequence moved out."""

    NONE = 0
    PRESSURE = 1
    PRIORITY = 2
    TOO_LONG = 3
    DEADLINE = 4
    HOST_FULL = 5
    OVERLOAD = 6


class Action(enum.IntFlag):
    """What the scheduler may do to a victim."""

    SWAP = 1
    RECOMPUTE = 2
    DROP = 4


@dataclass(frozen=True)
class Item:
    """One entry of a plan list: a request id, and for prefill its chunk."""

    id: int
    tokens: int = 0
    start: int = 0
    reason: Reason = Reason.NONE


@dataclass(frozen=True)
class Plan:
    """One step's plan. Execute swap_out, preempt, drop, then swap_in, then
    prefill and decode: every page reservation then succeeds."""

    swap_out: list[Item] = field(default_factory=list)
    preempt: list[Item] = field(default_factory=list)
    drop: list[Item] = field(default_factory=list)
    swap_in: list[Item] = field(default_factory=list)
    prefill: list[Item] = field(default_factory=list)
    decode: list[int] = field(default_factory=list)
    reject: list[Item] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    pressure: bool = False
    pages_needed: int = 0
    forecast_pages: int = 0


def _items(ptr, n) -> list[Item]:
    return [Item(ptr[i].id, ptr[i].tokens, ptr[i].start, Reason(ptr[i].reason)) for i in range(n)]


class Scheduler(Handle):
    """``kvp_sched_t``: admission, priorities, pressure forecast, victims.

    Keyword arguments are the fields of ``kvp_sched_params_t`` (page_size and
    total_pages are required); ``actions`` takes an :class:`Action` flag.
    """

    def __init__(self, page_size: int, total_pages: int, **params):
        p = _lib.new_struct(_lib.SchedParamsC)
        L.kvp_sched_params_init(ctypes.byref(p))
        p.page_size = page_size
        p.total_pages = total_pages
        known = {name for name, _ in _lib.SchedParamsC._fields_} - {"struct_size", "allocator"}
        for name, value in params.items():
            if name not in known:
                raise TypeError(f"Scheduler: unknown parameter {name!r}")
            setattr(p, name, int(value) if name not in ("host_bytes_per_s",
                                                        "prefill_tokens_per_s") else value)
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(L.kvp_sched_create(ctypes.byref(p), ctypes.byref(ptr), err, len(err)), err)
        super().__init__(ptr, L.kvp_sched_destroy)

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise error_for(rc, L.kvp_sched_last_error(self._p()).decode())

    def submit(self, id: int, prompt_tokens: int, max_new_tokens: int, priority: int = 0,
               cached_tokens: int = 0, arrival: int = 0, deadline: int = 0) -> None:
        """Queue a request (see ``kvp_sched_submit``)."""
        r = _lib.new_struct(_lib.SchedRequestC)
        r.id, r.priority = id, priority
        r.prompt_tokens, r.max_new_tokens = prompt_tokens, max_new_tokens
        r.cached_tokens, r.arrival, r.deadline = cached_tokens, arrival, deadline
        self._check(L.kvp_sched_submit(self._p(), ctypes.byref(r)))

    def finish(self, id: int) -> None:
        """The engine finished or abandoned a request."""
        self._check(L.kvp_sched_finish(self._p(), id))

    def step(self, free_pages: int, free_staging: int = 0, host_free_bytes: int = 0,
             now: int = 0) -> Plan:
        """Plan one step from the pool's state now."""
        i = _lib.new_struct(_lib.SchedInputC)
        i.free_pages, i.free_staging = free_pages, free_staging
        i.host_free_bytes, i.now = host_free_bytes, now
        o = _lib.new_struct(_lib.SchedPlanC)
        self._check(L.kvp_sched_step(self._p(), ctypes.byref(i), ctypes.byref(o)))
        return Plan(
            swap_out=_items(o.swap_out, o.n_swap_out), preempt=_items(o.preempt, o.n_preempt),
            drop=_items(o.drop, o.n_drop), swap_in=_items(o.swap_in, o.n_swap_in),
            prefill=_items(o.prefill, o.n_prefill),
            decode=[o.decode[k] for k in range(o.n_decode)],
            reject=_items(o.reject, o.n_reject),
            finished=[o.finished[k] for k in range(o.n_finished)],
            pressure=bool(o.pressure), pages_needed=o.pages_needed,
            forecast_pages=o.forecast_pages)

    def stats(self) -> dict:
        """Counters since creation, as a dict."""
        s = _lib.new_struct(_lib.SchedStatsC)
        self._check(L.kvp_sched_stats(self._p(), ctypes.byref(s)))
        return {name: getattr(s, name) for name, _ in s._fields_
                if name not in ("struct_size", "reserved_")}
