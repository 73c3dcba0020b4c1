"""KV beyond one process: page blobs, chain hashes and blob tiers
(``kvpage_blob.h``; ``docs/blob-format.md`` specifies the bytes).

A *page blob* is one page of KV (every layer's K and V blocks, in the
store's own bytes) behind a 192-byte header that says exactly what it is:
the model's fingerprint, the layout and formats, the tensor-parallel shard,
the page's *chain hash*, a checksum and, with a key, an HMAC tag. A page is
named by its chain hash: SHA-256 over its parent's hash and its token ids,
starting from a root into which the fingerprint, the layout, the formats,
the shard and the sequence's salt are hashed.

Here:

- hashes (chain hashes, tier keys) and fingerprints are 32-byte
  :class:`bytes` (:data:`Hash`); :func:`hash_hex` gives their text form;
- :class:`BlobCodec` writes and reads the blobs of one :class:`kvpage.Store`;
  a rejected blob raises :class:`kvpage.BadBlob`, whose ``reason``
  attribute is the :class:`BlobReason` (the detail text names it too);
- :class:`FileTier` keeps blobs in a directory; :class:`PyTier` turns any
  Python object with ``get``/``put``/``exists``/``remove`` methods into a
  tier the library (and a :class:`kvpage.Cache`) can use;
- :class:`TierPolicy` and :class:`CacheEvent` go with the cache's
  :meth:`~kvpage.Cache.set_blob`, :meth:`~kvpage.Cache.add_tier`,
  :meth:`~kvpage.Cache.seq_export` and :meth:`~kvpage.Cache.set_event_callback`.

The codec, the chain hashes and the cache's calls need a library built with
the blob feature (``kvpage.build_has(kvpage.Feature.BLOB)``); without it they
raise :class:`kvpage.NotSupported`. Tiers move opaque bytes and work in
every build.
"""

from __future__ import annotations

import ctypes
import enum
import os
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence, Union

import numpy as np

from . import _lib
from ._arrays import Buffer, IntArray, buffer_address
from ._handle import Handle
from .errors import BadBlob, Error, check, errbuf, error_for
from .paging import EventKind, as_i32
from .store import Store

L = _lib.lib

#: A chain hash (a page's name, a blob's key in a tier): 32 bytes.
Hash = bytes

#: Version of the blob format the library writes and reads.
FORMAT_VERSION = 1
#: Bytes of a blob's header; the payload follows it.
HEADER_BYTES = _lib.BLOB_HEADER_BYTES
#: Bytes of a model fingerprint.
FINGERPRINT_BYTES = _lib.FINGERPRINT_BYTES
#: Bytes of a chain hash.
HASH_BYTES = _lib.HASH_BYTES
#: Most bytes of an authentication key (the fewest is 16).
MAX_KEY_BYTES = _lib.BLOB_MAX_KEY_BYTES
#: The ``tier`` of a :class:`CacheEvent` that involves no tier.
TIER_NONE = -1

_KVP_ENOTSUP = -5
_KVP_EIO = -12


class BlobReason(enum.IntEnum):
    """Why a blob was rejected (``kvp_blob_reason``); :attr:`kvpage.BadBlob.reason`."""

    OK = 0           #: accepted
    TRUNCATED = 1    #: shorter (or longer) than its header and payload length say
    MAGIC = 2        #: not a page blob
    VERSION = 3      #: another format version or header size
    FINGERPRINT = 4  #: another model
    LAYOUT = 5       #: another layout (layers, kv heads, head dim, page size, key order)
    FORMAT = 6       #: other K/V formats, or other fp8 scales
    SHARD = 7        #: another tensor-parallel shard
    HASH = 8         #: not the chain hash asked for
    TOKENS = 9       #: another token count, or a staging flag that does not fit
    CHECKSUM = 10    #: corrupt bytes
    AUTH = 11        #: tag missing, unexpected or wrong (another key)
    PAYLOAD = 12     #: the payload breaks an invariant of its formats
    RESERVED = 13    #: unknown flags or non-zero reserved bytes


