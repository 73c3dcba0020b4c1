"""The CUDA backend from Python: a store whose arena lives on the GPU, a
context that runs attention there, device quantize / dequantize, and pinned
host memory.

Tensors are *device* memory and are never copied or inspected: pass any
object with ``__cuda_array_interface__`` (CuPy, Numba, PyTorch CUDA tensors),
or a raw device address (``tensor.data_ptr()``, an ``int``) together with
``dtype=``. Shapes, dtypes, strides and alignment are checked from the
interface when there is one; a raw address is taken to be C-contiguous rows.
Streams are ``int`` handles (``torch.cuda.current_stream().cuda_stream``,
``cupy.cuda.get_current_stream().ptr``), objects with such an attribute, or
``None`` for the default stream. Metadata (slots, page ops, the CSR view)
stays in host NumPy arrays, as the table makes them.

In a CPU-only build every constructor here raises :class:`kvpage.NotSupported`;
on a machine without a usable GPU, :class:`kvpage.NoDevice`.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _lib
from .errors import check, errbuf
from ._arrays import DTYPE_CODES, slots_of
from .cache import Cache
from .context import Context, attention_struct
from .paging import Export, PageOp
from .store import FormatLike, Store, append_struct, ops_array, quant_desc
from .plan import Format

L = _lib.lib

_BF16_CODE = int(Format.BF16)


def stream_handle(stream: Any) -> Optional[int]:
    """The ``cudaStream_t`` of ``stream`` as an int (None: the default stream).

    Accepts an int, ``None``, or an object with a ``cuda_stream`` (PyTorch) or
    ``ptr`` (CuPy) attribute."""
    if stream is None:
        return None
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            stream = getattr(stream, attr)
            break
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < 0:
        raise ValueError(f"stream must be a non-negative int handle or a stream object, "
                         f"got {type(stream).__name__}")
    return stream or None


def _dtype_code(dtype: Any, what: str) -> tuple[int, int]:
    """(format code, item size) of a float32 / float16 / "bfloat16" dtype."""
    if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16"):
        return _BF16_CODE, 2
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"{what}: unknown dtype {dtype!r}") from None
    code = DTYPE_CODES.get(dt)
    if code is None:
        raise ValueError(f"{what} must be float32, float16 or bfloat16, got {dt}")
    return code, dt.itemsize


def _typestr_code(typestr: str, what: str) -> tuple[int, int]:
    if typestr in ("<f4", "=f4"):
        return int(Format.FP32), 4
    if typestr in ("<f2", "=f2"):
        return int(Format.FP16), 2
    raise ValueError(f"{what} must be float32 or float16 (typestr <f4 / <f2), got {typestr!r}; "
                     "pass a bfloat16 tensor as data_ptr() with dtype='bfloat16'")


def device_rows(a: Any, what: str, heads: int, head_dim: int, rows: int,
                dtype: Any = None, writable: bool = False) -> tuple[int, int, int]:
    """Check a device tensor of ``rows`` rows of ``heads * head_dim`` elements.

    ``a`` has ``__cuda_array_interface__`` (shape ``[rows][heads][head_dim]``
    or ``[rows][heads*head_dim]``, elements within a row contiguous, rows any
    stride), or is a raw address (``int``) of C-contiguous rows with ``dtype``
    given. Returns (address, dtype code, row stride in elements)."""
    width = heads * head_dim
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is None:
        if isinstance(a, bool) or not isinstance(a, int):
            raise ValueError(f"{what} must be a device array (__cuda_array_interface__) or a "
                             f"device address (int), got {type(a).__name__}")
        if dtype is None:
            raise ValueError(f"{what} is a raw device address: pass dtype= as well")
        code, item = _dtype_code(dtype, what)
        if a <= 0 and rows > 0:
            raise ValueError(f"{what} is a null or negative device address")
        if a % item:
            raise ValueError(f"{what} is not aligned to its element size ({item} bytes)")
        return a, code, width
    shape = tuple(cai["shape"])
    code, item = _typestr_code(cai["typestr"], what)
    if dtype is not None and _dtype_code(dtype, what)[0] != code:
        raise ValueError(f"{what} has typestr {cai['typestr']}, not the dtype given")
    if len(shape) == 3:
        if shape[1:] != (heads, head_dim):
            raise ValueError(f"{what} must have shape [rows][{heads}][{head_dim}], got {shape}")
    elif len(shape) == 2:
        if shape[1] != width:
            raise ValueError(f"{what} must have shape [rows][{width}], got {shape}")
    else:
        raise ValueError(f"{what} must be 2- or 3-dimensional, got shape {shape}")
    if shape[0] != rows:
        raise ValueError(f"{what} has {shape[0]} rows, expected {rows}")
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise ValueError(f"{what} is read-only")
    strides = cai.get("strides")
    row_stride = width
    if strides is not None and rows > 0:
        inner = (item,) if len(shape) == 2 else (head_dim * item, item)
        if tuple(strides[1:]) != inner or strides[0] % item or strides[0] < width * item:
            raise ValueError(f"{what} rows must hold contiguous elements (got strides "
                             f"{tuple(strides)})")
        row_stride = strides[0] // item
    if rows > 0 and (not ptr or ptr % item):
        raise ValueError(f"{what} is null or not aligned to its element size")
    return int(ptr or 0), code, row_stride


def _device_bytes(a: Any, what: str, nbytes: int, writable: bool) -> int:
    """Address of a device buffer of at least ``nbytes`` bytes (an int, or a
    contiguous ``__cuda_array_interface__`` array of any dtype)."""
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is None:
        if isinstance(a, bool) or not isinstance(a, int) or a <= 0:
            raise ValueError(f"{what} must be a device array or a positive device address")
        return a
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise ValueError(f"{what} is read-only")
    item = int(cai["typestr"][2:])
    shape = tuple(cai["shape"])
    n = item * int(np.prod(shape, dtype=np.int64)) if shape else item
    strides = cai.get("strides")
    if strides is not None:
        expect, acc = [], item
        for dim in reversed(shape):
            expect.insert(0, acc)
            acc *= dim
        if tuple(strides) != tuple(expect):
            raise ValueError(f"{what} must be C-contiguous")
    if n < nbytes:
        raise ValueError(f"{what} holds {n} bytes, {nbytes} needed")
    if not ptr:
        raise ValueError(f"{what} is a null device address")
    return int(ptr)


def _cuda_params(device: int, stream: Any, arena: Any = None, arena_bytes: int = 0,
                 staging_bytes: int = 0):
    c = _lib.new_struct(_lib.CudaParamsC)
    L.kvp_cuda_params_init(ctypes.byref(c))
    c.device = device
    c.stream = stream_handle(stream)
    if arena is not None:
        c.arena = _device_bytes(arena, "arena", arena_bytes, writable=True)
        c.arena_bytes = arena_bytes
    c.staging_bytes = staging_bytes
    return c


def _device_attention(layer, q, out, q_heads, head_dim, rows, sm_scale, causal, window_left,
                      soft_cap, dtype):
    """kvp_attention_params_t for device q / out (checked), without qo_indptr."""
    if out is None:
        raise ValueError("out is required for device attention (a device array or address)")
    if q_heads is None:
        shape = getattr(q, "__cuda_array_interface__", {}).get("shape", ())
        if len(shape) != 3:
            raise ValueError("q_heads is needed unless q is a 3-dimensional device array")
        q_heads = int(shape[1])
    qp, qc, qs = device_rows(q, "q", q_heads, head_dim, rows, dtype)
    op, oc, os_ = device_rows(out, "out", q_heads, head_dim, rows, dtype, writable=True)
    if qs != q_heads * head_dim or os_ != qs:
        raise ValueError("q and out must be C-contiguous")
    if oc != qc:
        raise ValueError("out must have q's dtype")
    return attention_struct(layer, q_heads, qc, sm_scale, causal, window_left, soft_cap, qp, op)


class CudaStore(Store):
    """``kvp_cuda_store_create``: the page arena on a GPU, byte for byte the
    CPU store's layout (``docs/formats.md``).

    ``arena`` hands over device memory the engine owns (at least the
    layout's arena bytes, ``arena_bytes``, 256-byte aligned); it must outlive
    the store, which keeps a reference to it. ``stream`` becomes the store's
    stream. :meth:`read`, :meth:`page_to_host` and the tier's swaps work as on
    the CPU store (page copies are asynchronous on the stream).

    The shape and format arguments and their defaults are :class:`kvpage.Store`'s
    (page_size 16, fp16 keys and values, token-major keys). ``device``
    defaults to 0, ``stream`` to None (the default stream), ``arena`` to None
    (the store allocates its arena), ``staging_bytes`` to 0 (4 MiB of pinned
    and device memory for the metadata uploaded per call)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, num_pages: int,
                 page_size: int = 16, k_format: FormatLike = Format.FP16,
                 v_format: FormatLike = Format.FP16, num_staging: int = 0,
                 dim_major_keys: bool = False, device: int = 0,
                 stream: Any = None, arena: Any = None, arena_bytes: int = 0,
                 staging_bytes: int = 0):
        self._cuda_c = _cuda_params(device, stream, arena, arena_bytes, staging_bytes)
        super().__init__(layers, kv_heads, head_dim, num_pages, page_size=page_size,
                         k_format=k_format, v_format=v_format, num_staging=num_staging,
                         dim_major_keys=dim_major_keys)
        self._arena_owner = arena  # engine memory stays alive as long as the store

    def _create_c(self, p, ptr, err) -> int:
        return L.kvp_cuda_store_create(ctypes.byref(p), ctypes.byref(self._cuda_c),
                                       ctypes.byref(ptr), err, len(err))

    def set_stream(self, stream: Any) -> None:
        """Make ``stream`` the store's stream (ordered after earlier work)."""
        self._check(L.kvp_cuda_store_set_stream(self._p(), stream_handle(stream)))

    def append(self, layer: int, k, v, slots, ops: Sequence[PageOp] = (), stream: Any = None,
               dtype: Any = None) -> None:
        """Write device rows of K/V at their slots (host int64 array, from
        ``Table.append``); SEAL ops quantize the pages they name. Enqueued on
        the store's stream; ``stream``, if given, becomes the store's stream
        first (:meth:`set_stream`)."""
        s = slots_of(slots)
        kp, kc, ks = device_rows(k, "k", self.kv_heads, self.head_dim, s.size, dtype)
        vp, vc, vs = device_rows(v, "v", self.kv_heads, self.head_dim, s.size, dtype)
        if kc != vc:
            raise ValueError("k and v must have the same dtype")
        a, _ops_keep = append_struct(layer, s, kp, vp, kc, ks, vs, ops)
        if stream is not None:
            self.set_stream(stream)
        self._check(L.kvp_store_append(self._p(), ctypes.byref(a)))

    def apply_ops(self, ops: Sequence[PageOp], stream: Any = None) -> None:
        """Run COPY and UNSEAL ops on the device, on the store's stream
        (``stream``, if given, becomes the store's stream first)."""
        arr = ops_array(ops)
        if stream is not None:
            self.set_stream(stream)
        self._check(L.kvp_store_apply_ops(self._p(), arr, len(ops)))


