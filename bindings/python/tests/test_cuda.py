"""The CUDA backend through Python: device-pointer and stream checking (no GPU
needed), clean failures where no GPU is usable, the store's page I/O feeding
the host tier, and — on a machine with a GPU — the CUDA store and context
against the CPU backend, with device memory from the CUDA runtime."""

import ctypes
import ctypes.util

import numpy as np
import pytest

import kvpage
from kvpage import Context, Isa, NoDevice, NotSupported, Pool, Store, Table, Tier
from kvpage.cuda import (CudaCache, CudaContext, CudaStore, device_rows, pinned_empty,
                         stream_handle)

H, QH, D = 2, 8, 64


class Dev:
    """A stand-in device array: only ``__cuda_array_interface__``."""

    def __init__(self, shape, typestr="<f2", ptr=0x10000, strides=None, readonly=False):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (ptr, readonly), "strides": strides,
                                         "version": 3}


def gpu_count():
    try:
        return kvpage.cuda_device_count()
    except (NoDevice, NotSupported):
        return 0


def test_stream_handles():
    class Torch:
        cuda_stream = 0x1234

    class Cupy:
        ptr = 0x5678

    assert stream_handle(None) is None and stream_handle(0) is None
    assert stream_handle(77) == 77
    assert stream_handle(Torch()) == 0x1234 and stream_handle(Cupy()) == 0x5678
    for bad in (-1, "s", 1.5, True):
        with pytest.raises(ValueError):
            stream_handle(bad)


def test_device_rows_accepts_interfaces_and_addresses():
    assert device_rows(Dev((5, H, D)), "k", H, D, 5) == (0x10000, int(kvpage.Format.FP16), H * D)
    assert device_rows(Dev((5, H * D), "<f4"), "k", H, D, 5)[1:] == (int(kvpage.Format.FP32), H * D)
    # strided rows (e.g. K and V halves of one fused [rows][2][H*D] tensor)
    strided = Dev((5, H * D), strides=(4 * H * D, 2))
    assert device_rows(strided, "k", H, D, 5)[2] == 2 * H * D
    assert device_rows(0x2000, "k", H, D, 5, dtype=np.float16) == (0x2000, int(kvpage.Format.FP16),
                                                                    H * D)
    assert device_rows(0x2000, "k", H, D, 5, dtype="bfloat16")[1] == int(kvpage.Format.BF16)
    assert device_rows(Dev((0, H, D), ptr=0), "k", H, D, 0)[0] == 0  # an empty step


@pytest.mark.parametrize("bad,match", [
    (Dev((5, H, D), "<f8"), "float32 or float16"),
    (Dev((5, H, D + 1)), "shape"),
    (Dev((5, H * D + 2)), "shape"),
    (Dev((5, H, D, 1)), "dimensional"),
    (Dev((4, H, D)), "rows"),
    (Dev((5, H, D), strides=(2 * H * D, 2, 2 * H)), "contiguous"),  # transposed heads
    (Dev((5, H * D), strides=(H * D, 2)), "contiguous"),  # rows overlap
    (Dev((5, H, D), ptr=0x10001), "aligned"),
    (Dev((5, H, D), ptr=0), "null"),
    (0x2000, "dtype="),
    (0x2001, "aligned"),
    (-8, "negative"),
    (True, "device array"),
    (None, "device array"),
    (np.zeros((5, H, D), np.float16), "device array"),  # host memory is refused
])
def test_device_rows_refuses(bad, match):
    dtype = np.float16 if isinstance(bad, int) and match not in ("dtype=", "device array") else None
    with pytest.raises(ValueError, match=match):
        device_rows(bad, "k", H, D, 5, dtype=dtype)


def test_device_rows_writable_and_dtype_mismatch():
    with pytest.raises(ValueError, match="read-only"):
        device_rows(Dev((5, H, D), readonly=True), "out", H, D, 5, writable=True)
    with pytest.raises(ValueError, match="not the dtype"):
        device_rows(Dev((5, H, D)), "q", H, D, 5, dtype=np.float32)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        device_rows(0x2000, "q", H, D, 5, dtype=np.int8)


