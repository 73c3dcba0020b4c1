"""Page blobs, chain hashes and blob tiers through Python (kvpage.blob), and
the cache's use of them: prefix reuse through a tier, sequence transfer,
events, a tier written in Python."""

import gc
import hashlib

import numpy as np
import pytest

import kvpage
from kvpage import (BadBlob, BlobCodec, BlobReason, Cache, CacheEvent, EventKind, FileTier,
                    Pool, PyTier, Store, Table, TierIOError, TierPolicy)
from kvpage.blob import hash_hex, reason_name

from _reference import D, H, QH

HAVE_BLOB = kvpage.build_has(kvpage.Feature.BLOB)
pytestmark = pytest.mark.skipif(
    not HAVE_BLOB,
    reason="libkvpage was built without the blob feature (needs OpenSSL's libcrypto and "
           "libxxhash: install libssl-dev and libxxhash-dev and rebuild); "
           "test_blob_unbuilt.py covers that build")

FP = bytes(range(32))  # the fingerprint of docs/blob-format.md's test vectors
MODEL = kvpage.fingerprint(b"test-model", b"weights v1") if HAVE_BLOB else FP


# ---- chain hashes: docs/blob-format.md's test vectors --------------------------------------

def test_chain_hash_vector_a():
    store = Store(layers=2, kv_heads=2, head_dim=64, num_pages=4, page_size=4,
                  k_format="fp16", v_format="fp16")
    codec = BlobCodec(store, FP)
    root = codec.chain_root(0)
    assert root.hex() == "f923d2b8c429134788bfc004d575b3c05b790a46036eafc0261aa9b7658c7f7f"
    pages = codec.chain(root, list(range(1, 11)))
    assert [hash_hex(h) for h in pages] == [
        "786beae07bd63d796af386a23212aed594684bb54288819d2508eaee340cad2b",
        "a5eb7d2bdfedc79877c64713f58c10e48413f26bf552ee62d8aed595f1267389",
        "0afe237f591e09f33fc34676f48b496dc83247ba3f175435012ecd7ef8526b7a",
    ]
    assert codec.hashes(np.arange(1, 11, dtype=np.int32)) == pages
    # a chain continues from any page: the second page from the first's hash
    assert codec.chain(pages[0], range(5, 11)) == pages[1:]
    # a name is the SHA-256 of its parent's name and its tokens (little-endian u32)
    tokens = np.arange(1, 5, dtype="<u4").tobytes()
    assert hashlib.sha256(root + tokens).digest() == pages[0]
    assert codec.chain(root, []) == []


def test_chain_hash_vector_b():
    store = Store(layers=2, kv_heads=2, head_dim=64, num_pages=4, page_size=4,
                  k_format="int8", v_format="int4_v1", num_staging=1)
    codec = BlobCodec(store, FP, shard_index=1, shard_count=2)
    root = codec.chain_root(0x0123456789ABCDEF)
    assert root.hex() == "1efd0f8f085a6886235ca1b122f8af5285ec3f4f1cbfbf150e9c32f2898ff549"
    pages = codec.chain(root, [0, -1, 2147483647, -2147483648, 100000])
    assert [h.hex() for h in pages] == [
        "a70df438596718211798ab5a623c5e840f80104b06d325b2437f722c5e92bc40",
        "fc0d22b469f8f5d61bab35eff09a7f4c9172f28a40524b3664bd0c07ba3466c4",
    ]


def test_fingerprint_hash_hex_and_reasons():
    assert kvpage.fingerprint(b"abc", bytearray(b"def"), "gh") == \
        hashlib.sha256(b"abcdefgh").digest()
    assert kvpage.fingerprint(np.arange(4, dtype=np.uint8), b"") == \
        hashlib.sha256(bytes([0, 1, 2, 3])).digest()
    with pytest.raises(ValueError, match="at least one"):
        kvpage.fingerprint()
    assert hash_hex(FP) == FP.hex()
    with pytest.raises(ValueError, match="32 bytes"):
        hash_hex(b"short")
    assert reason_name(BlobReason.CHECKSUM) == "checksum"
    assert reason_name(BlobReason.AUTH) == "auth"
    assert reason_name(99) == "unknown"
    assert [reason_name(r) for r in BlobReason] == [r.name.lower() for r in BlobReason]
    assert kvpage.blob.Reason is BlobReason


