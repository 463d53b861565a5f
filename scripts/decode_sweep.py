"""Sweep (BLOCK_N, num_warps, num_stages) of the Triton decode kernel on the H200 shapes."""
import itertools
import os
import sys

import torch
import triton

import pagedattn as pa

SHAPES = [(1, 32768), (8, 8192), (64, 4096), (256, 2048), (128, 512)]
CONFIGS = [(bn, w, st) for bn, w, st in itertools.product((32, 64, 128), (4, 8), (2, 3, 4))]


def main():
    dev = "cuda"
    hq, hkv, d = 32, 8, 128
    bs = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    x = torch.empty(2 ** 31, dtype=torch.uint8, device=dev)
    t = triton.testing.do_bench(lambda: x.sum(dtype=torch.int32), return_mode="median")
    bw = x.numel() / t / 1e6
    del x
    print(f"read bw {bw:.0f} GB/s (uint8 sum of 2 GiB)")
    rows = []
    for b, ctx in SHAPES:
        nblk = b * ctx // bs + 1
        kc, vc = pa.make_kv_cache(nblk, bs, hkv, d, dtype=torch.bfloat16, device=dev)
        kc.normal_(); vc.normal_()
        table = (torch.randperm(nblk - 1, device=dev)[: b * ctx // bs] + 1).to(torch.int32)
        table = table.view(b, ctx // bs)
        lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
        q = torch.randn(b, hq, d, dtype=torch.bfloat16, device=dev)
        gb = 2 * b * ctx * hkv * d * 2 / 1e9
        best = None
        for cfg in CONFIGS:
            os.environ["PAGEDATTN_DECODE_CONFIG"] = ",".join(map(str, cfg))
            try:
                f = lambda: pa.paged_decode(q, kc, vc, table, lens, backend="triton",
                                            validate=False)
                f()
                ms = triton.testing.do_bench(f, return_mode="median")
            except Exception as e:  # noqa: BLE001
                print(b, ctx, cfg, "failed", type(e).__name__, str(e)[:100])
                continue
            frac = gb / (ms * 1e-3) / bw
            rows.append((b, ctx, cfg, ms * 1e3, frac))
            if best is None or ms < best[1]:
                best = (cfg, ms)
        print(f"B={b} ctx={ctx} bs={bs}: best {best[0]} {best[1]*1e3:.1f} us "
              f"frac {gb / (best[1] * 1e-3) / bw:.3f}", flush=True)
        del kc, vc
    os.environ.pop("PAGEDATTN_DECODE_CONFIG", None)
    for r in rows:
        print(*r)


if __name__ == "__main__":
    main()