@pytest.mark.skipif(gpu_count() > 0, reason="a GPU is present")
def test_without_a_gpu_constructors_fail_cleanly():
    expected = NoDevice if kvpage.build_has_cuda() else NotSupported
    with pytest.raises(expected) as e:
        CudaStore(layers=1, kv_heads=H, head_dim=D, num_pages=8)
    assert e.value.detail  # the library says why
    with pytest.raises(expected):
        CudaContext()
    with pytest.raises(expected):
        CudaCache(layers=1, kv_heads=H, head_dim=D, num_pages=8, host_bytes="1MiB")
    with pytest.raises(expected):
        pinned_empty(4096)
    with pytest.raises(expected):
        kvpage.cuda.quantize(Dev((16, H, D)), 1, Dev((H, 4096), "|u1"), "int8", H, D)


def test_device_quantize_checks_buffers_before_the_call():
    src = Dev((16, H, D))  # one page of fp16 rows
    with pytest.raises(ValueError, match="bytes"):
        kvpage.cuda.quantize(src, 1, Dev((8,), "|u1"), "int8", H, D)  # blocks do not fit
    with pytest.raises(ValueError, match="bytes"):
        kvpage.cuda.quantize(src, 2, Dev((H, 4096), "|u1"), "int8", H, D)  # src too short
    with pytest.raises(ValueError, match="pages"):
        kvpage.cuda.quantize(src, 0, Dev((H, 4096), "|u1"), "int8", H, D)
    with pytest.raises(ValueError, match="contiguous"):
        kvpage.cuda.quantize(Dev((16, H, D), strides=(4 * H * D, 2 * D, 2)), 1,
                             Dev((H, 4096), "|u1"), "int8", H, D)
    with pytest.raises(ValueError, match="read-only"):
        kvpage.cuda.quantize(src, 1, Dev((H, 4096), "|u1", readonly=True), "int8", H, D)


def _filled_store(fmt_k="int8", fmt_v="int4", seed=3):
    rng = np.random.default_rng(seed)
    pool = Pool(num_pages=4, page_size=4, num_staging=4)
    table = Table(pool, max_seqs=4)
    store = Store(layers=2, kv_heads=H, head_dim=D, num_pages=4, page_size=4, k_format=fmt_k,
                  v_format=fmt_v, num_staging=4)
    s = table.create()
    table.reserve(s, 10)
    slots, ops = table.append(s, np.arange(10))
    for layer in range(2):
        k = rng.normal(size=(10, H, D)).astype(np.float32)
        v = rng.normal(size=(10, H, D)).astype(np.float32)
        store.append(layer, k, v, slots, ops)
    return pool, table, store, s


def _contents(store, table, s):
    """Every layer's K and V of the sequence's tokens (not past its length)."""
    out, n = [], table.length(s)
    for i, p in enumerate(table.pages(s)):
        count = min(store.page_size, n - i * store.page_size)
        out.append(tuple(x for layer in range(2) for x in store.read(layer, int(p), 0, count)))
    return out