def test_codec_arguments():
    store = Store(layers=1, kv_heads=H, head_dim=D, num_pages=4, page_size=16)
    with pytest.raises(kvpage.InvalidArgument, match="all zero"):
        BlobCodec(store, bytes(32))
    with pytest.raises(ValueError, match="32 bytes"):
        BlobCodec(store, b"x" * 31)
    with pytest.raises(kvpage.InvalidArgument, match="shard_index"):
        BlobCodec(store, MODEL, shard_index=2, shard_count=2)
    with pytest.raises(kvpage.InvalidArgument, match="auth_key_bytes"):
        BlobCodec(store, MODEL, auth_key=b"k" * 8)
    codec = BlobCodec(store, MODEL, auth_key=b"k" * 16)
    lay = store.layout()
    assert codec.size() == kvpage.blob.HEADER_BYTES + lay.page_bytes
    store.close()
    with pytest.raises(kvpage.Closed):  # the store must outlive the codec
        codec.chain_root()
    codec.close()
    with pytest.raises(kvpage.Closed):
        codec.size()


# ---- export and import between stores ------------------------------------------------------

def _filled_store(k_format, v_format, tokens, seed, scales=None):
    """A store (pool, table) holding one sequence of `tokens` tokens of random K/V."""
    rng = np.random.default_rng(seed)
    staging = 2 if k_format in ("int8", "int4") else 0
    pool = Pool(num_pages=8, page_size=16, num_staging=staging)
    table = Table(pool)
    store = Store(layers=2, kv_heads=H, head_dim=D, num_pages=8, page_size=16,
                  k_format=k_format, v_format=v_format, num_staging=staging)
    if scales:
        _set_fp8_scales(store, scales)
    s = table.create()
    slots, ops = table.append(s, np.arange(tokens))
    for layer in range(2):
        k = rng.normal(size=(tokens, H, D)).astype(np.float32)
        v = rng.normal(size=(tokens, H, D)).astype(np.float32)
        store.append(layer, k, v, slots, ops)
    info = table.info(s)
    pages = list(table.pages(s))
    if info["staging_page"] >= 0 and len(pages) * 16 < tokens:
        pages.append(info["staging_page"])
    return pool, table, store, pages


def _set_fp8_scales(store, scale):
    """Set every fp8_e4m3 scale of a store (blobs carry a digest of them)."""
    for layer in range(store.layers):
        for head in range(store.kv_heads):
            for is_value, fmt in ((False, store.k_format), (True, store.v_format)):
                if fmt == kvpage.Format.FP8_E4M3:
                    store.set_fp8_scale(layer, head, is_value, scale)


def _page_bytes(store, page):
    lay = store.layout()
    n = lay.staging_page_bytes if page >= store.num_pages else lay.page_bytes
    buf = bytearray(n)
    store.page_to_host(page, buf)
    return bytes(buf)


@pytest.mark.parametrize("k_format,v_format", [("fp16", "fp16"), ("fp32", "int8"),
                                               ("bf16", "int4"), ("int8", "int4"),
                                               ("int4", "int8"), ("fp8", "fp8")])
def test_export_import_round_trip_is_bit_exact(k_format, v_format):
    tokens = 40  # two full pages and a partly filled one
    scales = 0.05 if k_format == "fp8" else None
    _, _, src, pages = _filled_store(k_format, v_format, tokens, seed=3, scales=scales)
    _, _, dst, _ = _filled_store(k_format, v_format, 1, seed=4, scales=scales)
    a, b = BlobCodec(src, MODEL), BlobCodec(dst, MODEL)
    names = a.hashes(np.arange(tokens))
    assert len(names) == len(pages) == 3
    for i, (page, name) in enumerate(zip(pages, names)):
        held = min(16, tokens - 16 * i)
        blob = a.export(page, held, name)
        staging = page >= src.num_pages
        assert len(blob) == a.size(staging=staging)
        assert blob[:4] == b"KVPB"
        info = b.validate(blob, expect=name, tokens=held)
        assert info == kvpage.BlobInfo(staging, held, len(blob) - 192, name)
        target = 6 - i if not staging else dst.num_pages + 1
        b.import_(target, blob, expect=name, tokens=held)
        assert _page_bytes(dst, target) == blob[192:]  # the page holds the payload, exactly
        for layer in range(2):
            ka, va = src.read(layer, page, 0, held)
            kb, vb = dst.read(layer, target, 0, held)
            assert np.array_equal(ka, kb) and np.array_equal(va, vb)
            if held < 16:  # past its tokens, a partly filled page travels as zeros
                kz, vz = dst.read(layer, target, held, 16 - held)
                assert not kz.any() and not vz.any()
    sa, sb = a.stats(), b.stats()
    assert sa["exported"] == 3 and sa["bytes_out"] == sum(a.size(p >= src.num_pages)
                                                          for p in pages)
    assert sb["imported"] == 6 and sb["rejected"] == 0  # 3 validated, 3 imported


