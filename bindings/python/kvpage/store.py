"""The page arena (:class:`Store`) on the CPU backend, and quantize /
dequantize of plain tensors into the store's block formats.

Arrays are passed by pointer, never copied behind your back (see
:mod:`kvpage._arrays` for what is accepted).
"""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from . import _lib
from ._arrays import Buffer, FloatArray, SlotArray, buffer_address, dtype_code, rows_of, slots_of
from ._handle import Handle
from .errors import check, errbuf, error_for
from .paging import PageOp
from .plan import Format, Layout, format_of, layout

L = _lib.lib

FormatLike = Union[Format, int, str]


class Backend(enum.IntEnum):
    """Where a store keeps its arena and a context runs its kernels (``kvp_backend``)."""

    CPU = 0
    CUDA = 1


@dataclass(frozen=True)
class StoreInfo:
    """``kvp_store_info_t``: where a store's arena is and what it holds."""

    backend: Backend
    device: int          #: CUDA device ordinal; -1 on the CPU
    dim_major_keys: bool #: k_order: True for ``[head_dim][token]`` key blocks
    num_pages: int       #: pool pages (ids 0 .. num_pages-1)
    num_staging: int     #: staging pages (ids num_pages .. num_pages+num_staging-1)
    arena: int           #: address of the arena's first byte (a device address on CUDA)
    arena_bytes: int     #: its size: exactly the layout's arena bytes


def append_struct(layer, slots, k_ptr, v_ptr, dtype, k_stride, v_stride, ops):
    """A filled ``kvp_append_params_t`` and the ops array it points to (keep both
    alive until the call)."""
    a = _lib.new_struct(_lib.AppendC)
    L.kvp_append_params_init(ctypes.byref(a))
    a.layer, a.rows, a.dtype = layer, slots.size, dtype
    a.k, a.v, a.k_row_stride, a.v_row_stride = k_ptr or None, v_ptr or None, k_stride, v_stride
    a.slots = slots.ctypes.data
    arr = ops_array(ops)
    a.ops, a.num_ops = ctypes.cast(arr, ctypes.c_void_p), len(ops)
    return a, arr


def ops_array(ops: Sequence[PageOp]):
    """The ops as a ``kvp_page_op_t`` array (at least one entry long)."""
    arr = (_lib.PageOpC * max(len(ops), 1))()
    for i, o in enumerate(ops):
        arr[i] = _lib.PageOpC(int(o.kind), o.src, o.dst, o.count, o.row)
    return arr


