"""A few decode steps through libkvpage from Python, with NumPy data.

Plans a cache for a small model shape, creates it (int8 keys and values),
prefills two prompts of different lengths, decodes a few tokens each, forks
one sequence, and prints the last step's batch (the CSR page table an
engine's own kernels would read) and the pool's statistics. The K/V/Q
tensors are random: a real engine computes them with its model.

    pip install ./bindings/python && python3 examples/python/decode_loop.py

or, against a build tree without installing:

    make lib && KVPAGE_LIBRARY=build/libkvpage.so.0 PYTHONPATH=bindings/python \
        python3 examples/python/decode_loop.py
"""

import numpy as np

import kvpage

LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM = 4, 2, 8, 64

plan = kvpage.plan(layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, q_heads=Q_HEADS,
                   kv_budget="64MiB", context=2048, format="int8")
print(plan)

rng = np.random.default_rng(0)
with kvpage.Cache(layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                  kv_budget=plan.kv_budget_bytes, k_format="int8", v_format="int8",
                  max_seqs=plan.max_seqs, threads=2) as cache:
    a, b = cache.create(), cache.create()
    active = {a: 100, b: 37}  # prompt lengths: the first step prefills them
    for step in range(6):
        seqs = list(active)
        rows = cache.begin_step(seqs, [active[s] for s in seqs])
        for layer in range(LAYERS):
            k = rng.normal(size=(rows, KV_HEADS, HEAD_DIM)).astype(np.float32)
            v = rng.normal(size=(rows, KV_HEADS, HEAD_DIM)).astype(np.float32)
            cache.write(layer, k, v)
            q = rng.normal(size=(rows, Q_HEADS, HEAD_DIM)).astype(np.float32)
            out = cache.attend(layer, q)  # softmax scale: 1/sqrt(head_dim) by default
        if step == 2:
            c = cache.fork(a)  # e.g. a second sample from the same prefix
            active[c] = 1
        active = {s: 1 for s in active}  # from now on: one token per sequence
        print(f"step {step}: {rows} rows, lengths "
              + ", ".join(f"seq {s}: {cache.length(s)}" for s in active))
    view = cache.step_view()  # valid until the next step
    print(f"last step: indptr {view.indptr.tolist()}, last_page_len "
          f"{view.last_page_len.tolist()}, slots {view.slots.tolist()}")
    stats = cache.stats()
    print({k: stats[k] for k in ("total_pages", "used_pages", "live_seqs", "live_tokens",
                                 "utilization")})