@pytest.mark.parametrize("v_format", ["int8", "int4"])
def test_partly_filled_page_with_stale_slots_is_accepted(v_format):
    """The slots a partly filled page does not hold keep whatever bytes the
    page held before (here: not even valid scales); they never leave the
    process (the blob carries zeros there) and do not make it invalid."""
    store = Store(layers=1, kv_heads=H, head_dim=D, num_pages=4, page_size=16,
                  k_format="fp16", v_format=v_format)
    store.page_from_host(2, b"\xff" * store.layout().page_bytes)
    rows = np.random.default_rng(0).normal(size=(8, H, D)).astype(np.float32)
    store.append(0, rows, rows, np.arange(32, 40, dtype=np.int64))  # tokens 0..7 of page 2
    codec = BlobCodec(store, MODEL)
    name = codec.hashes(np.arange(40))[2]
    blob = codec.export(2, 8, name)
    assert b"\xff" * 64 not in blob  # the stale bytes stayed home
    assert codec.validate(blob, expect=name, tokens=8).tokens == 8
    codec.import_(1, blob, expect=name, tokens=8)
    k1, v1 = store.read(0, 1, 0, 8)
    k2, v2 = store.read(0, 2, 0, 8)
    assert np.array_equal(k1, k2) and np.array_equal(v1, v2)


def test_fp8_blobs_of_other_scales_are_refused():
    _, _, src, pages = _filled_store("fp8", "fp16", 16, seed=5, scales=0.05)
    _, _, dst, _ = _filled_store("fp8", "fp16", 1, seed=6, scales=0.07)
    a, b = BlobCodec(src, MODEL), BlobCodec(dst, MODEL)
    name = a.hashes(np.arange(16))[0]
    with pytest.raises(BadBlob) as e:
        b.import_(5, a.export(pages[0], 16, name), expect=name)
    assert e.value.reason == BlobReason.FORMAT


def _one_blob(**codec_args):
    _, _, store, pages = _filled_store("fp16", "int8", 16, seed=7)
    codec = BlobCodec(store, MODEL, **codec_args)
    name = codec.hashes(np.arange(16))[0]
    return store, codec, name, codec.export(pages[0], 16, name)


def test_corrupt_blobs_are_bad_blobs_with_their_reason():
    store, codec, name, blob = _one_blob()
    before = _page_bytes(store, 5)
    bad = bytearray(blob)
    bad[192 + 100] ^= 0x01  # one bit of the payload
    with pytest.raises(BadBlob) as e:
        codec.validate(bad, expect=name)
    assert e.value.reason == BlobReason.CHECKSUM
    assert e.value.status == -11 and e.value.name == "KVP_EBADBLOB"
    assert "checksum" in e.value.detail
    with pytest.raises(BadBlob) as e:
        codec.import_(5, bytes(bad), expect=name)
    assert e.value.reason == BlobReason.CHECKSUM
    assert _page_bytes(store, 5) == before  # a rejected blob writes nothing
    for blob_bytes, expect, tokens, reason in [
            (blob[:100], None, 0, BlobReason.TRUNCATED),
            (blob + b"\0", None, 0, BlobReason.TRUNCATED),
            (b"XXXX" + blob[4:], None, 0, BlobReason.MAGIC),
            (blob, bytes(32), 0, BlobReason.HASH),
            (blob, None, 3, BlobReason.TOKENS)]:
        with pytest.raises(BadBlob) as e:
            codec.validate(blob_bytes, expect=expect, tokens=tokens)
        assert e.value.reason == reason, reason
        assert reason_name(reason) in e.value.detail
    # another model's blob, intact: identity, not integrity
    other = BlobCodec(store, kvpage.fingerprint(b"another model"))
    with pytest.raises(BadBlob) as e:
        other.validate(blob)
    assert e.value.reason == BlobReason.FINGERPRINT
    # another shard
    shard = BlobCodec(store, MODEL, shard_index=1, shard_count=2)
    with pytest.raises(BadBlob) as e:
        shard.validate(blob)
    assert e.value.reason == BlobReason.SHARD
    st = codec.stats()
    assert st["rejected"] == 7
    assert st["rejects"][BlobReason.CHECKSUM] == 2 and st["rejects"][BlobReason.TRUNCATED] == 2
    assert codec.validate(blob, expect=name).hash == name  # the intact blob still passes