class Store(Handle):
    """``kvp_store_t``: the page arena on the CPU backend, one allocation of
    exactly the planner's byte count.

    Args:
        layers, kv_heads, head_dim: the model's shape (required).
        num_pages: pool pages (required, >= 1).
        page_size: tokens per page; default 16.
        k_format, v_format: :class:`Format`, its value or a name such as
            ``"int8"``; default fp16 for both.
        num_staging: fp16 staging pages; required (>= 1) when the key format
            is int8 or int4, ignored otherwise; default 0.
        dim_major_keys: store plain-format and staging keys ``[head_dim][token]``
            instead of the default ``[token][head_dim]``.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, num_pages: int,
                 page_size: int = 16, k_format: FormatLike = Format.FP16,
                 v_format: FormatLike = Format.FP16, num_staging: int = 0,
                 dim_major_keys: bool = False):
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
        self._set_shape()

    def _create_c(self, p, ptr, err) -> int:
        return L.kvp_store_create(ctypes.byref(p), ctypes.byref(ptr), err, len(err))

    @classmethod
    def _borrow(cls, ptr: int, owner) -> "Store":
        """A store owned by ``owner`` (a cache): never destroyed from here."""
        s = cls.__new__(cls)
        Handle.__init__(s, ctypes.c_void_p(ptr), lambda _p: None)
        s._owner = owner  # keeps the owner, and so the store, alive
        s._set_shape()
        return s

    def _set_shape(self) -> None:
        lay = self.layout()
        info = self.info()
        self.layers, self.kv_heads, self.head_dim = lay.layers, lay.kv_heads, lay.head_dim
        self.page_size = lay.page_size
        self.k_format, self.v_format = lay.k_format, lay.v_format
        self.num_pages, self.num_staging = info.num_pages, info.num_staging

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise error_for(rc, L.kvp_store_last_error(self._p()).decode())

    def info(self) -> StoreInfo:
        """Backend, device, page counts and the arena's address and size."""
        s = _lib.new_struct(_lib.StoreInfoC)
        self._check(L.kvp_store_info(self._p(), ctypes.byref(s)))
        return StoreInfo(Backend(s.backend), s.device, bool(s.k_order), s.num_pages,
                         s.num_staging, s.arena or 0, s.arena_bytes)

    @property
    def device(self) -> int:
        """The CUDA device ordinal of the arena; -1 on the CPU."""
        return self.info().device

    def layout(self) -> Layout:
        """The exact byte counts of the store's pages (``kvp_store_layout``)."""
        c = _lib.new_struct(_lib.LayoutC)
        self._check(L.kvp_store_layout(self._p(), ctypes.byref(c)))
        return layout(c.layers, c.kv_heads, c.head_dim, c.page_size, c.k_format, c.v_format)

    def arena(self) -> tuple[int, int]:
        """(address, bytes) of the arena: for kernels from elsewhere."""
        i = self.info()
        return i.arena, i.arena_bytes

    def append(self, layer: int, k: FloatArray, v: FloatArray, slots: SlotArray,
               ops: Sequence[PageOp] = ()) -> None:
        """Write rows of K and V (``[rows][kv_heads][head_dim]``, float32 or
        float16, one row per slot) at their slots, quantizing on the way in;
        the SEAL ops of the table's append are run here. Call once per layer
        with the same slots and ops."""
        s = slots_of(slots)
        k, kc, ks = rows_of(k, "k", self.kv_heads, self.head_dim, s.size)
        v, vc, vs = rows_of(v, "v", self.kv_heads, self.head_dim, s.size)
        if kc != vc:
            raise ValueError("k and v must have the same dtype")
        a, _ops_keep = append_struct(layer, s, k.ctypes.data, v.ctypes.data, kc, ks, vs, ops)
        self._check(L.kvp_store_append(self._p(), ctypes.byref(a)))

    def apply_ops(self, ops: Sequence[PageOp]) -> None:
        """Run COPY and UNSEAL ops (SEALs belong to the append), in order."""
        arr = ops_array(ops)
        self._check(L.kvp_store_apply_ops(self._p(), arr, len(ops)))

    def read(self, layer: int, page: int, token0: int = 0,
             count: Optional[int] = None) -> tuple[npt.NDArray[np.float32],
                                                   npt.NDArray[np.float32]]:
        """Dequantized K and V of tokens ``token0 .. token0+count-1`` of a page
        (``count`` defaults to the rest of the page): two float32
        ``[count][kv_heads][head_dim]`` arrays."""
        n = self.page_size - token0 if count is None else count
        k = np.empty((max(n, 0), self.kv_heads, self.head_dim), np.float32)
        v = np.empty_like(k)
        fp = ctypes.POINTER(ctypes.c_float)
        self._check(L.kvp_store_read(self._p(), layer, page, token0, n, k.ctypes.data_as(fp),
                                     v.ctypes.data_as(fp)))
        return k, v

    def page_to_host(self, page: int, dst: Buffer, offset: int = 0) -> None:
        """Copy bytes ``[offset, offset + len(dst))`` of a page's serialization
        (every layer's K blocks, then its V blocks) into ``dst``, a writable
        buffer (bytearray, uint8 NumPy array, pinned array). On a CUDA store
        the copy is asynchronous on the store's stream: ``dst`` is complete
        after :meth:`synchronize`."""
        addr, n = buffer_address(dst, "dst", writable=True)
        self._check(L.kvp_store_page_to_host(self._p(), page, offset, addr, n))

    def page_from_host(self, page: int, src: Buffer, offset: int = 0) -> None:
        """Write ``src`` (bytes from :meth:`page_to_host` of a store with the
        same layout) into a page's serialization at ``offset``. On a CUDA
        store ``src`` must stay unchanged until :meth:`synchronize`. Bytes
        from elsewhere are read safely but mean nothing unless
        :meth:`page_check` accepts them."""
        addr, n = buffer_address(src, "src", writable=False)
        self._check(L.kvp_store_page_from_host(self._p(), page, offset, addr, n))

    def page_check(self, page: int, src: Buffer) -> None:
        """Check that ``src`` is a well-formed serialization of page ``page``
        (the whole of it): int8/int4 scales finite and not negative, int4
        keys' outlier channels increasing and below head_dim. Raises
        :class:`kvpage.InvalidArgument` (the message names the block) if not."""
        addr, n = buffer_address(src, "src", writable=False)
        self._check(L.kvp_store_page_check(self._p(), page, addr, n))

    def synchronize(self) -> None:
        """Wait for the store's stream (nothing to wait for on the CPU); raises
        :class:`kvpage.CudaError` for a failure of work already enqueued."""
        self._check(L.kvp_store_synchronize(self._p()))

    def set_fp8_scale(self, layer: int, kv_head: int, is_value: bool, scale: float) -> None:
        """Set the fp8_e4m3 scale of one (layer, kv head) of K or V (> 0, finite).
        Scales still 0 ("not calibrated") are set by the first append."""
        self._check(L.kvp_store_set_fp8_scale(self._p(), layer, kv_head, int(is_value), scale))

    def fp8_scale(self, layer: int, kv_head: int, is_value: bool) -> float:
        """The fp8_e4m3 scale of one (layer, kv head) of K or V; 0 until calibrated."""
        out = ctypes.c_float()
        self._check(L.kvp_store_get_fp8_scale(self._p(), layer, kv_head, int(is_value),
                                              ctypes.byref(out)))
        return out.value

    @property
    def nonfinite_count(self) -> int:
        """NaN/Inf input elements the appends have seen (they are stored by the
        format's rules, docs/formats.md)."""
        out = ctypes.c_uint64()
        self._check(L.kvp_store_nonfinite_count(self._p(), ctypes.byref(out)))
        return out.value