#: ``kvpage.blob.Reason`` is :class:`BlobReason` (``kvpage.Reason`` is the scheduler's).
Reason = BlobReason


class TierPolicy(enum.IntFlag):
    """What a cache does with a tier (``kvp_tier_policy``; combine with ``|``)."""

    READ = 1           #: look prompts up in it on admission (attach_prefix)
    WRITE_BACK = 2     #: write cached pages the pool evicts to it
    WRITE_THROUGH = 4  #: write every full page stored in the prefix cache to it


def reason_name(reason: int) -> str:
    """The name of a :class:`BlobReason`, e.g. ``"checksum"``; ``"unknown"`` out of range."""
    return L.kvp_blob_reason_name(int(reason)).decode()


def _hash_c(h: Any, what: str = "hash") -> _lib.HashC:
    try:
        if isinstance(h, (int, str)):
            raise TypeError
        b = bytes(h)
    except TypeError:
        raise ValueError(f"{what} must be {HASH_BYTES} bytes, got {type(h).__name__}") from None
    if len(b) != HASH_BYTES:
        raise ValueError(f"{what} must be {HASH_BYTES} bytes, got {len(b)}")
    return _lib.HashC.from_buffer_copy(b)


def _hash_ptr(h: Any, what: str):
    return None if h is None else ctypes.byref(_hash_c(h, what))


def _keys_c(keys: Sequence[Any]):
    arr = (_lib.HashC * max(len(keys), 1))()
    for i, k in enumerate(keys):
        arr[i] = _hash_c(k, f"keys[{i}]")
    return arr


def _hashes_of(address: int, n: int) -> list[bytes]:
    raw = ctypes.string_at(address, n * HASH_BYTES) if n > 0 else b""
    return [raw[i * HASH_BYTES:(i + 1) * HASH_BYTES] for i in range(n)]


def hash_hex(h: Hash) -> str:
    """The text form of a hash (``kvp_hash_hex``): 64 lowercase hexadecimal
    digits, the blob's key in a tier (a file tier adds ``.kvpb``)."""
    out = ctypes.create_string_buffer(2 * HASH_BYTES + 1)
    rc = L.kvp_hash_hex(ctypes.byref(_hash_c(h)), out)
    if rc != 0:
        raise error_for(rc, "kvp_hash_hex")
    return out.value.decode()


def _parts_of(parts) -> tuple[list, list]:
    keep, addrs, sizes = [], [], []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            part = part.encode()
        addr, n = buffer_address(part, f"parts[{i}]", writable=False)
        keep.append(part)
        addrs.append(addr)
        sizes.append(n)
    return keep, [addrs, sizes]


def fingerprint(*parts: Union[Buffer, str]) -> bytes:
    """A model fingerprint from the engine's own description of its model
    (``kvp_fingerprint``): SHA-256 of the concatenated parts, e.g. the
    architecture's name and hyperparameters, then the weights. Parts are
    bytes-like (a ``str`` is taken as UTF-8). Any 32 bytes that change
    whenever the weights, the architecture or the way K/V are computed change
    will do as well. :class:`kvpage.NotSupported` without the blob feature."""
    if not parts:
        raise ValueError("fingerprint needs at least one part")
    keep, (addrs, sizes) = _parts_of(parts)
    n = len(addrs)
    a = (ctypes.c_void_p * n)(*addrs)
    s = (ctypes.c_uint64 * n)(*sizes)
    out = (ctypes.c_uint8 * FINGERPRINT_BYTES)()
    rc = L.kvp_fingerprint(a, s, n, out)
    del keep
    if rc != 0:
        raise error_for(rc, "kvp_fingerprint" + (
            ": libkvpage was built without page blobs (needs libcrypto and libxxhash)"
            if rc == _KVP_ENOTSUP else ""))
    return bytes(out)


