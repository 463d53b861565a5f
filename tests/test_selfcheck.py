"""The self-check (pagedattn/selfcheck): the layout probe's diagnosis, the cases against wrong
kernels, the record round-trip and a corrupted record file, and the CLI on the CPU."""
import json
import subprocess
import sys

import pytest
import torch

from pagedattn import dispatch, torch_backend
from pagedattn._triton import triton_available
from pagedattn.selfcheck import cases as C
from pagedattn.selfcheck import probe as P
from pagedattn.selfcheck import record, runner


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Records go to a fresh directory; no decision or record read survives a test."""
    monkeypatch.setenv("PAGEDATTN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PAGEDATTN_BACKEND", raising=False)
    dispatch.cache_clear()
    yield tmp_path
    dispatch.cache_clear()


# ----------------------------------------------------------------------------------------------
# layout probe
# ----------------------------------------------------------------------------------------------

def test_probe_names_the_wrong_layout():
    a, b = P.known_tiles(16, 16, 16, torch.float16, seed=3)
    af, bf = a.float(), b.float()
    assert P.diagnose(af @ bf.T, a, b) == ""
    assert "transposed" in P.diagnose((af @ bf.T).T, a, b)
    assert "B taken untransposed" in P.diagnose(af @ bf, a, b)
    assert "A taken transposed" in P.diagnose(af.T @ bf.T, a, b)
    assert "operands, swapped" in P.diagnose(bf @ af.T, a, b)
    lanes = af @ bf.T
    lanes[:, 8:] = lanes[:, 8:].roll(1, 0)  # half the columns from the wrong lanes
    assert "wrong in rows" in P.diagnose(lanes, a, b) and "columns [8, 9" in \
        P.diagnose(lanes, a, b)
    assert "NaN" in P.diagnose(torch.full((16, 16), float("nan")), a, b)


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_triton_probe_passes_and_hip_probe_reports_missing(monkeypatch, device):
    got = P.probe("triton", device, (torch.float16,))
    assert [r.status for r in got] == ["pass", "pass"], got
    from pagedattn import hip_kernels
    monkeypatch.delattr(hip_kernels, "mma_probe", raising=False)
    (hip,) = P.probe("hip", torch.device("cpu"), (torch.float16,))
    assert hip.status == "skip" and "not available" in hip.detail


# ----------------------------------------------------------------------------------------------
# the cases fail wrong kernels (mutations of the torch backend, which the cases force)
# ----------------------------------------------------------------------------------------------

def _decode_skips_a_sequence(c):
    lse = torch_backend.R.paged_decode(c.q[1:], c.k_cache, c.v_cache, c.block_table[1:],
                                       c.seq_lens[1:], layout=c.layout, out=c.out[1:],
                                       return_lse=True, k_scale=c.opts.k_scale,
                                       v_scale=c.opts.v_scale)[1]
    return None if not c.return_lse else torch.cat([torch.zeros_like(lse[:1]), lse])


def _store_one_slot_late(k, v, k_cache, v_cache, slot_mapping, **kw):
    shifted = torch.where(slot_mapping >= 0, slot_mapping + 1, slot_mapping)
    torch_backend.R.store_kv(k, v, k_cache, v_cache, shifted, layout=kw["layout"],
                             k_scale=kw["k_scale"], v_scale=kw["v_scale"])


def _copy_all_but_last(caches, block_mapping, **kw):
    torch_backend.R.copy_blocks(caches, block_mapping[:-1])


@pytest.mark.parametrize("op,fake", [("paged_decode", _decode_skips_a_sequence),
                                     ("store_kv", _store_one_slot_late),
                                     ("copy_blocks", _copy_all_but_last)])
def test_cases_fail_wrong_kernels(monkeypatch, op, fake):
    case = C.Case(op, "hcu", torch.float16, torch.float16)
    assert C.run_case(case, "torch", torch.device("cpu")) == ("pass", "")
    monkeypatch.setattr(torch_backend, op, fake)
    status, detail = C.run_case(case, "torch", torch.device("cpu"))
    assert status == "fail" and detail, (status, detail)


def test_failed_run_excludes_the_backend(monkeypatch):
    """A backend that fails an op here is recorded as failed and dispatch stops picking it."""
    monkeypatch.setattr(torch_backend, "copy_blocks", _copy_all_but_last)
    rep = runner.run("cpu", backends=("torch",), log=lambda line: None)
    assert not rep.ok and rep.path
    e = rep.entries["torch"]["ops"]
    assert e["copy_blocks"]["passed"] is False and e["copy_blocks"]["failed"] == 8
    assert e["paged_decode"]["passed"] is True
    checks = dispatch.verified.device_checks("cpu", "copy_blocks")
    assert checks and checks[0][:2] == ("torch", False)
    with pytest.raises(ValueError, match="torch failed `python -m pagedattn.selfcheck`"):
        dispatch.select("copy_blocks", "cpu", interpret=False, checked=checks)
    assert "failed here" in runner.tables(rep)


# ----------------------------------------------------------------------------------------------
# the record
# ----------------------------------------------------------------------------------------------

def _entry(passed=True, backend="triton"):
    return {"version": record.backend_version(backend), "date": "2026-01-01",
            "probe": {"passed": True, "detail": ""},
            "ops": {"paged_decode": {"passed": passed, "cases": 3, "failed": 0 if passed else 1,
                                     "detail": "" if passed else "x: max |err| 1"}}}


def test_record_round_trip(cache_dir):
    key = record.device_key(-1)
    assert key["arch"] == "cpu" and record.load(key) is None
    path = record.write(key, {"triton": _entry()})
    assert path.parent == cache_dir / "selfcheck" and path.name.startswith("cpu-")
    record.write(key, {"torch": _entry(False, "torch")})  # merged, not replaced
    got = record.load(key)
    assert set(got["backends"]) == {"triton", "torch"} and got["key"] == key
    assert sorted((b, op, p) for b, op, p, _ in record.results(got)) == \
        [("torch", "paged_decode", False), ("triton", "paged_decode", True)]
    other = dict(key, runtime="cuda 99")  # another driver: another file, no record yet
    assert record.path_for(other) != path and record.load(other) is None


def test_record_of_other_code_is_ignored(monkeypatch):
    key = record.device_key(-1)
    record.write(key, {"triton": _entry()})
    monkeypatch.setattr(record, "backend_version", lambda b: "triton 0.0; kernels other")
    assert list(record.results(record.load(key))) == []


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": 1, "key": {}}),
                                     json.dumps({"format": 1, "key": {}, "backends": {
                                         "triton": {"ops": {"paged_decode": {"passed": "yes"}}}}}),
                                     "\udcff"])
def test_corrupted_record_is_ignored_with_a_warning(content):
    key = record.device_key(-1)
    path = record.path_for(key)
    path.parent.mkdir(parents=True)
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.warns(RuntimeWarning, match="self-check record"):
        assert record.load(key) is None
    with pytest.warns(RuntimeWarning):  # dispatch: the table alone (triton trusted on cpu)
        assert dispatch.verified.device_checks("cpu", "paged_decode") == ()
    record.write(key, {"triton": _entry(False)})  # a new run replaces the file
    assert dispatch.verified.device_checks("cpu", "paged_decode") == ()  # cached until cleared
    dispatch.cache_clear()
    assert dispatch.verified.device_checks("cpu", "paged_decode")[0][:2] == ("triton", False)


# ----------------------------------------------------------------------------------------------
# the whole run on the CPU
# ----------------------------------------------------------------------------------------------

@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def _interpreter_version_ok() -> bool:
    """The CPU tier runs the kernels under triton 3.9's interpreter (CI's). Triton 3.6's (the
    H200's) hands the kernels 1-element arrays where they need scalars (tl.num_programs, loaded
    bounds) and fails on them; that machine runs the device self-check instead."""
    if not triton_available():
        return False
    import triton
    return tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 9)


@pytest.mark.skipif(not _interpreter_version_ok(),
                    reason="the CPU self-check needs triton >= 3.9's interpreter")
def test_cli_on_cpu_passes_and_writes_the_record(cache_dir):
    env = {"PAGEDATTN_CACHE_DIR": str(cache_dir), "TRITON_INTERPRET": "1",
           "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    r = subprocess.run([sys.executable, "-m", "pagedattn.selfcheck", "--device", "cpu"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "all checks passed" in r.stdout and "| triton    | float16 16x16x16 | pass" in r.stdout
    (path,) = (cache_dir / "selfcheck").glob("cpu-*.json")
    rec = record.read(path)
    for backend in ("torch", "triton"):
        ops = rec["backends"][backend]["ops"]
        assert set(ops) == set(C.OPS) and all(o["passed"] and o["cases"] > 0
                                              for o in ops.values()), (backend, ops)
    assert "hip" not in rec["backends"]  # it cannot run here: no evidence either way


def test_docstring_example_runs():
    import doctest

    import pagedattn.selfcheck
    result = doctest.testmod(pagedattn.selfcheck, raise_on_error=False, verbose=False)
    assert result.attempted > 0 and result.failed == 0, result
