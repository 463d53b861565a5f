"""Shared benchmark machinery: device setup, ceilings, timing, errors, tables, progress.

Every bench in this folder reports the same way (STYLE.md example 14, "benchmarks as data"):

* ``setup_device()`` once, before anything imports triton: on a machine without a GPU it sets
  ``TRITON_INTERPRET=1`` so Triton kernels run (slowly, timings meaningless) on the CPU, and
  one torch thread.
* ``measure_ceilings()`` once per run: the read bandwidth (``pagedattn.bench.read_probe``: the best of
  ``x.sum()`` and a streaming-read kernel over a 2 GiB tensor on a GPU; ``x.sum`` over 64 MiB on
  the CPU) and the dense matmul rate (bf16 8192^3 ``torch.matmul`` on a GPU, fp32
  1024^3 on the CPU). Kernel numbers are reported as a fraction of these, measured in the same run.
* ``time_fn()``: warm-up, then the median of per-call times. On a GPU each call is bracketed by
  CUDA events, preceded by a 256 MiB buffer write that evicts L2 (outside the timed interval) and
  fed the next of several input sets in rotation (cold-L2 inputs); ``cuda_graph=True`` captures
  ``graph_calls`` calls in one CUDA graph and reports replay time / calls (launch overhead
  amortised, for µs kernels; inputs then stay warm in L2). On the CPU: ``time.perf_counter``.
* ``write_table()``: a pandas DataFrame -> ``NAME.md`` (title + ``results_header()`` + a tabulate
  github table), ``NAME.csv``, ``NAME.json`` and, when matplotlib imports, ``NAME.png``.
"""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]  # the source checkout, when there is one
INTERPRETER_NOTE = "CPU: Triton interpreter, timings not meaningful"


# ----------------------------------------------------------------------------- device


def setup_device(*, interpret: bool = True) -> str:
    """'cuda' when a GPU is present, else 'cpu' (and, with ``interpret``, TRITON_INTERPRET=1
    unless already set).

    Call before anything imports triton: the interpreter flag is read at import time.
    """
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if interpret:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    # NOTE: the benches run µs-sized CPU ops; on a shared machine OpenMP spin-waiting makes them
    # ~50x slower with 2 threads than with 1
    torch.set_num_threads(1)
    return "cpu"


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"CPU {platform.machine()} ({os.cpu_count()} cores)"


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- header


COMMIT = None  # the commit to report (``record --commit``: a copy of the tree without .git)


def git_commit() -> str:
    """Short commit of the checkout (+ "-dirty"), :data:`COMMIT` when set, else the package
    version (an installed wheel)."""
    if COMMIT:
        return COMMIT
    if not (REPO_ROOT / ".git").exists():
        import pagedattn
        return f"pagedattn {pagedattn.__version__}"
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, text=True,
                             capture_output=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, text=True, capture_output=True, timeout=10)
        sha = out.stdout.strip() or "unknown"
        return sha + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def results_header(*, device: str, ceilings: Optional[Dict[str, float]] = None,
                   ran: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """Provenance of a table: date, commit, device, versions, ceilings of this run; ``ran``: the
    backends or providers that produced its numbers (a ``ran`` entry; the triton version says
    "(interpreter)" only when a Triton one is among them, or ``ran`` is not given)."""
    import torch

    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = "not installed"
    triton_ran = tv != "not installed" and (ran is None or _has_triton(ran))
    h = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "commit": git_commit(),
        "device": device_name(device),
        "torch": torch.__version__ + (f" (hip {torch.version.hip})" if torch.version.hip else ""),
        "triton": tv + (" (interpreter)" if device == "cpu" and interpreter_on() and triton_ran
                        else ""),
        "python": platform.python_version(),
    }
    if ran is not None:
        h["ran"] = ", ".join(ran) or "nothing"
    for k, v in (ceilings or {}).items():
        h[k] = f"{v:.4g}" if isinstance(v, float) else str(v)
    return h


