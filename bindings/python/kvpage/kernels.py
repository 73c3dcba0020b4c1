"""Tensors on the CPU backend: the page arena (Store), quantize / dequantize,
attention (Context), and the Cache façade for a decode loop.

Arrays are passed by pointer, never copied behind your back: a K/V/Q/output
array must have the right dtype (float32 or float16) and shape, rows of
contiguous elements, and element alignment; anything else is a ValueError
naming the problem.
"""

from __future__ import annotations

import ctypes
import enum
from typing import Optional, Sequence, Union

import numpy as np

from . import _lib
from ._handle import Handle
from .errors import check, errbuf, error_for
from .paging import Export, PageOp, as_i32
from .plan import Format, format_of

L = _lib.lib

_DTYPES = {np.dtype(np.float32): int(Format.FP32), np.dtype(np.float16): int(Format.FP16)}


class Isa(enum.IntEnum):
    """Instruction sets the CPU kernels can use."""

    AUTO = 0
    PORTABLE = 1
    AVX2 = 2
    AVX512 = 3


def isa_supported(isa: Isa) -> bool:
    """Whether this CPU can run kernels for `isa`."""
    return bool(L.kvp_isa_supported(int(isa)))


def _dtype_code(a: np.ndarray, what: str) -> int:
    code = _DTYPES.get(a.dtype)
    if code is None:
        raise ValueError(f"{what} must be float32 or float16, got {a.dtype}")
    return code


def rows_of(a, what: str, heads: int, head_dim: int, rows: Optional[int] = None,
            writable: bool = False) -> tuple[np.ndarray, int, int]:
    """Check a [rows][heads][head_dim] (or [rows][heads*head_dim]) array whose
    rows may be strided but whose elements within a row are contiguous.
    Returns (array, dtype code, row stride in elements)."""
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{what} must be a NumPy array, got {type(a).__name__}")
    code = _dtype_code(a, what)
    width = heads * head_dim
    if a.ndim == 3:
        if a.shape[1:] != (heads, head_dim):
            raise ValueError(f"{what} must have shape [rows][{heads}][{head_dim}], got {a.shape}")
        inner_ok = a.strides[2] == a.itemsize and a.strides[1] == head_dim * a.itemsize
    elif a.ndim == 2:
        if a.shape[1] != width:
            raise ValueError(f"{what} must have shape [rows][{width}], got {a.shape}")
        inner_ok = a.strides[1] == a.itemsize
    else:
        raise ValueError(f"{what} must be 2- or 3-dimensional, got shape {a.shape}")
    if rows is not None and a.shape[0] != rows:
        raise ValueError(f"{what} has {a.shape[0]} rows, expected {rows}")
    if a.size == 0:  # NumPy gives empty arrays arbitrary strides
        return a, code, width
    if not inner_ok or a.strides[0] % a.itemsize != 0 or a.strides[0] < width * a.itemsize:
        raise ValueError(f"{what} rows must hold contiguous elements (got strides {a.strides}); "
                         "use np.ascontiguousarray")
    if a.ctypes.data % a.itemsize != 0:
        raise ValueError(f"{what} is not aligned to its element size")
    if writable and not a.flags.writeable:
        raise ValueError(f"{what} is read-only")
    return a, code, a.strides[0] // a.itemsize


def _buffer_address(buf, what: str, writable: bool) -> tuple[Optional[int], int]:
    """(address, bytes) of a C-contiguous buffer: NumPy array, bytearray,
    bytes (read-only), memoryview."""
    try:
        a = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must be a contiguous buffer: {e}") from None
    if not a.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    if writable and not a.flags.writeable:
        raise ValueError(f"{what} is read-only")
    return (a.ctypes.data if a.nbytes else None), a.nbytes