def test_authentication():
    key = b"a tenant's secret key"
    store, keyed, name, blob = _one_blob(auth_key=key)
    assert keyed.validate(blob, expect=name).tokens == 16
    wrong = BlobCodec(store, MODEL, auth_key=b"another tenant's key")
    with pytest.raises(BadBlob) as e:
        wrong.validate(blob, expect=name)
    assert e.value.reason == BlobReason.AUTH
    unkeyed = BlobCodec(store, MODEL)
    with pytest.raises(BadBlob) as e:  # a reader without a key refuses tagged blobs
        unkeyed.validate(blob)
    assert e.value.reason == BlobReason.AUTH
    plain = unkeyed.export(0, 16, name)
    with pytest.raises(BadBlob) as e:  # and a reader with one refuses untagged blobs
        keyed.validate(plain)
    assert e.value.reason == BlobReason.AUTH


# ---- tiers -------------------------------------------------------------------------------

def _key(i: int) -> bytes:
    return hashlib.sha256(b"key %d" % i).digest()


def test_file_tier_round_trip(tmp_path):
    path = tmp_path / "blobs"
    with FileTier(path, fsync=False) as t:
        assert t.name == "file"
        keys = [_key(i) for i in range(3)]
        blobs = [bytes([i]) * (100 + i) for i in range(3)]
        t.put(keys[:2], blobs[:2])
        assert t.exists(keys) == [True, True, False]
        assert t.get(keys, cap=4096) == [blobs[0], blobs[1], None]
        assert t.get(keys[:1], cap=50) == [None]  # larger than the room: a miss
        assert sorted(p.name for p in path.iterdir()) == sorted(
            hash_hex(k) + ".kvpb" for k in keys[:2])
        t.put([keys[0]], [np.frombuffer(b"replaced", np.uint8)])
        t.remove([keys[1], keys[2]])  # absent keys are no error
        assert t.exists(keys) == [True, False, False]
        s = t.stats()
        assert s["puts"] == 3 and s["gets"] == 4 and s["hits"] == 2 and s["errors"] == 0
        assert s["entries"] == 1 and s["bytes"] == len(b"replaced")
        assert t.get([], cap=1) == [] and t.exists([]) == []
        with pytest.raises(ValueError, match="2 keys for 1 blobs"):
            t.put(keys[:2], blobs[:1])
        with pytest.raises(kvpage.InvalidArgument, match="put: "):
            t.put(keys[:1], [b""])
        with pytest.raises(ValueError, match="32 bytes"):
            t.exists([b"short"])
    # another tier on the same directory sees what the first wrote
    with FileTier(str(path)) as again:
        assert again.get([keys[0]], cap=100) == [b"replaced"]
        assert again.stats()["entries"] == 1
    # a byte cap: least recently used blobs go
    with FileTier(tmp_path / "capped", max_bytes=3000, fsync=False) as capped:
        for i in range(10):
            capped.put([_key(i)], [bytes(1000)])
        s = capped.stats()
        assert s["bytes"] <= 3000 and s["entries"] <= 3
        assert capped.exists([_key(9)]) == [True]
    with pytest.raises(kvpage.TierIOError):
        FileTier(tmp_path / "missing" / "parent")


class DictStorage:
    """The engine's own tier, in a dict."""

    def __init__(self):
        self.blobs = {}
        self.calls = []

    def get(self, keys):
        self.calls.append(("get", len(keys)))
        return [self.blobs.get(k) for k in keys]

    def put(self, keys, blobs):
        self.calls.append(("put", len(keys)))
        self.blobs.update(zip(keys, blobs))

    def exists(self, keys):
        return [k in self.blobs for k in keys]

    def remove(self, keys):
        self.calls.append(("remove", len(keys)))
        for k in keys:
            self.blobs.pop(k, None)

    def usage(self):
        return len(self.blobs), sum(len(b) for b in self.blobs.values())


