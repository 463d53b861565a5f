"""Every ``PAGEDATTN_*`` environment variable, declared once: name, type, default, allowed values
and meaning. The rest of the package reads them only through :func:`get`, which validates the
value and raises ``ValueError`` naming the variable; ``docs/configuration.md`` holds the same
table (a test compares the two, and another fails when code reads an undeclared name).

Variables under ``PAGEDATTN_DEV_`` are internal overrides for A/B measurements and tests: they
exist so a maintainer can reproduce a committed comparison, they are not part of the public API,
and they may change between releases.

NOTE hot path: :func:`get` sits on the eager per-call path (backend choice, validation mode,
launch replay). ``os.environ.get`` encodes the name and decodes the value on every read
(~1.5 us on a server host); on CPython/POSIX ``os.environ._data`` holds the encoded bytes,
updated by every ``os.environ[...] = ...`` (``monkeypatch.setenv`` included), so a lookup by a
pre-encoded name sees the same value for ~0.05 us, and a parsed value is memoised per raw value.
"""
import os
from typing import Any, Callable, NamedTuple, Optional, Tuple


class Var(NamedTuple):
    """One environment variable: ``kind`` is ``choice`` (one of ``choices``), ``bool`` (0/1),
    ``int`` (a positive integer, or ``auto`` where ``choices`` holds it) or ``path``."""

    name: str
    kind: str
    default: str
    meaning: str
    choices: Tuple[str, ...] = ()


_DECLARED = (
    Var("PAGEDATTN_BACKEND", "choice", "auto",
        "backend for every op: `auto` (dispatch decides per call) or a forced one, which raises "
        "when it cannot serve the call", ("auto", "triton", "hip", "torch")),
    Var("PAGEDATTN_VALIDATE", "bool", "0",
        "also check device-resident metadata on the host before each launch (one host sync) and "
        "raise on the first bad entry, instead of the kernels' guarded result (NaN rows, "
        "skipped writes)"),
    Var("PAGEDATTN_PARTITION_SIZE", "int", "auto",
        "split-KV partition in tokens for decode (`auto`: 512, 256 when the GQA group is larger "
        "than 15); a power of 2", ("auto",)),
    Var("PAGEDATTN_LAUNCH_REPLAY", "bool", "1",
        "eager GPU decode calls relaunch the recorded launches of metadata seen before "
        "(49-124 us of host time per decode instead of 121-399 on the H200)"),
    Var("PAGEDATTN_CACHE_DIR", "path", "",
        "where HIP builds, the radix cache's C helpers, self-check records, the radix "
        "bench's SGLang files and the tests' peer wheels (about 660 MB) live (empty: "
        "`$XDG_CACHE_HOME/pagedattn` or `~/.cache/pagedattn`)"),
    Var("PAGEDATTN_HIP_VERBOSE", "bool", "0",
        "print the compiler's output while the HIP extension builds"),
    Var("PAGEDATTN_SLOW", "bool", "0",
        "tests: also run the nightly-size cases (marker `slow`)"),
    Var("PAGEDATTN_DEV_DECODE_MODE", "choice", "auto",
        "internal: force the decode launch shape (`one_pass`, `split`, `balance`, or the "
        "`count` rule); every shape gives bitwise-equal outputs",
        ("auto", "one_pass", "split", "balance", "count")),
    Var("PAGEDATTN_DEV_DECODE_KERNEL", "choice", "auto",
        "internal: which Triton-backend decode kernel runs (`gluon` wherever the sm_90 Gluon "
        "kernel can serve the call, `triton` always the portable kernel)",
        ("auto", "gluon", "triton")),
    Var("PAGEDATTN_DEV_EXTEND_KERNEL", "choice", "auto",
        "internal: which Triton-backend extend kernel runs (`gluon` where the sm_90 Gluon "
        "kernel can serve the call, `triton` always the portable kernel)",
        ("auto", "gluon", "triton")),
    Var("PAGEDATTN_DEV_GUARDS", "bool", "1",
        "internal: `0` compiles the kernels without their metadata bounds guards, for measuring "
        "what the guards cost; never for serving"),
)
DECLARED = {v.name: v for v in _DECLARED}
PREFIX = "PAGEDATTN_"
DEV_PREFIX = "PAGEDATTN_DEV_"

_DATA = os.environ.__dict__.get("_data")
if os.name != "posix" or not isinstance(_DATA, dict):
    _DATA = None
