"""pagedattn-bench as a user meets it: help texts that name the installed command, plain
top-level help, tables whose header says what ran, notes instead of tracebacks without triton,
and radix --record outside a checkout."""
import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pagedattn._triton import triton_available
from pagedattn.bench import __main__ as cli
from pagedattn.bench import common as C
from pagedattn.bench import radix

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("part", list(cli.PARTS))
def test_part_help_names_the_installed_command(capsys, part):
    with pytest.raises(SystemExit) as e:
        cli.main([part, "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: pagedattn-bench {part} ")


def test_top_level_help_is_plain_and_self_contained(capsys):
    """No reST markup, and no path into docs/ (an installed wheel has none)."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "docs/" not in out
    for part in ["run", "record"] + list(cli.PARTS):
        assert part in out.split("commands:", 1)[1], part


def test_header_says_what_ran():
    """A CPU table that only torch produced says so, never "(interpreter)"."""
    h = C.results_header(device="cpu", ran=["torch"])
    assert h["ran"] == "torch" and "interpreter" not in h["triton"]
    assert "Triton interpreter" not in C.cpu_note(["torch"])
    assert C.cpu_note(["torch", "triton"]) == C.INTERPRETER_NOTE
    if triton_available() and C.interpreter_on():
        assert h["triton"] != C.results_header(device="cpu", ran=["triton"])["triton"]


NO_TRITON = textwrap.dedent("""
    import sys
    sys.modules["triton"] = None  # what an install without triton sees: ModuleNotFoundError
    from pagedattn.bench.__main__ import main
    out = sys.argv[1]
    for argv in (["record", "--quick", "--out", out + "/record"], ["decode", "--quick"],
                 ["ab", "--quick", "--out", out + "/ab"],
                 ["replay", "--quick", "--backend", "torch", "--out", out + "/replay"]):
        rc = main(argv)
        print("rc", argv[0], rc, flush=True)
""")


def test_benches_without_triton_give_notes_not_tracebacks(tmp_path):
    """record and decode crashed with ModuleNotFoundError; the tables now carry dispatch's
    reason as a row note, and their headers say that only torch ran."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", NO_TRITON, str(tmp_path)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-3000:]
    assert "rc record 0" in r.stdout and "rc ab 0" in r.stdout and "rc replay 0" in r.stdout
    decode = (tmp_path / "record" / "decode.md").read_text()
    assert "triton: n/a: triton is not installed" in decode and "ran: nothing" in decode
    extend = (tmp_path / "record" / "extend.md").read_text()
    assert "n/a: triton is not installed" in extend
    assert "CPU: only torch sdpa ran (triton is not installed)" in extend
    for md in (decode, extend, (tmp_path / "ab" / "ab_decode.md").read_text(),
               (tmp_path / "replay" / "replay.md").read_text()):
        assert "triton: not installed ·" in md and "interpreter" not in md.lower(), md[:600]
    assert "(CPU: only torch ran (triton is not installed))" in (
        tmp_path / "ab" / "ab_extend.md").read_text()


def _record_args(**kw):
    return argparse.Namespace(**{"record": True, "commit": None, "out": None, **kw})


def test_radix_record_outside_a_checkout_takes_the_commit(monkeypatch, tmp_path):
    monkeypatch.setattr(radix, "REPO", str(tmp_path))  # a tree without .git
    monkeypatch.setattr(radix, "COMMIT", None)
    with pytest.raises(SystemExit, match="--commit"):
        radix.check_record_args(_record_args())
    with pytest.raises(SystemExit, match="--out"):
        radix.check_record_args(_record_args(commit="4c53df4"))
    radix.check_record_args(_record_args(commit="4c53df4", out=str(tmp_path / "r")))
    assert radix.git_commit() == "4c53df4"
    radix.check_record_args(_record_args(record=False))  # not a record: nothing to check
    assert radix.git_commit() == "nogit"