def blob_params(fp: Buffer, shard_index: int = 0, shard_count: int = 1,
                auth_key: Optional[Buffer] = None):
    """A filled ``kvp_blob_params_t`` and the key buffer it points to (keep
    both alive until the call)."""
    if isinstance(fp, (int, str)):
        raise ValueError(f"fingerprint must be {FINGERPRINT_BYTES} bytes, got "
                         f"{type(fp).__name__} (kvpage.fingerprint() makes one)")
    p = _lib.new_struct(_lib.BlobParamsC)
    L.kvp_blob_params_init(ctypes.byref(p))
    fpb = bytes(fp)
    if len(fpb) != FINGERPRINT_BYTES:
        raise ValueError(f"fingerprint must be {FINGERPRINT_BYTES} bytes, got {len(fpb)} "
                         "(kvpage.fingerprint() makes one)")
    ctypes.memmove(p.fingerprint, fpb, FINGERPRINT_BYTES)
    p.shard_index, p.shard_count = shard_index, shard_count
    key = None
    if auth_key is not None:
        kb = bytes(auth_key)
        if len(kb) == 0:
            raise ValueError(f"auth_key is empty (give 16..{MAX_KEY_BYTES} bytes, or None)")
        key = ctypes.create_string_buffer(kb, len(kb))
        p.auth_key = ctypes.cast(key, ctypes.c_void_p)
        p.auth_key_bytes = len(kb)  # outside 16..64 is the library's to refuse
    return p, key


def _set_reason(e: Error, reason: Optional[ctypes.c_int32]) -> Error:
    """Give a BadBlob the library's reason (None when it gave none)."""
    if isinstance(e, BadBlob):
        r = reason.value if reason is not None else 0
        try:
            e.reason = BlobReason(r) if r != 0 else None
        except ValueError:
            e.reason = r
    return e


@dataclass(frozen=True)
class BlobInfo:
    """What a valid blob's header says (``kvp_blob_info_t``)."""

    staging: bool       #: an fp16 staging page (a partly filled last page of int8/int4 keys)
    tokens: int         #: tokens the page holds
    payload_bytes: int  #: payload length
    hash: bytes         #: the chain hash it echoes


