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
- :class:`FileTier` keeps blobs in a directory; :class:`QueueTier` puts
  them behind another tier from a thread of its own; :class:`RedisTier`
  keeps them on Redis or Valkey servers; :class:`PyTier` turns any Python
  object with ``get``/``put``/``exists``/``remove`` methods into a tier the
  library (and a :class:`kvpage.Cache`) can use;
- :class:`TierPolicy` and :class:`CacheEvent` go with the cache's
  :meth:`~kvpage.Cache.set_blob`, :meth:`~kvpage.Cache.add_tier`,
  :meth:`~kvpage.Cache.seq_export` and :meth:`~kvpage.Cache.set_event_callback`.

The codec, the chain hashes and the cache's calls need a library built with
the blob feature (``kvpage.build_has(kvpage.Feature.BLOB)``); without it they
raise :class:`kvpage.NotSupported`. Tiers move opaque bytes and work in
every build, but for :class:`RedisTier`, which needs a library built with
hiredis (``kvpage.build_has(kvpage.Feature.REDIS)``).
"""

from __future__ import annotations

import ctypes
import enum
import os
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Protocol, Sequence, Union

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
    the library's checked, counted interface. Made by :class:`FileTier`,
    :class:`QueueTier`, :class:`RedisTier` and :class:`PyTier`.

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
        """The tier's name ("file", "queue:file", "redis", "python", ...)."""
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


def _text(value: Optional[str], what: str) -> Optional[bytes]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str or None, got {type(value).__name__}")
    b = value.encode()
    if b"\0" in b:
        raise ValueError(f"{what} contains a NUL character")
    return b


_CLUSTER = {None: -1, False: 0, True: 1, -1: -1, 0: 0, 1: 1}


