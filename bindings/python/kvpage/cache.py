"""The :class:`Cache` façade: page pool, page table, page store and attention
context (and optionally a host tier) kept consistent for a decode loop.

Per step::

    rows = cache.begin_step(seqs, num_new, tokens)   # all or nothing
    for layer in range(layers):
        cache.write(layer, k, v)                     # the step's rows of K and V
        out = cache.attend(layer, q)                 # paged attention of those rows

Beyond one process (a library built with the blob feature): give the cache
its model's identity with :meth:`Cache.set_blob`, add blob tiers
(:class:`kvpage.FileTier`, :class:`kvpage.PyTier`) with
:meth:`Cache.add_tier` for prefix reuse across processes, and move a
sequence to another cache with :meth:`Cache.seq_export` /
:meth:`Cache.seq_import`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import numpy as np
import numpy.typing as npt

from . import _lib
from ._arrays import Buffer, FloatArray, IntArray, buffer_address, rows_of
from ._handle import Handle
from .blob import (BlobCodec, BlobTier, CacheEvent, TierPolicy, _set_reason, _stats_dict,
                   _tokens_ptr, blob_params)
from .context import Context, Isa, host_attention
from .errors import check, errbuf, error_for
from .paging import Pool, Table, as_i32
from .plan import Format, format_of, parse_size
from .store import FormatLike, Store
from .tier import Tier

L = _lib.lib

_i32p = ctypes.POINTER(ctypes.c_int32)


def _borrowed_array(address: Optional[int], n: int, ctype, owner: Any) -> np.ndarray:
    """A read-only NumPy view of ``n`` C elements at ``address`` that keeps
    ``owner`` alive."""
    dtype = np.dtype(ctype)
    if n <= 0 or not address:
        a = np.empty(0, dtype)
    else:
        buf = (ctype * n).from_address(address)
        buf._kvpage_owner = owner
        a = np.frombuffer(buf, dtype=dtype)
    a.flags.writeable = False
    return a


@dataclass(frozen=True)
class StepView:
    """The current step's batch, as ``kvp_cache_step_view`` exports it: the
    CSR page table in FlashInfer's convention, and the step's rows.

    The arrays are read-only NumPy views of the cache's own buffers (no
    copy). They are valid until the next :meth:`Cache.begin_step` (or a
    fork, truncation, release or swap, which end the step): copy them
    (``np.array(view.indices)``) to keep them longer.

    Sequence ``b`` owns pages ``indices[indptr[b]:indptr[b+1]]`` in token
    order; its last page holds ``last_page_len[b]`` tokens. Page ids
    ``>= num_pages`` are fp16 staging pages. Its new rows are
    ``qo_indptr[b]:qo_indptr[b+1]``, written at ``slots`` (``page *
    page_size + offset``). A StepView can be passed as the ``batch`` of
    :meth:`kvpage.Context.attention`.
    """

    batch: int
    page_size: int
    num_pages: int
    num_staging: int
    rows: int
    indptr: npt.NDArray[np.int32]         #: ``[batch+1]``
    indices: npt.NDArray[np.int32]        #: ``[indptr[-1]]`` page ids
    last_page_len: npt.NDArray[np.int32]  #: ``[batch]``, 1 .. page_size
    slots: npt.NDArray[np.int64]          #: ``[rows]`` slots of the step's rows
    qo_indptr: npt.NDArray[np.int32]      #: ``[batch+1]`` row offsets
    view: _lib.KvViewC                    #: the ``kvp_kv_view_t`` itself


class Cache(Handle):
    """``kvp_cache_t``: pool + table + store + context (+ host tier) for a decode loop.

    Args:
        layers, kv_heads, head_dim: the model's shape (required).
        num_pages: pool pages; give this or ``kv_budget``.
        kv_budget: with ``num_pages`` 0, the arena's byte budget (an int, or a
            string such as ``"2GiB"``): as many pages as it holds, plus
            ``max_seqs`` staging pages for int8/int4 keys.
        page_size: tokens per page; default 16.
        k_format, v_format: :class:`Format`, its value or a name (``"fp32"``,
            ``"fp16"``, ``"bf16"``, ``"fp8"``, ``"int8"``, ``"int4"``); default fp16.
        max_seqs: live sequences at once (also the staging pages for int8/int4
            keys); default 256.
        prefix_cache: keep full pages for prefix reuse; default True.
        threads: attention threads, the caller's included; default 1.
        isa: CPU instruction set; default :attr:`Isa.AUTO`.
        dim_major_keys: ``[head_dim][token]`` key blocks for plain formats;
            default False (``[token][head_dim]``, FlashInfer's layout).
        host_bytes: a host tier of this many bytes for :meth:`swap_out` /
            :meth:`swap_in` (int or string); default None (no host tier).
        hash_seed: prefix-cache hash seed; default 0 (set it from a secret
            when prompts come from untrusted users).

    The parts are there for everything else: :attr:`pool` (statistics),
    :attr:`table` (sequence information), :attr:`store` (the arena),
    :attr:`context` and :attr:`tier`. They stay owned by the cache; change
    sequences through the cache's own methods.
    """

    _store_class = Store
    _context_class = Context

    def __init__(self, layers: int, kv_heads: int, head_dim: int, num_pages: int = 0,
                 kv_budget: Union[int, str, None] = None, page_size: int = 16,
                 k_format: FormatLike = Format.FP16, v_format: FormatLike = Format.FP16,
                 max_seqs: int = 256, prefix_cache: bool = True, threads: int = 1,
                 isa: Isa = Isa.AUTO, dim_major_keys: bool = False,
                 host_bytes: Union[int, str, None] = None, hash_seed: int = 0):
        p = _lib.new_struct(_lib.CacheParamsC)
        L.kvp_cache_params_init(ctypes.byref(p))
        p.layers, p.kv_heads, p.head_dim, p.page_size = layers, kv_heads, head_dim, page_size
        p.k_format, p.v_format = int(format_of(k_format)), int(format_of(v_format))
        p.k_order = 1 if dim_major_keys else 0
        p.max_seqs, p.prefix_cache, p.threads, p.isa = max_seqs, int(prefix_cache), threads, int(isa)
        p.num_pages = num_pages
        p.kv_budget_bytes = 0 if kv_budget is None else parse_size(kv_budget)
        p.host_bytes = 0 if host_bytes is None else parse_size(host_bytes)
        p.hash_seed = hash_seed
        ptr = ctypes.c_void_p()
        err = errbuf()
        check(self._create_c(p, ptr, err), err)
        super().__init__(ptr, L.kvp_cache_destroy)
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.page_size = page_size
        self._rows = 0
        self._parts_c = _lib.new_struct(_lib.CachePartsC)
        self._check(L.kvp_cache_parts(self._p(), ctypes.byref(self._parts_c)))
        self._parts: dict[str, Handle] = {}
        self._blob_tiers: list[BlobTier] = []
        self._event_fn = None
        self._event_error: list = [None]

    def _create_c(self, p, ptr, err) -> int:
        return L.kvp_cache_create(ctypes.byref(p), ctypes.byref(ptr), err, len(err))

    def close(self) -> None:
        """Destroy the cache and everything it owns (idempotent); its parts
        (:attr:`store`, :attr:`table`, ...) are closed with it. Pending
        write-through pages are written to the tiers first; the tiers
        themselves are not closed (a tier closed before the cache is
        destroyed now)."""
        for part in getattr(self, "_parts", {}).values():
            part.close()
        was_open = getattr(self, "_ptr", None) is not None
        super().close()
        if was_open:
            tiers, self._blob_tiers = getattr(self, "_blob_tiers", []), []
            for t in tiers:
                t._detach()

    def _check(self, rc: int, reason: Optional[ctypes.c_int32] = None) -> None:
        box = getattr(self, "_event_error", None)
        pending = None
        if box is not None:
            pending, box[0] = box[0], None
        if rc != 0:
            raise _set_reason(error_for(rc, L.kvp_cache_last_error(self._p()).decode()),
                              reason) from pending
        if pending is not None:
            raise pending

    # ---- the parts (kvp_cache_parts) ----------------------------------------

    def _part(self, name: str, make):
        self._p()  # raises Closed once the cache is closed
        part = self._parts.get(name)
        if part is None or part.closed:
            part = self._parts[name] = make(getattr(self._parts_c, name))
        return part

    @property
    def store(self) -> Store:
        """The cache's page arena (owned by the cache)."""
        return self._part("store", lambda ptr: self._store_class._borrow(ptr, self))

    @property
    def context(self) -> Context:
        """The cache's attention context (owned by the cache)."""
        return self._part("ctx", lambda ptr: self._context_class._borrow(ptr, self))

    @property
    def pool(self) -> Pool:
        """The cache's page pool (owned by the cache): statistics, events."""
        return self._part("pool", lambda ptr: Pool._borrow(ptr, self))

    @property
    def table(self) -> Table:
        """The cache's page table (owned by the cache): sequence information.
        Change sequences through the cache (its fork, truncate, release and
        swaps run the page operations on the arena)."""
        return self._part("table", lambda ptr: Table._borrow(ptr, self.pool, self))

    @property
    def tier(self) -> Optional[Tier]:
        """The cache's host tier, or None without ``host_bytes``."""
        if not self._parts_c.tier:
            self._p()
            return None
        return self._part("tier", lambda ptr: Tier._borrow(ptr, self.table, self))

    # ---- sequences ------------------------------------------------------------

    def create(self, priority: int = 0, salt: int = 0) -> int:
        """A new, empty sequence; returns its id.

        Args:
            priority: eviction priority of the pages it fills (higher is kept
                longer in the prefix cache); default 0.
            salt: prefix-cache namespace; sequences with different salts never
                share cached pages; default 0 (shared by every salt-0 sequence).
        """
        out = ctypes.c_int32()
        self._check(L.kvp_cache_seq_create(self._p(), priority, salt, ctypes.byref(out)))
        return out.value

    def release(self, seq: int) -> None:
        """End a sequence (resident or swapped out); its full pages stay in the
        prefix cache."""
        self._check(L.kvp_cache_seq_release(self._p(), seq))

    def fork(self, seq: int) -> int:
        """A child sharing every page of ``seq`` (parallel sampling, beam
        search); returns its id. Copies run on the arena at once."""
        out = ctypes.c_int32()
        self._check(L.kvp_cache_seq_fork(self._p(), seq, ctypes.byref(out)))
        return out.value

    def truncate(self, seq: int, length: int) -> None:
        """Shorten a sequence to ``length`` tokens (e.g. rejected speculative tokens)."""
        self._check(L.kvp_cache_seq_truncate(self._p(), seq, length))

    def attach_prefix(self, seq: int, tokens: IntArray) -> int:
        """Attach the longest cached prefix of ``tokens`` to an empty sequence;
        returns the tokens matched (whole pages: prefill the rest). Pass the
        prompt without its last token when its logits are needed."""
        t = as_i32(tokens, "tokens")
        out = ctypes.c_int64()
        self._check(L.kvp_cache_seq_attach_prefix(
            self._p(), seq, t.ctypes.data_as(_i32p) if t.size else None, t.size,
            ctypes.byref(out)))
        return out.value

    def info(self, seq: int) -> dict:
        """``kvp_seq_info_t`` of a sequence (length, pages, priority, salt,
        swapped, ...) as a dict, from the cache's table."""
        return self.table.info(seq)

    def length(self, seq: int) -> int:
        """Tokens of a sequence (``kvp_table_seq_info``)."""
        return self.table.length(seq)

    def swap_out(self, seq: int) -> None:
        """Move a sequence's KV to the host tier (needs ``host_bytes``);
        :class:`kvpage.HostFull` when it does not fit (nothing changes)."""
        self._check(L.kvp_cache_seq_swap_out(self._p(), seq))

    def swap_in(self, seq: int) -> None:
        """Bring a swapped-out sequence back, bit for bit."""
        self._check(L.kvp_cache_seq_swap_in(self._p(), seq))

    # ---- the step -----------------------------------------------------------------

    def begin_step(self, seqs: IntArray, num_new: IntArray,
                   tokens: Optional[IntArray] = None) -> int:
        """Start a step: append each sequence's new tokens, all or nothing
        (:class:`kvpage.NoSpace` names the batch index that did not fit), and
        export the batch. Returns the step's row count, ``sum(num_new)``.

        Args:
            seqs: distinct live sequence ids.
            num_new: new tokens per sequence (>= 1 each).
            tokens: the new tokens' ids in batch order (they feed the prefix
                cache), or None.
        """
        s, n = as_i32(seqs, "seqs"), as_i32(num_new, "num_new")
        if s.size != n.size:
            raise ValueError(f"num_new has {n.size} entries for {s.size} sequences")
        t = None if tokens is None else as_i32(tokens, "tokens")
        if t is not None and t.size != int(n.sum()):
            raise ValueError(f"tokens has {t.size} ids, num_new sums to {int(n.sum())}")
        rc = L.kvp_cache_begin_step(
            self._p(), s.ctypes.data_as(_i32p), s.size, n.ctypes.data_as(_i32p),
            None if t is None or t.size == 0 else t.ctypes.data_as(_i32p))
        if rc == 0:  # the step began, even if an event callback raised below
            self._rows = int(n.sum())
        self._check(rc)
        return self._rows

    def write(self, layer: int, k: FloatArray, v: FloatArray) -> None:
        """Write the step's rows of K and V for one layer (``[rows][kv_heads][head_dim]``,
        float32 or float16, rows in batch order), quantizing on the way in."""
        k, kc, ks = rows_of(k, "k", self.kv_heads, self.head_dim, self._rows)
        v, vc, vs = rows_of(v, "v", self.kv_heads, self.head_dim, self._rows)
        if kc != vc:
            raise ValueError("k and v must have the same dtype")
        self._check(L.kvp_cache_write(self._p(), layer, kc, k.ctypes.data, v.ctypes.data, ks, vs))

    def attend(self, layer: int, q: FloatArray, out: Optional[FloatArray] = None,
               q_heads: Optional[int] = None, sm_scale: Optional[float] = None,
               causal: bool = True, window_left: int = -1, soft_cap: float = 0.0,
               lse: Optional[npt.NDArray[np.float32]] = None) -> FloatArray:
        """Paged attention of the step's rows for one layer, after :meth:`write`.

        Args:
            q: ``[rows][q_heads][head_dim]`` queries, float32 or float16, C-contiguous.
            out: the output (q's shape and dtype); allocated if None (the default).
            q_heads: needed only for a 2-dimensional ``q``; a multiple of kv_heads.
            sm_scale: softmax scale; default (None) 1/sqrt(head_dim).
            causal: causal mask; default True.
            window_left: sliding window in tokens to the left; default -1 (none).
            soft_cap: logit soft cap if > 0; default 0 (off).
            lse: optional float32 ``[rows][q_heads]`` array for the log-sum-exp.

        Returns ``out``.
        """
        p, out, lse = host_attention(layer, q, out, lse, q_heads, self.head_dim, sm_scale,
                                     causal, window_left, soft_cap, self._rows)
        self._check(L.kvp_cache_attend(self._p(), ctypes.byref(p)))
        return out

    def step_view(self) -> StepView:
        """The current step's batch (CSR page table, slots, row offsets) for
        kernels of your own, as read-only NumPy views valid until the next
        step (see :class:`StepView`). :class:`kvpage.BadState` outside a step."""
        v = _lib.new_struct(_lib.KvViewC)
        slots = ctypes.POINTER(ctypes.c_int64)()
        qo = ctypes.POINTER(ctypes.c_int32)()
        rows = ctypes.c_int32()
        self._check(L.kvp_cache_step_view(self._p(), ctypes.byref(v), ctypes.byref(slots),
                                          ctypes.byref(qo), ctypes.byref(rows)))

        def addr(p) -> Optional[int]:
            return ctypes.cast(p, ctypes.c_void_p).value

        b = v.batch
        indptr = _borrowed_array(addr(v.indptr), b + 1, ctypes.c_int32, self)
        n_idx = int(indptr[-1]) if b > 0 else 0
        return StepView(
            batch=b, page_size=v.page_size, num_pages=v.num_pages, num_staging=v.num_staging,
            rows=rows.value, indptr=indptr,
            indices=_borrowed_array(addr(v.indices), n_idx, ctypes.c_int32, self),
            last_page_len=_borrowed_array(addr(v.last_page_len), b, ctypes.c_int32, self),
            slots=_borrowed_array(addr(slots), rows.value, ctypes.c_int64, self),
            qo_indptr=_borrowed_array(addr(qo), b + 1, ctypes.c_int32, self),
            view=v)

    def stats(self) -> dict:
        """The pool's statistics (pages, tokens, utilization, prefix hits) as a dict."""
        return self.pool.stats()

    # ---- beyond one process: blobs, tiers, sequence transfer (kvpage_blob.h) -----------

    def set_blob(self, fingerprint: Buffer, shard_index: int = 0, shard_count: int = 1,
                 auth_key: Optional[Buffer] = None) -> None:
        """Give the cache its blob identity (``kvp_cache_set_blob``): the
        model's 32-byte fingerprint (:func:`kvpage.fingerprint`), this
        cache's tensor-parallel shard, and an optional 16..64-byte key (blobs
        then carry an HMAC tag). Needed by the tier and sequence transfer
        calls; call once, before :meth:`add_tier`. Raises
        :class:`kvpage.NotSupported` in a build without the blob feature,
        :class:`kvpage.BadState` when set already."""
        p, _key = blob_params(fingerprint, shard_index, shard_count, auth_key)
        self._check(L.kvp_cache_set_blob(self._p(), ctypes.byref(p)))

    @property
    def blob_codec(self) -> BlobCodec:
        """The cache's codec (after :meth:`set_blob`), owned by the cache: its
        chain hashes (the keys its tiers use) and counters."""
        codec = self._parts.get("codec")
        if codec is None or codec.closed:
            ptr = ctypes.c_void_p()
            self._check(L.kvp_cache_blob_codec(self._p(), ctypes.byref(ptr)))
            codec = self._parts["codec"] = BlobCodec._borrow(ptr.value, self.store, self)
        return codec

    def add_tier(self, tier: BlobTier, policy: Union[TierPolicy, int]) -> int:
        """Add a blob tier behind the pool (``kvp_cache_add_tier``); returns its
        index (0, 1, ...) for :meth:`tier_stats` and events.

        ``policy`` is a non-empty set of :class:`kvpage.TierPolicy` flags:
        READ (look prompts up in it in :meth:`attach_prefix`, after the pool
        and the tiers added before), WRITE_BACK (write cached pages the pool
        evicts), WRITE_THROUGH (write each full page stored in the prefix
        cache, at the next step, release or :meth:`flush`).

        The cache does not own the tier but keeps it alive: close the tier
        after the cache (a tier closed earlier is destroyed when the cache
        is). Up to 8 tiers; call :meth:`set_blob` first."""
        if not isinstance(tier, BlobTier):
            raise TypeError(f"tier must be a kvpage.BlobTier (FileTier, PyTier), got "
                            f"{type(tier).__name__}")
        index = ctypes.c_int32()
        self._check(L.kvp_cache_add_tier(self._p(), tier._p(), int(policy), ctypes.byref(index)))
        tier._attach()
        self._blob_tiers.append(tier)
        return index.value

    @property
    def tiers(self) -> tuple[BlobTier, ...]:
        """The blob tiers added, by index."""
        return tuple(self._blob_tiers)

    def tier_stats(self, index: int) -> dict:
        """What tier ``index`` did for this cache (``kvp_cache_tier_stats_t``:
        lookups, hit_pages, miss_pages, rejected, rejects by
        :class:`kvpage.BlobReason`, written, errors, bytes, time) as a dict."""
        s = _lib.new_struct(_lib.CacheTierStatsC)
        self._check(L.kvp_cache_tier_stats(self._p(), index, ctypes.byref(s)))
        return _stats_dict(s)

    def flush(self) -> None:
        """Write pending write-through pages to the tiers now (the cache also
        does at the start of each step, before a release and when closed).
        Tier failures are counted in :meth:`tier_stats`, not raised."""
        self._check(L.kvp_cache_flush(self._p()))

    def clear_prefix(self) -> None:
        """Empty the prefix cache: every cached page is dropped (not written
        back) and one ``CLEARED`` event is sent. Raises
        :class:`kvpage.BadState` while sequences are live."""
        self._check(L.kvp_cache_clear_prefix(self._p()))

    def set_event_callback(self, fn: Optional[Callable[[CacheEvent], None]]) -> None:
        """Call ``fn(event)`` with each pool event as the cache sees it (a
        :class:`kvpage.CacheEvent`: the page stored, evicted or freed, the
        tier it came from or went to, its chain hash); None removes it.

        ``fn`` runs inside the cache's calls and must not call the cache. An
        exception it raises is kept and raised by the cache method during
        which it happened (or, for an event of a call on one of the cache's
        parts, by the next cache method), after the call itself has taken
        effect; the events that follow in that call still come.
        With tiers the cache listens to its pool itself: use this, not
        ``cache.pool.record_events()``, which would replace the cache's
        listener."""
        if fn is None:
            self._check(L.kvp_cache_set_event_callback(self._p(), _lib.CacheEventFn(), None))
            self._event_fn = None
            return
        box = self._event_error

        def on_event(_opaque, ev):
            try:
                fn(CacheEvent._from_c(ev.contents))
            except BaseException as e:  # noqa: BLE001 - raised after the C call returns
                if box[0] is None:
                    box[0] = e

        cb = _lib.CacheEventFn(on_event)
        self._check(L.kvp_cache_set_event_callback(self._p(), cb, None))
        self._event_fn = cb  # must outlive its use by the cache

    def seq_export_size(self, seq: int) -> tuple[int, int]:
        """(blobs, bytes) that :meth:`seq_export` writes for a resident sequence."""
        blobs = ctypes.c_int32()
        nbytes = ctypes.c_uint64()
        self._check(L.kvp_cache_seq_export_size(self._p(), seq, ctypes.byref(blobs),
                                                ctypes.byref(nbytes)))
        return blobs.value, nbytes.value

    def seq_export(self, seq: int, tokens: IntArray) -> bytes:
        """A resident sequence as consecutive page blobs, for another cache to
        continue it (:meth:`seq_import`). ``tokens`` are all its token ids:
        they name the pages and never enter a blob."""
        t = as_i32(tokens, "tokens")
        _, nbytes = self.seq_export_size(seq)
        buf = ctypes.create_string_buffer(nbytes)
        self._check(L.kvp_cache_seq_export(self._p(), seq, _tokens_ptr(t), t.size, buf, nbytes))
        return buf.raw

    def seq_import(self, seq: int, tokens: IntArray, data: Buffer) -> None:
        """Fill an empty resident sequence (of the exporter's salt) from
        :meth:`seq_export`'s bytes and the same ``tokens``. Pages this cache
        holds in its prefix cache are attached, every other blob is
        validated and written. All or nothing: a rejected blob raises
        :class:`kvpage.BadBlob` (its ``reason`` and detail say which and
        why) and leaves the sequence empty; :class:`kvpage.NoSpace` without
        enough free pages."""
        t = as_i32(tokens, "tokens")
        addr, n = buffer_address(data, "data", writable=False)
        reason = ctypes.c_int32()
        self._check(L.kvp_cache_seq_import(self._p(), seq, _tokens_ptr(t), t.size, addr, n,
                                           ctypes.byref(reason)), reason)