def test_py_tier_direct_calls():
    storage = DictStorage()
    with PyTier(storage, name="dict") as t:
        assert t.name == "dict"
        t.put([_key(1), _key(2)], [b"one", bytearray(b"two")])
        assert storage.blobs == {_key(1): b"one", _key(2): b"two"}
        assert t.get([_key(2), _key(3), _key(1)], cap=16) == [b"two", None, b"one"]
        assert t.exists([_key(1), _key(3)]) == [True, False]
        t.remove([_key(1)])
        s = t.stats()
        assert (s["entries"], s["bytes"]) == (1, 3)
        assert s["gets"] == 3 and s["hits"] == 2 and s["puts"] == 2

        def broken(keys):
            raise RuntimeError("the store is down")

        storage.get = broken
        with pytest.raises(TierIOError) as e:
            t.get([_key(2)], cap=16)
        assert isinstance(e.value.__cause__, RuntimeError)
        assert "RuntimeError: the store is down" in e.value.detail
        assert "RuntimeError: the store is down" in t.last_error
        assert isinstance(t.last_exception, RuntimeError)
        assert t.stats()["errors"] == 1
        storage.exists = lambda keys: [True]  # one answer for two keys
        with pytest.raises(TierIOError, match="exists returned 1 values for 2 keys"):
            t.exists([_key(1), _key(2)])
        storage.remove = lambda keys: (_ for _ in ()).throw(kvpage.NotFound(-4, "no such key"))
        with pytest.raises(kvpage.NotFound):  # a kvpage.Error keeps its status
            t.remove([_key(1)])
    with pytest.raises(TypeError, match="put"):
        PyTier(object())


# ---- the cache with tiers ------------------------------------------------------------------

def _cache(**kw):
    args = dict(layers=2, kv_heads=H, head_dim=D, num_pages=32, page_size=16, max_seqs=4)
    args.update(kw)
    return Cache(**args)


def _prefill(cache, seq, tokens, seed, start=0):
    """One step of `tokens` rows (K/V/Q rows `start` .. of the stream `seed`);
    returns the attention of the last row per layer."""
    n = len(tokens)
    cache.begin_step([seq], [n], tokens)
    outs = []
    for layer in range(2):
        k, v, q = _rows(seed, layer, start, n)
        cache.write(layer, k, v)
        outs.append(cache.attend(layer, q, sm_scale=0.125)[-1].copy())
    return outs


def _rows(seed, layer, start, n):
    """K, V and Q rows start .. start+n-1 of a layer: the same in every cache."""
    out = []
    for what in range(3):
        heads = QH if what == 2 else H
        rows = [np.random.default_rng([seed, layer, what, start + i]).normal(size=(heads, D))
                for i in range(n)]
        out.append(np.array(rows, np.float32))
    return out


