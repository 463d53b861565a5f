"""Decode launch shapes on a ragged batch (GPU only).

usage: python3 scripts/ragged_decode.py [--heads 32/8,32/32] [--batch 64] [--short 512]
       [--long 32768] [--mix one_long|uniform|bimodal|even|spread] [--block 16] [--width KEYS]
       [--backends triton,triton_tl,flashinfer_fa2]
Mixes: ``one_long`` (batch - 1 sequences of --short keys and one of --long), ``uniform``
(lengths uniform in [1, --long], seeded), ``bimodal`` (half --short, half --long), ``even``
(every sequence --long), ``spread`` (uniform in [3/4, 1] x --long, seeded: an even batch whose
partition counts differ). --width: the block table's width in keys (default --long); engines size
it by the model's length, and the count rule sizes split shares by it (the slack points at a
valid page and is masked).
Times the launch rule (the Triton backend, its Gluon forms too: balanced, shares sized from the
lengths on the device) against the count rule, each launch shape forced and split with one
partition per program, from CUDA graphs, on a batch whose lengths are
not equal: us per call and GB/s of the K/V actually visible. ``triton_tl``: the Triton kernel forced
(PAGEDATTN_DEV_DECODE_KERNEL=triton; the Gluon kernel serves MHA and 64-token pages).
``flashinfer``, ``flashinfer_fa2``, ``flashinfer_cuda``: FlashInfer's batch decode (tensor cores
under "auto" / FA2, CUDA cores), planned from the lengths outside the timing; "rule" only.
"""
import argparse

import torch

from pagedattn.bench.decode import (D, FLASHINFER_PATHS, _bench_graph, _case, _flashinfer, _ours,
                                _with_env)

from pagedattn.triton_kernels import decode as PD  # noqa: E402

MODE = "PAGEDATTN_DEV_DECODE_MODE"
BASE = {"triton": {}, "triton_tl": {"PAGEDATTN_DEV_DECODE_KERNEL": "triton"}}


def _one_partition(fn):
    """fn with one partition per split program (decode.PPP)."""
    def run():
        PD.PPP = 1
        try:
            return fn()
        finally:
            PD.PPP = None
    return run


def _lengths(a, gen):
    """int32 [batch] lengths of the mix (on the CPU)."""
    if a.mix == "even":
        return torch.full((a.batch,), a.long, dtype=torch.int32)
    if a.mix == "uniform":
        return torch.randint(1, a.long + 1, (a.batch,), generator=gen, dtype=torch.int32)
    if a.mix == "spread":
        return torch.randint(a.long - a.long // 4, a.long + 1, (a.batch,), generator=gen,
                             dtype=torch.int32)
    lens = torch.full((a.batch,), a.short, dtype=torch.int32)
    if a.mix == "bimodal":
        lens[a.batch // 2:] = a.long
    else:
        lens[-1] = a.long
    return lens


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", default="32/8,32/32")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--short", type=int, default=512)
    ap.add_argument("--long", type=int, default=32768)
    ap.add_argument("--mix", default="one_long",
                    choices=("one_long", "uniform", "bimodal", "even", "spread"))
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--backends", default="triton,triton_tl")
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    cpu_gen = torch.Generator().manual_seed(0)
    width = max(a.width or a.long, a.long)
    print(f"# ragged decode: batch {a.batch}, mix {a.mix} (short {a.short}, long {a.long} keys), "
          f"block {a.block}, table width {width} keys, bf16, D {D}; us per call from CUDA graphs")
    print("| Hq/Hkv | backend | rule | count rule | forced one pass | forced split | split, 1 "
          "partition a program | rule GB/s | split-1 GB/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for pair in a.heads.split(","):
        hq, hkv = (int(x) for x in pair.split("/"))
        q, k, v, table, lens = _case(a.batch, a.long, hq, hkv, a.block, torch.bfloat16, "cuda",
                                     gen)
        lens.copy_(_lengths(a, cpu_gen).to(lens.device))
        extra = -(-width // a.block) - table.shape[1]
        if extra > 0:  # slack ids: a valid page, masked off by the lengths
            table = torch.cat([table, table[:, :1].expand(-1, extra)], 1).contiguous()
        keys = int(lens.sum())
        kb = keys * hkv * D * 2 * 2 / 1e3  # K + V bytes visible, in kB: kB / us = GB/s
        out = torch.empty_like(q)
        for be in a.backends.split(","):
            if be in FLASHINFER_PATHS:  # its own plan (from the lengths, untimed); one cell
                try:
                    fi = _flashinfer(q, k, v, table, lens, a.block, **FLASHINFER_PATHS[be])
                    t = [_bench_graph(fi)]
                except Exception as e:  # not installed, or no prebuilt kernel for this case
                    print(f"<!-- {be}: {type(e).__name__}: {str(e)[:200]} -->", flush=True)
                    continue
                t += [None] * 4
            else:
                fn = _ours(q, k, v, table, lens, out, "triton")
                envs = [{}, {MODE: "count"}, {MODE: "one_pass"}, {MODE: "split"}]
                t = [_bench_graph(_with_env(fn, **BASE[be], **env)) for env in envs]
                split = _with_env(fn, **BASE[be], **{MODE: "split"})
                t.append(_bench_graph(_one_partition(split)))
            cells = " | ".join("-" if x is None else f"{x:.1f}" for x in t)
            bw = " | ".join("-" if x is None else f"{kb / x:.0f}" for x in (t[0], t[4]))
            print(f"| {hq}/{hkv} | {be} | {cells} | {bw} |", flush=True)
        del q, k, v, table, lens, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
