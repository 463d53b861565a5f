"""The README's Python blocks run as written (CPU, a fresh process each), and its links point at
files in the repository."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")


def _blocks():
    text = open(README).read()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_python_blocks():
    assert len(_blocks()) >= 2


@pytest.mark.parametrize("i", range(len(_blocks())))
def test_readme_block_runs(i, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEDATTN_")}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    env.pop("TRITON_INTERPRET", None)  # as a user runs it: the default, no interpreter
    r = subprocess.run([sys.executable, "-c", _blocks()[i]], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("doc", ["README.md"] + [f"docs/{n}" for n in
                                                 sorted(os.listdir(os.path.join(ROOT, "docs")))])
def test_doc_links_stay_in_the_repository(doc):
    """Relative links resolve to files in the repository; no absolute paths."""
    path = os.path.join(ROOT, doc)
    text = open(path).read()
    assert not re.search(r"(?<![\w.])/(tmp|work|root|home|opt)/", text), f"{doc}: absolute path"
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        full = os.path.normpath(os.path.join(os.path.dirname(path), target))
        assert full.startswith(ROOT) and os.path.exists(full), f"{doc}: broken link {target}"