def slots_of(slots) -> np.ndarray:
    """The append's slots: a contiguous int64 array, as Table.append returns."""
    s = np.asarray(slots)
    if s.dtype != np.int64 or s.ndim != 1 or not s.flags.c_contiguous:
        raise ValueError("slots must be a contiguous int64 array (Table.append returns one)")
    return s


def append_struct(layer, slots, k_ptr, v_ptr, dtype_code, k_stride, v_stride, ops):
    """A filled ``kvp_append_t`` and the ops array it points to (keep both
    alive until the call)."""
    a = _lib.new_struct(_lib.AppendC)
    L.kvp_append_init(ctypes.byref(a))
    a.layer, a.rows, a.dtype = layer, slots.size, dtype_code
    a.k, a.v, a.k_row_stride, a.v_row_stride = k_ptr or None, v_ptr or None, k_stride, v_stride
    a.slots = slots.ctypes.data
    arr = _ops_array(ops)
    a.ops, a.num_ops = ctypes.cast(arr, ctypes.c_void_p), len(ops)
    return a, arr


def _ops_array(ops: Sequence[PageOp]):
    arr = (_lib.PageOpC * max(len(ops), 1))()
    for i, o in enumerate(ops):
        arr[i] = _lib.PageOpC(int(o.kind), o.src, o.dst, o.count, o.row)
    return arr


class Store(Handle):
    """``kvp_store_t``: the page arena on the CPU backend (one allocation of
    exactly the planner's byte count)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, num_pages: int,
                 page_size: int = 16, k_format=Format.FP16, v_format=Format.FP16,
                 num_staging: int = 0, dim_major_keys: bool = False):
        p = _lib.new_struct(_lib.StoreParamsC)
        L.kvp_store_params_init(ctypes.byref(p))
        p.layers, p.kv_heads, p.head_dim, p.page_size = layers, kv_heads, head_dim, page_size
        p.k_format, p.v_format = int(format_of(k_format)), int(format_of(v_format))
        p.k_order = 1 if dim_major_keys else 0
        p.num_pages, p.num_staging = num_pages, num_staging
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(self._create_c(p, ptr, err), err)
        super().__init__(ptr, L.kvp_store_destroy)
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.page_size, self.num_pages, self.num_staging = page_size, num_pages, num_staging

    def _create_c(self, p, ptr, err) -> int:
        return L.kvp_store_create(ctypes.byref(p), ctypes.byref(ptr), err, len(err))

    @classmethod
    def _borrow(cls, ptr, layers, kv_heads, head_dim, page_size, owner):
        s = cls.__new__(cls)
        Handle.__init__(s, ctypes.c_void_p(ptr), lambda _p: None)  # owned by `owner`
        s._owner = owner
        s.layers, s.kv_heads, s.head_dim, s.page_size = layers, kv_heads, head_dim, page_size
        return s

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise error_for(rc, L.kvp_store_last_error(self._p()).decode())

    def arena(self) -> tuple[int, int]:
        """(address, bytes) of the arena: for kernels from elsewhere."""
        base, n = ctypes.c_void_p(), ctypes.c_uint64()
        self._check(L.kvp_store_arena(self._p(), ctypes.byref(base), ctypes.byref(n)))
        return base.value, n.value

    def append(self, layer: int, k, v, slots, ops: Sequence[PageOp] = ()) -> None:
        """Write rows of K/V (quantizing on the way in) at their slots; SEAL ops
        from the table's append are run here."""
        s = slots_of(slots)
        k, kc, ks = rows_of(k, "k", self.kv_heads, self.head_dim, s.size)
        v, vc, vs = rows_of(v, "v", self.kv_heads, self.head_dim, s.size)
        if kc != vc:
            raise ValueError("k and v must have the same dtype")
        a, _ops_keep = append_struct(layer, s, k.ctypes.data, v.ctypes.data, kc, ks, vs, ops)
        self._check(L.kvp_store_append(self._p(), ctypes.byref(a)))

    def apply_ops(self, ops: Sequence[PageOp]) -> None:
        """Run COPY and UNSEAL ops (SEALs belong to the append)."""
        arr = _ops_array(ops)
        self._check(L.kvp_store_apply_ops(self._p(), arr, len(ops)))

    def read(self, layer: int, page: int, token0: int = 0, count: Optional[int] = None):
        """Dequantized K and V of tokens of a page: two [count][kv_heads][head_dim] float32 arrays."""
        n = self.page_size - token0 if count is None else count
        k = np.empty((max(n, 0), self.kv_heads, self.head_dim), np.float32)
        v = np.empty_like(k)
        fp = ctypes.POINTER(ctypes.c_float)
        self._check(L.kvp_store_read(self._p(), layer, page, token0, n, k.ctypes.data_as(fp),
                                     v.ctypes.data_as(fp)))
        return k, v

    def page_to_host(self, page: int, dst, offset: int = 0) -> None:
        """Copy bytes ``[offset, offset + len(dst))`` of a page's serialization
        (every layer's K blocks, then its V blocks) into ``dst``, a writable
        buffer (bytearray, uint8 NumPy array, pinned array). On a CUDA store
        the copy is asynchronous on the store's stream: ``dst`` is complete
        after :meth:`synchronize`."""
        addr, n = _buffer_address(dst, "dst", writable=True)
        self._check(L.kvp_store_page_to_host(self._p(), page, offset, addr, n))

    def page_from_host(self, page: int, src, offset: int = 0) -> None:
        """Write ``src`` (bytes from :meth:`page_to_host` of a store with the
        same layout) into a page's serialization at ``offset``. On a CUDA
        store ``src`` must stay unchanged until :meth:`synchronize`."""
        addr, n = _buffer_address(src, "src", writable=False)
        self._check(L.kvp_store_page_from_host(self._p(), page, offset, addr, n))

    def synchronize(self) -> None:
        """Wait for the store's stream (nothing to wait for on the CPU); raises
        :class:`kvpage.CudaError` for a failure of work already enqueued."""
        self._check(L.kvp_store_synchronize(self._p()))

    def set_fp8_scale(self, layer: int, kv_head: int, is_value: bool, scale: float) -> None:
        self._check(L.kvp_store_set_fp8_scale(self._p(), layer, kv_head, int(is_value), scale))

    def fp8_scale(self, layer: int, kv_head: int, is_value: bool) -> float:
        out = ctypes.c_float()
        self._check(L.kvp_store_get_fp8_scale(self._p(), layer, kv_head, int(is_value),
                                              ctypes.byref(out)))
        return out.value

    @property
    def nonfinite_count(self) -> int:
        """NaN/Inf inputs the appends have seen."""
        return L.kvp_store_nonfinite_count(self._p())


