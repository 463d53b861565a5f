"""The self-check's verification record: one JSON file per device in the package cache directory.

A record is keyed by the device (name, arch, driver/runtime version) and the package version; it
holds, per backend, the backend's version (its code's hash and compiler version: a record of
other code is ignored), the date, the layout probe's outcome and each op's pass/fail::

    <cache dir>/selfcheck/<arch>-<hash of the key>.json
    {"format": 1, "key": {"device": ..., "arch": ..., "runtime": ..., "package": ...},
     "backends": {"triton": {"version": ..., "date": ..., "probe": {"passed": ..., "detail": ...},
                             "ops": {"paged_decode": {"passed": true, "cases": 12,
                                                      "failed": 0, "detail": ""}, ...}}}}

The cache directory is ``PAGEDATTN_CACHE_DIR``, else ``$XDG_CACHE_HOME/pagedattn``, else
``~/.cache/pagedattn`` (docs/configuration.md). An unreadable or malformed file counts as no
record: dispatch warns once and falls back to the package's verification table.
"""
import functools
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Iterator, Optional, Tuple

import torch

FORMAT = 1
_PKG = Path(__file__).resolve().parent.parent


def _runtime(index: int) -> str:
    if index < 0:
        return "none"
    rt = f"hip {torch.version.hip}" if getattr(torch.version, "hip", None) else \
        f"cuda {torch.version.cuda}"
    try:
        rt += f", driver {torch._C._cuda_getDriverVersion()}"
    except Exception:  # a build without the query: the runtime version alone
        pass
    return rt


def device_key(index: int) -> dict:
    """The record key of device ``index`` (-1: the CPU)."""
    import pagedattn
    from pagedattn.dispatch.arch import _detect, device_name
    return {"device": device_name(index), "arch": _detect(index), "runtime": _runtime(index),
            "package": pagedattn.__version__}


def path_for(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    from pagedattn import config
    return Path(config.cache_dir()) / "selfcheck" / f"{key['arch']}-{digest}.json"


def _tree_hash(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        root = _PKG / part
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in
                       (".py", ".h", ".cuh", ".cu", ".cpp")) if root.is_dir() else [root]
        for f in files:
            h.update(str(f.relative_to(_PKG)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


@functools.lru_cache(maxsize=None)
def backend_version(backend: str) -> str:
    """What a backend's results depend on besides the device: its code and its compiler."""
    if backend == "torch":
        return f"torch {torch.__version__}; reference {_tree_hash('reference.py', 'layouts.py')}"
    if backend == "triton":
        try:
            import triton
            tv = triton.__version__
        except ImportError:
            tv = "missing"
        return f"triton {tv}; kernels {_tree_hash('triton_kernels')}"
    if backend == "hip":
        return f"torch {torch.__version__}; sources {_tree_hash('hip_kernels')}"
    raise ValueError(f"backend: expected triton, hip or torch, got {backend!r}")


def read(path: Path) -> dict:
    """The record at ``path``; ValueError (naming the file) when it is not a valid record."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"self-check record {path}: unreadable ({e})") from None
    ok = isinstance(rec, dict) and rec.get("format") == FORMAT and \
        isinstance(rec.get("key"), dict) and isinstance(rec.get("backends"), dict)
    for entry in (rec.get("backends", {}).values() if ok else ()):
        ok = ok and isinstance(entry, dict) and isinstance(entry.get("ops"), dict) and all(
            isinstance(r, dict) and isinstance(r.get("passed"), bool)
            for r in entry["ops"].values())
    if not ok:
        raise ValueError(f"self-check record {path}: not a format-{FORMAT} record")
    return rec


def load(key: dict) -> Optional[dict]:
    """The record for ``key``, None when there is none. A malformed file warns and counts as
    none (running the self-check again replaces it)."""
    path = path_for(key)
    if not path.exists():
        return None
    try:
        rec = read(path)
    except ValueError as e:
        warnings.warn(f"pagedattn: {e}; ignored (run `python -m pagedattn.selfcheck` again)",
                      RuntimeWarning, stacklevel=2)
        return None
    return rec if rec["key"] == key else None


def load_for_device(index: int) -> Optional[dict]:
    return load(device_key(index))


def results(rec: Optional[dict]) -> Iterator[Tuple[str, str, bool, str]]:
    """(backend, op, passed, note) for every op of every backend in ``rec`` whose version is the
    installed one."""
    if not rec:
        return
    for backend, entry in rec["backends"].items():
        if backend not in ("triton", "hip", "torch") or \
                entry.get("version") != backend_version(backend):
            continue
        for op, r in entry["ops"].items():
            note = f"{entry.get('date', '?')}: {r.get('cases', '?')} cases"
            if not r["passed"]:
                note += f", {r.get('failed', '?')} failed: {r.get('detail') or 'see the record'}"
            yield backend, op, r["passed"], note


def write(key: dict, backends: dict) -> Path:
    """Merge ``backends`` (name -> entry) into the record for ``key`` and write it atomically;
    returns its path. A malformed previous file is replaced."""
    path = path_for(key)
    try:
        rec = read(path) if path.exists() else None
    except ValueError:
        rec = None
    if rec is None or rec["key"] != key:
        rec = {"format": FORMAT, "key": key, "backends": {}}
    rec["backends"].update(backends)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(rec, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path
