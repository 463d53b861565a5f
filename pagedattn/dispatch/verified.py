"""What has been verified where: the table ``auto`` trusts, and this device's self-check record.

``auto`` picks a backend for an op on an arch only when it is *trusted* there:

1. this device's self-check record (``python -m pagedattn.selfcheck``) says the backend passed the
   op here: trusted; says it failed: excluded, whatever the table says;
2. otherwise the table below: ``run-verified`` is trusted; ``compile-verified``,
   ``syntax-checked`` and ``unverified`` are not, with one exception: the portable Triton
   backend stays eligible on every GPU arch (the vendor's own Triton compiles it for the device;
   on AMD and Hygon it is the path engines run), so ``auto`` never falls back to the torch
   reference for lack of a run there. ``explain()`` states its level and ``auto`` warns once
   that it runs unverified; the self-check verifies it, and a failed self-check excludes it.
   The hand-written HIP kernels run under ``auto`` only once they have run there.

A forced backend (``backend=`` or ``PAGEDATTN_BACKEND``) runs whatever its level; the decision's
reasons still state it. The torch reference is trusted everywhere: it is plain torch ops, the
oracle every test compares against.

NOTE the table states facts about commits that ran on hardware; a new row comes with its
evidence (a results directory under ``bench/results/`` or a CI run), never from a prior.
"""
import functools
import warnings
from typing import Dict, NamedTuple, Tuple

from pagedattn.dispatch.arch import _device_index

RUN = "run-verified"
COMPILE = "compile-verified"
SYNTAX = "syntax-checked"
NONE = "unverified"
LEVELS = (RUN, COMPILE, SYNTAX, NONE)
OPS = ("paged_decode", "extend_attention", "store_kv", "copy_blocks")
ATTN = ("paged_decode", "extend_attention")
SELFCHECK = "python -m pagedattn.selfcheck"
_VERIFY_HINT = f"run `{SELFCHECK}` on this device to verify it"

# (backend, passed, note) for one op on this device, from its self-check record; a tuple of
# these is what ``select(checked=...)`` takes (hashable: the decision is cached).
Check = Tuple[str, bool, str]


class Verification(NamedTuple):
    """How far one backend's op is verified on one arch family, and the evidence."""

    level: str  # one of LEVELS
    how: str  # what ran or compiled, where the evidence lies
    date: str = ""
    commit: str = ""
    device: str = ""

    def describe(self) -> str:
        where = "".join(f" {w}" for w in (self.date, self.commit and f"at {self.commit}",
                                          self.device and f"on {self.device}") if w)
        return f"{self.level}{where} ({self.how})"


def _rows(level, how, ops=OPS, **kw) -> Dict[str, Verification]:
    return {op: Verification(level, how, **kw) for op in ops}


_H200 = dict(device="NVIDIA H200")
_HIP_H200 = "tests/test_hip_backend.py on the GPU, 99 passed: bench/results/2026-12-02-h200-3e3d07a"
_HYGON_HIP = ("the MMAC branch type-checked through compile_check/mmac_shim.h, which maps MMAC "
              "onto MFMA for gfx90a; no compiler here targets a Hygon DCU")
_HYGON_TRITON = ("never compiled: upstream Triton has no Hygon target, 3.9 fails in "
                 "ConvertWarpPipeline for gfx936; DTK ships its own Triton")
_AMD_TRITON = ("every kernel auto runs, compiled offline by Triton's AMD backend with the default "
               "tiles and the guards: no spill, no scratch (tests/test_triton_amd_compile.py)")

# arch family -> backend -> op -> Verification. An arch, backend or op missing here is
# unverified. Hygon's gfx928/gfx936/gfx938 are DTK's default build targets.
TABLE = {
    "sm_90": {
        "triton": {
            **_rows(RUN, "GPU decode tests, 214 passed: bench/results/2026-12-02-h200-92139e0",
                    ("paged_decode",), date="2026-12-02", commit="92139e0", **_H200),
            **_rows(RUN, "GPU extend tests, 135 of 136 passed (one host-side reason string): "
                    "bench/results/2026-12-01-h200-396d43e", ("extend_attention",),
                    date="2026-12-01", commit="396d43e", **_H200),
            **_rows(RUN, "the whole GPU tier, 538 passed: bench/results/2026-12-01-h200-babbb06",
                    ("store_kv", "copy_blocks"), date="2026-12-01", commit="babbb06", **_H200),
        },
        "hip": _rows(RUN, _HIP_H200, ATTN, date="2026-12-02", commit="3e3d07a", **_H200),
    },
    "sm_80": {"hip": _rows(COMPILE, "nvcc 13 device code for sm_80: tests/test_hip_compile.py",
                           ATTN)},
    "gfx90a": {"hip": _rows(COMPILE, "hipcc 5.2 device code: tests/test_hip_compile.py", ATTN),
               "triton": _rows(COMPILE, _AMD_TRITON)},
    "gfx942": {"hip": _rows(COMPILE, "clang-19 device code: tests/test_hip_compile.py", ATTN),
               "triton": _rows(COMPILE, _AMD_TRITON)},
    **{a: {"hip": _rows(SYNTAX, _HYGON_HIP, ATTN), "triton": _rows(NONE, _HYGON_TRITON)}
       for a in ("gfx928", "gfx936", "gfx938")},
    "cpu": {"triton": _rows(RUN, "the Triton interpreter, TRITON_INTERPRET=1: the CPU test tier "
                            "of every commit, .ci/run", device="CPU")},
}
_TORCH = Verification(RUN, "the float32 reference in plain torch ops, the oracle of every test")
_MISSING = Verification(NONE, "never compiled or run here")


