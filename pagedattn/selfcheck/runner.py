"""Run the self-check on one device: the layout probe and the small cases per backend, a table,
and the verification record that dispatch reads."""
import datetime
import time
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch

from pagedattn.selfcheck import cases as C
from pagedattn.selfcheck import probe as P
from pagedattn.selfcheck import record

BACKENDS = ("torch", "triton", "hip")
MATMUL_OPS = ("paged_decode", "extend_attention")  # the ops the probe's matrix unit serves


class CaseResult(NamedTuple):
    backend: str
    case: C.Case
    status: str  # "pass" | "fail" | "skip"
    detail: str


class Report(NamedTuple):
    device: str
    key: dict
    probes: List[P.ProbeResult]
    results: List[CaseResult]
    entries: Dict[str, dict]  # backend -> its record entry
    path: Optional[str]  # the record written, None when not written
    seconds: float

    @property
    def ok(self) -> bool:
        return not any(r.status == "fail" for r in [*self.probes, *self.results])


def why_not_here(backend: str, device: torch.device) -> Optional[str]:
    """None when ``backend`` can run on ``device``, else the reason."""
    if backend == "torch":
        return None
    if backend == "triton":
        from pagedattn._triton import interpreter_enabled, triton_available
        if not triton_available():
            return "triton is not installed"
        if device.type != "cuda" and not interpreter_enabled():
            return "a CPU device and TRITON_INTERPRET is not set"
        return None
    if device.type != "cuda":
        return "needs a CUDA/ROCm device"
    from pagedattn import hip_kernels
    return hip_kernels._toolchain_reason() or hip_kernels._arch_reason(
        device.index if device.index is not None else torch.cuda.current_device())


def _entry(backend, probes, results) -> dict:
    probe_bad = [p for p in probes if p.status == "fail"]
    probe_ran = [p for p in probes if p.status != "skip"]
    ops = {}
    for op in C.OPS:
        mine = [r for r in results if r.case.op == op and r.status != "skip"]
        if not mine:
            continue  # no evidence either way
        failed = [r for r in mine if r.status == "fail"]
        detail = f"{failed[0].case.name}: {failed[0].detail}" if failed else ""
        if op in MATMUL_OPS and probe_bad:
            detail = "; ".join(filter(None, [detail, f"layout probe failed ({probe_bad[0].tile})"]))
        ops[op] = {"passed": not failed and not (op in MATMUL_OPS and probe_bad),
                   "cases": len(mine), "failed": len(failed), "detail": detail[:500]}
    return {"version": record.backend_version(backend),
            "date": datetime.date.today().isoformat(),
            "probe": {"passed": (not probe_bad) if probe_ran else None,
                      "detail": "; ".join(f"{p.tile}: {p.detail}" for p in probe_bad)[:500]},
            "ops": ops}


def run(device=None, backends: Sequence[str] = BACKENDS, write: bool = True, log=print,
        seed: int = 0) -> Report:
    """Run the self-check on ``device`` (default: the current GPU, else the CPU) for
    ``backends``; write the record when ``write`` (and any case ran). ``log``: progress lines."""
    from pagedattn import dispatch
    from pagedattn.dispatch.arch import _device_index

    t0 = time.perf_counter()
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = record.device_key(_device_index(device))
    log(f"self-check on {key['device']} ({key['arch']}, {key['runtime']}), pagedattn "
        f"{key['package']}")
    gpu = device.type == "cuda"
    probes, results, entries = [], [], {}
    for backend in backends:
        why = why_not_here(backend, device)
        mine_p = []
        if backend != "torch":
            # the interpreter's bf16 tl.dot multiplies raw bits: no bf16 tile off the GPU
            dtypes = (torch.float16, torch.bfloat16) if gpu else (torch.float16,)
            mine_p = P.probe(backend, device, dtypes, why)
        mine_r = []
        for case in C.all_cases():
            if why:
                mine_r.append(CaseResult(backend, case, "skip", why))
                continue
            try:
                status, detail = C.run_case(case, backend, device, seed)
            except Exception as e:  # a crash is this case's failure; the others still run
                status, detail = "fail", f"{type(e).__name__}: {e}"[:300]
            mine_r.append(CaseResult(backend, case, status, detail))
            if status == "fail":
                log(f"  FAIL {backend} {case.name}: {detail}")
        probes += mine_p
        results += mine_r
        if not why:
            entries[backend] = _entry(backend, mine_p, mine_r)
        ran = sum(r.status != "skip" for r in mine_r)
        log(f"  {backend}: {ran} cases run, {sum(r.status == 'fail' for r in mine_r)} failed"
            + (f" (skipped: {why})" if why else ""))
    path = None
    if write and any(e["ops"] for e in entries.values()):
        path = str(record.write(key, {b: e for b, e in entries.items() if e["ops"]}))
        dispatch.cache_clear()  # this process's decisions read the new record
    return Report(key["device"], key, probes, results, entries, path,
                  time.perf_counter() - t0)


def _auto(backend, op, arch, checked, entries) -> str:
    from pagedattn.dispatch import verified as V
    if backend not in entries:
        return "no: cannot run here"
    if not V.distrust(backend, op, arch, checked):
        return "yes"
    outcome = next((p for b, p, _ in checked if b == backend), None)
    return "no: failed here" if outcome is False else \
        f"no: {V.table_entry(arch, backend, op).level} (no case ran)"


def tables(report: Report, verbose: bool = False) -> str:
    """The report as text: the probe, a summary per backend and op (with whether ``auto`` may
    pick it here now), and every failed (or, verbose, every) case."""
    from tabulate import tabulate

    arch = report.key["arch"]
    parts = []
    if report.probes:
        parts.append("layout probe (C = A @ B^T on integer tiles, exact):\n" + tabulate(
            [[p.backend, p.tile, p.status, p.detail] for p in report.probes],
            headers=["backend", "tile", "result", "detail"], tablefmt="github"))
    rows = []
    checked = {op: tuple((b, e["ops"][op]["passed"], "this run") for b, e in
                         report.entries.items() if op in e["ops"]) for op in C.OPS}
    for backend in BACKENDS:
        for op in C.OPS:
            mine = [r for r in report.results if r.backend == backend and r.case.op == op]
            if not mine:
                continue
            n = {s: sum(r.status == s for r in mine) for s in ("pass", "fail", "skip")}
            rows.append([backend, op, n["pass"], n["fail"], n["skip"],
                         _auto(backend, op, arch, checked[op], report.entries)])
    parts.append("cases against the float32 reference:\n" + tabulate(
        rows, headers=["backend", "op", "pass", "fail", "skip", "auto may pick it here"],
        tablefmt="github"))
    shown = [r for r in report.results if verbose or r.status == "fail"]
    if shown:
        parts.append(tabulate([[r.backend, r.case.name, r.status, r.detail[:120]] for r in shown],
                              headers=["backend", "case", "result", "detail"],
                              tablefmt="github"))
    parts.append(f"record: {report.path or 'not written'}; {report.seconds:.1f} s; "
                 + ("all checks passed" if report.ok else "FAILURES above"))
    return "\n\n".join(parts)