def test_cache_prefix_reuse_through_a_file_tier(tmp_path):
    prompt = np.random.default_rng(8).integers(0, 32000, 40).astype(np.int32)
    path = tmp_path / "kv"
    writer_tier = FileTier(path, fsync=False)
    reader_tier = FileTier(path, fsync=False)
    with _cache() as a, _cache() as b:
        a.set_blob(MODEL)
        assert a.add_tier(writer_tier, TierPolicy.WRITE_THROUGH) == 0
        events = []
        a.set_event_callback(events.append)
        s = a.create()
        _prefill(a, s, prompt, 11)
        a.flush()
        names = a.blob_codec.hashes(prompt)[:2]  # the two full pages
        assert a.tier_stats(0)["written"] == 2
        assert sorted(p.name for p in path.iterdir()) == sorted(hash_hex(n) + ".kvpb"
                                                                for n in names)
        stored = [e for e in events if e.kind == EventKind.STORED]
        assert [e.chain for e in stored] == names
        assert stored[0].parent_chain == a.blob_codec.chain_root(0)
        assert stored[1].parent_chain == names[0] and stored[1].parent == stored[0].page
        assert all(isinstance(e, CacheEvent) and e.tier == -1 for e in stored)

        b.set_blob(MODEL)
        b.add_tier(reader_tier, TierPolicy.READ)
        b_events = []
        b.set_event_callback(b_events.append)
        t = b.create()
        assert b.attach_prefix(t, prompt) == 32
        st = b.tier_stats(0)
        assert st["hit_pages"] == 2 and st["lookups"] == 2 and st["rejected"] == 0
        assert st["bytes_in"] == 2 * b.blob_codec.size()
        assert reader_tier.stats()["hits"] == 2
        assert [(e.kind, e.tier, e.chain) for e in b_events] == [
            (EventKind.STORED, 0, names[0]), (EventKind.STORED, 0, names[1])]
        for pa, pb in zip(a.table.pages(s)[:2], b.table.pages(t)[:2]):
            assert _page_bytes(a.store, pa) == _page_bytes(b.store, pb)
        # b prefills the rest of the prompt; then both decode one token
        _prefill(b, t, prompt[32:], 11, start=32)
        nxt = np.array([7], np.int32)
        out_a = _prefill(a, s, nxt, 11, start=40)
        out_b = _prefill(b, t, nxt, 11, start=40)
        for x, y in zip(out_a, out_b):
            assert np.array_equal(x, y)
    # the caches are closed: the tiers can be
    writer_tier.close()
    reader_tier.close()


def test_cache_tier_calls_need_an_identity_and_a_tier(tmp_path):
    with _cache() as c, FileTier(tmp_path / "t") as t:
        with pytest.raises(kvpage.BadState, match="set_blob"):
            c.add_tier(t, TierPolicy.READ)
        with pytest.raises(kvpage.BadState):
            c.blob_codec
        c.set_blob(MODEL)
        with pytest.raises(kvpage.BadState, match="already"):
            c.set_blob(MODEL)
        with pytest.raises(kvpage.InvalidArgument, match="policy"):
            c.add_tier(t, 0)
        with pytest.raises(TypeError):
            c.add_tier("a directory", TierPolicy.READ)
        c.add_tier(t, TierPolicy.READ | TierPolicy.WRITE_BACK)
        with pytest.raises(kvpage.InvalidArgument, match="already"):
            c.add_tier(t, TierPolicy.READ)
        with pytest.raises(kvpage.InvalidArgument, match="index 3"):
            c.tier_stats(3)
        assert c.tiers == (t,)
        s = c.create()
        with pytest.raises(kvpage.InvalidArgument):
            c.seq_export(s, [])  # empty


def test_tier_closed_before_the_cache_lives_until_the_cache_is_closed(tmp_path):
    storage = DictStorage()
    tier = PyTier(storage)
    c = _cache()
    c.set_blob(MODEL)
    c.add_tier(tier, TierPolicy.WRITE_THROUGH)
    s = c.create()
    prompt = np.arange(16, dtype=np.int32)
    c.begin_step([s], [16], prompt)
    for layer in range(2):
        k, v, _ = _rows(1, layer, 0, 16)
        c.write(layer, k, v)
    name = c.blob_codec.hashes(prompt)[0]
    tier.close()  # too early: deferred
    assert tier.closed
    with pytest.raises(kvpage.Closed):
        tier.stats()
    assert storage.blobs == {}
    c.close()  # writes its pending page through to the (still alive) tier, then frees it
    assert list(storage.blobs) == [name]
    del c, tier
    gc.collect()


def test_py_tier_with_a_cache_write_back_and_read():
    storage = DictStorage()
    writer = PyTier(storage)
    # 4 pages: a second prompt evicts the first one's cached pages
    with _cache(num_pages=4) as a:
        a.set_blob(MODEL)
        a.add_tier(writer, TierPolicy.WRITE_BACK)
        events = []
        a.set_event_callback(events.append)
        first = np.arange(100, 148, dtype=np.int32)
        s = a.create()
        _prefill(a, s, first, 21)
        a.release(s)
        assert storage.blobs == {}  # cached in the pool, not written yet
        s2 = a.create()
        _prefill(a, s2, np.arange(500, 564, dtype=np.int32), 22)
        names = a.blob_codec.hashes(first)
        assert set(storage.blobs) == set(names)
        evicted = [e for e in events if e.kind == EventKind.EVICTED]
        assert sorted(e.chain for e in evicted) == sorted(names)
        assert all(e.tier == 0 for e in evicted)
        assert a.tier_stats(0)["written"] == 3
    reader = PyTier(storage, name="dict")
    with _cache() as b:
        b.set_blob(MODEL)
        b.add_tier(reader, TierPolicy.READ)
        t = b.create()
        assert b.attach_prefix(t, first) == 48
        assert b.tier_stats(0)["hit_pages"] == 3
        assert ("get", 3) in storage.calls


