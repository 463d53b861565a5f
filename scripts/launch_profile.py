"""Host cost of one eager decode / extend call per backend (H200 diagnostic).

Prints the wall time per call of N back-to-back calls (host-bound when the kernel is short) and
the top cProfile entries of the Triton decode path, to find where the launch time goes.
"""
import cProfile
import pstats
import time

import torch

import pagedattn as pa
from bench.bench_decode import _case


def per_call_us(fn, n=300):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, table, lens = _case(1, 4096, 32, 8, 16, torch.bfloat16, "cuda", gen)
    out = torch.empty_like(q)
    calls = {
        "triton paged_decode": lambda: pa.paged_decode(q, k, v, table, lens, backend="triton",
                                                       out=out, validate=False),
        "hip paged_decode": lambda: pa.paged_decode(q, k, v, table, lens, backend="hip",
                                                    out=out, validate=False),
        "torch empty (floor)": lambda: torch.empty(16, device="cuda"),
        "torch add (one launch)": lambda: q.add_(0),
    }
    plan = pa.plan_decode(table, lens, num_q_heads=32, num_kv_heads=8, head_dim=128,
                          block_size=16, num_blocks=k.shape[0], q_dtype=torch.bfloat16,
                          backend="triton")
    calls["triton run_decode (plan)"] = lambda: pa.run_decode(plan, q, k, v, out=out)
    for name, fn in calls.items():
        try:
            print(f"{name:28s} {per_call_us(fn):8.1f} us/call", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:28s} failed: {type(e).__name__}: {e}"[:160], flush=True)
    prof = cProfile.Profile()
    fn = calls["triton paged_decode"]
    prof.enable()
    for _ in range(200):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