def _quant_desc(format, is_value, page_size, heads, head_dim, dtype_code, fp8_scale,
                dim_major_keys):
    d = _lib.new_struct(_lib.QuantDescC)
    d.format, d.is_value = int(format_of(format)), int(is_value)
    d.k_order = 1 if dim_major_keys else 0
    d.page_size, d.head_dim, d.heads, d.dtype = page_size, head_dim, heads, dtype_code
    d.fp8_scale = fp8_scale
    return d


def quantize(x: np.ndarray, format, is_value: bool = False, page_size: int = 16,
             fp8_scale: float = 1.0, dim_major_keys: bool = False) -> np.ndarray:
    """Quantize a contiguous [pages*page_size][heads][head_dim] tensor into the
    store's blocks: a uint8 array [pages][heads][block bytes]."""
    if not isinstance(x, np.ndarray) or x.ndim != 3 or not x.flags.c_contiguous:
        raise ValueError("x must be a C-contiguous [tokens][heads][head_dim] array")
    code = _dtype_code(x, "x")
    if x.shape[0] % page_size:
        raise ValueError(f"x has {x.shape[0]} tokens, not a multiple of page_size {page_size}")
    d = _quant_desc(format, is_value, page_size, x.shape[1], x.shape[2], code, fp8_scale,
                    dim_major_keys)
    bb = ctypes.c_uint64()
    err = errbuf()
    check(L.kvp_quant_block_bytes(ctypes.byref(d), ctypes.byref(bb), err, len(err)), err)
    pages = x.shape[0] // page_size
    out = np.empty((pages, x.shape[1], bb.value), np.uint8)
    check(L.kvp_quantize(ctypes.byref(d), x.ctypes.data, pages, out.ctypes.data, err, len(err)),
          err)
    return out