class BlobCodec(Handle):
    """``kvp_blob_codec_t``: writes and reads the page blobs of one store.

    Args:
        store: a :class:`kvpage.Store` (or a CUDA store); it must stay open
            while the codec is used (a call after it closed raises
            :class:`kvpage.Closed`). For fp8_e4m3 set its scales first: blobs
            carry a digest of them.
        fingerprint: the model's identity, 32 bytes, not all zero
            (:func:`fingerprint` makes one).
        shard_index, shard_count: this store's tensor-parallel shard; default 0 of 1.
        auth_key: None (default), or 16 to 64 bytes: blobs written carry an
            HMAC-SHA256 tag and blobs read must carry a valid one.

    Rejected blobs raise :class:`kvpage.BadBlob`: its ``reason`` attribute is
    the :class:`BlobReason`, its detail text names the reason and the field.
    Raises :class:`kvpage.NotSupported` in a build without the blob feature.
    """

    def __init__(self, store: Store, fingerprint: Buffer, shard_index: int = 0,
                 shard_count: int = 1, auth_key: Optional[Buffer] = None):
        p, _key = blob_params(fingerprint, shard_index, shard_count, auth_key)
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(L.kvp_blob_codec_create(store._p(), ctypes.byref(p), ctypes.byref(ptr), err,
                                      len(err)), err)
        super().__init__(ptr, L.kvp_blob_codec_destroy)
        self.store = store  # the store must outlive the codec
        self._set_shape()

    @classmethod
    def _borrow(cls, ptr: int, store: Store, owner) -> "BlobCodec":
        """A codec owned by ``owner`` (a cache): never destroyed from here."""
        c = cls.__new__(cls)
        Handle.__init__(c, ctypes.c_void_p(ptr), lambda _p: None)
        c._owner = owner
        c.store = store
        c._set_shape()
        return c

    def _set_shape(self) -> None:
        self.page_size = self.store.page_size
        self.num_pages = self.store.num_pages

    def _p(self) -> ctypes.c_void_p:
        ptr = super()._p()
        self.store._p()  # raises Closed once the store is gone
        return ptr

    def _check(self, rc: int, reason: Optional[ctypes.c_int32] = None) -> None:
        if rc != 0:
            raise _set_reason(error_for(rc, self.last_error), reason)

    @property
    def last_error(self) -> str:
        """Detail of the most recent failed call on this codec (sticky)."""
        return L.kvp_blob_codec_last_error(self._p()).decode(errors="replace")

    def chain_root(self, salt: int = 0) -> bytes:
        """The chain root of sequences of salt ``salt``: the parent of a prompt's first page."""
        out = _lib.HashC()
        self._check(L.kvp_blob_chain_root(self._p(), salt, ctypes.byref(out)))
        return bytes(out.bytes)

    def chain(self, parent: Hash, tokens: IntArray) -> list[bytes]:
        """Chain hashes of the pages of ``tokens`` following ``parent``: one per
        ``page_size`` tokens, the last one of a partly filled page (its tokens only)."""
        t = as_i32(tokens, "tokens")
        n = -(-t.size // self.page_size)
        out = (_lib.HashC * max(n, 1))()
        tp = t.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)) if t.size else None
        self._check(L.kvp_blob_chain(self._p(), ctypes.byref(_hash_c(parent, "parent")), tp,
                                     t.size, out))
        return _hashes_of(ctypes.addressof(out), n)

    def hashes(self, tokens: IntArray, salt: int = 0) -> list[bytes]:
        """Chain hashes of a sequence's pages from its first token:
        ``chain(chain_root(salt), tokens)``."""
        return self.chain(self.chain_root(salt), tokens)

    def size(self, staging: bool = False) -> int:
        """Bytes of one blob: header plus a pool page, or an fp16 staging page."""
        out = ctypes.c_uint64()
        self._check(L.kvp_blob_size(self._p(), int(staging), ctypes.byref(out)))
        return out.value

    def export(self, page: int, tokens: int, hash: Hash) -> bytes:
        """The blob of one page of the store: ``tokens`` it holds (page_size
        for a full pool page), ``hash`` its chain hash. A page id ``>=
        num_pages`` is a staging page."""
        n = self.size(staging=page >= self.num_pages)
        buf = ctypes.create_string_buffer(n)
        self._check(L.kvp_blob_export(self._p(), page, tokens, ctypes.byref(_hash_c(hash)),
                                      buf, n))
        return buf.raw

    def validate(self, blob: Buffer, expect: Optional[Hash] = None, tokens: int = 0) -> BlobInfo:
        """Check a blob against this codec without writing anything; its header's
        fields. ``expect``: the chain hash it must echo (None: any); ``tokens``:
        the token count it must hold (0: any). Raises :class:`kvpage.BadBlob`
        (``.reason`` says why) for a rejected blob."""
        addr, n = buffer_address(blob, "blob", writable=False)
        info = _lib.new_struct(_lib.BlobInfoC)
        reason = ctypes.c_int32()
        self._check(L.kvp_blob_validate(self._p(), addr, n, _hash_ptr(expect, "expect"), tokens,
                                        ctypes.byref(info), ctypes.byref(reason)), reason)
        return BlobInfo(bool(info.staging), info.tokens, info.payload_bytes,
                        bytes(info.hash.bytes))

    def import_(self, page: int, blob: Buffer, expect: Optional[Hash] = None,
                tokens: int = 0) -> None:
        """Validate a blob (as :meth:`validate`), then write its payload into
        ``page`` (a pool page for a pool-page blob, a staging page for a
        staging blob). A rejected blob writes nothing and raises
        :class:`kvpage.BadBlob` with its ``reason``."""
        addr, n = buffer_address(blob, "blob", writable=False)
        reason = ctypes.c_int32()
        self._check(L.kvp_blob_import(self._p(), page, addr, n, _hash_ptr(expect, "expect"),
                                      tokens, ctypes.byref(reason)), reason)

    def stats(self) -> dict:
        """Counters (``kvp_blob_stats_t``) as a dict; ``rejects`` maps each
        :class:`BlobReason` to its count."""
        s = _lib.new_struct(_lib.BlobStatsC)
        self._check(L.kvp_blob_codec_stats(self._p(), ctypes.byref(s)))
        return _stats_dict(s)