class RedisTier(BlobTier):
    """A tier on Redis or Valkey (``kvp_redis_tier_create``): one string key
    per blob, ``<prefix><64 hex digits>``, shared by every process that uses
    the same servers, prefix and identity.

    Each call is one pipelined exchange per server (``GET``, ``SET`` with an
    optional ``EX``, ``EXISTS``, ``UNLINK``). Several standalone servers form
    a sharded set (each key on one of them, by rendezvous hashing); in a
    Redis/Valkey Cluster keys follow the slot map and its ``MOVED``/``ASK``
    redirects. Creation connects to every server, authenticates, and tries
    each command on a probe key under the prefix, so a wrong password or a
    missing ACL permission raises :class:`kvpage.AccessDenied` here, with the
    server's words, not at the first put.

    A call never waits longer than ``timeout_ms`` in all. A server that is
    slow, dead or unreachable is disconnected and left alone for a backoff
    (``retry_min_ms``, doubling up to ``retry_max_ms``); its keys fail
    meanwhile. A :class:`kvpage.Cache` takes such a failure as misses (its
    :meth:`~kvpage.Cache.tier_stats` count it), never as an error of its own
    call. Called directly, :meth:`get` and :meth:`exists` raise
    :class:`kvpage.TierIOError` when no key could be answered, and give the
    others' keys as misses (None, False) when only some servers failed;
    :meth:`put` and :meth:`remove` raise when any key failed.
    :meth:`reconnect` retries every server at once; :meth:`info` counts
    exchanges, failures, timeouts and redirects.

    Every blob a cache reads back is validated before use, so an evicted,
    expired, corrupt or foreign one is a miss, never attached. Calls on one
    tier are serialized; it may be shared between threads.

    Args:
        uri: ``redis://[user:password@]host[:port][/db]`` (port 6379 and db 0
            by default; user and password percent-encoded), or several of
            them (a sequence, or one string with commas or spaces between).
        cluster: None (default): ask the first server that answers
            (``CLUSTER SLOTS``); False: standalone servers; True: a Cluster
            whose nodes ``uri`` lists some of.
        user: ACL user for URIs that name none (default None: none, or the
            server's ``default`` user with a password).
        password: password for URIs that carry none, so that it need not be
            written in a URI (default None).
        prefix: key namespace, at most 64 bytes; default ``"kvp:"``.
        connect_timeout_ms: longest wait for one connection; default 250.
        timeout_ms: budget of one call, whatever it waits for (the lock,
            connections, every server's replies); default 100.
        ttl_s: expire each stored blob after this many seconds; default 0:
            never (the server's eviction policy decides).
        retry_min_ms, retry_max_ms: backoff after a server fails before a
            reconnection is tried, doubling from the first to the second;
            default 100 and 5000.

    Raises :class:`kvpage.InvalidArgument` for a malformed URI or a bad
    parameter, :class:`kvpage.TierIOError` when a server cannot be reached
    or answers wrongly, :class:`kvpage.AccessDenied` for refused credentials
    or commands, and :class:`kvpage.NotSupported` in a build without hiredis.
    """

    def __init__(self, uri: Union[str, Iterable[str]], *, cluster: Optional[bool] = None,
                 user: Optional[str] = None, password: Optional[str] = None,
                 prefix: Optional[str] = None, connect_timeout_ms: Optional[int] = None,
                 timeout_ms: Optional[int] = None, ttl_s: Optional[int] = None,
                 retry_min_ms: Optional[int] = None, retry_max_ms: Optional[int] = None):
        if not isinstance(uri, str):
            uri = ",".join(uri)
        if cluster not in _CLUSTER:
            raise ValueError(f"cluster must be None, False or True, got {cluster!r}")
        p = _lib.new_struct(_lib.RedisTierParamsC)
        L.kvp_redis_tier_params_init(ctypes.byref(p))
        p.uri = _text(uri, "uri")
        p.cluster = _CLUSTER[cluster]
        p.user = _text(user, "user")
        p.password = _text(password, "password")
        if prefix is not None:
            p.prefix = _text(prefix, "prefix")
        for name, value in (("connect_timeout_ms", connect_timeout_ms),
                            ("timeout_ms", timeout_ms), ("ttl_s", ttl_s),
                            ("retry_min_ms", retry_min_ms), ("retry_max_ms", retry_max_ms)):
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(f"{name} must be an int, got {type(value).__name__}")
                if not -2**31 <= value < 2**31:
                    raise ValueError(f"{name} is out of range: {value}")
                setattr(p, name, value)
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(L.kvp_redis_tier_create(ctypes.byref(p), ctypes.byref(ptr), err, len(err)), err)
        # the library copied the strings; none (no password) is kept here
        self.prefix = (p.prefix or b"kvp:").decode()
        super().__init__(ptr)

    def info(self) -> dict[str, int]:
        """Connection state and counters (``kvp_redis_tier_info_t``):
        ``cluster`` (1: a Cluster, 0: standalone servers), ``nodes`` (servers
        known), ``nodes_down`` (of which waiting to be reconnected),
        ``round_trips`` (pipelined exchanges), ``commands`` (sent),
        ``connects`` (first connections and reconnections), ``failures``
        (connections refused, lost or timed out), ``timeouts`` (calls that
        ran out of their budget), ``skipped`` (keys not sent: their server
        was down), ``server_errors`` (error replies other than redirects),
        ``moved``, ``asked`` (redirects followed), ``slot_refreshes``."""
        info = _lib.new_struct(_lib.RedisTierInfoC)
        self._check(L.kvp_redis_tier_info(self._p(), ctypes.byref(info)))
        return {n: int(getattr(info, n))
                for n in ("cluster", "nodes", "nodes_down") + _lib.REDIS_TIER_COUNTERS}

    def reconnect(self) -> None:
        """Forget every backoff and connect to the servers that are down now
        (each within the connect timeout; a Cluster's slot map is read again).
        Raises :class:`kvpage.TierIOError` when some server still does not
        answer (it is retried after its backoff, as before) and
        :class:`kvpage.AccessDenied` when one refuses the credentials."""
        self._check(L.kvp_redis_tier_reconnect(self._p()))


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
    """A cache event (``kvp_cache_event_t``), for
    :meth:`kvpage.Cache.set_event_callback`: a pool event with its tier and
    chain hashes, or a tier event. Replaying the stream gives what the cache
    holds: STORED adds ``chain`` to the pool, EVICTED removes it, CLEARED
    empties it; TIER_STORED adds ``chain`` to tier ``tier``, TIER_REMOVED
    removes it (vLLM's and Dynamo's stored / removed / cleared)."""

    kind: EventKind               #: STORED, EVICTED, FREED, TIER_STORED, TIER_REMOVED, CLEARED
    page: int                     #: the pool page (-1 for tier events and CLEARED)
    parent: int                   #: the parent page (-1 for a first page)
    priority: int                 #: eviction priority
    tier: int                     #: STORED: tier imported from; EVICTED: written to;
    #: TIER_*: the tier; else -1
    hash: int                     #: the pool's 64-bit prefix hash
    chain: Optional[bytes]        #: the page's chain hash (its blob key); None when unknown
    parent_chain: Optional[bytes]  #: its parent's chain hash (the root for a first page)
    seq_no: int = 0               #: the event's number in the cache's stream (0, 1, 2, ...)
    page_size: int = 0            #: tokens per page (vLLM's block_size)
    tokens: Optional[tuple] = None  #: STORED: the page's token ids

    @classmethod
    def _from_c(cls, e: _lib.CacheEventC) -> "CacheEvent":
        def h(x) -> Optional[bytes]:
            b = bytes(x.bytes)
            return b if any(b) else None

        try:
            kind: Any = EventKind(e.kind)
        except ValueError:
            kind = e.kind
        toks = (tuple(e.tokens[i] for i in range(e.num_tokens))
                if e.num_tokens > 0 and e.tokens else None)
        return cls(kind, e.page, e.parent, e.priority, e.tier, e.hash, h(e.chain),
                   h(e.parent_chain), e.seq_no, e.page_size, toks)


def _tokens_ptr(t: np.ndarray):
    return t.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)) if t.size else None