def dequantize(blocks: np.ndarray, format, head_dim: int, is_value: bool = False,
               page_size: int = 16, fp8_scale: float = 1.0,
               dim_major_keys: bool = False) -> np.ndarray:
    """Inverse of :func:`quantize`: float32 [pages*page_size][heads][head_dim]."""
    if (not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint8 or blocks.ndim != 3
            or not blocks.flags.c_contiguous):
        raise ValueError("blocks must be a C-contiguous uint8 [pages][heads][bytes] array")
    pages, heads, nbytes = blocks.shape
    d = _quant_desc(format, is_value, page_size, heads, head_dim, int(Format.FP32), fp8_scale,
                    dim_major_keys)
    bb = ctypes.c_uint64()
    err = errbuf()
    check(L.kvp_quant_block_bytes(ctypes.byref(d), ctypes.byref(bb), err, len(err)), err)
    if bb.value != nbytes:
        raise ValueError(f"blocks of {nbytes} bytes, but this format's blocks are {bb.value}")
    out = np.empty((pages * page_size, heads, head_dim), np.float32)
    check(L.kvp_dequantize(ctypes.byref(d), blocks.ctypes.data, pages, out.ctypes.data, err,
                           len(err)), err)
    return out


def _attention_params(layer, q, out, q_heads, head_dim, sm_scale, causal, window_left,
                      soft_cap, rows=None):
    q, qc, qs = rows_of(q, "q", q_heads, head_dim, rows)
    if qs != q_heads * head_dim:
        raise ValueError("q must be C-contiguous")
    if out is None:
        out = np.empty((q.shape[0], q_heads, head_dim), q.dtype)
    out, oc, os_ = rows_of(out, "out", q_heads, head_dim, q.shape[0], writable=True)
    if oc != qc or os_ != q_heads * head_dim:
        raise ValueError("out must be C-contiguous with q's dtype and shape")
    p = attention_struct(layer, q_heads, head_dim, qc, sm_scale, causal, window_left, soft_cap,
                         q.ctypes.data, out.ctypes.data)
    return p, q, out


def attention_struct(layer, q_heads, head_dim, dtype_code, sm_scale, causal, window_left,
                     soft_cap, q_ptr, out_ptr):
    """A filled ``kvp_attention_params_t`` (sm_scale None: 1/sqrt(head_dim))."""
    p = _lib.new_struct(_lib.AttentionParamsC)
    L.kvp_attention_params_init(ctypes.byref(p))
    p.layer, p.q_heads, p.dtype = layer, q_heads, dtype_code
    p.causal, p.window_left = int(causal), window_left
    p.sm_scale = float(sm_scale) if sm_scale is not None else 1.0 / float(np.sqrt(head_dim))
    p.logit_soft_cap = soft_cap
    p.q, p.out = q_ptr or None, out_ptr or None
    return p