def _stats_dict(s) -> dict:
    out = {}
    for name, _ in s._fields_:
        if name in ("struct_size", "reserved_"):
            continue
        if name == "rejects":
            out[name] = {BlobReason(i): int(s.rejects[i]) for i in range(len(BlobReason))}
        else:
            out[name] = getattr(s, name)
    return out


# ---- blob tiers ---------------------------------------------------------------------------

class BlobTier(Handle):
    """``kvp_blob_tier_t``: blobs kept by key (a chain hash) somewhere, behind
    the library's checked, counted interface. Made by :class:`FileTier` and
    :class:`PyTier`.

    Keys are 32-byte hashes; the batched calls take lists of them (an empty
    list does nothing). A tier added to a :class:`kvpage.Cache` must be
    closed after the cache: closing it earlier only marks it closed here,
    and the library object is destroyed once the last cache using it is.
    """

    _users = 0
    _deferred: Optional[ctypes.c_void_p] = None

    def __init__(self, ptr: ctypes.c_void_p):
        super().__init__(ptr, L.kvp_blob_tier_destroy)

    def close(self) -> None:
        """Destroy the tier (idempotent); deferred while a cache still uses it."""
        if self._users > 0 and self._ptr is not None:
            self._deferred, self._ptr = self._ptr, None
            return
        super().close()

    def _attach(self) -> None:
        self._users += 1

    def _detach(self) -> None:
        self._users -= 1
        if self._users == 0 and self._deferred is not None:
            ptr, self._deferred = self._deferred, None
            self._destroy(ptr)

    def _begin(self) -> None:
        """Before a call: forget the last call's implementation failure."""

    def _cause(self) -> Optional[BaseException]:
        return None

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise error_for(rc, self.last_error) from self._cause()

    @property
    def name(self) -> str:
        """The tier's name ("file", "python", ...)."""
        return L.kvp_blob_tier_name(self._p()).decode(errors="replace")

    @property
    def last_error(self) -> str:
        """Detail of the most recent failed call on this tier (sticky)."""
        return L.kvp_blob_tier_last_error(self._p()).decode(errors="replace")

    def get(self, keys: Sequence[Hash], cap: int) -> list[Optional[bytes]]:
        """Fetch blobs: for each key its bytes, or None when the tier does not
        hold it or it is larger than ``cap`` bytes (e.g.
        :meth:`BlobCodec.size`). Raises :class:`kvpage.TierIOError` (or the
        implementation's status) when the call fails."""
        n = len(keys)
        if n == 0:
            return []
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        k = _keys_c(keys)
        room = (ctypes.c_char * (n * cap))()
        base = ctypes.addressof(room)
        bufs = (ctypes.c_void_p * n)(*[base + i * cap for i in range(n)])
        caps = (ctypes.c_uint64 * n)(*([cap] * n))
        sizes = (ctypes.c_uint64 * n)()
        p = self._p()
        self._begin()
        self._check(L.kvp_blob_tier_get(p, n, k, bufs, caps, sizes))
        return [ctypes.string_at(base + i * cap, sizes[i]) if sizes[i] else None
                for i in range(n)]

    def put(self, keys: Sequence[Hash], blobs: Sequence[Buffer]) -> None:
        """Store blobs (each at least one byte) under their keys, replacing any."""
        if len(keys) != len(blobs):
            raise ValueError(f"{len(keys)} keys for {len(blobs)} blobs")
        n = len(keys)
        if n == 0:
            return
        k = _keys_c(keys)
        addrs, lens = [], []
        for i, b in enumerate(blobs):
            a, m = buffer_address(b, f"blobs[{i}]", writable=False)
            addrs.append(a)
            lens.append(m)
        ptrs = (ctypes.c_void_p * n)(*addrs)
        sizes = (ctypes.c_uint64 * n)(*lens)
        p = self._p()
        self._begin()
        self._check(L.kvp_blob_tier_put(p, n, k, ptrs, sizes))

    def exists(self, keys: Sequence[Hash]) -> list[bool]:
        """Which keys the tier holds."""
        n = len(keys)
        if n == 0:
            return []
        k = _keys_c(keys)
        present = (ctypes.c_uint8 * n)()
        p = self._p()
        self._begin()
        self._check(L.kvp_blob_tier_exists(p, n, k, present))
        return [bool(x) for x in present]

    def remove(self, keys: Sequence[Hash]) -> None:
        """Remove keys (absent keys are not an error)."""
        n = len(keys)
        if n == 0:
            return
        k = _keys_c(keys)
        p = self._p()
        self._begin()
        self._check(L.kvp_blob_tier_remove(p, n, k))

    def stats(self) -> dict:
        """Counters (``kvp_blob_tier_stats_t``: gets, hits, puts, errors, bytes,
        time, and the entries and bytes held when the tier knows) as a dict."""
        s = _lib.new_struct(_lib.BlobTierStatsC)
        self._check(L.kvp_blob_tier_stats(self._p(), ctypes.byref(s)))
        return _stats_dict(s)