def test_py_tier_that_fails_is_a_miss():
    storage = DictStorage()
    with _cache() as a:
        a.set_blob(MODEL)
        a.add_tier(PyTier(storage), TierPolicy.WRITE_THROUGH)
        prompt = np.arange(48, dtype=np.int32)
        _prefill(a, a.create(), prompt, 3)
        a.flush()
    assert len(storage.blobs) == 3

    def broken(keys):
        raise ConnectionError("store unreachable")

    storage.get = broken
    tier = PyTier(storage)
    with _cache() as b:
        b.set_blob(MODEL)
        b.add_tier(tier, TierPolicy.READ)
        t = b.create()
        assert b.attach_prefix(t, prompt) == 0  # a miss, not an error
        st = b.tier_stats(0)
        assert st["errors"] == 1 and st["hit_pages"] == 0 and st["miss_pages"] == 3
        assert tier.stats()["errors"] == 1
        assert isinstance(tier.last_exception, ConnectionError)
        assert "store unreachable" in tier.last_error
        # the cache carries on: prefill as usual
        _prefill(b, t, prompt, 3)
        assert b.length(t) == 48


def test_corrupt_blob_in_a_tier_is_rejected_and_removed():
    storage = DictStorage()
    with _cache() as a:
        a.set_blob(MODEL)
        a.add_tier(PyTier(storage), TierPolicy.WRITE_THROUGH)
        prompt = np.arange(32, dtype=np.int32)
        _prefill(a, a.create(), prompt, 4)
        a.flush()
        names = a.blob_codec.hashes(prompt)
    bad = bytearray(storage.blobs[names[1]])
    bad[-1] ^= 0xFF
    storage.blobs[names[1]] = bytes(bad)
    with _cache() as b:
        b.set_blob(MODEL)
        b.add_tier(PyTier(storage), TierPolicy.READ)
        assert b.attach_prefix(b.create(), prompt) == 16  # the first page only
        st = b.tier_stats(0)
        assert st["hit_pages"] == 1 and st["rejected"] == 1
        assert st["rejects"][BlobReason.CHECKSUM] == 1
    assert names[1] not in storage.blobs and names[0] in storage.blobs


def test_event_stream_replays_to_the_tier_contents(tmp_path):
    path = tmp_path / "kv"
    tier = FileTier(path, fsync=False)
    with _cache() as a:
        a.set_blob(MODEL)
        a.add_tier(tier, TierPolicy.WRITE_THROUGH)
        events = []
        a.set_event_callback(events.append)
        rng = np.random.default_rng(3)
        for _ in range(3):
            s = a.create()
            _prefill(a, s, rng.integers(0, 32000, 40).astype(np.int32), 11)
            a.release(s)
        a.flush()
        assert [e.seq_no for e in events] == list(range(events[0].seq_no,
                                                        events[0].seq_no + len(events)))
        assert all(e.page_size == 16 for e in events)
        held, pool = set(), set()
        for e in events:
            if e.kind == EventKind.TIER_STORED:
                held.add(e.chain)
            elif e.kind == EventKind.TIER_REMOVED:
                held.discard(e.chain)
            elif e.kind == EventKind.STORED:
                assert e.tokens is not None and len(e.tokens) == 16
                pool.add(e.chain)
            elif e.kind == EventKind.EVICTED:
                pool.discard(e.chain)
        assert sorted(hash_hex(h) + ".kvpb" for h in held) == sorted(p.name for p in path.iterdir())
        assert len(held) == 6 and pool == held
        a.clear_prefix()
        assert events[-1].kind == EventKind.CLEARED and events[-1].tier == -1
        assert a.pool.stats()["cached_pages"] == 0
    tier.close()