class Context(Handle):
    """``kvp_ctx_t``: worker threads and workspace for attention, made once."""

    def __init__(self, threads: int = 1, isa: Isa = Isa.AUTO, workspace_bytes: int = 0):
        p = _lib.new_struct(_lib.CtxParamsC)
        L.kvp_ctx_params_init(ctypes.byref(p))
        p.threads, p.isa, p.workspace_bytes = threads, int(isa), workspace_bytes
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(self._create_c(p, ptr, err), err)
        super().__init__(ptr, L.kvp_ctx_destroy)

    def _create_c(self, p, ptr, err) -> int:
        return L.kvp_ctx_create(ctypes.byref(p), ctypes.byref(ptr), err, len(err))

    @property
    def isa(self) -> Isa:
        """The instruction set the kernels run with."""
        return Isa(L.kvp_ctx_isa(self._p()))

    def attention(self, store: Store, batch: Export, layer: int, q: np.ndarray,
                  out: Optional[np.ndarray] = None, q_heads: Optional[int] = None,
                  sm_scale: Optional[float] = None, causal: bool = True,
                  window_left: int = -1, soft_cap: float = 0.0) -> np.ndarray:
        """Paged attention of q's rows (``batch.qo_indptr``) over ``batch``'s pages."""
        qh = q_heads if q_heads is not None else (q.shape[1] if q.ndim == 3 else None)
        if qh is None:
            raise ValueError("q_heads is needed for a 2-dimensional q")
        p, q, out = _attention_params(layer, q, out, qh, store.head_dim, sm_scale, causal,
                                      window_left, soft_cap, int(batch.qo_indptr[-1]))
        p.qo_indptr = batch.qo_indptr.ctypes.data
        rc = L.kvp_attention(self._p(), store._p(), ctypes.byref(batch.view), ctypes.byref(p))
        if rc != 0:
            raise error_for(rc, L.kvp_ctx_last_error(self._p()).decode())
        return out