class CudaContext(Context):
    """``kvp_cuda_ctx_create``: attention on a GPU, with its split-KV
    workspace (``workspace_bytes``, 0 = 16 MiB) allocated once here."""

    def __init__(self, device: int = 0, stream: Any = None, workspace_bytes: int = 0,
                 staging_bytes: int = 0):
        self._cuda_c = _cuda_params(device, stream, staging_bytes=staging_bytes)
        super().__init__(workspace_bytes=workspace_bytes)

    def _create_c(self, p, ptr, err) -> int:
        return L.kvp_cuda_ctx_create(ctypes.byref(p), ctypes.byref(self._cuda_c),
                                     ctypes.byref(ptr), err, len(err))

    def set_stream(self, stream: Any) -> None:
        """Make ``stream`` the context's stream (ordered after earlier work)."""
        self._check(L.kvp_cuda_ctx_set_stream(self._p(), stream_handle(stream)))

    def set_timing(self, enable: bool = True) -> None:
        """Time each :meth:`attention` call's kernels on the device
        (``kvp_cuda_ctx_set_timing``): events right before its first kernel
        and after its last, the host's share left out."""
        self._check(L.kvp_cuda_ctx_set_timing(self._p(), 1 if enable else 0))

    def set_pipeline(self, enable: bool = True) -> None:
        """Bring K/V pages on chip through the multi-stage copy pipeline
        (default) or, with ``False``, the single-buffer loader
        (``kvp_cuda_ctx_set_pipeline``); the same results, for comparisons."""
        self._check(L.kvp_cuda_ctx_set_pipeline(self._p(), 1 if enable else 0))

    def kernel_time(self) -> float:
        """Seconds of device time of the last :meth:`attention` call, timed as
        :meth:`set_timing` says (waits for its kernels). Raises the library's
        error (``KVP_ESTATE``) when that call was not timed."""
        s = ctypes.c_double(0.0)
        self._check(L.kvp_cuda_ctx_kernel_time(self._p(), ctypes.byref(s)))
        return s.value

    def attention(self, store: Store, batch: Export, layer: int, q, out=None,
                  q_heads: Optional[int] = None, sm_scale: Optional[float] = None,
                  causal: bool = True, window_left: int = -1, soft_cap: float = 0.0,
                  stream: Any = None, dtype: Any = None, lse: Any = None):
        """Paged attention of device ``q``'s rows (``batch.qo_indptr``) over
        ``batch``'s pages into device ``out`` (required: nothing is allocated
        on the device here). ``lse``, if given, is a device float32 array of
        ``rows * q_heads`` log-sum-exp values. ``stream``, if given, becomes
        the context's stream first (:meth:`set_stream`). Returns ``out``."""
        rows = int(batch.qo_indptr[-1])
        p = _device_attention(layer, q, out, q_heads, store.head_dim, rows, sm_scale, causal,
                              window_left, soft_cap, dtype)
        if lse is not None:
            p.lse = _device_bytes(lse, "lse", 4 * rows * p.q_heads, writable=True)
        p.qo_indptr = batch.qo_indptr.ctypes.data
        if stream is not None:
            self.set_stream(stream)
        self._check(L.kvp_attention(self._p(), store._p(), ctypes.byref(batch.view),
                                    ctypes.byref(p)))
        return out


