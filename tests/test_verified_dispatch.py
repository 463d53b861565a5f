"""Dispatch trusts verified backends only (dispatch/verified.py): the verification table, `auto`
against it, the device's self-check record making a backend eligible or excluding it, forced
backends, and the reasons explain() gives."""
import pytest
import torch

from pagedattn import dispatch
from pagedattn.dispatch import verified as V
from pagedattn.dispatch.core import PREFERENCE, Decision
from pagedattn.selfcheck import record
from dispatch_utils import _clean_dispatch, _decode_args  # noqa: F401

ARCHS = ["gfx90a", "gfx942", "gfx950", "gfx928", "gfx936", "gfx938", "sm_80", "sm_86", "sm_90",
         "sm_100", "cpu", "unknown"]
OPS = ["paged_decode", "extend_attention", "store_kv", "copy_blocks"]
F16, BF16 = torch.float16, torch.bfloat16
CALL = dict(dtype=F16, head_dim=128, block_size=16, group=4, layout="bhsd", interpret=True)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDATTN_CACHE_DIR", str(tmp_path))
    dispatch.cache_clear()
    return tmp_path


def _sel(op, arch, **kw):
    return dispatch.select(op, arch, **{**CALL, **kw})


def test_table_states_what_ran_where():
    e = V.table_entry
    for op in OPS:
        assert e("sm_90", "triton", op).level == V.RUN and e("sm_90", "triton", op).device
        assert e("cpu", "triton", op).level == V.RUN
        assert e("gfx942", "triton", op).level == e("gfx90a", "triton", op).level == V.COMPILE
        assert e("gfx936", "triton", op).level == V.NONE
        assert "ConvertWarpPipeline" in e("gfx936", "triton", op).how
        for arch in ARCHS:
            assert e(arch, "torch", op).level == V.RUN
    for op in ("paged_decode", "extend_attention"):
        h = e("sm_90", "hip", op)
        assert (h.level, h.date, h.commit, h.device) == (V.RUN, "2026-12-02", "3e3d07a",
                                                         "NVIDIA H200")
        assert e("gfx90a", "hip", op).level == e("gfx942", "hip", op).level == V.COMPILE
        assert e("gfx936", "hip", op).level == V.SYNTAX and "shim" in e("gfx936", "hip", op).how
    assert e("sm_90", "hip", "store_kv").level == V.NONE  # not implemented in hip
    assert e("gfx1100", "triton", "paged_decode").level == V.NONE


@pytest.mark.parametrize("arch", ARCHS)
def test_auto_never_picks_a_backend_that_has_not_run_there(arch):
    """Only a run-verified backend, or the portable Triton backend on a GPU (with its level in
    the reasons), ever serves auto; the HIP kernels never run where they have not run."""
    for op in OPS:
        for dtype in (F16, BF16):
            d = _sel(op, arch, dtype=dtype)
            level = V.table_entry(arch, d.backend, op).level
            if level == V.RUN:
                assert any(r.startswith(f"{d.backend} ") and "run-verified" in r
                           for r in d.reasons), d.describe()
            else:
                assert d.backend == "triton" and arch != "cpu", d.describe()
                assert any(f"triton on {arch}: " in r and "it runs as the portable backend" in r
                           and "selfcheck" in r for r in d.reasons), d.describe()


def test_amd_and_hygon_order_triton_first():
    for vendor in ("amd", "hygon"):
        assert PREFERENCE[vendor]["*"][0] == "triton"
    everything = tuple((b, True, "passed") for b in ("triton", "hip", "torch"))
    triton_failed = (("triton", False, "1 failed"),)
    for arch in ("gfx90a", "gfx942", "gfx928", "gfx936", "gfx938"):
        assert _sel("paged_decode", arch).backend == "triton"  # the table alone
        assert _sel("paged_decode", arch, checked=everything).backend == "triton"
        assert _sel("extend_attention", arch, checked=everything).backend == "triton"
        # Triton failed here, HIP never ran: the reference, not the unrun kernels
        assert _sel("paged_decode", arch, checked=triton_failed).backend == "torch"


def test_explain_says_why_and_how_to_verify():
    d = _sel("paged_decode", "gfx936", checked=(("triton", False, "1 failed"),))
    hip = next(r for r in d.reasons if r.startswith("hip skipped: "))
    assert hip.startswith("hip skipped: hip on gfx936: syntax-checked only (") and \
        hip.endswith("run `python -m pagedattn.selfcheck` on this device to verify it")
    d = _sel("paged_decode", "gfx936")
    assert d.backend == "triton"
    assert any("triton on gfx936: unverified" in r and "portable backend" in r
               for r in d.reasons)
    d = _sel("paged_decode", "gfx942", checked=(("triton", False, "1 failed"),))
    assert any("hip on gfx942: compile-checked only" in r for r in d.reasons)
    # a capability reason comes first: an unservable call does not blame verification
    d = _sel("paged_decode", "gfx942", head_dim=80, checked=(("triton", False, "1 failed"),))
    assert any(r.startswith("hip skipped: head_dim 80 not in") for r in d.reasons)


