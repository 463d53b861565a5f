"""``python -m pagedattn.bench`` (installed as ``pagedattn-bench``): the benchmark CLI
(docs/bench.md).

* ``run`` (``make run``, the main job, any device): the serving replay table, then a short A/B
  table of paged_decode and extend_attention with every available backend side by side.
  Without a GPU Triton runs under ``TRITON_INTERPRET=1`` on tiny shapes (timings not
  meaningful) and the replay uses the torch backend (the interpreter would take minutes).
* ``record`` (a GPU): the tables of record, decode and extend beside FlashInfer and torch SDPA
  as fractions of the ceilings measured in the same run, with the device and software facts and
  the command itself, into one folder (``bench/results/<date>-<device>-<commit>/`` in the
  repository); ``--tests DIR`` also runs the GPU test tier there and keeps its log.
* ``decode``, ``extend``, ``ab``, ``replay``, ``block-manager``: one part alone, with its own
  flags (``python -m pagedattn.bench decode --help``).
"""
import argparse
import json
import shlex
import subprocess
import sys
import time

from pagedattn.bench import common as C

PARTS = {"decode": "pagedattn.bench.decode", "extend": "pagedattn.bench.extend",
         "ab": "pagedattn.bench.ab", "replay": "pagedattn.bench.replay",
         "block-manager": "pagedattn.bench.block_manager", "radix": "pagedattn.bench.radix"}


# --help text: plain and self-contained (an installed wheel has no docs folder to point to)
HELP = "pagedattn's benchmarks: tables of timings against measured ceilings and peers."
EPILOG = """commands:
  run            the main job on any device: the serving replay table, then a short A/B
                 table of paged_decode and extend_attention with every available backend.
                 Without a GPU, Triton runs under its interpreter on tiny shapes (timings
                 not meaningful) and the replay uses the torch backend.
  record         on a GPU: the decode and extend tables of record beside FlashInfer and
                 torch SDPA, as fractions of ceilings measured in the same run, with the
                 device and software facts and the command, into one folder (--out).
  decode, extend, ab, replay, block-manager, radix
                 one part alone, with its own flags: pagedattn-bench decode --help

Every table is written as NAME.md, NAME.csv and NAME.json. The source repository's
documentation (bench.md) describes each table and the results of record."""


def _replay_backend(device: str, backend: str) -> str:
    # NOTE: "auto" on a CPU with TRITON_INTERPRET=1 would pick the interpreted Triton kernels
    # for every layer of every step: minutes instead of seconds. The A/B table covers Triton.
    return "torch" if device == "cpu" and backend == "auto" else backend


def cmd_run(a) -> int:
    from pagedattn.bench import ab, replay

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


def _facts(device: str) -> dict:
    """Device and software facts of a record."""
    import platform

    import torch

    facts = C.results_header(device=device)
    facts["platform"] = platform.platform()
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        facts.update(sms=p.multi_processor_count, memory_GiB=round(p.total_memory / 2**30, 1),
                     arch=getattr(p, "gcnArchName", "") or f"sm_{p.major}{p.minor}",
                     cuda=torch.version.cuda, hip=torch.version.hip)
    for mod in ("flashinfer", "pandas"):
        try:
            facts[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - a peer that does not import is a fact too
            facts[mod] = f"not importable ({type(e).__name__})"
    return facts


def cmd_record(a) -> int:
    from pathlib import Path

    from pagedattn.bench import decode, extend

    C.COMMIT = a.commit or None
    device = C.setup_device()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "command.txt").write_text(
        "python -m pagedattn.bench " + " ".join(shlex.quote(x) for x in a.argv) + "\n")
    (out / "device.json").write_text(json.dumps(_facts(device), indent=1) + "\n")
    rc = 0
    if a.tests:
        with open(out / "gpu-tests.log", "w") as log:
            rc |= subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p",
                                  "no:cacheprovider", a.tests], stdout=log,
                                 stderr=subprocess.STDOUT).returncode
    quick = ["--quick"] if a.quick else []
    rc |= int(decode.main(["--out", str(out)] + quick) is None)
    rc |= extend.main(["--out", str(out)] + quick)
    print(f"bench record: {out}/ (decode, extend: .md .csv .json; device.json; command.txt"
          f"{'; gpu-tests.log' if a.tests else ''})", flush=True)
    return rc


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PARTS:  # these parse their own flags
        import importlib
        rc = importlib.import_module(PARTS[argv[0]]).main(argv[1:])
        return rc if isinstance(rc, int) else 0
    ap = argparse.ArgumentParser(prog="pagedattn-bench", description=HELP, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="the main job: replay + short A/B on this device")
    p.add_argument("--out", default="results", help="folder for the tables")
    p.add_argument("--quick", action="store_true", help="smaller workloads")
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "triton", "hip"],
                   help="backend of the replay's ops")
    p.add_argument("--baseline", default=None, help="A/B speed-up baseline backend")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("record", help="the decode and extend tables of record (a GPU)")
    p.add_argument("--out", required=True, help="the record's folder")
    p.add_argument("--tests", default=None, help="also run this test folder's GPU tier")
    p.add_argument("--commit", default=None, help="the commit to report (a tree without .git)")
    p.add_argument("--quick", action="store_true", help="fewer shapes (not a record)")
    for name in PARTS:
        sub.add_parser(name, help=f"{name} alone (its own --help)")
    a = ap.parse_args(argv)
    a.argv = argv
    return cmd_run(a) if a.cmd == "run" else cmd_record(a)


if __name__ == "__main__":
    raise SystemExit(main())