class CudaCache(Cache):
    """``kvp_cuda_cache_create``: the :class:`kvpage.Cache` façade with its
    store and context on a GPU (one device, one stream) and, with
    ``host_bytes``, a host tier in pinned memory whose swaps are
    asynchronous copies on that stream. :meth:`write` takes device K/V rows,
    :meth:`attend` device queries and a device ``out``; sequences and the
    step's metadata stay on the host. ``cache.store.synchronize()`` waits
    for the stream; ``cache.store.set_stream()`` and
    ``cache.context.set_stream()`` change it.

    The arguments and their defaults are :class:`kvpage.Cache`'s (page_size
    16, fp16, max_seqs 256, prefix cache on, no host tier), plus
    :class:`CudaStore`'s ``device`` (0), ``stream`` (None: the default
    stream), ``arena`` and ``staging_bytes``. ``sm_scale`` of :meth:`attend`
    defaults to 1/sqrt(head_dim)."""

    _store_class = CudaStore
    _context_class = CudaContext

    def __init__(self, layers: int, kv_heads: int, head_dim: int, num_pages: int = 0,
                 kv_budget: Union[int, str, None] = None, page_size: int = 16,
                 k_format: FormatLike = Format.FP16, v_format: FormatLike = Format.FP16,
                 max_seqs: int = 256, prefix_cache: bool = True, dim_major_keys: bool = False,
                 host_bytes: Union[int, str, None] = None, device: int = 0,
                 stream: Any = None, arena: Any = None, arena_bytes: int = 0,
                 staging_bytes: int = 0):
        self._cuda_c = _cuda_params(device, stream, arena, arena_bytes, staging_bytes)
        super().__init__(layers, kv_heads, head_dim, num_pages=num_pages, kv_budget=kv_budget,
                         page_size=page_size, k_format=k_format, v_format=v_format,
                         max_seqs=max_seqs, prefix_cache=prefix_cache,
                         dim_major_keys=dim_major_keys, host_bytes=host_bytes)
        self.device = device
        self._arena_owner = arena

    def _create_c(self, p, ptr, err) -> int:
        return L.kvp_cuda_cache_create(ctypes.byref(p), ctypes.byref(self._cuda_c),
                                       ctypes.byref(ptr), err, len(err))

    def write(self, layer: int, k, v, dtype: Any = None) -> None:
        """Write the step's device rows of K/V for one layer."""
        kp, kc, ks = device_rows(k, "k", self.kv_heads, self.head_dim, self._rows, dtype)
        vp, vc, vs = device_rows(v, "v", self.kv_heads, self.head_dim, self._rows, dtype)
        if kc != vc:
            raise ValueError("k and v must have the same dtype")
        self._check(L.kvp_cache_write(self._p(), layer, kc, kp or None, vp or None, ks, vs))

    def attend(self, layer: int, q, out=None, q_heads: Optional[int] = None,
               sm_scale: Optional[float] = None, causal: bool = True, window_left: int = -1,
               soft_cap: float = 0.0, dtype: Any = None):
        """Attention of the step's rows for one layer, from device ``q`` into
        device ``out`` (required); returns ``out``."""
        p = _device_attention(layer, q, out, q_heads, self.head_dim, self._rows, sm_scale, causal,
                              window_left, soft_cap, dtype)
        self._check(L.kvp_cache_attend(self._p(), ctypes.byref(p)))
        return out


