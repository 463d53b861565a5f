"""``python -m pagedattn.dispatch [--all-archs]``: the device, its arch facts, and the backend
each op picks for typical decode and extend shapes (Llama-3-8B-like heads: 32 q / 8 kv, D 128,
block 16). The shapes are real tensors on the device, so the backends' own ``supports()`` run.
``--all-archs`` also prints, per arch family, the backends' verification levels and what ``auto``
picks from the package's table alone and once the backends passed the self-check there.
"""
import argparse
import os
import sys

import torch

from pagedattn.dispatch.arch import (ARCH_FACTS, _device_index, detect_arch, device_facts,
                                     device_name)
from pagedattn.dispatch.core import BACKENDS, select
from pagedattn.dispatch.explain import explain

HQ, HKV, D, BS = 32, 8, 128, 16


def _cases(dev, dtype):
    import pagedattn as pa

    def cache(kv_dtype=dtype, blocks=8):
        return pa.make_kv_cache(blocks, BS, HKV, D, layout="bhsd", dtype=kv_dtype, device=dev)

    def decode(b, kv_dtype=dtype, q_len=None, **kw):
        k, v = cache(kv_dtype)
        shape = (b, HQ, D) if q_len is None else (b, q_len, HQ, D)
        q = torch.zeros(shape, dtype=dtype, device=dev)
        table = torch.zeros(b, 4, dtype=torch.int32, device=dev)
        lens = torch.full((b,), 50, dtype=torch.int32, device=dev)
        if kv_dtype != dtype:
            kw.update(k_scale=1.0, v_scale=1.0)
        return ("paged_decode", (q, k, v, table, lens), kw)

    def extend(**kw):
        k, v = cache()
        q = torch.zeros(32, HQ, D, dtype=dtype, device=dev)  # 2 requests x 16 new tokens
        cu = torch.tensor([0, 16, 32], dtype=torch.int32, device=dev)
        lens = torch.tensor([48, 40], dtype=torch.int32, device=dev)
        table = torch.zeros(2, 4, dtype=torch.int32, device=dev)
        if kw.pop("tree", False):
            kw.update(custom_mask=torch.ones(16 * 48 + 16 * 40, dtype=torch.bool, device=dev),
                      mask_indptr=torch.tensor([0, 768, 1408], dtype=torch.int32, device=dev))
        return ("extend_attention", (q, k, v, table, cu, lens), kw)

    k, v = cache()
    new = torch.zeros(4, HKV, D, dtype=dtype, device=dev)
    slots = torch.arange(4, dtype=torch.int64, device=dev)
    return [
        ("decode, 1 seq", decode(1)),
        ("decode, 256 seqs", decode(256)),
        ("decode, 8 seqs, fp8 e4m3 KV", decode(8, torch.float8_e4m3fn)),
        ("decode, 8 seqs, fp8 e5m2 KV", decode(8, torch.float8_e5m2)),
        ("decode, 8 seqs, sinks + window", decode(8, sinks=torch.zeros(HQ, device=dev),
                                                  sliding_window=128)),
        ("decode, 8 seqs x 4 spec tokens", decode(8, q_len=4)),
        ("extend, 2 x 16 new tokens", extend()),
        ("extend, tree mask", extend(tree=True)),
        ("store_kv, 4 tokens", ("store_kv", (new, new, k, v, slots), {})),
        ("copy_blocks", ("copy_blocks", (k, v, [(1, 2)]), {})),
    ]


def all_archs_table() -> str:
    """Per arch family: the order, each GPU backend's verification level for decode, and what
    ``auto`` picks from the package's table alone and once every backend passed the self-check
    on such a device (bf16 decode, 8 seqs, group 4, D 128, block 16)."""
    from tabulate import tabulate

    from pagedattn.dispatch import verified as V
    from pagedattn.dispatch.core import preference

    def pick(arch, checked=()):
        try:
            return select("paged_decode", arch, dtype=torch.bfloat16, head_dim=D, block_size=BS,
                          group=HQ // HKV, layout="bhsd", num_seqs=8, num_kv_heads=HKV,
                          interpret=True, checked=checked).backend
        except ValueError:
            return "none"

    rows = []
    for a in list(ARCH_FACTS) + ["unknown"]:
        order = preference(a, "paged_decode")
        passed = tuple((b, True, "what-if") for b in order)
        rows.append([a, ARCH_FACTS[a].vendor if a in ARCH_FACTS else "unknown", " > ".join(order),
                     V.table_entry(a, "triton", "paged_decode").level,
                     V.table_entry(a, "hip", "paged_decode").level, pick(a), pick(a, passed)])
    return ("== auto's choice per arch: bf16 decode, 8 seqs, group 4, D 128, block 16 ==\n"
            + tabulate(rows, headers=["arch", "vendor", "order", "triton", "hip",
                                      "auto (table)", "auto (self-check passed)"],
                       tablefmt="github"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pagedattn.dispatch",
                                 description="The device, its arch facts, and the backend each "
                                 "op picks for typical decode and extend shapes (32 q / 8 kv "
                                 "heads, head_dim 128, block 16), with the reasons.")
    ap.add_argument("--all-archs", action="store_true",
                    help="also print, per arch family, the backends' verification levels and "
                    "what auto picks from the package's table alone and once the backends "
                    "passed the self-check there")
    flags = ap.parse_args(argv)  # --help: exit 0; an unknown flag: exit 2
    from pagedattn import config
    try:
        config.validate_all()
    except ValueError as e:
        print(f"{ap.prog}: {e}", file=sys.stderr)
        return 2
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    arch = detect_arch(dev)
    facts = device_facts(dev)
    print(f"device: {device_name(dev)} ({dev}), arch {arch}, torch {torch.__version__}"
          f"{', hip ' + torch.version.hip if getattr(torch.version, 'hip', None) else ''}")
    print("arch facts: " + ", ".join(f"{k}={v}" for k, v in facts._asdict().items()
                                     if k != "dtypes")
          + ", dtypes=" + str([str(d).replace("torch.", "") for d in facts.dtypes]))
    env = {k: os.environ.get(k) for k in ("PAGEDATTN_BACKEND", "PAGEDATTN_PARTITION_SIZE",
                                          "TRITON_INTERPRET")}
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    print(f"backends: {list(BACKENDS)}")
    from pagedattn.selfcheck import record
    key = record.device_key(_device_index(dev))
    ran = sorted({f"{b} {op}: {'passed' if ok else 'FAILED'}" for b, op, ok, _ in
                  record.results(record.load(key))})
    print(f"self-check record: {record.path_for(key)}: " + ("; ".join(ran) or "none"))
    for dtype in ((torch.bfloat16,) if dev.type == "cuda" else (torch.float16, torch.bfloat16)):
        print(f"\n== {str(dtype).replace('torch.', '')} (q {HQ} heads, kv {HKV} heads, D {D}, "
              f"block {BS}) ==")
        for label, (op, args, kw) in _cases(dev, dtype):
            try:
                d = explain(op, *args, quiet=True, **kw)
            except (ValueError, TypeError) as e:
                print(f"{label:34s} error: {e}")
                continue
            p = ", ".join(f"{k}={v}" for k, v in d.params.items())
            print(f"{label:32s} {d.backend:6s} {d.variant}{' (' + p + ')' if p else ''}")
            for r in d.reasons:
                if " skipped: " in r:
                    print(" " * 33 + "- " + r)
    if flags.all_archs:
        print("\n" + all_archs_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
