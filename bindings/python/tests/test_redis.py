"""The Redis/Valkey tier (kvpage.RedisTier) against a real redis-server that
each test starts on a free loopback port (no persistence) and stops: calls
and keys on the server, credentials and ACLs, a cache writing through to it
and another cache reading the prefix back, a server killed and restarted."""

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

import kvpage
from kvpage import AccessDenied, BlobReason, Cache, RedisTier, TierIOError, TierPolicy
from kvpage.blob import hash_hex

from _reference import D, H

HAVE_REDIS = kvpage.build_has(kvpage.Feature.REDIS)
HAVE_BLOB = kvpage.build_has(kvpage.Feature.BLOB)
REDIS_SERVER = shutil.which("redis-server") or shutil.which("valkey-server")

needs_redis = pytest.mark.skipif(
    not HAVE_REDIS,
    reason="libkvpage was built without the Redis tier (needs hiredis: install libhiredis-dev "
           "and rebuild); test_redis_tier_is_not_supported covers that build")
needs_server = pytest.mark.skipif(
    REDIS_SERVER is None,
    reason="redis-server (or valkey-server) is not installed (Debian: apt-get install "
           "redis-server)")
needs_blob = pytest.mark.skipif(
    not HAVE_BLOB,
    reason="libkvpage was built without the blob feature (libcrypto, libxxhash): caches "
           "cannot use tiers")

MODEL = kvpage.fingerprint(b"test-model", b"weights v1") if HAVE_BLOB else bytes(range(32))


# ---- a redis-server of the test's own -------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _encode(*args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class _Reader:
    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis-server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("redis-server closed the connection")
                self.buf += chunk
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError(f"unexpected reply {line!r}")


class RedisServer:
    """redis-server on 127.0.0.1:port, no persistence; `cmd` talks to it."""

    def __init__(self, directory, password=None):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.port = _free_port()
        self.proc = None

    @property
    def uri(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> "RedisServer":
        """Start (or restart, on the same port) and wait until it answers."""
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.dir), "--daemonize", "no",
                "--logfile", str(self.dir / "redis.log")]
        if self.password is not None:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                self.cmd("PING")
                return self
            except (OSError, RuntimeError):
                time.sleep(0.02)
        log = (self.dir / "redis.log").read_text(errors="replace")[-2000:] \
            if (self.dir / "redis.log").exists() else ""
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not start:\n{log}")

    def stop(self, sig=signal.SIGTERM) -> None:
        """Stop it (SIGKILL: as a crash); bounded waits."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def cmd(self, *args):
        """One command (after AUTH when the server has a password)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            r = _Reader(s)
            if self.password is not None:
                s.sendall(_encode("AUTH", self.password))
                r.reply()
            s.sendall(_encode(*args))
            return r.reply()

    def keys(self, pattern: str) -> list[str]:
        return sorted(k.decode() for k in self.cmd("KEYS", pattern))