class FileTier(BlobTier):
    """A tier on a local directory (``kvp_file_tier_create``): one file per
    blob, ``<64 hex digits>.kvpb``, written under a temporary name and
    renamed into place, so a crash never leaves a partial blob visible.
    Several processes may share the directory.

    Args:
        path: the directory (created if missing; its parent must exist).
        max_bytes: byte cap of the blobs, least recently used removed first;
            default 0 (no cap).
        fsync: fsync each blob and the directory before it becomes visible;
            default True.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], max_bytes: int = 0,
                 fsync: bool = True):
        p = _lib.new_struct(_lib.FileTierParamsC)
        L.kvp_file_tier_params_init(ctypes.byref(p))
        self.path = os.fspath(path)
        p.path = os.fsencode(self.path)
        p.max_bytes, p.fsync = max_bytes, int(fsync)
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(L.kvp_file_tier_create(ctypes.byref(p), ctypes.byref(ptr), err, len(err)), err)
        super().__init__(ptr)


class QueueTier(BlobTier):
    """A tier whose puts never wait (``kvp_queue_tier_create``): blobs are
    copied into a queue and written to ``inner`` by a thread of its own.

    Blobs waiting or being written are visible to ``get`` and ``exists``.
    A put beyond ``max_bytes`` is dropped and counted (:meth:`info`).
    Closing the queue writes what is queued first. ``inner`` must stay open
    while the queue is (close the queue first); this object keeps a
    reference to it.

    Args:
        inner: the tier written from the queue's thread.
        max_bytes: most blob bytes waiting at once; default 256 MiB.
    """

    def __init__(self, inner: BlobTier, max_bytes: int = 256 << 20):
        p = _lib.new_struct(_lib.QueueTierParamsC)
        L.kvp_queue_tier_params_init(ctypes.byref(p))
        p.inner = inner._p()
        p.max_bytes = max_bytes
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(L.kvp_queue_tier_create(ctypes.byref(p), ctypes.byref(ptr), err, len(err)), err)
        self.inner = inner
        super().__init__(ptr)

    def info(self) -> dict[str, int]:
        """``queued``, ``queued_bytes``, ``dropped``, ``failed`` blobs."""
        info = _lib.new_struct(_lib.QueueTierInfoC)
        self._check(L.kvp_queue_tier_info(self._p(), ctypes.byref(info)))
        return {n: int(getattr(info, n)) for n in ("queued", "queued_bytes", "dropped", "failed")}

    def drain(self) -> None:
        """Wait until every queued blob has been written (or refused) behind."""
        self._check(L.kvp_queue_tier_drain(self._p()))


class BlobStorage(Protocol):
    """What a Python object implements to be a tier (:class:`PyTier`).

    Keys are 32-byte :class:`bytes`; every call gets at least one. ``get``
    returns one value per key: the blob's bytes (any bytes-like object), or
    None when absent. ``put`` must store whole blobs only (a ``get`` never
    sees part of one). Raising fails the whole call (see :class:`PyTier`).
    An optional ``usage()`` returns ``(entries, bytes)`` held now.
    """

    def get(self, keys: list[bytes]) -> Sequence[Optional[Buffer]]: ...

    def put(self, keys: list[bytes], blobs: list[bytes]) -> None: ...

    def exists(self, keys: list[bytes]) -> Sequence[bool]: ...

    def remove(self, keys: list[bytes]) -> None: ...


class _Failure:
    """The last failure of a Python tier's methods: the exception, and its
    message in C memory for the library's ``last_error`` call."""

    def __init__(self) -> None:
        self.exception: Optional[BaseException] = None  # most recent, kept
        self.pending: Optional[BaseException] = None    # of the current call
        self.message: Optional[ctypes.Array] = None

    def set(self, e: BaseException) -> int:
        self.exception = self.pending = e
        text = f"{type(e).__name__}: {e}".encode(errors="replace")[:_lib.ERR_SIZE - 1]
        self.message = ctypes.create_string_buffer(text)
        return e.status if isinstance(e, Error) and e.status < 0 else _KVP_EIO


