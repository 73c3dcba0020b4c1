"""A float64 NumPy reference for paged attention, shared by the tests."""

import numpy as np

H, QH, D = 2, 8, 64


def reference(q, k, v, scale, causal=True, with_lse=False):
    """float64 attention: q [rows][QH][D] are the last rows of a sequence of
    len(k) tokens (kv heads H, query heads QH)."""
    rows, n = q.shape[0], k.shape[0]
    out = np.zeros(q.shape)
    lse = np.zeros((rows, q.shape[1]))
    g = q.shape[1] // k.shape[1]
    for i in range(rows):
        pos = n - rows + i
        hi = pos + 1 if causal else n
        for h in range(q.shape[1]):
            s = (k[:hi, h // g].astype(np.float64) @ q[i, h].astype(np.float64)) * scale
            w = np.exp(s - s.max())
            lse[i, h] = s.max() + np.log(w.sum())
            w /= w.sum()
            out[i, h] = w @ v[:hi, h // g].astype(np.float64)
    return (out, lse) if with_lse else out


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)
