"""Timeline of one decode call through the Gluon kernel (GPU only): where the time goes.

Each program of the Gluon decode kernel stamps %globaltimer at its start, when its first KV tile
has landed, after its tile loop and at its exit (``_decode_gluon.TIMELINE``). One call is timed
with CUDA events around it (decode kernel + combine), and compared with the kernel's own span:

* start spread: when programs begin, after the first one (launch / block scheduling);
* first tile: start -> first tile landed (q, seq_len, the block ids and one tile: the latency the
  pipeline cannot hide);
* loop: first tile -> loop done; tail: loop done -> exit (park or store);
* end spread: the last exit minus each program's exit (how long the last ones run alone);
* event time - kernel span: the combine, the launch gaps and the event overhead.

Usage: python scripts/decode_timeline.py [--batch 1] [--ctx 32768] [--heads 32/8] [--block 16]
[--mode split|one_pass]
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.bench_decode import _case  # noqa: E402


def _pct(x, qs=(0, 10, 50, 90, 100)):
    import torch
    x = x.double()
    return " ".join(f"p{q} {torch.quantile(x, q / 100).item() / 1e3:7.2f}" for q in qs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--mode", default=None, choices=["split", "one_pass"])
    ap.add_argument("--calls", type=int, default=5, help="timed calls (each reported)")
    args = ap.parse_args(argv)
    os.environ["PAGEDATTN_DECODE_VARIANT"] = "gluon"
    if args.mode:
        os.environ["PAGEDATTN_DECODE_MODE"] = args.mode
    import torch

    import pagedattn as pa
    from pagedattn.triton_kernels import decode as PD

    G = PD.gluon_kernel()
    if G is None or not G.is_sm90(torch.device("cuda")):
        sys.exit("needs an sm_90 GPU and triton " + PD.GLUON_TRITON)
    hq, hkv = (int(x) for x in args.heads.split("/"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, table, lens = _case(args.batch, args.ctx, hq, hkv, args.block, torch.bfloat16,
                                 "cuda", gen)
    out = torch.empty_like(q)
    nbytes = 2 * args.batch * args.ctx * hkv * q.shape[-1] * k.element_size()
    call = lambda: pa.paged_decode(q, k, v, table, lens, out=out, validate=False)  # noqa: E731
    stamps = torch.zeros(4 << 16, dtype=torch.int64, device="cuda")
    G.TIMELINE = stamps
    try:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        print(f"# decode timeline: batch {args.batch} ctx {args.ctx} heads {args.heads} "
              f"block {args.block}, {nbytes / 1e6:.1f} MB of K/V; us")
        for i in range(args.calls):
            stamps.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            s.record()
            call()
            e.record()
            e.synchronize()
            t = stamps.view(-1, 4)
            t = t[t[:, 0] > 0]
            work = t[t[:, 1] > 0]  # programs that had a tile
            t0 = t[:, 0].min()
            span = (t[:, 3].max() - t0).item()
            print(f"call {i}: events {s.elapsed_time(e) * 1e3:7.2f} | kernel span "
                  f"{span / 1e3:7.2f} ({nbytes / span:6.0f} GB/s) | programs {len(t)} "
                  f"({len(work)} with tiles)")
            print(f"  start spread  {_pct(t[:, 0] - t0)}")
            print(f"  first tile    {_pct(work[:, 1] - work[:, 0])}")
            print(f"  loop          {_pct(work[:, 2] - work[:, 1])}")
            print(f"  tail          {_pct(work[:, 3] - work[:, 2])}")
            print(f"  end spread    {_pct(t[:, 3].max() - t[:, 3])}")
    finally:
        G.TIMELINE = None


if __name__ == "__main__":
    main()
