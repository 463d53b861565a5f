"""How fast can k programs read, by copy engine (GPU only, sm_90, triton 3.6): the per-SM cap.

Session 14 (bench/results/2026-12-01-h200-s14): a lone Gluon decode program streams ~30 GB/s
whatever its ring depth (3-5 tiles of 32 KB in flight) and whatever its tensor work (the swap
kernel does 8x less). If that is a per-SM cap of 16-byte cp.async copies, the programs left
running at the end of a call cannot take the bandwidth the finished ones free (the (1, 32768)
tail), and bulk copies (TMA) are the lever. Each probe program streams its own contiguous rows
of a [rows, 128] bf16 tensor through an NS-slot shared ring, with no other work:

* ``cpasync``: 16-byte cp.async per thread (as the decode kernels), commit/wait groups;
* ``tma``: one TMA box [BR, 128] per slot, completion on an mbarrier.

Prints GB/s in all and per program for k programs (one per SM up to 132, then two).

Usage: python scripts/sm_read_probe.py [--gb 2] [--programs 8,33,66,132,264]
"""
import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

D = 128


@gluon.jit
def _cpasync_probe(x_ptr, out_ptr, rows_per_prog, BR: gl.constexpr, NS: gl.constexpr,
                   num_warps: gl.constexpr):
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    SM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BR, 128], gl.bfloat16)
    ring = gl.allocate_shared_memory(gl.bfloat16, [NS, BR, 128], SM)
    pid = gl.program_id(0)
    row0 = pid.to(gl.int64) * rows_per_prog
    r = gl.arange(0, BR, layout=gl.SliceLayout(1, LD))
    c = gl.arange(0, 128, layout=gl.SliceLayout(0, LD))
    n = rows_per_prog // BR
    for i in gl.static_range(NS - 1):
        async_copy.async_copy_global_to_shared(
            ring.index(i), x_ptr + ((row0 + i * BR + r)[:, None] * 128 + c[None, :]))
        async_copy.commit_group()
    acc = gl.zeros([BR, 128], gl.float32, LD)
    for t in range(n):
        gl.thread_barrier()
        nt = t + NS - 1
        async_copy.async_copy_global_to_shared(
            ring.index(nt % NS), x_ptr + ((row0 + nt * BR + r)[:, None] * 128 + c[None, :]),
            mask=(nt * BR + r < n * BR)[:, None])
        async_copy.commit_group()
        async_copy.wait_group(NS - 1)
        gl.thread_barrier()
        acc += ring.index(t % NS).load(LD).to(gl.float32)
    async_copy.wait_group(0)
    gl.store(out_ptr + pid, gl.sum(gl.sum(acc, 1), 0))


@gluon.jit
def _tma_probe(desc, out_ptr, rows_per_prog, BR: gl.constexpr, NS: gl.constexpr,
               num_warps: gl.constexpr):
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    ring = gl.allocate_shared_memory(gl.bfloat16, [NS, BR, 128], desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NS):
        mbarrier.init(full.index(i), count=1)
    pid = gl.program_id(0)
    row0 = pid * rows_per_prog
    n = rows_per_prog // BR
    for i in gl.static_range(NS):
        mbarrier.expect(full.index(i), BR * 128 * 2)
        tma.async_copy_global_to_shared(desc, [row0 + i * BR, 0], full.index(i), ring.index(i))
    acc = gl.zeros([BR, 128], gl.float32, LD)
    for t in range(n):
        slot = t % NS
        mbarrier.wait(full.index(slot), (t // NS) & 1)
        acc += ring.index(slot).load(LD).to(gl.float32)
        gl.thread_barrier()  # every warp read the slot
        nt = t + NS
        mbarrier.expect(full.index(slot), BR * 128 * 2, pred=nt < n)
        tma.async_copy_global_to_shared(desc, [row0 + nt * BR, 0], full.index(slot),
                                        ring.index(slot), pred=nt < n)
    for i in gl.static_range(NS):
        mbarrier.invalidate(full.index(i))
    gl.store(out_ptr + pid, gl.sum(gl.sum(acc, 1), 0))


def _time(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2 * reps)]
    ts = []
    for i in range(reps):
        ev[2 * i].record()
        fn()
        ev[2 * i + 1].record()
    torch.cuda.synchronize()
    for i in range(reps):
        ts.append(ev[2 * i].elapsed_time(ev[2 * i + 1]) * 1e-3)
    return sorted(ts)[len(ts) // 2]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--programs", default="8,33,66,132,264")
    args = ap.parse_args(argv)
    rows = int(args.gb * 1e9) // (D * 2) // 8192 * 8192
    x = torch.randn(rows, D, device="cuda", dtype=torch.bfloat16)
    forms = [("cpasync", 64, 2), ("cpasync", 64, 4), ("cpasync", 64, 6),
             ("tma", 64, 2), ("tma", 64, 4), ("tma", 64, 6), ("tma", 16, 8), ("tma", 16, 16)]
    print(f"# per-SM read probe: {rows * D * 2 / 1e9:.2f} GB, bf16 rows of {D}; GB/s total "
          "(per program)")
    print("| form | BR | NS | KB in flight | " + " | ".join(f"k={k}" for k in
                                                          args.programs.split(",")) + " |")
    print("|---|---|---|---|" + "---|" * len(args.programs.split(",")))
    for form, br, ns in forms:
        cells = []
        for k in (int(v) for v in args.programs.split(",")):
            rpp = rows // k // br * br
            out = torch.empty(k, device="cuda", dtype=torch.float32)
            if form == "cpasync":
                def fn():
                    _cpasync_probe[(k,)](x, out, rpp, BR=br, NS=ns, num_warps=4)
                kb = (ns - 1) * br * D * 2 / 1024
            else:
                layout = gl.NVMMASharedLayout.get_default_for([br, D], gl.bfloat16)
                desc = TensorDescriptor.from_tensor(x, [br, D], layout)

                def fn():
                    _tma_probe[(k,)](desc, out, rpp, BR=br, NS=ns, num_warps=4)
                kb = ns * br * D * 2 / 1024
            try:
                s = _time(fn)
                gbs = k * rpp * D * 2 / s / 1e9
                cells.append(f"{gbs:.0f} ({gbs / k:.1f})")
            except Exception as e:  # noqa: BLE001 - a form the compiler rejects: say why
                cells.append(f"error: {str(e).splitlines()[0][:60]}")
        print(f"| {form} | {br} | {ns} | {kb:.0f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
