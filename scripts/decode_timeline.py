"""Timeline of one decode call through the Gluon kernel (GPU only): where the time goes.

Each program of the Gluon decode kernel stamps %globaltimer at its start, when its first KV tile
has landed, after its tile loop and at its exit (``_decode_gluon.TIMELINE``). One call is timed
with CUDA events around it (decode kernel + combine), and compared with the kernel's own span:

* start spread: when programs begin, after the first one (launch / block scheduling);
* first tile: start -> first tile landed (q, seq_len, the block ids and one tile: the latency the
  pipeline cannot hide);
* loop: first tile -> loop done; tail: loop done -> exit (park or store);
* end spread: the last exit minus each program's exit (how long the last ones run alone);
* event time - kernel span: the combine, the launch gaps and the event overhead;
* issue / wait / compute: the loop's %clock64 cycles refilling the ring, waiting for a tile to
  land, and computing (decode_sm90; the wait share says how memory-bound a program is);
* by SM (%smid): loop time by the number of programs an SM ran, and whether an SM's speed
  persists across calls (correlation of per-SM mean loop times between calls): persistent,
  position-bound rates would argue for handing out work dynamically.

HIP (``--backend hip``): the column-split kernel stamps slots 0-4 the same way in a build with
PAGEDATTN_HIP_TIMELINE=1 (set here before the first build; its own cached build); no cycle counts.
The Triton tile loop (``--backend triton``, ``decode.TIMELINE``): no first-tile stamp (its
"loop" includes the first tile's latency), no cycle counts.

Usage: python scripts/decode_timeline.py [--batch 1] [--ctx 32768] [--heads 32/8] [--block 16]
[--mode split|one_pass] [--backend gluon|hip|triton]
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
    ap.add_argument("--backend", default="gluon", choices=["gluon", "hip", "triton"])
    args = ap.parse_args(argv)
    os.environ["PAGEDATTN_DECODE_VARIANT"] = "triton" if args.backend == "triton" else "gluon"
    os.environ["PAGEDATTN_HIP_TIMELINE"] = "1"
    if args.mode:
        os.environ["PAGEDATTN_DECODE_MODE"] = args.mode
        os.environ["PAGEDATTN_HIP_DECODE_MODE"] = args.mode
    import torch

    import pagedattn as pa
    from pagedattn.triton_kernels import decode as PD

    if args.backend == "hip":
        from pagedattn import hip_kernels as G  # G.TIMELINE: the stamps' tensor
    elif args.backend == "triton":
        G = PD
    else:
        G = PD.gluon_kernel()
        if G is None or not G.is_sm90(torch.device("cuda")):
            sys.exit("needs an sm_90 GPU and triton " + PD.GLUON_TRITON)
    hq, hkv = (int(x) for x in args.heads.split("/"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, table, lens = _case(args.batch, args.ctx, hq, hkv, args.block, torch.bfloat16,
                                 "cuda", gen)
    out = torch.empty_like(q)
    nbytes = 2 * args.batch * args.ctx * hkv * q.shape[-1] * k.element_size()
    call = lambda: pa.paged_decode(q, k, v, table, lens, out=out, validate=False,  # noqa: E731
                                   backend="hip" if args.backend == "hip" else "triton")
    stamps = torch.zeros(G.STAMPS << 16, dtype=torch.int64, device="cuda")
    G.TIMELINE = stamps
    per_sm = []  # per call: {SM id: mean loop time}
    try:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        print(f"# decode timeline ({args.backend}): batch {args.batch} ctx {args.ctx} heads "
              f"{args.heads} block {args.block}, {nbytes / 1e6:.1f} MB of K/V; us")
        for i in range(args.calls):
            stamps.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            s.record()
            call()
            e.record()
            e.synchronize()
            t = stamps.view(-1, G.STAMPS)
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
            cyc = work[:, 5:8].double()
            if cyc.sum() > 0:  # decode_sm90: loop cycles issuing, waiting for tiles, computing
                tot = cyc.sum(1)
                for j, name in enumerate(("issue", "wait", "compute")):
                    share = 100 * cyc[:, j] / tot
                    print(f"  {name:8s} % of loop cycles " + " ".join(
                        f"p{q} {torch.quantile(share, q / 100).item():5.1f}"
                        for q in (0, 10, 50, 90, 100)))
                ghz = tot / (work[:, 2] - work[:, 1]).double()
                print(f"  loop cycles / loop ns (SM clock, GHz): p50 "
                      f"{torch.quantile(ghz, 0.5).item():.2f}")
            per_sm.append(_by_sm(work))
        _persistence(per_sm)
    finally:
        G.TIMELINE = None


def _by_sm(work):
    """Loop times by how many programs shared the SM; returns {SM id: mean loop ns}."""
    import torch
    sm, loop = work[:, 4], (work[:, 2] - work[:, 1]).double()
    ids, inv, count = torch.unique(sm, return_inverse=True, return_counts=True)
    for c in torch.unique(count).tolist():
        sel = count[inv] == c
        print(f"  loop, {c} program(s) on the SM ({int(sel.sum())} programs): {_pct(loop[sel])}")
    mean = torch.zeros(len(ids), dtype=torch.float64, device=loop.device).index_add_(0, inv, loop)
    return dict(zip(ids.tolist(), (mean / count).tolist()))


def _persistence(per_sm):
    """Correlation of per-SM mean loop times between the first call and each later one."""
    import torch
    if len(per_sm) < 2:
        return
    first = per_sm[0]
    for i, other in enumerate(per_sm[1:], 1):
        common = sorted(set(first) & set(other))
        a = torch.tensor([first[k] for k in common], dtype=torch.float64)
        b = torch.tensor([other[k] for k in common], dtype=torch.float64)
        r = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
        print(f"per-SM mean loop time, call 0 vs call {i}: correlation {r:+.2f} over "
              f"{len(common)} SMs")
    slow = sorted(first, key=first.get)
    print(f"call 0 fastest SMs {slow[:8]}, slowest {slow[-8:]}")


if __name__ == "__main__":
    main()