def _has_triton(ran: Sequence[str]) -> bool:
    return any(r.startswith("triton") for r in ran)


def cpu_note(ran: Sequence[str]) -> str:
    """What a CPU table measured, for its title or notes: :data:`INTERPRETER_NOTE` when a Triton
    backend ran, else which ones did (and that triton is missing, when it is)."""
    if _has_triton(ran):
        return INTERPRETER_NOTE
    from pagedattn._triton import triton_available

    what = f"only {', '.join(ran)} ran" if ran else "nothing ran"
    return f"CPU: {what}" + ("" if triton_available() else " (triton is not installed)")


def header_markdown(h: Dict[str, str]) -> str:
    return " · ".join(f"{k}: {v}" for k, v in h.items())


# ----------------------------------------------------------------------------- timing


def time_fn(fn: Callable, *, inputs: Optional[Sequence[tuple]] = None, device: str = "cpu",
            warmup: int = 3, rep: int = 20, flush_l2: bool = True, cuda_graph: bool = False,
            graph_calls: int = 20) -> float:
    """Median seconds per call of ``fn(*inputs[i % len(inputs)])`` (``fn()`` when no inputs).

    GPU: CUDA events around each call; before each call an L2-sized buffer is zeroed (untimed)
    and the input set rotates, so each timed call starts with cold caches. ``cuda_graph``: time
    one replay of a graph holding ``graph_calls`` calls and divide (µs kernels; warm L2).
    CPU: wall time per call (perf_counter), same warm-up and median.
    """
    import torch

    sets = list(inputs) if inputs else [()]
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    if device != "cuda":
        times = []
        for i in range(rep):
            t0 = time.perf_counter()
            fn(*sets[i % len(sets)])
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    torch.cuda.synchronize()
    if cuda_graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(*sets[0])  # allocator warm-up on the capture stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(graph_calls):
                fn(*sets[i % len(sets)])
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(max(3, rep // 4)):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            graph.replay()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3 / graph_calls)
        return statistics.median(times)
    scratch = torch.empty(256 * 2 ** 20, dtype=torch.int8, device="cuda") if flush_l2 else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    for i in range(rep):
        if scratch is not None:
            scratch.zero_()
        starts[i].record()
        fn(*sets[i % len(sets)])
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends))


def measure_ceilings(device: str, *, quick: bool = False) -> Dict[str, float]:
    """Measured hardware ceilings of this run: read GB/s (pagedattn.bench.read_probe: the best of x.sum and
    a streaming-read kernel over a large tensor) and matmul TFLOP/s (square torch.matmul on
    random data)."""
    import torch

    if device == "cuda":
        n_bytes, mm_n, mm_dtype = 2 * 2 ** 30, 8192, torch.bfloat16  # quick or not: ~0.1 s
    else:
        n_bytes, mm_n, mm_dtype = 64 * 2 ** 20, (1024 if not quick else 512), torch.float32
    from pagedattn.bench.read_probe import read_ceiling

    read_bps, read_how, _ = read_ceiling(device, n_bytes)
    a = torch.randn(mm_n, mm_n, device=device, dtype=mm_dtype)
    b = torch.randn(mm_n, mm_n, device=device, dtype=mm_dtype)
    t_mm = time_fn(lambda: torch.matmul(a, b), device=device, warmup=2, rep=10 if device == "cuda"
                   else 3, flush_l2=False)
    what = "bf16 8192^3" if device == "cuda" else f"fp32 {mm_n}^3"
    return {
        "read_GBps": read_bps / 1e9,
        "read_ceiling": read_how,
        "matmul_TFLOPs": 2 * mm_n ** 3 / t_mm / 1e12,
        "matmul_ceiling": f"torch.matmul {what}",
    }


# ----------------------------------------------------------------------------- errors


