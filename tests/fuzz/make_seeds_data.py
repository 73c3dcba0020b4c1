#!/usr/bin/env python3
"""Write the seed corpora of the data-plane harnesses: tests/fuzz/corpus/
attention/, store/ and quant/ (tests/fuzz/fuzz_{attention,store,quant}.c).

Each seed is a small scenario in its harness's byte language (see the
comments of the encoders below, which mirror the harnesses' readers). Run
from anywhere; the files are committed, so this only needs rerunning when a
byte language changes. Seeds that crash the library on purpose (known bugs)
are not committed: they live with the fuzzing findings.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
FP32, FP16, BF16, FP8, INT8, INT4 = range(6)


def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


# ---- attention ---------------------------------------------------------------
A_DIMS = {64: 0, 128: 1, 80: 4, 96: 5, 256: 6, 32: 7}
A_PAGES = {1: 0, 2: 1, 4: 2, 8: 3, 16: 4, 32: 5}


def a_config(layers, heads, dim, page, kf, vf, pages, staging=1, dim_major=False, fill=None):
    b0 = (layers - 1) | ((heads - 1) << 1) | (A_DIMS[dim] << 2)
    b1 = A_PAGES[page] | (8 if dim_major else 0)
    b2 = kf + 6 * vf
    b3 = (pages - 1) | ((staging - 1) << 3) | (0x40 if fill is not None else 0)
    return bytes([b0, b1, b2, b3]) + (bytes([fill]) if fill is not None else b"")


def a_rows(page, t0, rows, staging_layout=False, dtype=0, big=False, rng=12345):
    """Rows into a page (pool page, or staging slot index when staging)."""
    pre = bytes([0]) if staging_layout else b""
    return bytes([200]) + pre + bytes([page, t0, rows - 1, dtype, 250 if big else 0]) + u32(rng)


def a_seal(page, dtype=0, rng=777):
    return bytes([200, 1, page, dtype, 0]) + u32(rng)


def a_garbage(page, fill_byte, int4_idx=False, huge=False):
    m = 2 | (4 if int4_idx else 0) | (8 if huge else 0)
    return bytes([10, page, m, fill_byte])


def a_view(seqs, corrupt=()):
    """seqs: list of (page ids, last_page_len, query rows)."""
    out = bytes([len(seqs)])
    for ids, last, q in seqs:
        out += bytes([len(ids)]) + bytes(ids) + bytes([last - 1])
        if ids:
            out += bytes([q])
    out += bytes([len(corrupt)])
    for where, edge in corrupt:
        out += bytes([where, edge])
    return out


def a_params(layer=0, qmul=1, dtype=0, causal=1, window=None, scale=0, cap=0, lse=False,
             ws_big=True, raw_qheads=None):
    qh = raw_qheads if raw_qheads is not None else (qmul - 1)
    win = 0 if window is None else 128 + window
    opt = (2 if lse else 0) | (4 if ws_big else 0)
    return bytes([layer, qh, dtype, causal, win, scale, cap, opt]) + u32(99)


def attention_seeds():
    s = {}
    # fp16 pages, one layer: a prefill of 3 rows over 6 tokens, GQA 2:1
    s["fp16-prefill"] = (a_config(1, 1, 64, 4, FP16, FP16, 4) + bytes([2])
                         + a_rows(0, 0, 4) + a_rows(1, 0, 2) + bytes([0])
                         + a_view([([0, 1], 2, 3)]) + a_params(qmul=2, lse=True))
    # int8 keys and values with staging: a sealed page + a staging page
    s["int8-staged-decode"] = (a_config(2, 2, 128, 8, INT8, INT8, 4, 2) + bytes([3])
                               + a_seal(0) + a_rows(0, 0, 5, True) + a_seal(2, 1)
                               + bytes([1]) + a_view([([0, 128 + 0], 5, 1), ([2], 8, 1)])
                               + a_params(layer=1, qmul=2, lse=True))
    # int4 keys and values over zeroed garbage pages (outlier indices 0)
    s["int4-garbage-zero"] = (a_config(1, 1, 64, 16, INT4, INT4, 2, 1, fill=0) + bytes([2])
                              + a_garbage(0, 0) + a_seal(1, 2) + bytes([0])
                              + a_view([([0, 1], 16, 4)]) + a_params(qmul=4))
    # fp8 keys, fp32 values, two kv heads, window and soft cap, fp16 q/out
    s["fp8-window-cap"] = (a_config(2, 2, 128, 2, FP8, FP32, 8) + bytes([3])
                           + a_rows(0, 0, 2) + a_rows(1, 0, 2, big=True) + a_rows(2, 0, 1)
                           + bytes([0]) + a_view([([0, 1, 2], 1, 2), ([1], 2, 1)])
                           + a_params(qmul=2, dtype=1, window=1, scale=129, cap=129))
    # bf16 values, dim-major fp32 keys, a batch of three decodes, bf16 q/out
    s["dim-major-batch"] = (a_config(1, 2, 64, 32, FP32, BF16, 3, dim_major=True) + bytes([3])
                            + a_rows(0, 0, 32) + a_rows(1, 0, 7) + a_rows(2, 3, 9) + bytes([0])
                            + a_view([([0, 1], 7, 1), ([0], 32, 1), ([1], 1, 1)])
                            + a_params(qmul=1, dtype=2, causal=0))
    # head_dim 96 and 256 (supported), 32 (not: KVP_ENOTSUP)
    for dim in (96, 256, 32):
        s[f"head-dim-{dim}"] = (a_config(1, 1, dim, 4, FP16, INT8, 2) + bytes([1]) + a_rows(0, 0, 4)
                                + bytes([0]) + a_view([([0], 4, 2)]) + a_params())
    # invalid parameters: NaN scale, q_heads not a multiple, a bad layer
    s["bad-params"] = (a_config(1, 2, 64, 4, FP16, FP16, 2) + bytes([1]) + a_rows(0, 0, 3)
                       + bytes([2]) + a_view([([0], 3, 1)]) + a_params(scale=134)
                       + a_view([([0], 3, 1)]) + a_params(raw_qheads=200))
    # invalid views: last_page_len 0, more query rows than tokens, a page id past the store
    s["bad-views"] = (a_config(1, 1, 64, 4, FP32, FP32, 2) + bytes([1]) + a_rows(0, 0, 4)
                      + bytes([2]) + a_view([([0], 4, 1)], corrupt=[(2, 0)]) + a_params()
                      + a_view([([0, 9], 4, 1)]) + a_params())
    # no sequences at all, and empty sequences
    s["empty-batch"] = (a_config(1, 1, 64, 1, FP16, FP16, 1) + bytes([0, 1])
                        + a_view([([], 1, 0), ([], 1, 0)]) + a_params())
    return s


# ---- store -------------------------------------------------------------------
S_DIMS = {8: 0, 16: 1, 64: 2, 128: 3}
S_PAGES = {1: 0, 2: 1, 4: 2, 8: 3, 16: 4, 3: 5}


def s_config(layers, heads, dim, page, kf, vf, pages, staging=0, dim_major=False, fail=None):
    b0 = (layers - 1) | ((heads - 1) << 1) | (S_DIMS[dim] << 2) | (S_PAGES[page] << 4)
    b1 = kf + 6 * vf + (128 if dim_major else 0)
    b2 = (pages - 1) | (staging << 3)
    b3 = 0 if fail is None else 0x80 | fail
    return bytes([b0, b1, b2, b3])


def s_append(rows, slots, row_elems, layer=0, dtype=0, strides=(0, 0), flags=0,
             seals=(), extra=b""):
    """slots: list of (page index in the writable range, token) or None (skip)."""
    out = bytes([0, flags, layer, rows, dtype]) + bytes(strides) + extra
    for sl in slots:
        out += bytes([sl[0], sl[1]]) if sl is not None else bytes([200])
    out += bytes([len(seals)])
    for dst, count, src, row in seals:
        out += bytes([0, dst, count]) + (bytes([src]) if count > 0 else b"") + bytes([row, 0])
    n = rows * row_elems  # one input byte per element of k, then of v
    return out + bytes((i * 13 + 5) % 256 for i in range(2 * n))


def s_apply(ops, how=0):
    out = bytes([2, len(ops)])
    for kind, src, dst, count in ops:
        out += bytes([kind, src, dst, count, 0])
    return out + bytes([how])


def s_read(layer, page, t0, n, how=0):
    return bytes([3, layer, page, t0, n, how])


def s_to_host(page, off16, nbytes, how=0):
    """offset = off16 x 16; bytes = nbytes modulo (largest page + 1)."""
    return bytes([4, page, 0, off16, 100]) + struct.pack("<H", nbytes) + bytes([how])


def s_from_host(page, off16, nbytes, how=0, data=b""):
    return bytes([5, page, 0, off16, 100]) + struct.pack("<H", nbytes) + bytes([how]) + data


def s_inspect(m, args=b""):
    return bytes([6, m]) + args


def store_seeds():
    s = {}
    row = 8  # kv_heads 1 x head_dim 8
    s["fp32-append-read"] = (s_config(1, 1, 8, 4, FP32, FP32, 2)
                             + s_append(3, [(0, 0), (0, 1), (1, 3)], row)
                             + s_read(0, 0, 0, 2) + s_read(0, 1, 3, 1))
    s["fp16-strided"] = (s_config(2, 2, 16, 2, FP16, BF16, 3)
                         + s_append(2, [(0, 0), (2, 1)], 32, layer=1, dtype=1, strides=(160, 161))
                         + s_read(1, 2, 1, 1))
    s["int8-seal-unseal"] = (s_config(1, 1, 8, 4, INT8, INT8, 2, 1)
                             + s_append(6, [(0, 0), (0, 1), None, None, None, None], row,
                                        seals=[(1, 0, 0, 2)])
                             + s_apply([(2, 1, 2, 3)]) + s_read(0, 2, 0, 3))
    s["int4-seal-from-staging"] = (s_config(1, 2, 64, 4, INT4, INT4, 2, 2)
                                   + s_append(2, [(0, 0), (0, 1)], 128)
                                   + s_append(2, [None, None], 128, seals=[(0, 2, 2, 0)])
                                   + s_read(0, 0, 0, 4))
    s["fp8-scales"] = (s_config(1, 1, 8, 2, FP8, FP8, 2)
                       + s_inspect(1, bytes([0, 0, 1, 7]))
                       + s_append(2, [(0, 0), (1, 1)], row) + s_inspect(1, bytes([0, 0, 0, 2]))
                       + s_read(0, 0, 0, 2))
    s["page-io"] = (s_config(1, 1, 16, 2, FP16, INT4, 3)
                    + s_from_host(1, 1, 40, data=bytes(range(64)))
                    + s_to_host(1, 0, 200) + s_to_host(2, 3, 17, how=8)
                    + s_from_host(0, 2, 9, how=8, data=b"\xff" * 16) + s_apply([(0, 0, 1, 0)]))
    s["copy-ops"] = (s_config(1, 1, 8, 1, BF16, FP32, 4)
                     + s_append(2, [(0, 0), (1, 0)], row)
                     + s_apply([(0, 0, 2, 0)]) + s_apply([(0, 1, 3, 0), (0, 2, 1, 0)]))
    s["bad-strides"] = (s_config(1, 1, 8, 4, FP32, FP32, 2)
                        + s_append(2, [(0, 0), (0, 1)], row, strides=(176, 0))
                        + s_append(2, [(0, 0), (0, 1)], row, strides=(100, 96)))
    s["bad-ids-ranges"] = (s_config(1, 1, 8, 4, FP16, FP16, 2)
                           + s_read(0, 9, 0, 1) + s_read(0, 0, 3, 2) + s_to_host(5, 0, 10)
                           + s_from_host(0, 63, 65535) + s_apply([(7, 0, 1, 0)])
                           + s_apply([(2, 0, 1, 1)]) + s_inspect(0, bytes([0, 9])))
    s["alloc-failures"] = s_config(2, 2, 64, 8, INT8, FP16, 2, 1, fail=1) + s_inspect(2)
    s["alloc-failure-first"] = s_config(1, 1, 8, 4, FP32, FP32, 1, fail=0) + s_read(0, 0, 0, 4)
    return s


# ---- quant -------------------------------------------------------------------
Q_PAGES = {1: 0, 2: 1, 3: 2, 4: 3, 6: 4, 8: 5, 16: 6, 32: 7}
Q_DIMS = {8: 0, 16: 1, 32: 2, 64: 3, 80: 4, 96: 5, 128: 6, 256: 7, 24: 8, 40: 9, 0: 10, 12: 11}


def q_seed(mode, fmt, is_value, page, dim, heads=1, dtype=0, k_order=0, scale_idx=0,
           pages=1, data=b"", misc=b"\x00", pm=b"\x00"):
    """misc: 255 + u32 sets reserved_, 254 + u32 struct_size; pm >= 240 + an
    fzi_edgy_i64 encoding gives a limit page count."""
    return (bytes([mode, fmt, is_value, k_order, Q_PAGES[page], Q_DIMS[dim], heads - 1, dtype,
                   scale_idx]) + misc + bytes([pages - 1]) + pm + data)


def quant_seeds():
    s = {}
    ramp = bytes((i * 29 + 3) % 256 for i in range(300))
    s["int4-keys-roundtrip"] = q_seed(2, INT4, 0, 8, 64, data=bytes([0, 9]) + ramp)
    s["int4-values-hd80"] = q_seed(3, INT4, 1, 4, 80, heads=2, dtype=1, data=bytes([2, 0]) + ramp)
    s["int8-keys-fp16"] = q_seed(2, INT8, 0, 16, 32, dtype=1, data=bytes([1, 1]) + ramp)
    s["int8-values-bf16"] = q_seed(2, INT8, 1, 3, 128, dtype=2, data=bytes([4, 0]) + ramp)
    s["fp8-scale-small"] = q_seed(2, FP8, 0, 2, 16, scale_idx=1, data=bytes([2, 0]) + ramp)
    s["fp16-dim-major"] = q_seed(2, FP16, 0, 4, 8, k_order=1, pages=2, data=bytes([0, 0]) + ramp)
    s["wild-floats-int4"] = q_seed(1, INT4, 0, 4, 32, data=bytes(i % 64 for i in range(200)))
    s["wild-floats-fp8"] = q_seed(1, FP8, 1, 2, 8, scale_idx=4,
                                  data=b"".join(bytes([64 + i, 0, 0, 0x80, 0x7f]) for i in range(40)))
    s["dequant-int4-huge-idx"] = q_seed(0, INT4, 0, 2, 64, data=b"\x11" * 200 + b"\x01")
    s["dequant-garbage-int8"] = q_seed(0, INT8, 0, 4, 16, heads=3, data=bytes(range(256)))
    s["bad-desc"] = q_seed(1, INT4, 0, 3, 24, data=ramp[:20])
    s["bad-fp8-scale"] = q_seed(2, FP8, 0, 4, 8, scale_idx=205)
    s["reserved-set"] = q_seed(2, FP16, 0, 4, 8, misc=b"\xff\x01\x00\x00\x00")
    s["struct-size-small"] = q_seed(2, FP16, 0, 4, 8, misc=b"\xfe\x08\x00\x00\x00")
    # INT64_MAX pages (fzi_edgy_i64: byte 151 = edge 151 % 26 = 21): the byte count overflows
    s["pages-edgy-reject"] = q_seed(0, FP32, 0, 32, 256, heads=3, pm=bytes([240, 151]))
    return s


def write(name, seeds):
    out = os.path.join(HERE, "corpus", name)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    for k, v in seeds.items():
        with open(os.path.join(out, k), "wb") as f:
            f.write(v)
    print(f"{len(seeds)} seeds in {out}")


if __name__ == "__main__":
    write("attention", attention_seeds())
    write("store", store_seeds())
    write("quant", quant_seeds())
