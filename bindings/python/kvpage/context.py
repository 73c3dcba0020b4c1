"""Paged attention on the CPU backend: the execution :class:`Context`
(worker threads and workspace, made once) and the CPU instruction sets."""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass
from typing import Optional

import numpy as np
import numpy.typing as npt

from . import _lib
from ._arrays import FloatArray, lse_of, rows_of
from ._handle import Handle
from .errors import check, errbuf, error_for
from .paging import Export
from .store import Backend, Store

L = _lib.lib


class Isa(enum.IntEnum):
    """Instruction sets the CPU kernels can use (``kvp_isa``)."""

    AUTO = 0
    PORTABLE = 1
    AVX2 = 2
    AVX512 = 3
    AVX512_BF16 = 4
    NEON = 5
    NEON_DOTPROD = 6

    def __str__(self) -> str:  # the library's name, e.g. "avx512"
        return L.kvp_isa_name(int(self)).decode()


def isa_supported(isa: Isa) -> bool:
    """Whether this CPU can run kernels for ``isa``."""
    return bool(L.kvp_isa_supported(int(isa)))


@dataclass(frozen=True)
class ContextInfo:
    """``kvp_ctx_info_t``: what a context runs with."""

    backend: Backend
    device: int            #: CUDA device ordinal; -1 on the CPU
    isa: Optional[Isa]     #: the CPU kernels' instruction set (never AUTO); None on CUDA
    threads: int           #: threads that run kernels, caller included (1 on CUDA)
    workspace_bytes: int   #: the split-KV workspace


def attention_struct(layer, q_heads, dtype, sm_scale, causal, window_left, soft_cap, q_ptr,
                     out_ptr):
    """A filled ``kvp_attention_params_t``. ``sm_scale`` None (or 0) leaves the
    library's default, 1/sqrt(head_dim)."""
    p = _lib.new_struct(_lib.AttentionParamsC)
    L.kvp_attention_params_init(ctypes.byref(p))
    p.layer, p.q_heads, p.dtype = layer, q_heads, dtype
    p.causal, p.window_left = int(causal), window_left
    if sm_scale is not None:
        p.sm_scale = float(sm_scale)
    p.logit_soft_cap = soft_cap
    p.q, p.out = q_ptr or None, out_ptr or None
    return p


def host_attention(layer, q, out, lse, q_heads, head_dim, sm_scale, causal, window_left,
                   soft_cap, rows):
    """Check host q / out / lse and fill the attention parameters (without
    qo_indptr). Returns (params, out, lse); ``out`` is allocated if None."""
    qh = q_heads if q_heads is not None else (q.shape[1] if getattr(q, "ndim", 0) == 3 else None)
    if qh is None:
        raise ValueError("q_heads is needed for a 2-dimensional q")
    q, qc, qs = rows_of(q, "q", qh, head_dim, rows)
    if qs != qh * head_dim:
        raise ValueError("q must be C-contiguous")
    if out is None:
        out = np.empty((q.shape[0], qh, head_dim), q.dtype)
    out, oc, os_ = rows_of(out, "out", qh, head_dim, q.shape[0], writable=True)
    if oc != qc or os_ != qh * head_dim:
        raise ValueError("out must be C-contiguous with q's dtype and shape")
    lse = lse_of(lse, q.shape[0], qh)
    p = attention_struct(layer, qh, qc, sm_scale, causal, window_left, soft_cap, q.ctypes.data,
                         out.ctypes.data)
    if lse is not None:
        p.lse = lse.ctypes.data
    return p, out, lse


class Context(Handle):
    """``kvp_ctx_t``: worker threads and workspace for attention, made once so
    that attention neither allocates nor spawns.

    Args:
        threads: threads that run kernels, the caller's included (1 .. 256); default 1.
        isa: the CPU instruction set; default :attr:`Isa.AUTO` (the best this CPU has).
        workspace_bytes: split-KV workspace; 0 (default) = 16 MiB.
    """

    def __init__(self, threads: int = 1, isa: Isa = Isa.AUTO, workspace_bytes: int = 0):
        p = _lib.new_struct(_lib.CtxParamsC)
        L.kvp_ctx_params_init(ctypes.byref(p))
        p.threads, p.isa = threads, int(isa)
        if workspace_bytes:
            p.workspace_bytes = workspace_bytes
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(self._create_c(p, ptr, err), err)
        super().__init__(ptr, L.kvp_ctx_destroy)

    def _create_c(self, p, ptr, err) -> int:
        return L.kvp_ctx_create(ctypes.byref(p), ctypes.byref(ptr), err, len(err))

    @classmethod
    def _borrow(cls, ptr: int, owner) -> "Context":
        """A context owned by ``owner`` (a cache): never destroyed from here."""
        c = cls.__new__(cls)
        Handle.__init__(c, ctypes.c_void_p(ptr), lambda _p: None)
        c._owner = owner
        return c

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise error_for(rc, L.kvp_ctx_last_error(self._p()).decode())

    def info(self) -> ContextInfo:
        """Backend, device, instruction set, threads and workspace."""
        s = _lib.new_struct(_lib.CtxInfoC)
        self._check(L.kvp_ctx_info(self._p(), ctypes.byref(s)))
        return ContextInfo(Backend(s.backend), s.device, Isa(s.isa) if s.isa >= 0 else None,
                           s.threads, s.workspace_bytes)

    @property
    def isa(self) -> Optional[Isa]:
        """The instruction set the CPU kernels run with (None on CUDA)."""
        return self.info().isa

    @property
    def device(self) -> int:
        """The CUDA device ordinal the context runs on; -1 on the CPU."""
        return self.info().device

    @property
    def threads(self) -> int:
        """Threads that run kernels, the caller's included."""
        return self.info().threads

    def attention(self, store: Store, batch: Export, layer: int, q: FloatArray,
                  out: Optional[FloatArray] = None, q_heads: Optional[int] = None,
                  sm_scale: Optional[float] = None, causal: bool = True,
                  window_left: int = -1, soft_cap: float = 0.0,
                  lse: Optional[npt.NDArray[np.float32]] = None) -> FloatArray:
        """Paged attention of q's rows (``batch.qo_indptr``) over ``batch``'s pages.

        Args:
            q: ``[rows][q_heads][head_dim]`` queries (float32 or float16), the
                last rows of each sequence, C-contiguous.
            out: where to write the output (q's shape and dtype); allocated if None.
            q_heads: needed only for a 2-dimensional ``q``; a multiple of kv_heads.
            sm_scale: softmax scale; default (None) 1/sqrt(head_dim).
            causal: causal mask (the default); False: every token of the sequence.
            window_left: sliding window, in tokens to the left; default -1 (none).
            soft_cap: if > 0, logits become ``cap * tanh(logit / cap)``; default 0 (off).
            lse: optional float32 ``[rows][q_heads]`` array for the log-sum-exp
                of the scaled logits (natural log).

        Returns ``out``.
        """
        p, out, lse = host_attention(layer, q, out, lse, q_heads, store.head_dim, sm_scale,
                                     causal, window_left, soft_cap, int(batch.qo_indptr[-1]))
        p.qo_indptr = batch.qo_indptr.ctypes.data
        self._check(L.kvp_attention(self._p(), store._p(), ctypes.byref(batch.view),
                                    ctypes.byref(p)))
        return out