def max_err(out, ref) -> float:
    """max |out - ref| in float32 (NaN counts as inf)."""
    import torch

    d = (out.float() - ref.float()).abs()
    if d.numel() == 0:
        return 0.0
    return float("inf") if bool(torch.isnan(d).any()) else float(d.max())


# ----------------------------------------------------------------------------- tables


def markdown(df) -> str:
    from tabulate import tabulate

    df = df.astype(object).where(df.notna(), None)  # missing cells print empty, not "nan"
    return tabulate(df, headers="keys", tablefmt="github", showindex=False, floatfmt=".4g")


def write_table(df, out_dir, name: str, *, title: str, header: Dict[str, str],
                notes: Sequence[str] = (), plot: Optional[Dict[str, str]] = None) -> str:
    """Write NAME.md/.csv/.json (+ .png when matplotlib imports and ``plot`` gives
    ``{"x": col, "y": col, "hue": col}``); return the markdown text."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = f"## {title}\n\n{header_markdown(header)}\n\n{markdown(df)}\n"
    if notes:
        text += "\n" + "\n".join(f"* {n}" for n in notes) + "\n"
    (out / f"{name}.md").write_text(text)
    df.to_csv(out / f"{name}.csv", index=False)
    payload = {"title": title, "header": header, "notes": list(notes),
               "rows": json.loads(df.to_json(orient="records"))}
    (out / f"{name}.json").write_text(json.dumps(payload, indent=1))
    if plot:
        _plot(df, out / f"{name}.png", title=title, **plot)
    return text


def _plot(df, path: Path, *, title: str, x: str, y: str, hue: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    pivot = df.pivot_table(index=x, columns=hue, values=y, aggfunc="first", sort=False)
    ax = pivot.plot.bar(figsize=(max(6, len(pivot) * 0.8), 4), rot=30)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(y)
    plt.tight_layout()
    plt.savefig(path, dpi=120)
    plt.close("all")


# ----------------------------------------------------------------------------- progress


class Progress:
    """A plain-text progress bar on stderr: ``[#####.....] 5/10 label``."""

    def __init__(self, total: int, desc: str, *, width: int = 24):
        self.total, self.desc, self.width, self.n = max(total, 1), desc, width, 0
        self.tty = sys.stderr.isatty()

    def step(self, label: str = "") -> None:
        self.n += 1
        fill = self.width * self.n // self.total
        bar = "#" * fill + "." * (self.width - fill)
        line = f"{self.desc} [{bar}] {self.n}/{self.total} {label}"
        if self.tty:
            sys.stderr.write("\r" + line[:120].ljust(120))
            if self.n >= self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def elapsed(t0: float) -> str:
    return f"{time.perf_counter() - t0:.1f} s"


def failure_note(e: Exception) -> str:
    """A table row's note for a backend or peer that failed: dispatch's refusal as ``n/a:`` and
    its reasons (e.g. "triton is not installed"), anything else as its type and first line."""
    msg = str(e)
    if "cannot serve" in msg:
        return "n/a: " + msg.split(": ", 1)[-1]
    return f"{type(e).__name__}: {msg.splitlines()[0] if msg else ''}"


def fmt_reasons(reasons: List[str], limit: int = 90) -> str:
    s = "; ".join(reasons)
    return s if len(s) <= limit else s[: limit - 3] + "..."


# ----------------------------------------------------------------------------- dispatch


def decision(op: str, *args, **kwargs):
    """dispatch's Decision for ``pagedattn.<op>(*args, **kwargs)`` (no launch, no print); a
    forced backend that cannot serve the call raises ValueError with the reasons."""
    from pagedattn import dispatch

    return dispatch.explain(op, *args, quiet=True, **kwargs)


def with_env(fn, **env):
    """fn, called with the environment variables ``env`` set (restored after each call): an A/B
    peer that runs the same op under an internal override (PAGEDATTN_DEV_*)."""
    def run():
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return fn()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return run
