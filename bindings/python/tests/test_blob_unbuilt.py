"""A library built without the blob feature: the codec, fingerprints and the
cache's blob calls raise NotSupported; tiers, which move opaque bytes, work."""

import hashlib

import pytest

import kvpage
from kvpage import BlobCodec, Cache, FileTier, PyTier, Store, TierPolicy

from _reference import D, H

pytestmark = pytest.mark.skipif(
    kvpage.build_has(kvpage.Feature.BLOB),
    reason="the loaded libkvpage has the blob feature (test_blob.py covers it); build one "
           "with HAVE_BLOB=0 to run these")

FP = bytes(range(32))


def test_codec_fingerprint_and_cache_are_not_supported():
    store = Store(layers=1, kv_heads=H, head_dim=D, num_pages=4, page_size=16)
    with pytest.raises(kvpage.NotSupported, match="without page blobs"):
        BlobCodec(store, FP)
    with pytest.raises(kvpage.NotSupported):
        kvpage.fingerprint(b"model")
    with Cache(layers=1, kv_heads=H, head_dim=D, num_pages=8, page_size=16) as c:
        with pytest.raises(kvpage.NotSupported, match="without page blobs"):
            c.set_blob(FP)
        with pytest.raises(kvpage.BadState):
            c.seq_export(c.create(), [1])


class _Dict:
    def __init__(self):
        self.d = {}

    def get(self, keys):
        return [self.d.get(k) for k in keys]

    def put(self, keys, blobs):
        self.d.update(zip(keys, blobs))

    def exists(self, keys):
        return [k in self.d for k in keys]

    def remove(self, keys):
        for k in keys:
            self.d.pop(k, None)


def test_tiers_work_without_the_feature(tmp_path):
    key = hashlib.sha256(b"k").digest()
    with FileTier(tmp_path / "t", fsync=False) as t:
        t.put([key], [b"opaque bytes"])
        assert t.get([key], cap=64) == [b"opaque bytes"]
    with PyTier(_Dict()) as p:
        p.put([key], [b"x"])
        assert p.exists([key]) == [True]
    assert kvpage.blob.hash_hex(key) == key.hex()
    assert int(TierPolicy.READ | TierPolicy.WRITE_THROUGH) == 5
