#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on kvpage-bench attention's decode
shapes, over a contiguous fp16 cache: the comparison baseline the CUDA
backend's issue asks for (docs/PERFORMANCE.md).

Shapes: llama-3.1-8b (32 q heads, 8 kv heads, head_dim 128), q_len 1,
batch 1 and 16, context 1k / 8k / 32k, fp16 K/V. GQA through SDPA's
enable_gqa (PyTorch >= 2.5), else K/V repeated to 32 heads (timed without the
repeat). Times are CUDA-event medians of 50 runs after 10 warm-ups; KV GB/s
counts the fp16 K and V bytes once. The last line is one JSON object.

Needs a GPU and PyTorch; prints why and exits 1 otherwise.
"""
import json
import sys


def main() -> int:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"bench_sdpa: PyTorch is not installed ({e})", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("bench_sdpa: no CUDA device", file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    q_heads, kv_heads, dim = 32, 8, 128
    gqa = True
    results = []
    print(f"SDPA on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, fp16, q_len 1")
    print(f"{'batch':>5} {'context':>7} {'time ms':>9} {'KV GB/s':>9}")
    for batch in (1, 16):
        for context in (1024, 8192, 32768):
            q = torch.randn(batch, q_heads, 1, dim, device=dev, dtype=torch.float16)
            k = torch.randn(batch, kv_heads, context, dim, device=dev, dtype=torch.float16)
            v = torch.randn(batch, kv_heads, context, dim, device=dev, dtype=torch.float16)
            try:
                def run():
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                run()
            except TypeError:  # PyTorch < 2.5: no enable_gqa
                gqa = False
                kr = k.repeat_interleave(q_heads // kv_heads, dim=1)
                vr = v.repeat_interleave(q_heads // kv_heads, dim=1)

                def run():
                    return F.scaled_dot_product_attention(q, kr, vr)
            for _ in range(10):
                run()
            torch.cuda.synchronize()
            times = []
            for _ in range(50):
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                run()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e-3)
            times.sort()
            t = times[len(times) // 2]
            kv_bytes = 2 * batch * kv_heads * context * dim * 2
            results.append({"batch": batch, "context": context, "seconds": t,
                            "kv_gbps": kv_bytes / t / 1e9})
            print(f"{batch:5d} {context:7d} {t * 1e3:9.4f} {kv_bytes / t / 1e9:9.1f}")
            del q, k, v
    print(json.dumps({"bench": "sdpa", "gpu": torch.cuda.get_device_name(0),
                      "torch": torch.__version__, "gqa_native": bool(gqa), "cases": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