def test_store_page_io_round_trip():
    layout = kvpage.layout(2, H, D, page_size=4, k_format="int8", v_format="int4")
    pool, table, store, s = _filled_store()
    page = int(table.pages(s)[0])
    buf = np.zeros(layout.page_bytes, np.uint8)
    store.page_to_host(page, buf)
    store.synchronize()
    assert buf.any()
    k0, v0 = store.read(1, page)
    blank = np.zeros_like(buf)
    store.page_from_host(page, blank)
    assert not store.read(1, page)[0].any()
    half = layout.page_bytes // 2  # in two pieces, bytes and bytearray
    store.page_from_host(page, bytes(buf[:half]))
    store.page_from_host(page, bytearray(buf[half:]), offset=half)
    k1, v1 = store.read(1, page)
    assert np.array_equal(k0, k1) and np.array_equal(v0, v1)
    with pytest.raises(ValueError, match="read-only"):
        store.page_to_host(page, bytes(16))
    with pytest.raises(ValueError, match="contiguous"):
        store.page_to_host(page, np.zeros((64, 2), np.uint8)[:, 0])
    with pytest.raises(kvpage.InvalidArgument):
        store.page_to_host(page, np.zeros(layout.page_bytes + 1, np.uint8))  # past the page
    with pytest.raises(kvpage.InvalidArgument):
        store.page_to_host(99, buf)
    # what the store wrote is well formed; a NaN scale is not (int8 keys:
    # page_size * head_dim code bytes, then the fp16 scales)
    store.page_check(page, buf)
    store.page_check(page, blank)  # zeros: a valid page of zeros
    bad = buf.copy()
    bad[4 * D:4 * D + 2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    with pytest.raises(kvpage.InvalidArgument, match="K block"):
        store.page_check(page, bad)
    with pytest.raises(kvpage.InvalidArgument):
        store.page_check(page, buf[:-1])  # not the whole serialization


def test_tier_swaps_through_the_store():
    layout = kvpage.layout(2, H, D, page_size=4, k_format="int8", v_format="int4")
    pool, table, store, s = _filled_store()
    before = _contents(store, table, s)
    old_pages = {int(p) for p in table.pages(s)}
    tier = Tier(table, 16 * layout.page_bytes + 4096, layout, page_io=store)
    assert tier.swap_out(s) == []  # the store moved the bytes itself
    assert tier.seq_info(s)["swapped"]
    other = table.create()  # reuse the freed pages, overwriting them
    table.reserve(other, 12)
    slots, ops = table.append(other, np.arange(12))
    for layer in range(2):
        z = np.full((12, H, D), 7.0, np.float32)
        store.append(layer, z, z, slots, ops)
    assert old_pages & {int(p) for p in table.pages(other)}  # the old bytes are gone
    table.release(other)
    assert tier.swap_in(s) == []
    after = _contents(store, table, s)
    for a, b in zip(before, after):
        for x, y in zip(a, b):
            assert np.array_equal(x, y)
    del store  # the tier keeps its store alive
    tier.swap_out(s)
    tier.close()


# ---- with a GPU: device memory from the CUDA runtime --------------------------------


class Cudart:
    """cudaMalloc / cudaMemcpy / cudaFree through ctypes (tests only)."""

    def __init__(self):
        name = ctypes.util.find_library("cudart")
        self.lib = ctypes.CDLL(name or "libcudart.so")
        self.lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_int]
        self.lib.cudaFree.argtypes = [ctypes.c_void_p]
        self.lib.cudaDeviceSynchronize.argtypes = []

    def upload(self, a: np.ndarray) -> int:
        p = ctypes.c_void_p()
        assert self.lib.cudaMalloc(ctypes.byref(p), max(a.nbytes, 1)) == 0
        a = np.ascontiguousarray(a)
        assert self.lib.cudaMemcpy(p, a.ctypes.data, a.nbytes, 1) == 0  # host to device
        return p.value

    def download(self, ptr: int, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        assert self.lib.cudaDeviceSynchronize() == 0
        assert self.lib.cudaMemcpy(out.ctypes.data, ptr, out.nbytes, 2) == 0  # device to host
        return out

    def free(self, ptr: int) -> None:
        self.lib.cudaFree(ptr)


@pytest.mark.skipif(gpu_count() == 0, reason="no GPU")
@pytest.mark.parametrize("k_fmt,v_fmt", [("fp16", "fp16"), ("int8", "int8"), ("int4", "int4")])
def test_gpu_store_and_attention_match_the_cpu_backend(k_fmt, v_fmt):
    rt = Cudart()
    rng = np.random.default_rng(5)
    n, rows = 37, 3
    k = rng.normal(size=(n, H, D)).astype(np.float16)
    v = rng.normal(size=(n, H, D)).astype(np.float16)
    q = rng.normal(size=(rows, QH, D)).astype(np.float16)
    outs, reads = [], []
    for on_gpu in (False, True):
        pool = Pool(num_pages=8, page_size=16, num_staging=2)
        t = Table(pool)
        kw = dict(layers=1, kv_heads=H, head_dim=D, num_pages=8, page_size=16, k_format=k_fmt,
                  v_format=v_fmt, num_staging=2)
        store = CudaStore(**kw) if on_gpu else Store(**kw)
        ctx = CudaContext() if on_gpu else Context(threads=1, isa=Isa.PORTABLE)
        s = t.create()
        t.reserve(s, n)
        slots, ops = t.append(s, np.arange(n))
        batch = t.export([s], num_new=[rows])
        if on_gpu:
            kd, vd, qd = rt.upload(k), rt.upload(v), rt.upload(q)
            od = rt.upload(np.zeros_like(q))
            store.append(0, kd, vd, slots, ops, dtype=np.float16)
            ctx.set_timing(True)
            ctx.attention(store, batch, 0, qd, od, q_heads=QH, dtype=np.float16, sm_scale=0.125)
            assert ctx.kernel_time() >= 0.0
            outs.append(rt.download(od, q))
            ctx.set_pipeline(False)  # the single-buffer loader: the same results
            ctx.attention(store, batch, 0, qd, od, q_heads=QH, dtype=np.float16, sm_scale=0.125)
            single = rt.download(od, q).astype(np.float32)
            assert np.abs(single - outs[-1].astype(np.float32)).max() < 2e-3
            ctx.set_pipeline(True)
            for p in (kd, vd, qd, od):
                rt.free(p)
        else:
            store.append(0, k, v, slots, ops)
            outs.append(ctx.attention(store, batch, 0, q, sm_scale=0.125))
        reads.append(store.read(0, int(t.pages(s)[0])))
        store.close()
    assert np.array_equal(reads[0][0], reads[1][0]) and np.array_equal(reads[0][1], reads[1][1])
    err = np.abs(outs[0].astype(np.float32) - outs[1].astype(np.float32)).max()
    assert err < 5e-3, err
    buf = pinned_empty(1024)
    buf[:] = 3
    assert buf.sum() == 3 * 1024


@pytest.mark.skipif(gpu_count() == 0, reason="no GPU")
def test_gpu_cache_matches_the_cpu_cache():
    rt = Cudart()
    rng = np.random.default_rng(9)
    kw = dict(layers=1, kv_heads=H, head_dim=D, num_pages=16, k_format="int8", v_format="int4",
              max_seqs=4, host_bytes="4MiB")
    cpu, gpu = kvpage.Cache(isa=Isa.PORTABLE, **kw), CudaCache(**kw)
    seqs = [cpu.create(), cpu.create()]
    assert [gpu.create(), gpu.create()] == seqs
    for num_new in ([20, 7], [1, 1], [1, 1]):
        rows = sum(num_new)
        cpu.begin_step(seqs, num_new)
        gpu.begin_step(seqs, num_new)
        k = rng.normal(size=(rows, H, D)).astype(np.float32)
        v = rng.normal(size=(rows, H, D)).astype(np.float32)
        q = rng.normal(size=(rows, QH, D)).astype(np.float32)
        cpu.write(0, k, v)
        ptrs = [rt.upload(x) for x in (k, v, q, np.zeros_like(q))]
        gpu.write(0, ptrs[0], ptrs[1], dtype=np.float32)
        want = cpu.attend(0, q)
        gpu.attend(0, ptrs[2], ptrs[3], q_heads=QH, dtype=np.float32)
        got = rt.download(ptrs[3], q)
        for p in ptrs:
            rt.free(p)
        assert np.abs(got - want).max() < 5e-3
    gpu.swap_out(seqs[1])
    gpu.swap_in(seqs[1])
    gpu.store.synchronize()
    assert gpu.length(seqs[1]) == cpu.length(seqs[1]) == 9