class Cache(Handle):
    """``kvp_cache_t``: pool + table + store + context for a decode loop.

    Give ``num_pages`` or ``kv_budget`` (bytes, or a string like "2GiB");
    ``host_bytes`` adds a host tier for swap_out / swap_in.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, num_pages: int = 0,
                 kv_budget: Union[int, str, None] = None, page_size: int = 16,
                 k_format=Format.FP16, v_format=Format.FP16, max_seqs: int = 256,
                 prefix_cache: bool = True, threads: int = 1, isa: Isa = Isa.AUTO,
                 dim_major_keys: bool = False, host_bytes: Union[int, str, None] = None):
        from .plan import parse_size
        p = _lib.new_struct(_lib.CacheParamsC)
        L.kvp_cache_params_init(ctypes.byref(p))
        p.layers, p.kv_heads, p.head_dim, p.page_size = layers, kv_heads, head_dim, page_size
        p.k_format, p.v_format = int(format_of(k_format)), int(format_of(v_format))
        p.k_order = 1 if dim_major_keys else 0
        p.max_seqs, p.prefix_cache, p.threads, p.isa = max_seqs, int(prefix_cache), threads, int(isa)
        p.num_pages = num_pages
        p.kv_budget_bytes = 0 if kv_budget is None else parse_size(kv_budget)
        p.host_bytes = 0 if host_bytes is None else parse_size(host_bytes)
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(self._create_c(p, ptr, err), err)
        super().__init__(ptr, L.kvp_cache_destroy)
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.page_size = page_size
        self._rows = 0
        self.store = Store._borrow(L.kvp_cache_store(self._p()), layers, kv_heads, head_dim,
                                   page_size, self)

    def _create_c(self, p, ptr, err) -> int:
        return L.kvp_cache_create(ctypes.byref(p), ctypes.byref(ptr), err, len(err))

    def close(self) -> None:
        if getattr(self, "store", None) is not None:
            self.store.close()
        super().close()

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise error_for(rc, L.kvp_cache_last_error(self._p()).decode())

    def create(self, priority: int = 0, salt: int = 0) -> int:
        """A new, empty sequence; returns its id."""
        out = ctypes.c_int32()
        self._check(L.kvp_cache_seq_create(self._p(), priority, salt, ctypes.byref(out)))
        return out.value

    def release(self, seq: int) -> None:
        self._check(L.kvp_cache_seq_release(self._p(), seq))

    def fork(self, seq: int) -> int:
        out = ctypes.c_int32()
        self._check(L.kvp_cache_seq_fork(self._p(), seq, ctypes.byref(out)))
        return out.value

    def truncate(self, seq: int, length: int) -> None:
        self._check(L.kvp_cache_seq_truncate(self._p(), seq, length))

    def attach_prefix(self, seq: int, tokens) -> int:
        """Attach the longest cached prefix; returns the tokens matched."""
        t = as_i32(tokens, "tokens")
        out = ctypes.c_int64()
        self._check(L.kvp_cache_seq_attach_prefix(
            self._p(), seq, t.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)) if t.size else None,
            t.size, ctypes.byref(out)))
        return out.value

    def length(self, seq: int) -> int:
        out = ctypes.c_int64()
        self._check(L.kvp_cache_seq_length(self._p(), seq, ctypes.byref(out)))
        return out.value

    def swap_out(self, seq: int) -> None:
        """Move a sequence's KV to the host tier (needs host_bytes)."""
        self._check(L.kvp_cache_seq_swap_out(self._p(), seq))

    def swap_in(self, seq: int) -> None:
        """Bring a swapped-out sequence back, bit for bit."""
        self._check(L.kvp_cache_seq_swap_in(self._p(), seq))

    def begin_step(self, seqs, num_new, tokens=None) -> int:
        """Append each sequence's new tokens (all or nothing); returns the step's row count."""
        s, n = as_i32(seqs, "seqs"), as_i32(num_new, "num_new")
        if s.size != n.size:
            raise ValueError(f"num_new has {n.size} entries for {s.size} sequences")
        t = None if tokens is None else as_i32(tokens, "tokens")
        if t is not None and t.size != int(n.sum()):
            raise ValueError(f"tokens has {t.size} ids, num_new sums to {int(n.sum())}")
        i32 = ctypes.POINTER(ctypes.c_int32)
        self._check(L.kvp_cache_begin_step(
            self._p(), s.ctypes.data_as(i32), s.size, n.ctypes.data_as(i32),
            None if t is None or t.size == 0 else t.ctypes.data_as(i32)))
        self._rows = int(n.sum())
        return self._rows

    def write(self, layer: int, k, v) -> None:
        """Write the step's rows of K/V for one layer."""
        k, kc, ks = rows_of(k, "k", self.kv_heads, self.head_dim, self._rows)
        v, vc, vs = rows_of(v, "v", self.kv_heads, self.head_dim, self._rows)
        if kc != vc:
            raise ValueError("k and v must have the same dtype")
        self._check(L.kvp_cache_write(self._p(), layer, kc, k.ctypes.data, v.ctypes.data, ks, vs))

    def attend(self, layer: int, q: np.ndarray, out: Optional[np.ndarray] = None,
               q_heads: Optional[int] = None, sm_scale: Optional[float] = None,
               causal: bool = True, window_left: int = -1, soft_cap: float = 0.0) -> np.ndarray:
        """Attention of the step's rows for one layer; returns `out`."""
        qh = q_heads if q_heads is not None else (q.shape[1] if q.ndim == 3 else None)
        if qh is None:
            raise ValueError("q_heads is needed for a 2-dimensional q")
        p, q, out = _attention_params(layer, q, out, qh, self.head_dim, sm_scale, causal,
                                      window_left, soft_cap, self._rows)
        self._check(L.kvp_cache_attend(self._p(), ctypes.byref(p)))
        return out

    def stats(self) -> dict:
        """The pool's statistics (pages, tokens, utilization, prefix hits)."""
        s = _lib.new_struct(_lib.PoolStatsC)
        rc = L.kvp_pool_stats(L.kvp_cache_pool(self._p()), ctypes.byref(s))
        if rc != 0:
            raise error_for(rc, "")
        return {name: getattr(s, name) for name, _ in s._fields_ if name != "struct_size"}