@pytest.fixture
def redis_factory(tmp_path):
    """Starts redis-servers (each on a free loopback port); stops them all after the test."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server (or valkey-server) is not installed (Debian: apt-get "
                    "install redis-server)")
    if not HAVE_REDIS:
        pytest.skip("libkvpage was built without the Redis tier (needs hiredis: install "
                    "libhiredis-dev and rebuild)")
    servers = []

    def start(password=None) -> RedisServer:
        s = RedisServer(tmp_path / f"redis{len(servers)}", password)
        servers.append(s)
        return s.start()

    yield start
    for s in servers:
        s.stop(signal.SIGKILL)


@pytest.fixture
def redis(redis_factory) -> RedisServer:
    """One redis-server on a free loopback port, stopped after the test."""
    return redis_factory()


def _key(i: int) -> bytes:
    return hashlib.sha256(b"key %d" % i).digest()


# ---- the tier's calls -----------------------------------------------------------------------

@needs_redis
@needs_server
def test_put_get_exists_remove_round_trip(redis):
    keys = [_key(i) for i in range(40)]
    blobs = [bytes([i]) * (1000 + i) for i in range(40)]
    with RedisTier(redis.uri, prefix="t1:") as t:
        assert t.name == "redis" and t.prefix == "t1:"
        t.put(keys, blobs)
        assert t.get(keys, cap=2000) == blobs
        assert t.get([_key(99), keys[3]], cap=2000) == [None, blobs[3]]
        assert t.get([keys[39]], cap=1038) == [None]  # larger than the room: a miss
        assert t.exists([keys[0], _key(99), keys[1]]) == [True, False, True]
        # one string key per blob: the prefix and the chain hash in hex
        assert len(redis.keys("t1:*")) == 40
        assert redis.cmd("GET", "t1:" + hash_hex(keys[5])) == blobs[5]
        t.put([keys[5]], [b"replaced"])
        assert t.get([keys[5]], cap=2000) == [b"replaced"]
        t.remove(keys[:20] + [_key(99)])  # absent keys are not an error
        assert t.exists(keys[:21]) == [False] * 20 + [True]
        assert len(redis.keys("t1:*")) == 20
        # a batch is one pipelined exchange: one round trip, a command per key
        before = t.info()
        assert t.get(keys, cap=2000)[20:] == blobs[20:]
        after = t.info()
        assert after["round_trips"] - before["round_trips"] == 1
        assert after["commands"] - before["commands"] == 40
        assert (after["cluster"], after["nodes"], after["nodes_down"]) == (0, 1, 0)
        assert after["failures"] == after["timeouts"] == after["server_errors"] == 0
        assert set(after) == {"cluster", "nodes", "nodes_down", "round_trips", "commands",
                              "connects", "failures", "timeouts", "skipped", "server_errors",
                              "moved", "asked", "slot_refreshes"}
        s = t.stats()
        assert s["puts"] == 41 and s["errors"] == 0
        with RedisTier(redis.uri, prefix="t2:") as other:  # another namespace
            assert other.get(keys[20:22], cap=2000) == [None, None]


@needs_redis
@needs_server
def test_ttl_and_database(redis):
    with RedisTier(redis.uri + "/3", prefix="ttl:", ttl_s=100) as t:
        t.put([_key(1)], [b"expires"])
        assert t.get([_key(1)], cap=16) == [b"expires"]
    assert redis.cmd("DBSIZE") == 0  # database 0 holds nothing
    with socket.create_connection(("127.0.0.1", redis.port), timeout=2) as s:
        r = _Reader(s)
        s.sendall(_encode("SELECT", 3) + _encode("TTL", "ttl:" + hash_hex(_key(1))))
        assert r.reply() == "OK"
        assert 0 < r.reply() <= 100


@needs_redis
@needs_server
def test_several_servers_share_the_keys(redis_factory):
    a, b = redis_factory(), redis_factory()
    keys = [_key(i) for i in range(64)]
    blobs = [b"blob %d" % i for i in range(64)]
    with RedisTier([a.uri, b.uri], prefix="s:", timeout_ms=300, retry_min_ms=60_000,
                   retry_max_ms=60_000) as t:
        assert t.info()["nodes"] == 2
        t.put(keys, blobs)
        on_a, on_b = a.keys("s:*"), b.keys("s:*")
        assert len(on_a) + len(on_b) == 64 and on_a and on_b  # rendezvous hashing splits them
        assert set(on_a).isdisjoint(on_b)
        assert t.get(keys, cap=64) == blobs
        # one server dies: its keys are misses, the other's are still hits
        b.stop(signal.SIGKILL)
        got = t.get(keys, cap=64)
        hex_on_a = {k[2:] for k in on_a}
        assert [g is not None for g in got] == [hash_hex(k) in hex_on_a for k in keys]
        assert t.info()["nodes_down"] == 1
    # the same URIs in the other order find the same keys on the same servers
    b.start()  # restarted empty
    with RedisTier(f"{b.uri}, {a.uri}", prefix="s:") as t2:
        got = t2.get(keys, cap=64)
        assert [g is not None for g in got] == [hash_hex(k) in hex_on_a for k in keys]


@needs_redis
def test_arguments_are_checked():
    with pytest.raises(kvpage.InvalidArgument, match="uri"):
        RedisTier("")
    with pytest.raises(kvpage.InvalidArgument):
        RedisTier("redis://127.0.0.1:99999")
    with pytest.raises(kvpage.InvalidArgument, match="prefix"):
        RedisTier("redis://127.0.0.1:6379", prefix="p" * 65)
    with pytest.raises(kvpage.InvalidArgument, match="retry_max_ms"):
        RedisTier("redis://127.0.0.1:6379", retry_min_ms=500, retry_max_ms=100)
    with pytest.raises(ValueError, match="cluster"):
        RedisTier("redis://127.0.0.1:6379", cluster="yes")
    with pytest.raises(TypeError, match="timeout_ms"):
        RedisTier("redis://127.0.0.1:6379", timeout_ms=0.5)
    with pytest.raises(ValueError, match="NUL"):
        RedisTier("redis://127.0.0.1:6379", password="a\0b")
    # nothing listens there: an I/O error within the connect timeout
    port = _free_port()
    with pytest.raises(TierIOError, match=str(port)):
        RedisTier(f"redis://127.0.0.1:{port}", connect_timeout_ms=200, cluster=False)


@pytest.mark.skipif(HAVE_REDIS, reason="the loaded libkvpage has the Redis tier (the other "
                                       "tests cover it); build one with HAVE_REDIS=0 to run this")
def test_redis_tier_is_not_supported():
    with pytest.raises(kvpage.NotSupported, match="hiredis"):
        RedisTier("redis://127.0.0.1:6379")


# ---- credentials ------------------------------------------------------------------------------

@needs_redis
@needs_server
def test_wrong_password_is_access_denied(redis_factory):
    s = redis_factory(password="s3cret")
    with pytest.raises(AccessDenied) as e:
        RedisTier(s.uri, password="wrong")
    assert e.value.status == -13 and e.value.name == "KVP_EACCES"
    assert isinstance(e.value, kvpage.Error) and isinstance(e.value, PermissionError)
    assert "s3cret" not in str(e.value) and "wrong" not in e.value.detail.replace("WRONGPASS", "")
    with pytest.raises(AccessDenied):
        RedisTier(s.uri)  # no password at all
    with pytest.raises(AccessDenied):
        RedisTier(f"redis://:wrong@127.0.0.1:{s.port}")
    for t in (RedisTier(s.uri, password="s3cret"),
              RedisTier(f"redis://:s3cret@127.0.0.1:{s.port}"),
              RedisTier(f"redis://default:s3cret@127.0.0.1:{s.port}")):
        with t:
            t.put([_key(1)], [b"in"])
            assert t.get([_key(1)], cap=8) == [b"in"]


@needs_redis
@needs_server
def test_acl_without_a_command_or_the_prefix_is_access_denied(redis_factory):
    s = redis_factory(password="admin")
    assert s.cmd("ACL", "SETUSER", "reader", "on", ">pw", "~kvp:*", "+get", "+exists",
                 "+ping", "+select", "+cluster") == "OK"
    assert s.cmd("ACL", "SETUSER", "elsewhere", "on", ">pw", "~other:*", "+@all") == "OK"
    with pytest.raises(AccessDenied) as e:
        RedisTier(s.uri, user="reader", password="pw")  # may not SET
    assert "NOPERM" in e.value.detail or "permission" in e.value.detail
    with pytest.raises(AccessDenied):
        RedisTier(s.uri, user="elsewhere", password="pw")  # not on keys kvp:*
    with RedisTier(s.uri, user="elsewhere", password="pw", prefix="other:") as t:
        t.put([_key(2)], [b"ok"])
        assert t.exists([_key(2)]) == [True]
    with RedisTier(f"redis://elsewhere:pw@127.0.0.1:{s.port}", prefix="other:") as t:
        assert t.get([_key(2)], cap=8) == [b"ok"]


# ---- caches ---------------------------------------------------------------------------------

def _cache():
    return Cache(layers=2, kv_heads=H, head_dim=D, num_pages=32, page_size=16, max_seqs=4)


def _prefill(cache, seq, tokens, seed, start=0):
    """One step of `tokens` (K/V/Q rows `start` .. of the stream `seed`)."""
    n = len(tokens)
    cache.begin_step([seq], [n], tokens)
    for layer in range(2):
        rows = [np.array([np.random.default_rng([seed, layer, what, start + i])
                          .normal(size=(heads, D)) for i in range(n)], np.float32)
                for what, heads in ((0, H), (1, H), (2, 4 * H))]
        cache.write(layer, rows[0], rows[1])
        cache.attend(layer, rows[2], sm_scale=0.125)


def _page_bytes(store, page):
    buf = bytearray(store.layout().page_bytes)
    store.page_to_host(page, buf)
    return bytes(buf)


@needs_redis
@needs_server
@needs_blob
def test_cache_writes_through_and_another_cache_reads_the_prefix(redis):
    prompt = np.random.default_rng(8).integers(0, 32000, 40).astype(np.int32)
    writer = RedisTier(redis.uri, prefix="model-a:")
    reader = RedisTier(redis.uri, prefix="model-a:")
    stranger = RedisTier(redis.uri, prefix="model-b:")
    with _cache() as a, _cache() as b, _cache() as c:
        a.set_blob(MODEL)
        assert a.add_tier(writer, TierPolicy.WRITE_THROUGH) == 0
        s = a.create()
        _prefill(a, s, prompt, 11)
        a.flush()
        names = a.blob_codec.hashes(prompt)[:2]  # the two full pages
        assert a.tier_stats(0)["written"] == 2 and a.tier_stats(0)["errors"] == 0
        assert redis.keys("model-a:*") == sorted("model-a:" + hash_hex(n) for n in names)
        assert redis.cmd("STRLEN", "model-a:" + hash_hex(names[0])) == a.blob_codec.size()

        b.set_blob(MODEL)
        b.add_tier(reader, TierPolicy.READ)
        t = b.create()
        assert b.attach_prefix(t, prompt) == 32
        st = b.tier_stats(0)
        assert st["hit_pages"] == 2 and st["rejected"] == 0 and st["errors"] == 0
        assert st["bytes_in"] == 2 * b.blob_codec.size()
        for pa, pb in zip(a.table.pages(s)[:2], b.table.pages(t)[:2]):
            assert _page_bytes(a.store, pa) == _page_bytes(b.store, pb)

        c.set_blob(MODEL)  # the same model under another prefix: nothing there
        c.add_tier(stranger, TierPolicy.READ)
        assert c.attach_prefix(c.create(), prompt) == 0
        assert c.tier_stats(0)["miss_pages"] >= 1
    for tier in (writer, reader, stranger):
        tier.close()


@needs_redis
@needs_server
@needs_blob
def test_a_corrupt_blob_on_the_server_is_rejected_and_removed(redis):
    prompt = np.arange(32, dtype=np.int32)
    with RedisTier(redis.uri) as tier:
        with _cache() as a:
            a.set_blob(MODEL)
            a.add_tier(tier, TierPolicy.WRITE_THROUGH)
            _prefill(a, a.create(), prompt, 4)
            a.flush()
            names = a.blob_codec.hashes(prompt)
        key = "kvp:" + hash_hex(names[1])
        last = redis.cmd("STRLEN", key) - 1
        byte = redis.cmd("GETRANGE", key, last, last)
        redis.cmd("SETRANGE", key, last, bytes([byte[0] ^ 0xFF]))
        with _cache() as b:
            b.set_blob(MODEL)
            b.add_tier(tier, TierPolicy.READ)
            assert b.attach_prefix(b.create(), prompt) == 16  # the first page only
            st = b.tier_stats(0)
            assert st["hit_pages"] == 1 and st["rejected"] == 1
            assert st["rejects"][BlobReason.CHECKSUM] == 1
        assert redis.keys("kvp:*") == ["kvp:" + hash_hex(names[0])]


# ---- a server that dies ---------------------------------------------------------------------

@needs_redis
@needs_server
@needs_blob
def test_server_killed_misses_then_reconnect_hits(redis):
    prompt = np.random.default_rng(3).integers(0, 32000, 33).astype(np.int32)
    # no reconnection by itself for a minute: only reconnect() brings it back
    slow = dict(timeout_ms=200, connect_timeout_ms=200, retry_min_ms=60_000,
                retry_max_ms=60_000)
    writer = RedisTier(redis.uri, prefix="k:", **slow)
    reader = RedisTier(redis.uri, prefix="k:", **slow)
    # back by itself once its 50 ms backoff has passed
    eager = RedisTier(redis.uri, prefix="k:", timeout_ms=200, retry_min_ms=50, retry_max_ms=50)
    with _cache() as a, _cache() as b:
        a.set_blob(MODEL)
        a.add_tier(writer, TierPolicy.WRITE_THROUGH)
        b.set_blob(MODEL)
        b.add_tier(reader, TierPolicy.READ)
        s = a.create()
        _prefill(a, s, prompt, 5)
        a.flush()
        assert a.tier_stats(0)["written"] == 2
        names = a.blob_codec.hashes(prompt)[:2]
        assert reader.get(names, cap=a.blob_codec.size())[1] is not None

        redis.stop(signal.SIGKILL)

        # through a cache: misses, counted, never an exception
        t = b.create()
        assert b.attach_prefix(t, prompt) == 0
        assert b.tier_stats(0)["errors"] >= 1 and b.tier_stats(0)["hit_pages"] == 0
        b.release(t)
        s2 = a.create()
        _prefill(a, s2, prompt[::-1].copy(), 6)  # new pages to write through
        a.flush()
        assert a.tier_stats(0)["errors"] >= 1
        # called directly: an error when no key could be answered
        for call in (lambda: reader.get(names, cap=a.blob_codec.size()),
                     lambda: reader.exists(names),
                     lambda: reader.put([_key(1)], [b"x"]),
                     lambda: eager.get(names, cap=a.blob_codec.size())):
            with pytest.raises(TierIOError):
                call()
        info = reader.info()
        assert info["nodes_down"] == 1 and info["failures"] >= 1
        assert info["skipped"] >= 1  # later calls did not even try
        with pytest.raises(TierIOError):
            reader.reconnect()  # still down
        assert reader.info()["nodes_down"] == 1

        redis.start()  # same port, empty: nothing was saved
        reader.reconnect()
        writer.reconnect()
        assert reader.info()["nodes_down"] == 0
        assert reader.get(names, cap=a.blob_codec.size()) == [None, None]  # a fresh server
        # the writer's next pages reach the new server, and the reader hits them
        prompt2 = np.random.default_rng(4).integers(0, 32000, 33).astype(np.int32)
        _prefill(a, a.create(), prompt2, 7)
        a.flush()
        fresh = a.blob_codec.hashes(prompt2)[:2]
        assert reader.exists(fresh) == [True, True]
        assert b.attach_prefix(b.create(), prompt2) == 32
        assert b.tier_stats(0)["hit_pages"] == 2
        # the eager tier came back without reconnect()
        time.sleep(0.2)
        assert eager.exists(fresh) == [True, True]
        assert eager.info()["connects"] >= 2
    for tier in (writer, reader, eager):
        tier.close()