def _copy_into(address: int, blob: Any) -> int:
    if isinstance(blob, bytes):
        ctypes.memmove(address, blob, len(blob))
        return len(blob)
    src, n = buffer_address(blob, "blob", writable=False)
    if n:
        ctypes.memmove(address, src, n)
    return n


def _blob_len(blob: Any) -> int:
    return len(blob) if isinstance(blob, (bytes, bytearray)) else memoryview(blob).nbytes


def _tier_callbacks(impl: Any, box: _Failure) -> dict:
    """C functions over ``impl``. They capture the implementation and the
    failure box, not the tier, so no reference cycle delays its destruction,
    and they never let an exception reach C."""

    def guarded(fn):
        def call(*args):
            try:
                fn(*args)
                return 0
            except BaseException as e:  # noqa: BLE001 - reported through last_error
                return box.set(e)
        return call

    def counted(what: str, values, n: int) -> list:
        values = list(values)
        if len(values) != n:
            raise ValueError(f"{what} returned {len(values)} values for {n} keys")
        return values

    @guarded
    def get(_self, n, keys, bufs, caps, sizes):
        blobs = counted("get", impl.get(_hashes_of(keys, n)), n)
        for i, blob in enumerate(blobs):
            size = 0 if blob is None else _blob_len(blob)
            if 0 < size <= caps[i]:  # larger than the room: a miss
                sizes[i] = _copy_into(bufs[i], blob)

    @guarded
    def put(_self, n, keys, blobs, sizes):
        impl.put(_hashes_of(keys, n), [ctypes.string_at(blobs[i], sizes[i]) for i in range(n)])

    @guarded
    def exists(_self, n, keys, present):
        for i, here in enumerate(counted("exists", impl.exists(_hashes_of(keys, n)), n)):
            present[i] = 1 if here else 0

    @guarded
    def remove(_self, n, keys):
        impl.remove(_hashes_of(keys, n))

    @guarded
    def usage(_self, entries, nbytes):
        e, b = impl.usage()
        entries[0], nbytes[0] = int(e), int(b)

    def last_error(_self):
        return ctypes.addressof(box.message) if box.message is not None else None

    fns = {"get": _lib.TIER_GET(get), "put": _lib.TIER_PUT(put),
           "exists": _lib.TIER_EXISTS(exists), "remove": _lib.TIER_REMOVE(remove),
           "last_error": _lib.TIER_LAST_ERROR(last_error)}
    if callable(getattr(impl, "usage", None)):
        fns["usage"] = _lib.TIER_USAGE(usage)
    return fns