_KEYS = {n: (n.encode() if _DATA is not None else n) for n in DECLARED}
_PARSED = {}  # (name, raw) -> value


def _raw(name: str):
    if _DATA is not None:
        raw = _DATA.get(_KEYS[name])
        return None if raw is None else raw.decode()
    return os.environ.get(name)


def _parse(var: Var, raw: str) -> Any:
    raw = raw.strip() or var.default
    if var.kind == "path":
        return raw
    if var.kind == "bool":
        if raw in ("0", "1"):
            return raw == "1"
        raise ValueError(f"{var.name}={raw!r}: expected 0 or 1")
    if var.kind == "choice":
        if raw in var.choices:
            return raw
        raise ValueError(f"{var.name}={raw!r}: expected one of {', '.join(var.choices)}")
    if raw in var.choices:  # int with a named value (auto)
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        extra = " or " + " or ".join(var.choices) if var.choices else ""
        raise ValueError(f"{var.name}={raw!r}: expected a positive integer{extra}")
    return value


def get(name: str) -> Any:
    """The parsed value of the declared variable ``name`` (its default when unset): str for
    choices and paths, bool for bool, int or None (``auto``) for int. ``ValueError`` names the
    variable and the values it takes; ``KeyError`` for an undeclared name."""
    var = DECLARED[name]
    raw = _raw(name)
    raw = var.default if raw is None else raw
    key = (name, raw)
    try:
        return _PARSED[key]
    except KeyError:
        value = _PARSED[key] = _parse(var, raw)
        return value


def cache_dir() -> str:
    """The package's cache directory: ``PAGEDATTN_CACHE_DIR``, else ``$XDG_CACHE_HOME/pagedattn``
    or ``~/.cache/pagedattn`` (HIP builds, the radix cache's C helpers, self-check records, the
    radix bench's SGLang files, the tests' peer wheels)."""
    path = get("PAGEDATTN_CACHE_DIR")
    if path:
        return path
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pagedattn")


def names(*env_names) -> tuple:
    """``env_names`` (declared ones, or other processes' variables such as TRITON_INTERPRET) in
    the form :func:`values` takes."""
    for n in env_names:
        if n.startswith(PREFIX) and n not in DECLARED:
            raise KeyError(n)
    return tuple(n.encode() for n in env_names) if _DATA is not None else env_names


def values(encoded_names) -> tuple:
    """The raw values (None when unset; bytes on POSIX) of names prepared by :func:`names`: for
    memo keys and comparisons, never for parsing (use :func:`get`)."""
    if _DATA is not None:
        return tuple(map(_DATA.get, encoded_names))
    return tuple(map(os.environ.get, encoded_names))


def is_set(name: str) -> bool:
    """Whether the declared variable ``name`` is present in the environment."""
    DECLARED[name]  # KeyError for an undeclared name
    return _raw(name) is not None


def validate_all() -> None:
    """Parse every declared variable that is set (``ValueError`` on the first bad one) and
    reject ``PAGEDATTN_*`` names in the environment that are not declared (a typo would
    otherwise be ignored silently)."""
    for name in os.environ:
        if name.startswith(PREFIX) and name not in DECLARED:
            raise ValueError(f"{name}: not a pagedattn variable (see docs/configuration.md)")
    for name in DECLARED:
        get(name)


def markdown_table() -> str:
    """The table of ``docs/configuration.md``."""
    rows = ["| variable | type | default | values | meaning |", "|---|---|---|---|---|"]
    for v in _DECLARED:
        values = {"bool": "`0`, `1`", "path": "a directory",
                  "int": "a positive integer" + "".join(f", `{c}`" for c in v.choices),
                  "choice": ", ".join(f"`{c}`" for c in v.choices)}[v.kind]
        default = f"`{v.default}`" if v.default else "(empty)"
        rows.append(f"| `{v.name}` | {v.kind} | {default} | {values} | {v.meaning} |")
    return "\n".join(rows) + "\n"


def override(name: str, value: Optional[str]) -> Callable[[], None]:
    """Set (``value`` a string) or unset (None) a declared variable for this process; returns a
    function that restores the previous value (benchmarks' A/B runs)."""
    DECLARED[name]
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        _parse(DECLARED[name], value)
        os.environ[name] = value

    def restore():
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
    return restore