def table_entry(arch: str, backend: str, op: str) -> Verification:
    """The table's verification of ``backend``'s ``op`` on ``arch`` (unverified when absent)."""
    if backend == "torch":
        return _TORCH
    return TABLE.get(arch, {}).get(backend, {}).get(op, _MISSING)


def _short(v: Verification) -> str:
    return {COMPILE: "compile-checked only", SYNTAX: "syntax-checked only",
            NONE: "unverified"}[v.level] + f" ({v.how})"


def distrust(backend: str, op: str, arch: str, checked: Tuple[Check, ...] = ()) -> list:
    """[] when ``auto`` may pick ``backend`` for ``op`` on ``arch``, else [the reason].

    checked: this device's self-check results for ``op`` (``device_checks``).
    """
    for name, passed, note in checked:
        if name == backend:
            return [] if passed else [f"{backend} failed `{SELFCHECK}` on this device ({note}); "
                                      f"force it with backend={backend!r} to run it anyway"]
    v = table_entry(arch, backend, op)
    if v.level == RUN or (backend == "triton" and arch != "cpu"):
        return []
    return [f"{backend} on {arch}: {_short(v)}; {_VERIFY_HINT}"]


def trust_note(backend: str, op: str, arch: str, checked: Tuple[Check, ...] = ()) -> str:
    """The evidence behind running ``backend``'s ``op`` on ``arch``, for a decision's reasons."""
    for name, passed, note in checked:
        if name == backend:
            return (f"{backend} {'passed' if passed else 'FAILED'} `{SELFCHECK}` on this device "
                    f"({note})")
    v = table_entry(arch, backend, op)
    if v.level == RUN:
        return f"{backend} {op} on {arch}: {v.describe()}"
    if backend == "triton" and arch != "cpu":
        return (f"triton on {arch}: {_short(v)}; it runs as the portable backend; "
                f"{_VERIFY_HINT}")
    return f"{backend} on {arch}: {_short(v)}; it runs because it was forced"


def warn_reference_fallback(decision, op: str):
    """Warn (once per arch, op and backends) when ``auto`` runs the torch reference on a GPU
    because capable backends are not trusted there, or runs Triton where it is not verified;
    returns ``decision``."""
    if decision.backend == "triton" and any("it runs as the portable backend" in r
                                            for r in decision.reasons):
        _warn_once(decision.arch, op, ("triton",), "runs unverified")
    if decision.backend == "torch" and decision.arch != "cpu":
        untrusted = tuple(r.split(" skipped: ")[0] for r in decision.reasons
                          if " skipped: " in r and r.endswith(_VERIFY_HINT))
        if untrusted:
            _warn_once(decision.arch, op, untrusted)
    return decision


@functools.lru_cache(maxsize=None)
def _warn_once(arch, op, untrusted, what="reference"):
    if what == "reference":
        msg = (f"pagedattn: {op} on {arch} runs the torch reference: {', '.join(untrusted)} not "
               f"trusted on this device; run `{SELFCHECK}` here to verify them (or force a "
               "backend)")
    else:
        msg = (f"pagedattn: {op} on {arch}: the Triton backend {what} on this arch; run "
               f"`{SELFCHECK}` here to verify it")
    warnings.warn(msg, RuntimeWarning, stacklevel=6)


##### This device's record #####

def device_checks(device, op: str) -> Tuple[Check, ...]:
    """This device's self-check results for ``op``: ((backend, passed, note), ...); () when no
    valid record exists. Read once per device (``dispatch.cache_clear`` forgets it)."""
    return _checks_by_op(_device_index(device)).get(op, ())


@functools.lru_cache(maxsize=None)
def _checks_by_op(index: int) -> Dict[str, Tuple[Check, ...]]:
    from pagedattn.selfcheck import record
    rec = record.load_for_device(index)
    out: Dict[str, list] = {}
    for backend, op, passed, note in record.results(rec):
        out.setdefault(op, []).append((backend, passed, note))
    return {op: tuple(v) for op, v in out.items()}


def clear() -> None:
    """Forget the records read (after a self-check, or a change of ``PAGEDATTN_CACHE_DIR``)."""
    _checks_by_op.cache_clear()