@pytest.mark.parametrize("forced_by", ["backend='hip'", "PAGEDATTN_BACKEND=hip"])
def test_forced_backend_runs_whatever_its_level(forced_by):
    d = _sel("paged_decode", "gfx936", backend="hip", forced_by=forced_by)
    assert d.backend == "hip" and d.reasons[0] == f"hip forced by {forced_by}"
    assert any("syntax-checked only" in r and "runs because it was forced" in r
               for r in d.reasons)
    failed = (("triton", False, "2026-01-01: 3 cases, 1 failed"),)
    d = _sel("paged_decode", "sm_90", backend="triton", checked=failed)
    assert d.backend == "triton" and any("triton FAILED" in r for r in d.reasons)


def test_record_makes_eligible_and_excludes():
    passed = (("hip", True, "2026-01-01: 16 cases"), ("triton", False, "1 failed"))
    d = _sel("paged_decode", "gfx942", checked=passed)  # hip passed here, triton failed
    assert d.backend == "hip"
    assert any("hip passed `python -m pagedattn.selfcheck` on this device" in r
               for r in d.reasons)
    failed = (("triton", False, "2026-01-01: 12 cases, 2 failed: x"),)
    d = _sel("paged_decode", "sm_90", checked=failed)  # run-verified, but failed on this device
    assert d.backend == "hip"
    assert any(r.startswith("triton skipped: triton failed `python -m pagedattn.selfcheck` on "
                            "this device (2026-01-01: 12 cases, 2 failed: x)") for r in d.reasons)
    both = failed + (("hip", False, "2026-01-01: 1 failed"),)
    assert _sel("paged_decode", "sm_90", checked=both).backend == "torch"


def _write_cpu_record(passed):
    key = record.device_key(-1)
    entry = {"version": record.backend_version("triton"), "date": "2026-01-01",
             "probe": {"passed": True, "detail": ""},
             "ops": {"paged_decode": {"passed": passed, "cases": 12, "failed": 0 if passed else 1,
                                      "detail": "" if passed else "paged_decode bhsd fp16: NaN"}}}
    return record.write(key, {"triton": entry})


def test_public_call_reads_this_devices_record(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors: Triton is the interpreter's
    args = _decode_args(torch.float16)
    assert dispatch.explain("paged_decode", *args, quiet=True).backend == "triton"
    _write_cpu_record(passed=False)
    dispatch.cache_clear()
    d = dispatch.explain("paged_decode", *args, quiet=True)
    assert d.backend == "torch", d.describe()
    assert any("triton failed `python -m pagedattn.selfcheck` on this device" in r and
               "NaN" in r for r in d.reasons)
    assert dispatch.explain("paged_decode", *args, backend="triton", quiet=True).backend == \
        "triton"  # forced: still runs
    assert dispatch.explain("store_kv", *_store_args(), quiet=True).backend == "triton"
    _write_cpu_record(passed=True)
    dispatch.cache_clear()
    d = dispatch.explain("paged_decode", *args, quiet=True)
    assert d.backend == "triton" and any("triton passed" in r for r in d.reasons)


def _store_args():
    import pagedattn as pa
    kc, vc = pa.make_kv_cache(4, 16, 2, 64, dtype=torch.float16)
    k = torch.randn(2, 2, 64, dtype=torch.float16)
    return k, k.clone(), kc, vc, torch.tensor([1, 5])


def test_reference_fallback_on_a_gpu_warns_once():
    reasons = ("arch gfx942 (...)", "triton skipped: triton on gfx942: compile-checked only (x); "
               "run `python -m pagedattn.selfcheck` on this device to verify it",
               "hip skipped: head_dim 80 not in [64, 128]", "torch: first backend")
    d = Decision("torch", "reference", reasons=reasons, arch="gfx942")
    with pytest.warns(RuntimeWarning, match="gfx942 runs the torch reference: triton not trusted"):
        assert V.warn_reference_fallback(d, "paged_decode") is d
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        V.warn_reference_fallback(d, "paged_decode")  # once per arch, op and backends
        V.warn_reference_fallback(d._replace(arch="cpu"), "extend_attention")
        V.warn_reference_fallback(d._replace(backend="triton"), "store_kv")