def _device_quant(fn, src, pages, dst, format, heads, head_dim, dtype, is_value, page_size,
                  fp8_scale, dim_major_keys, stream, src_is_blocks):
    code, item = _dtype_code(dtype, "dtype")
    d = quant_desc(format, is_value, page_size, heads, head_dim, code, fp8_scale,
                   dim_major_keys)
    bb = ctypes.c_uint64()
    err = errbuf()
    check(L.kvp_quant_block_bytes(ctypes.byref(d), ctypes.byref(bb), err, len(err)), err)
    if pages < 1:
        raise ValueError("pages must be >= 1")
    block_bytes = pages * heads * bb.value
    tensor_bytes = pages * page_size * heads * head_dim * item
    s = _device_bytes(src, "src", block_bytes if src_is_blocks else tensor_bytes, False)
    o = _device_bytes(dst, "dst", tensor_bytes if src_is_blocks else block_bytes, True)
    check(fn(ctypes.byref(d), s, pages, o, stream_handle(stream), err, len(err)), err)


def quantize(src, pages: int, dst, format, heads: int, head_dim: int, dtype=np.float16,
             is_value: bool = False, page_size: int = 16, fp8_scale: float = 1.0,
             dim_major_keys: bool = False, stream: Any = None) -> None:
    """``kvp_cuda_quantize``: ``pages * page_size`` rows of ``[heads][head_dim]``
    device elements of ``dtype`` into ``[pages][heads]`` blocks at ``dst``
    (device), byte-identical to :func:`kvpage.quantize`. Asynchronous on
    ``stream``."""
    _device_quant(L.kvp_cuda_quantize, src, pages, dst, format, heads, head_dim, dtype,
                  is_value, page_size, fp8_scale, dim_major_keys, stream, False)