def quant_desc(format, is_value, page_size, heads, head_dim, dtype, fp8_scale, dim_major_keys):
    """A filled ``kvp_quant_desc_t``."""
    d = _lib.new_struct(_lib.QuantDescC)
    d.format, d.is_value = int(format_of(format)), int(is_value)
    d.k_order = 1 if dim_major_keys else 0
    d.page_size, d.head_dim, d.heads, d.dtype = page_size, head_dim, heads, dtype
    d.fp8_scale = fp8_scale
    return d


def quantize(x: FloatArray, format: FormatLike, is_value: bool = False, page_size: int = 16,
             fp8_scale: float = 1.0, dim_major_keys: bool = False) -> npt.NDArray[np.uint8]:
    """Quantize a C-contiguous ``[pages*page_size][heads][head_dim]`` float32 or
    float16 tensor into the store's blocks: a uint8 array
    ``[pages][heads][block bytes]``, byte-identical to a store's.

    Args:
        format: the block format (:class:`Format`, value or name).
        is_value: value blocks (True) or key blocks (False, the default).
        page_size: tokens per block; default 16 (even for int4 keys).
        fp8_scale: the scale of fp8_e4m3 blocks; default 1.0.
        dim_major_keys: ``[head_dim][token]`` plain-format key blocks.
    """
    if not isinstance(x, np.ndarray) or x.ndim != 3 or not x.flags.c_contiguous:
        raise ValueError("x must be a C-contiguous [tokens][heads][head_dim] array")
    code = dtype_code(x, "x")
    if x.shape[0] % page_size:
        raise ValueError(f"x has {x.shape[0]} tokens, not a multiple of page_size {page_size}")
    d = quant_desc(format, is_value, page_size, x.shape[1], x.shape[2], code, fp8_scale,
                   dim_major_keys)
    bb = ctypes.c_uint64()
    err = errbuf()
    check(L.kvp_quant_block_bytes(ctypes.byref(d), ctypes.byref(bb), err, len(err)), err)
    pages = x.shape[0] // page_size
    out = np.empty((pages, x.shape[1], bb.value), np.uint8)
    check(L.kvp_quantize(ctypes.byref(d), x.ctypes.data, pages, out.ctypes.data, err, len(err)),
          err)
    return out


def dequantize(blocks: npt.NDArray[np.uint8], format: FormatLike, head_dim: int,
               is_value: bool = False, page_size: int = 16, fp8_scale: float = 1.0,
               dim_major_keys: bool = False) -> npt.NDArray[np.float32]:
    """Inverse of :func:`quantize` (same defaults): float32
    ``[pages*page_size][heads][head_dim]``."""
    if (not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint8 or blocks.ndim != 3
            or not blocks.flags.c_contiguous):
        raise ValueError("blocks must be a C-contiguous uint8 [pages][heads][bytes] array")
    pages, heads, nbytes = blocks.shape
    d = quant_desc(format, is_value, page_size, heads, head_dim, int(Format.FP32), fp8_scale,
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
