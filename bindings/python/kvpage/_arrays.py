"""Checking the arrays and buffers passed to the library (no copies, ever).

A K/V/Q/output array must have the right dtype (float32 or float16) and
shape, rows of contiguous elements (rows themselves may be strided, e.g. the
K half of a fused KV tensor) and element alignment; anything else is a
``ValueError`` naming the problem.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from .plan import Format

#: Host K/V/Q/output tensors: ``[rows][heads][head_dim]`` or ``[rows][heads*head_dim]``.
FloatArray = Union[npt.NDArray[np.float32], npt.NDArray[np.float16]]
#: Token ids, sequence ids, counts: an int32 array is used as is, other
#: integer arrays and sequences of ints are converted once.
IntArray = Union[npt.NDArray[np.integer], Sequence[int]]
#: Slots of appended rows (``page * page_size + offset``), as ``Table.append`` returns them.
SlotArray = npt.NDArray[np.int64]
#: A contiguous host buffer: NumPy array, bytearray, bytes (read-only), memoryview.
Buffer = Union[npt.NDArray[np.uint8], bytearray, bytes, memoryview]

DTYPE_CODES = {np.dtype(np.float32): int(Format.FP32), np.dtype(np.float16): int(Format.FP16)}


def dtype_code(a: np.ndarray, what: str) -> int:
    code = DTYPE_CODES.get(a.dtype)
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
    code = dtype_code(a, what)
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
    if writable and not a.flags.writeable:
        raise ValueError(f"{what} is read-only")
    if a.size == 0:  # NumPy gives empty arrays arbitrary strides
        return a, code, width
    if not inner_ok or a.strides[0] % a.itemsize != 0 or a.strides[0] < width * a.itemsize:
        raise ValueError(f"{what} rows must hold contiguous elements (got strides {a.strides}); "
                         "use np.ascontiguousarray")
    if a.ctypes.data % a.itemsize != 0:
        raise ValueError(f"{what} is not aligned to its element size")
    return a, code, a.strides[0] // a.itemsize


def lse_of(lse, rows: int, q_heads: int) -> Optional[np.ndarray]:
    """Check an optional, writable, C-contiguous float32 [rows][q_heads] array."""
    if lse is None:
        return None
    if not isinstance(lse, np.ndarray) or lse.dtype != np.float32:
        raise ValueError("lse must be a float32 NumPy array")
    if lse.size != rows * q_heads or (lse.ndim == 2 and lse.shape != (rows, q_heads)):
        raise ValueError(f"lse must have shape [{rows}][{q_heads}], got {lse.shape}")
    if not lse.flags.c_contiguous or not lse.flags.writeable:
        raise ValueError("lse must be C-contiguous and writable")
    return lse


def buffer_address(buf, what: str, writable: bool) -> tuple[Optional[int], int]:
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
