"""``python -m bench {run,all,ab,replay}``: the benchmark CLI (docs/bench.md).

* ``run`` (``make run``, the main job, any device): the serving replay table, then a short A/B
  table of paged_decode and extend_attention with every available backend side by side.
  Without a GPU Triton runs under ``TRITON_INTERPRET=1`` on tiny shapes (timings not
  meaningful) and the replay uses the torch backend (the interpreter would take minutes).
* ``all`` (``make gpu``, on the GPU): the full A/B suites, the kernel owners' suites
  (bench_decode, bench_extend, bench_hip), the replay (fp32 and bf16), the CPU cache-manager
  benches (bench_block_manager, bench_radix), and a summary table of what ran.
* ``ab`` and ``replay``: one part alone, with its own flags (``python -m bench ab --help``).
"""
import argparse
import importlib
import sys
import time
import traceback

from bench import common as C

SUITES = ("bench_decode", "bench_extend", "bench_hip")          # GPU kernel suites
CPU_SUITES = ("bench_block_manager", "bench_radix")            # cache-manager benches


def _replay_backend(device: str, backend: str) -> str:
    # NOTE: "auto" on a CPU with TRITON_INTERPRET=1 would pick the interpreted Triton kernels
    # for every layer of every step: minutes instead of seconds. The A/B table covers Triton.
    return "torch" if device == "cpu" and backend == "auto" else backend


def cmd_run(a) -> int:
    from bench import ab, replay

    t0 = time.perf_counter()
    device = C.setup_device()
    ceilings = C.measure_ceilings(device, quick=True)
    import torch

    rc = replay.report(device=device, backend=_replay_backend(device, a.backend),
                       dtype=torch.float32, quick=a.quick, seed=a.seed, out=a.out,
                       ceilings=ceilings)
    # short A/B: the first shapes of the GPU suites, or the tiny interpreter shapes on a CPU
    ab.report(device=device, ceilings=ceilings, out=a.out, quick=a.quick or device == "cuda",
              baseline=a.baseline)
    print(f"bench run: {C.elapsed(t0)}; tables under {a.out}/ (replay, ab_decode, ab_extend: "
          f".md .csv .json){'' if rc == 0 else '; REPLAY CHECK FAILED'}", flush=True)
    return rc


def _suite(name: str, argv) -> str:
    try:
        mod = importlib.import_module(f"bench.{name}")
    except ImportError as e:
        return f"skipped: bench/{name}.py not importable ({e})"
    try:
        rc = mod.main(argv)
    except SystemExit as e:  # argparse or an explicit exit
        rc = e.code
    except Exception as e:  # noqa: BLE001 - one suite's failure must not stop the others
        traceback.print_exc()
        return f"failed: {type(e).__name__}: {e}"
    if isinstance(rc, (int, bool)) and rc:  # some suites return their DataFrame: that is ok
        return f"exit code {int(rc)}"
    return "ok"


def cmd_all(a) -> int:
    import pandas as pd
    import torch

    from bench import ab, replay

    device = C.setup_device()
    if device != "cuda":
        print("bench all: no GPU found; running everything on the CPU (small shapes)",
              file=sys.stderr)
    ceilings = C.measure_ceilings(device, quick=a.quick)
    header = C.results_header(device=device, ceilings=ceilings)
    steps, rc = [], 0
    extra = ["--quick"] if a.quick else []

    def step(name, fn):
        t = time.perf_counter()
        try:
            status = fn()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            status = f"failed: {type(e).__name__}: {e}"
        steps.append({"step": name, "status": status, "seconds": time.perf_counter() - t})
        return status

    step("ab (ours + flashinfer)", lambda: ab.report(device=device, ceilings=ceilings, out=a.out,
                                                     quick=a.quick, baseline=a.baseline) and "ok")
    if device == "cuda":
        step("ab --cuda-graph decode", lambda: ab.report(
            device=device, ceilings=ceilings, out=f"{a.out}/cuda_graph", quick=a.quick,
            baseline=a.baseline, ops=("paged_decode",), cuda_graph=True) and "ok")
    skip = set(filter(None, a.skip.split(",")))
    for name in SUITES + CPU_SUITES:
        if name in skip:
            steps.append({"step": name, "status": "skipped (--skip)", "seconds": 0.0})
            continue
        step(name, lambda name=name: _suite(name, ["--out", a.out] + extra))
    dtypes = [torch.float32] + ([torch.bfloat16] if device == "cuda" else [])
    for dt in dtypes:
        sub = a.out if dt == torch.float32 else f"{a.out}/replay_bf16"
        status = step(f"replay {str(dt)[6:]}", lambda dt=dt, sub=sub: "ok" if replay.report(
            device=device, backend=_replay_backend(device, a.backend), dtype=dt, quick=a.quick,
            seed=a.seed, out=sub, ceilings=ceilings) == 0 else "logit check failed")
        rc |= status != "ok"
    print(C.write_table(pd.DataFrame(steps), a.out, "summary", title="bench all: what ran",
                        header=header), flush=True)
    return rc


def cmd_ab(argv) -> int:
    from bench import ab
    return ab.main(argv)


def cmd_replay(argv) -> int:
    from bench import replay
    return replay.main(argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("ab", "replay"):  # these parse their own flags
        return (cmd_ab if argv[0] == "ab" else cmd_replay)(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, helptext in (("run", "the main job: replay + short A/B on this device"),
                           ("all", "GPU: full A/B suites, kernel suites, replay, cache benches"),
                           ("ab", "A/B tables only (see `ab --help`)"),
                           ("replay", "serving replay only (see `replay --help`)")):
        p = sub.add_parser(name, help=helptext)
        if name in ("run", "all"):
            p.add_argument("--out", default="results", help="folder for the tables")
            p.add_argument("--quick", action="store_true", help="smaller workloads and suites")
            p.add_argument("--backend", default="auto", choices=["auto", "torch", "triton", "hip"],
                           help="backend of the replay's ops")
            p.add_argument("--baseline", default=None, help="A/B speed-up baseline backend")
            p.add_argument("--seed", type=int, default=0)
        if name == "all":
            p.add_argument("--skip", default="", help="comma-separated suites to leave out, e.g. "
                           "the CPU cache-manager benches on a GPU machine: "
                           "bench_block_manager,bench_radix")
    a = ap.parse_args(argv)
    return cmd_run(a) if a.cmd == "run" else cmd_all(a)


if __name__ == "__main__":
    raise SystemExit(main())
