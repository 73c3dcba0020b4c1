#!/usr/bin/env python3
"""Write the seed corpora of the control-plane harnesses:
tests/fuzz/corpus/sched (fuzz_sched.c), tests/fuzz/corpus/plan (fuzz_plan.c)
and tests/fuzz/corpus/cli (fuzz_cli.c).

Each seed is a small scenario in its harness's byte language (see the
comment at the top of each harness). Run from anywhere; the files are
committed, so this only needs rerunning when a byte language changes.
"""
import os
import struct

# ---- fzi_edgy_i64 encodings (tests/fuzz/fuzz_input.h) ----------------------
EDGES = [0, 1, -1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 255, 256, 65535, 65536, 2**31 - 1, -2**31,
         2**31, -2**31 - 1, 2**32 - 1, 2**63 - 1, -2**63, (2**63 - 1) // 2, (2**63 - 1) // 2 + 1,
         -((2**63 - 1) // 2)]


def edgy(v):
    """Bytes that make fzi_edgy_i64 return v."""
    if -2 <= v <= 13:
        return bytes([v + 2])
    if v in EDGES:
        j = EDGES.index(v)
        k = next(k for k in range(128, 224) if k % len(EDGES) == j)
        return bytes([k])
    return bytes([224]) + struct.pack("<Q", v & (2**64 - 1))


I64_MIN, I64_MAX = -2**63, 2**63 - 1

# ---- fuzz_sched.c -------------------------------------------------------------


def sched_config(page=4, staging=False, pages=32, max_req=8, batch=4, budget=64, chunk=16,
                 horizon=4, hyst=1, actions=7, drop_below=None, watermark=None, queue_delay=None,
                 page_bytes=1, staging_bytes=1, fail=None):
    b = bytes([0])  # not wild
    b += bytes([page - 1, 2 if staging else 0, pages - 1, max_req - 1, batch - 1, budget - 1,
                chunk, horizon, hyst, actions - 1])
    k = 0
    if drop_below is not None:
        k |= 1 | (drop_below << 5)
    if watermark is not None:
        k |= 2 | (watermark << 6)
    if queue_delay is not None:
        k |= 4
    b += bytes([k])
    if queue_delay is not None:
        b += bytes([queue_delay])
    b += bytes([page_bytes, staging_bytes, 0, 0])  # page bytes x1000, staging x500, rates
    b += bytes([0 if fail is None else 1 | (fail << 1)])
    return b


def wild_config(fields):
    """A config with extreme values: `fields` are the edgy values in order."""
    return bytes([200, 0x7f]) + b"".join(edgy(v) for v in fields)


def submit(rid, prompt=8, max_new=4, prio=0, cached=0, arrival=None, deadline=None,
           edgy_id=False, edgy_prio=False):
    k = (1 if edgy_id else 0) | (2 if edgy_prio else 0)
    if arrival is not None:
        k |= 8
    if deadline is not None:
        k |= 16
    b = bytes([0])
    tail = b""
    tail += edgy(rid) if edgy_id else bytes([rid])
    tail += edgy(prio) if edgy_prio else bytes([prio])
    for t in (prompt, max_new):
        if 1 <= t <= 48:
            tail += bytes([t - 1])
        else:
            tail += bytes([220]) + edgy(t)
    if cached is None or (isinstance(cached, int) and cached > 255):
        k |= 4
        tail += edgy(cached or 0)
    else:
        tail += bytes([cached])
    if arrival is not None:
        tail += edgy(arrival)
    else:
        tail += bytes([2])
    if deadline is not None:
        tail += edgy(deadline)
    return b + bytes([k]) + tail


def finish(index):
    return bytes([3, index])


def step(free, staging=2, host=50, now=None, back=0, reserved=None):
    k = 0
    if free > 255 or free < 0:
        k |= 1
    if now is not None:
        k |= 8
    if reserved is not None:
        k |= 0x30
    b = bytes([4, k])
    b += edgy(free) if k & 1 else bytes([free])
    b += bytes([staging, host])
    b += edgy(now) if now is not None else bytes([3 + 4 - back if back else 7])
    if reserved is not None:
        b += edgy(reserved)
    return b


def stats():
    return bytes([7])


SCHED = {
    "lifecycle": sched_config() + submit(1) + submit(2, prio=1) + step(32) + step(30)
    + step(28) + finish(0) + step(28) + stats() + step(28) + step(28),
    "extreme-times": sched_config(queue_delay=10) + submit(1, arrival=I64_MIN)
    + submit(2, arrival=I64_MAX) + submit(3, arrival=0) + step(32, now=I64_MAX) + step(32, now=0)
    + step(32, now=I64_MIN) + submit(4, arrival=5, deadline=I64_MAX) + step(32, now=2**31)
    + step(32, back=3),
    "huge-sizes": sched_config() + submit(1, prompt=I64_MAX // 2, max_new=I64_MAX // 2)
    + submit(2, prompt=2**31, max_new=I64_MAX // 2 + 1) + submit(3, prompt=65536, max_new=65535)
    + submit(4, cached=None) + step(32) + step(2**31) + step(I64_MAX) + stats(),
    "duplicates-full": sched_config(max_req=3) + submit(5) + submit(5) + submit(6) + submit(7)
    + submit(8) + finish(1) + submit(8) + submit(-1, edgy_id=True)
    + submit(I64_MIN, edgy_id=True) + step(32) + finish(200) + stats(),
    "pressure-swap": sched_config(pages=12, max_req=16, horizon=8, hyst=0, page_bytes=2)
    + b"".join(submit(i, prompt=12, max_new=20, prio=i % 3) for i in range(10))
    + b"".join(step(12 - (i % 6), host=255) for i in range(12)) + stats(),
    "staging": sched_config(staging=True, pages=20, horizon=2) + submit(1, prompt=10)
    + submit(2, prompt=3, cached=2) + step(20, staging=1) + step(18, staging=0) + step(18)
    + step(16) + stats(),
    "alloc-failure": sched_config(fail=5) + submit(1) + step(32),
    "bad-params": wild_config([I64_MAX, 0, -1, I64_MIN, 2**31]),
    "deadlines": sched_config(queue_delay=3) + submit(1, arrival=0, deadline=2)
    + submit(2, arrival=0, deadline=I64_MAX) + submit(3, arrival=1, deadline=0)
    + step(0, now=1) + step(0, now=4) + step(32, now=100) + step(32, now=3) + stats(),
    "bad-inputs": sched_config() + submit(1) + step(-1) + step(32, reserved=7)
    + step(32, now=-1) + submit(2, prompt=0) + submit(3, max_new=-1) + submit(4, cached=9)
    + submit(5, arrival=-5) + submit(6, deadline=-1) + step(32) + stats(),
    "reactive-recompute": sched_config(pages=8, horizon=0, hyst=0, actions=2, max_req=6)
    + b"".join(submit(i, prompt=10, max_new=30, prio=(5 - i)) for i in range(6))
    + b"".join(step(8 - (i % 4)) for i in range(16)),
    "drop-low-priority": sched_config(pages=10, actions=5, drop_below=2, horizon=6)
    + submit(1, prio=0, prompt=20) + submit(2, prio=3, prompt=20) + step(10) + step(6)
    + submit(3, prio=7, prompt=30) + step(4) + step(10) + stats(),
}

# ---- fuzz_plan.c --------------------------------------------------------------


def text(fn, s):
    b = s.encode()
    return bytes([fn, 0, len(b)]) + b  # k < 96: raw, then its length


def dims(layers, kvh, hd, ps):
    """fp_dim bytes for small values: layers and kv_heads step 1, head_dim step 8."""
    return bytes([layers - 1, kvh - 1, hd // 8 - 1, ps - 1])


def layout(layers, kvh, hd, ps, kf, vf, pages=(16, 1), staging=(2, 1)):
    b = bytes([3]) + dims(layers, kvh, hd, ps) + bytes([kf, vf])
    b += bytes([0]) + struct.pack("<H", pages[0]) + bytes([0, staging[0]])
    b += bytes([1]) + edgy(pages[1] if pages[1] > 255 else I64_MAX) + bytes([0, staging[1]])
    return b


def plan(layers, kvh, hd, kf, vf, context, memory=None, budget=None, weights=0, q_heads=1,
         util=0):
    k = 0 if budget is None else 8
    b = bytes([4, k]) + bytes([layers - 1, kvh - 1, hd // 8 - 1]) + bytes([q_heads])
    b += bytes([kf, vf]) + struct.pack("<H", context)

    def size(v):
        if v == 0:
            return bytes([0])
        # fp_bytes: 64 + shift, then u16 << shift
        for shift in range(40):
            if v % (1 << shift) == 0 and (v >> shift) < 65536:
                best = shift
        return bytes([64 + best]) + struct.pack("<H", v >> best)
    if budget is not None:
        b += size(budget)
    else:
        b += size(memory) + size(weights)
    return b + bytes([util])


GIB = 1 << 30
PLAN = {
    "size-gib": text(0, "80GiB"),
    "size-fraction": text(0, " 1.5T "),
    "size-max": text(0, "18446744073709551615"),
    "size-overflow": text(0, "16777216TiB"),
    "size-tiny-fraction": text(0, "0.9b"),
    "names-preset": text(1, "Llama-3.1-8B"),
    "names-gpu": text(1, "h200-141g"),
    "names-format": text(1, "FP8"),
    "weights-int4": bytes([2, 101, 0]) + edgy(8030261248),
    "weights-overflow": bytes([2, 96, 0]) + edgy(I64_MAX),
    "layout-int4-keys": layout(32, 8, 128, 16, 5, 4),
    "layout-fp8": layout(80, 8, 128, 2, 3, 3, pages=(65535, 2**40)),
    "plan-gpu": plan(32, 8, 128, 1, 1, 4096, memory=80 * GIB, weights=16 * GIB),
    "plan-budget-staging": plan(28, 4, 128, 4, 5, 32768, budget=24 * GIB),
    "plan-tiny-budget": plan(16, 8, 64, 5, 5, 1, budget=4096),
}

# ---- fuzz_cli.c -----------------------------------------------------------------


def args(*a):
    return b"\x00".join(x.encode() for x in a)


def csv_trace(lines):
    """fc_write_trace: CSV lines of dictionary fields (indexes into its tables)."""
    b = bytes([len(lines) - 1])
    for fields in lines:
        b += bytes([0, len(fields) - 3]) + bytes(fields)
    return b


def comment_trace():
    return bytes([0, 2, 0])


CLI = {
    "plan-preset-gpu": bytes([0]) + args("--preset", "llama-3.1-8b", "--gpu", "h100-80g",
                                         "--format", "int8"),
    "plan-shape-vram": bytes([0]) + args("--layers=32", "--kv-heads", "8", "--head-dim", "128",
                                         "--vram", "24GB", "--weights", "14GB", "--utilization",
                                         "0.9", "--json"),
    "plan-budget-context": bytes([0]) + args("--preset", "qwen2.5-0.5b", "--kv-budget", "1.5T",
                                             "--context", "32k", "--k-format", "int8",
                                             "--v-format", "int4", "--page-size", "64"),
    "plan-lists": bytes([0]) + args("--list-presets", "--list-gpus"),
    "plan-extremes": bytes([0]) + args("--layers", "65536", "--kv-heads", "65536", "--head-dim",
                                       "1024", "--page-size", "4096", "--kv-budget",
                                       "18446744073709551615", "--context",
                                       "9223372036854775807", "--format", "fp32"),
    "plan-cuda": bytes([0]) + args("--preset", "mistral-7b", "--gpu", "cuda:0"),
    "sim-preset-burst": bytes([1]) + comment_trace() + args("--preset", "burst", "--scale",
                                                            "0.005", "--strategies", "paged"),
    "sim-trace-full": bytes([1]) + csv_trace([[0, 2, 1, 1], [1, 3, 2, 2], [3, 1, 1, 0, 4]])
    + args("--trace", "1", "--strategies", "full,static", "--json", "--page-size", "2"),
    "sim-small-budget-check": bytes([1]) + comment_trace()
    + args("--kv-budget", "512MiB", "--full-format", "int4/int8", "--strategies", "full",
           "--check", "--scale", "0.005", "--drop-below", "2", "--horizon", "3"),
    "sim-files": bytes([1]) + comment_trace() + args("--plot", "1", "--save-trace", "0",
                                                     "--strategies", "static",
                                                     "--static-max-len", "1k", "--scale",
                                                     "0.003"),
    "sim-tight-engine": bytes([1]) + comment_trace()
    + args("--model", "smollm2-135m", "--gpu", "jetson-orin-8g", "--max-batch", "1",
           "--token-budget", "1", "--prefill-chunk", "1", "--strategies", "paged-int8",
           "--scale", "0.004"),
    "sim-bad-trace": bytes([1]) + csv_trace([[5, 2, 2, 1], [8, 6, 4, 0]])
    + args("--trace", "1", "--strategies", "paged"),
}


def write(name, seeds):
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", name)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    for seed, data in seeds.items():
        with open(os.path.join(out, seed), "wb") as f:
            f.write(data)
    print(f"{len(seeds)} seeds in {out}")


if __name__ == "__main__":
    write("sched", SCHED)
    write("plan", PLAN)
    write("cli", CLI)