def dequantize(src, pages: int, dst, format, heads: int, head_dim: int, dtype=np.float32,
               is_value: bool = False, page_size: int = 16, fp8_scale: float = 1.0,
               dim_major_keys: bool = False, stream: Any = None) -> None:
    """``kvp_cuda_dequantize``: the inverse of :func:`quantize`, into device
    elements of ``dtype``, exactly :func:`kvpage.dequantize`'s values."""
    _device_quant(L.kvp_cuda_dequantize, src, pages, dst, format, heads, head_dim, dtype,
                  is_value, page_size, fp8_scale, dim_major_keys, stream, True)


class _Pinned:
    """Owns one kvp_cuda_host_alloc() block; freed when the last array over it goes."""

    def __init__(self, nbytes: int):
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(L.kvp_cuda_host_alloc(nbytes, ctypes.byref(ptr), err, len(err)), err)
        self.address = ptr.value
        self._finalizer = weakref.finalize(self, L.kvp_cuda_host_free, ptr.value)


def pinned_empty(shape, dtype=np.uint8) -> np.ndarray:
    """A NumPy array over pinned (page-locked) host memory, for asynchronous
    page copies (:meth:`Store.page_to_host`). Freed with the array."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if n <= 0:
        raise ValueError("pinned_empty needs a non-empty shape")
    owner = _Pinned(n)
    buf = (ctypes.c_char * n).from_address(owner.address)
    buf._kvpage_owner = owner  # the ctypes buffer keeps the allocation alive
    return np.frombuffer(buf, dtype=dt).reshape(shape)