class PyTier(BlobTier):
    """A tier implemented in Python (``kvp_blob_tier_create`` over ctypes
    callbacks): the engine's own storage, a dict, a client of a shared store.

    Args:
        storage: an object with the :class:`BlobStorage` methods.
        name: a short name for reports (at most 31 bytes are kept); default "python".

    The methods run on the caller's thread, inside the library's calls (a
    cache's attach_prefix, begin_step, flush, release). An exception raised
    by one never reaches C: the call fails for its whole batch with the
    exception's status when it is a :class:`kvpage.Error`, else
    ``KVP_EIO``; the library's detail text gets ``"<type>: <message>"`` and
    :attr:`last_exception` keeps the exception. A cache counts such a failure
    (``errors`` of :meth:`kvpage.Cache.tier_stats`) and carries on as if the
    keys were absent; calling this tier's :meth:`get` and friends directly
    raises :class:`kvpage.TierIOError` chained to the exception.

    Whatever ``get`` returns is validated before a cache uses it.
    """

    def __init__(self, storage: BlobStorage, name: str = "python"):
        for m in ("get", "put", "exists", "remove"):
            if not callable(getattr(storage, m, None)):
                raise TypeError(f"storage has no {m}() method (needs get, put, exists, remove)")
        self.storage = storage
        self._failure = _Failure()
        self._callbacks = _tier_callbacks(storage, self._failure)  # must outlive the tier
        ops = _lib.new_struct(_lib.BlobTierOpsC)
        for field, fn in self._callbacks.items():
            setattr(ops, field, fn)
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(L.kvp_blob_tier_create(ctypes.byref(ops), None, name.encode(), ctypes.byref(ptr),
                                     err, len(err)), err)
        super().__init__(ptr)

    @property
    def last_exception(self) -> Optional[BaseException]:
        """The most recent exception raised by the storage's methods, or None."""
        return self._failure.exception

    def _begin(self) -> None:
        self._failure.pending = None

    def _cause(self) -> Optional[BaseException]:
        return self._failure.pending


# ---- the cache's events ----------------------------------------------------------------

@dataclass(frozen=True)
class CacheEvent:
    """A pool event as a cache sees it (``kvp_cache_event_t``), for
    :meth:`kvpage.Cache.set_event_callback`."""

    kind: EventKind               #: STORED, EVICTED or FREED
    page: int                     #: the pool page
    parent: int                   #: the parent page (-1 for a first page)
    priority: int                 #: eviction priority
    tier: int                     #: STORED: tier imported from; EVICTED: written to; else -1
    hash: int                     #: the pool's 64-bit prefix hash
    chain: Optional[bytes]        #: the page's chain hash (its blob key); None when unknown
    parent_chain: Optional[bytes]  #: its parent's chain hash (the root for a first page)

    @classmethod
    def _from_c(cls, e: _lib.CacheEventC) -> "CacheEvent":
        def h(x) -> Optional[bytes]:
            b = bytes(x.bytes)
            return b if any(b) else None

        try:
            kind: Any = EventKind(e.kind)
        except ValueError:
            kind = e.kind
        return cls(kind, e.page, e.parent, e.priority, e.tier, e.hash, h(e.chain),
                   h(e.parent_chain))


def _tokens_ptr(t: np.ndarray):
    return t.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)) if t.size else None