def test_event_callback_errors_surface_from_the_cache_call():
    with _cache() as c:
        def fn(event):
            raise KeyError("from the callback")

        c.set_event_callback(fn)
        s = c.create()
        with pytest.raises(KeyError, match="from the callback"):
            c.begin_step([s], [16], np.arange(16))
        c.set_event_callback(None)
        c.begin_step([s], [1], [5])  # later calls are unaffected


# ---- sequence transfer ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [("fp16", "fp16"), ("int8", "int4"), ("fp8", "fp8"),
                                 ("bf16", "int8")])
def test_seq_export_import_then_decode_is_identical(fmt):
    k_format, v_format = fmt
    prompt = np.random.default_rng(9).integers(0, 32000, 37).astype(np.int32)
    kw = dict(k_format=k_format, v_format=v_format)
    with _cache(**kw) as a, _cache(**kw) as b:
        if k_format == "fp8":  # blobs carry a digest of the scales: set them alike
            _set_fp8_scales(a.store, 0.05)
            _set_fp8_scales(b.store, 0.05)
        a.set_blob(MODEL)
        b.set_blob(MODEL)
        s = a.create(salt=5)
        _prefill(a, s, prompt, 12)
        blobs, nbytes = a.seq_export_size(s)
        data = a.seq_export(s, prompt)
        assert blobs == 3 and len(data) == nbytes
        t = b.create(salt=5)
        b.seq_import(t, prompt, data)
        assert b.length(t) == 37
        nxt = np.array([42], np.int32)
        out_a = _prefill(a, s, nxt, 12, start=37)
        out_b = _prefill(b, t, nxt, 12, start=37)
        for x, y in zip(out_a, out_b):
            assert np.array_equal(x, y)


def test_seq_import_refuses_bad_bytes_all_or_nothing():
    prompt = np.arange(37, dtype=np.int32)
    with _cache() as a, _cache() as b, _cache() as other:
        a.set_blob(MODEL)
        b.set_blob(MODEL)
        other.set_blob(kvpage.fingerprint(b"another model"))
        s = a.create()
        _prefill(a, s, prompt, 13)
        data = a.seq_export(s, prompt)
        t = b.create()
        bad = bytearray(data)
        bad[a.blob_codec.size() + 192 + 300] ^= 1  # the second blob's payload
        with pytest.raises(BadBlob) as e:
            b.seq_import(t, prompt, bad)
        assert e.value.reason == BlobReason.CHECKSUM and "blob 1" in e.value.detail
        assert b.length(t) == 0
        with pytest.raises(BadBlob) as e:  # other tokens name other pages
            b.seq_import(t, prompt + 1, data)
        assert e.value.reason == BlobReason.HASH
        with pytest.raises(BadBlob) as e:  # bytes that do not split into the blobs
            b.seq_import(t, prompt, data[:-10])
        assert e.value.reason == BlobReason.TRUNCATED and "truncated" in e.value.detail
        u = b.create(salt=1)
        with pytest.raises(BadBlob) as e:  # another salt names other pages
            b.seq_import(u, prompt, data)
        assert e.value.reason == BlobReason.HASH
        with pytest.raises(BadBlob) as e:
            other.seq_import(other.create(), prompt, data)
        assert e.value.reason == BlobReason.FINGERPRINT
        b.seq_import(t, prompt, data)  # the intact bytes still go in
        assert b.length(t) == 37
        with pytest.raises(kvpage.BadState, match="not empty"):
            b.seq_import(t, prompt, data)
    with _cache() as c:
        with pytest.raises(kvpage.BadState, match="set_blob"):
            c.seq_export(c.create(), [1])


def test_queue_tier_in_front_of_a_file_tier(tmp_path):
    files = FileTier(tmp_path / "kv", fsync=False)
    queue = kvpage.QueueTier(files, max_bytes=1 << 20)
    assert queue.name == "queue:file"
    keys = [bytes([i]) * 32 for i in range(3)]
    queue.put(keys, [b"a" * 100, b"b" * 100, b"c" * 100])
    assert queue.get(keys, 100) == [b"a" * 100, b"b" * 100, b"c" * 100]  # queued or written
    queue.drain()
    assert queue.info()["queued"] == 0 and queue.info()["dropped"] == 0
    assert files.get(keys, 100)[2] == b"c" * 100
    queue.put([bytes([9]) * 32], [b"x" * (2 << 20)])  # more than the queue holds
    assert queue.info()["dropped"] == 1
    queue.close()
    files.close()
