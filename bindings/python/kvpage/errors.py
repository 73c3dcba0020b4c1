"""libkvpage status codes as Python exceptions.

Every failing call raises a subclass of :class:`Error` carrying the status
code, its symbolic name and the library's detail text (which argument was
bad, what the CUDA runtime said, ...).
"""

from __future__ import annotations

import ctypes

from . import _lib


class Error(Exception):
    """A libkvpage call failed.

    Attributes:
        status: the negative ``KVP_E*`` code.
        name: its symbolic name, e.g. ``"KVP_ENOSPC"``.
        detail: the library's explanation of this failure.
    """

    status: int = 0

    def __init__(self, status: int, detail: str = ""):
        self.status = status
        self.name = _lib.lib.kvp_status_name(status).decode()
        self.detail = detail
        message = _lib.lib.kvp_strerror(status).decode()
        super().__init__(f"{self.name}: {detail}" if detail else f"{self.name}: {message}")


class InvalidArgument(Error, ValueError):
    """KVP_EINVAL: an argument is invalid; nothing was changed."""


class OutOfMemory(Error, MemoryError):
    """KVP_ENOMEM: a host or device allocation failed."""


class NoSpace(Error):
    """KVP_ENOSPC: not enough free pages for the request."""


class NotFound(Error, LookupError):
    """KVP_ENOENT: no such sequence, entry, preset or device name."""


class NotSupported(Error):
    """KVP_ENOTSUP: not supported by this build, backend or format."""


class NoDevice(Error):
    """KVP_ENODEV: no usable device (no GPU, no driver, bad ordinal)."""


class CudaError(Error):
    """KVP_ECUDA: the CUDA runtime reported an error."""


class BadState(Error):
    """KVP_ESTATE: the object is in the wrong state for this call."""


class InternalError(Error):
    """KVP_EINTERNAL: an internal invariant failed (a bug in libkvpage)."""


class HostFull(Error):
    """KVP_EHOSTFULL: the host tier has no room for the sequence (it stays on the device)."""


class BadBlob(Error):
    """KVP_EBADBLOB: a page blob failed validation; nothing was written.

    Attributes:
        reason: why, as a :class:`kvpage.BlobReason` (e.g. ``CHECKSUM``,
            ``AUTH``); None when the call that failed gives no reason.
    """

    reason = None


class TierIOError(Error):
    """KVP_EIO: a blob tier's storage or connection failed."""


class AccessDenied(Error, PermissionError):
    """KVP_EACCES: a server refused the credentials (wrong password, unknown
    user) or a command the caller needs (an ACL without it); the detail text
    has the server's reply. Retrying does not help: fix the configuration."""


_BY_STATUS = {
    -1: InvalidArgument,
    -2: OutOfMemory,
    -3: NoSpace,
    -4: NotFound,
    -5: NotSupported,
    -6: NoDevice,
    -7: CudaError,
    -8: BadState,
    -9: InternalError,
    -10: HostFull,
    -11: BadBlob,
    -12: TierIOError,
    -13: AccessDenied,
}


def error_for(status: int, detail: str = "") -> Error:
    """The exception for a status code (plain :class:`Error` for unknown codes)."""
    return _BY_STATUS.get(status, Error)(status, detail)


def check(status: int, err: ctypes.Array | None = None) -> None:
    """Raise the matching exception when ``status`` is not KVP_OK."""
    if status != 0:
        detail = err.value.decode(errors="replace") if err is not None else ""
        raise error_for(status, detail)


def errbuf() -> ctypes.Array:
    """A fresh detail-text buffer of the size the library recommends."""
    return ctypes.create_string_buffer(_lib.ERR_SIZE)
