"""Lifetime of library objects: destroyed exactly once, never used after close."""

from __future__ import annotations

import ctypes
from typing import Callable


class Closed(ValueError):
    """The object was closed; it can no longer be used."""


class Handle:
    """Owns one opaque library pointer and its destroy function.

    ``close()`` (or leaving a ``with`` block, or garbage collection) destroys
    it exactly once; any later use raises :class:`Closed`.
    """

    _destroy: Callable[[ctypes.c_void_p], None]
    #: For an object owned by another (a cache's parts): the owner, kept alive.
    _owner: object = None

    def __init__(self, ptr: ctypes.c_void_p, destroy: Callable[[ctypes.c_void_p], None]):
        self._ptr = ptr
        self._destroy = destroy

    @property
    def closed(self) -> bool:
        """True once the object has been destroyed."""
        return self._ptr is None

    def _p(self) -> ctypes.c_void_p:
        if self._ptr is None:
            raise Closed(f"{type(self).__name__} is closed")
        return self._ptr

    def close(self) -> None:
        """Destroy the library object (idempotent)."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._destroy(ptr)

    def __enter__(self):
        self._p()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass
